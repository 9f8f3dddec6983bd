#!/bin/sh
# Write a harness venv's lock: what pip resolved into it, one `name==version` a line, sorted.
# pip, setuptools and wheel count only when a package of the venv requires them (else they are
# what the host's Python put in every venv). torch loses its local build tag (2.13.0+cpu ->
# 2.13.0): the lock pins the release the Makefile names, and each host's index picks its build.
# A package installed from a URL or a directory (`name @ ...`, `-e ...`) cannot be a constraint
# and is left out.
# Usage: freeze.sh VENV LOCK
set -eu
venv=$1
lock=$2
if [ ! -x "$venv/bin/pip" ]; then
    echo "freeze.sh: $venv is not a venv (no bin/pip); build it first (make harnesses)" >&2
    exit 2
fi
unneeded=
for name in pip setuptools wheel; do
    if "$venv/bin/pip" show "$name" 2>/dev/null | grep -qx 'Required-by: *'; then
        unneeded="$unneeded --exclude=$name"
    fi
done
# shellcheck disable=SC2086 # $unneeded: one word per package left out
"$venv/bin/pip" freeze --all $unneeded > "$lock.frozen"
{
    echo "# $(basename "$lock" .txt): the packages its harness venv was tested with (pip constraints)."
    echo "# Refresh: docs/guide/accuracy-harnesses.md#the-locks"
    grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' "$lock.frozen" | sed -E 's/^torch==([^+]+)\+.*$/torch==\1/' | LC_ALL=C sort -f
} > "$lock.partial"
rm "$lock.frozen"
mv "$lock.partial" "$lock"
