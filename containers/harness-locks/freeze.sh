#!/bin/sh
# Write a harness venv's lock: what pip resolved into it, one `name==version` a line, sorted.
# pip, setuptools and wheel count only when a package of the venv requires them (else they are
# what the host's Python put in every venv). torch loses its local build tag (2.13.0+cpu ->
# 2.13.0): the lock pins the release the Makefile names, and each host's index picks its build.
# A package installed from a URL or a local directory (`name @ ...`) cannot be a constraint and
# is left out.
# Usage: freeze.sh VENV LOCK
set -eu
venv=$1
lock=$2
unneeded=
for name in pip setuptools wheel; do
    if "$venv/bin/pip" show "$name" 2>/dev/null | grep -qx 'Required-by: *'; then
        unneeded="$unneeded --exclude=$name"
    fi
done
{
    echo "# $(basename "$lock" .txt): the packages its harness venv was tested with (pip constraints)."
    echo "# Refresh: docs/guide/accuracy-harnesses.md#the-locks"
    # shellcheck disable=SC2086 # $unneeded: one word per package left out
    "$venv/bin/pip" freeze --all $unneeded | grep -v ' @ ' | sed -E 's/^torch==([^+]+)\+.*$/torch==\1/' | LC_ALL=C sort -f
} > "$lock.partial"
mv "$lock.partial" "$lock"
