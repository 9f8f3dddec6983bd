#!/usr/bin/env bash
# Start a Docker-compatible engine (podman's API service) on a machine without a Docker daemon.
# Idempotent: installs podman + runc if missing, writes the engine config, starts the service
# unless its socket already answers, waits for it, and prints the DOCKER_HOST line to export.
# Why each setting: see CONTAINERS.md (crun fails on hybrid cgroups here; default ulimits
# cannot be applied in this sandbox).
set -euo pipefail

SOCKET="${BISECT_NPU_PODMAN_SOCKET:-/run/bisect-npu-podman.sock}"
LOG="${BISECT_NPU_PODMAN_LOG:-/tmp/bisect-npu-podman.log}"
CONF=/etc/containers/containers.conf

say() { echo "setup-podman: $*" >&2; }

answering() {
    # The Docker API's ping endpoint; curl speaks HTTP over the unix socket.
    [ -S "$SOCKET" ] && curl -sf --max-time 2 --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1
}

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v curl >/dev/null; then
    say "installing podman, runc (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends podman runc curl uidmap iptables netavark aardvark-dns \
        fuse-overlayfs ca-certificates >/dev/null
fi
# The mirror-registry tests start Debian's registry (distribution) on a loopback port.
if ! command -v docker-registry >/dev/null; then
    say "installing docker-registry (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
fi

want_conf=$'[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n'
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "${want_conf%$'\n'}" ]; then
    mkdir -p /etc/containers
    printf '%s' "$want_conf" > "$CONF"
    say "wrote $CONF"
fi

# A service started from a checkout that was deleted since (a throw-away CI clone) still answers
# the ping, but every container it starts fails ("write child: broken pipe": conmon cannot enter
# the deleted working directory). Replace such a service.
for pid in $(pgrep -f "podman system service .*unix://$SOCKET" || true); do
    if [[ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" == *"(deleted)" ]]; then
        say "restarting the podman service $pid: its working directory was deleted"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
done

if ! answering; then
    say "starting podman system service on $SOCKET (log: $LOG)"
    rm -f "$SOCKET"
    # From /, so the service never depends on the directory `make` ran in; the subshell becomes
    # the service (exec) with its output in the log, so nothing keeps the caller's stdout open
    # (`make engine | tail` would otherwise wait for the service to end).
    (cd / && exec setsid podman system service --time=0 "unix://$SOCKET") >"$LOG" 2>&1 < /dev/null &
    for _ in $(seq 1 100); do
        answering && break
        sleep 0.2
    done
    if ! answering; then
        say "the podman service did not answer on $SOCKET within 20 s; last log lines:"
        tail -n 20 "$LOG" >&2 || true
        exit 5
    fi
fi
say "engine answering: $(podman --version)"
echo "export DOCKER_HOST=unix://$SOCKET"
