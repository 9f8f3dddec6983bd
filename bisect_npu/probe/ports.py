"""The candidate's server is the candidate's: its port is checked free before it starts (a held
one is traded for a free one), and what answers on it is checked to be the started process's
(Linux's /proc: the listening socket is held by a process of the server's session). A server
already listening there would otherwise be measured in the candidate's place.

Part of the probe: standard library only.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"  # /proc/net/tcp's state column for a listening socket
PROC = Path("/proc")


class PortHeld(RuntimeError):
    """Another process answers on the server's port: the run stops (infrastructure), nothing is judged."""


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def listening_sockets(port: int) -> set[str] | None:
    """The inodes of the sockets listening on `port` (any address); None where /proc has no table."""
    found: set[str] = set()
    tables = [PROC / "net" / name for name in ("tcp", "tcp6")]
    if not any(table.exists() for table in tables):
        return None
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _sockets_of(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in (PROC / str(pid) / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:  # gone, or another user's
        pass
    return inodes


def _session_of(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[3])  # after the command name: state, ppid, pgrp, session


def _pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def holder(port: int) -> str:
    """Who listens on `port`, as far as this user may see: `pid N (command line)`."""
    inodes = listening_sockets(port) or set()
    for pid in _pids():
        if inodes & _sockets_of(pid):
            try:
                command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                command = "?"
            return f"pid {pid} ({command.strip()[:200]})"
    return "another process"


def check_own_listener(port: int, session: int) -> None:
    """The socket answering on `port` is held by a process of the server's `session` (its pid, as
    started with a session of its own); else PortHeld naming the holder. Without /proc: unchecked."""
    listening = listening_sockets(port)
    if not listening:
        return
    if any(listening & _sockets_of(pid) for pid in _pids() if _session_of(pid) == session):
        return
    raise PortHeld(f"port {port} is answered by {holder(port)}, not by the server this probe started (pid "
                   f"{session}): stop that process, or give the recipe another engine.port")
