"""Whose fault is a failed image build: the commit's, or the host's surroundings?

A commit's own breakage (a compile error, a file its Dockerfile copies and no longer has) is a
`skip`: the search steps around it. A base image that cannot be pulled, a package index or git
host the build cannot reach, a full disk say nothing about the commit: as a `skip` they would
turn every candidate into one and end with "the ends are wrong". They are infrastructure errors
instead, naming the cause and what to do: one of the network (a pull, an index or a git host out of
reach) is `BuildUnreachable`, built again with the run's retry budget; the others (a full disk, a
registry that refuses the image) stop the run at once (exit 5), and `bisect-npu resume` goes on
afterwards.

Read from the engine's error (a pull fails before any step runs) and from the output of the
build step that failed (Docker's `Step N/M :` and podman's `STEP N/M:` headers split the log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bisect_npu.errors import InfrastructureError

RESUME = "then `bisect-npu resume` continues the session"

_DISK_FULL = re.compile(r"no space left on device|disk quota exceeded", re.IGNORECASE)

# A pull of the base image that failed: the engine's wording (podman, Docker's classic builder,
# BuildKit) of an unreachable, refusing or incomplete registry.
_PULL_SIGNS = re.compile(
    r"pinging container registry|initializing source docker://|failed to resolve source metadata|"
    r"pull access denied|manifest unknown|manifest for \S+ not found|toomanyrequests|"
    r"server gave HTTP response to HTTPS client|error pulling image|unable to copy from source docker://|"
    r"(?:Get|Head) \"?https?://[^/\s\"]+/v2/", re.IGNORECASE)
_PULLED_IMAGE = re.compile(
    r"(?:initializing source docker://|unable to copy from source docker://|failed to resolve source metadata for "
    r"|manifest for |pull access denied for |error pulling image \"?)(?P<image>[^\s,\"]+?)(?=: |[\s,\"]|$)",
    re.IGNORECASE)
_REGISTRY_HOST = re.compile(r"pinging container registry (?P<host>[^\s:]+(?::\d+)?)|https?://(?P<url>[^/\s\"']+)/v2/")
_FROM_STEP = re.compile(r"^\s*step\s+1/\d+\s*:?\s*FROM\s+(?:--\S+\s+)*(?P<image>\S+)", re.IGNORECASE | re.MULTILINE)

# The network failing inside a RUN step: pip, git, apt, curl, wget.
_NETWORK_LINES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"HTTPS?ConnectionPool\(host='(?P<host>[^']+)'[^)]*\): Max retries exceeded.*?"
                r"(?P<what>NewConnectionError|ConnectTimeoutError|ReadTimeoutError|ProxyError|SSLError|"
                r"Temporary failure in name resolution|Name or service not known)"), "pip"),
    (re.compile(r"Retrying \(Retry\(.*?(?P<what>NewConnectionError|ConnectTimeoutError|ReadTimeoutError|ProxyError)"
                r".*?(?:host='(?P<host>[^']+)'|/simple/)?"), "pip"),
    (re.compile(r"fatal: unable to access '(?P<url>[^']+)': (?P<what>Could not resolve host|Failed to connect|"
                r"Connection timed out|gnutls_handshake\(\) failed|Recv failure|OpenSSL SSL_connect)"), "git"),
    (re.compile(r"ssh: (?P<what>Could not resolve hostname) (?P<host>[^:\s]+)"), "git"),
    (re.compile(r"fatal: (?P<what>unable to look up) (?P<host>\S+)"), "git"),
    (re.compile(r"(?P<what>Temporary failure resolving|Could not resolve) '(?P<host>[^']+)'"), "apt"),
    (re.compile(r"Failed to fetch (?P<url>\S+)\s+(?P<what>Could not connect|Connection failed|Unable to connect)"),
     "apt"),
    (re.compile(r"curl: \((?:6|7|28|35)\) (?P<what>Could not resolve host|Failed to connect to|"
                r"Connection timed out|Resolving timed out)[: ]*(?P<host>[^\s:]+)?"), "curl"),
    (re.compile(r"wget: (?P<what>unable to resolve host address) '?(?P<host>[^'\s]+)"), "wget"),
    (re.compile(r"Connecting to (?P<host>[^\s|]+)[^\n]*(?P<what>failed: (?:Connection refused|Connection timed out|"
                r"Temporary failure in name resolution|No route to host|Network is unreachable))"), "wget"),
)
# pip giving up after its retries: with a network line above it is the index, not the pin.
_PIP_NO_VERSIONS = re.compile(r"Could not find a version that satisfies the requirement (?P<req>\S+) "
                              r"\(from versions: none\)")
# The commit's own breakage wins over retried network warnings earlier in the same step.
_OWN_BREAKAGE = re.compile(
    r"^[^\s:]+\.(?:c|cc|cpp|cxx|h|hpp|cu|f90|rs|go):\d+(?::\d+)?: (?:fatal )?error:|"
    r"^\s*(?:\S+: )?error: (?:command '[^']+' failed|subprocess-exited-with-error)|"
    r"^make(?:\[\d+\])?: \*\*\* |^CMake Error|COPY failed|no such file or directory.*(?:stat|COPY|ADD)|"
    r"^(?:E|ERROR): (?:Failed building wheel|Cannot install)|SyntaxError:|ModuleNotFoundError:",
    re.IGNORECASE | re.MULTILINE)
_STEP_HEADER = re.compile(r"^\s*(?:STEP|Step) \d+/\d+\s*:?", re.MULTILINE)


@dataclass(frozen=True)
class EnvironmentFailure:
    """A build that failed for a reason outside the commit: the cause and the next step."""

    cause: str
    next_step: str
    network: bool = False  # the network or a server out of reach: may pass, so the build is tried again

    def message(self, log_path: object | None = None) -> str:
        where = f" (build log: {log_path})" if log_path else ""
        return f"{self.cause}{where}; {self.next_step}, {RESUME}"

    def error(self, log_path: Path | None = None) -> InfrastructureError:
        """The error a build that failed so raises: BuildUnreachable (retried) for the network's."""
        if self.network:
            return BuildUnreachable(self, log_path)
        return InfrastructureError(self.message(log_path))


class BuildUnreachable(InfrastructureError):
    """A build that failed on the network (a base image that did not pull, a package index or git
    host out of reach): nothing about the commit, so the evaluator builds it again with the retry
    budget of a probe run; spent, the run stops (exit 5)."""

    def __init__(self, failure: EnvironmentFailure, log_path: Path | None = None) -> None:
        super().__init__(failure.message(log_path))
        self.failure = failure
        self.log_path = log_path

    def __reduce__(self) -> tuple[type[BuildUnreachable], tuple[EnvironmentFailure, Path | None]]:
        return type(self), (self.failure, self.log_path)  # crosses process boundaries whole


def classify_build_failure(error: str, log_text: str = "") -> EnvironmentFailure | None:
    """The environment failure behind a failed build, or None when the commit itself is at fault.

    `error` is the engine's error message, `log_text` the build's whole output."""
    last_step = _last_step(log_text)
    if _DISK_FULL.search(error) or _DISK_FULL.search(last_step):
        return EnvironmentFailure(
            "the disk is full (no space left on device) during an image build",
            "free space in the engine's storage (`podman system prune` / `docker system prune`, or a smaller "
            "--cache-size)")
    pull = _pull_failure(error, log_text)
    if pull is not None:
        return pull
    if _own_breakage_last(last_step):
        return None
    return _network_failure(last_step)


def _own_breakage_last(step: str) -> bool:
    """Whether the step broke on the commit's own code: a sign of it after pip last gave up on its
    index (pip's own errors follow a give-up; a compile error after it is the commit's)."""
    own = [match.start() for match in _OWN_BREAKAGE.finditer(step)]
    gave_up = [match.start() for match in _PIP_NO_VERSIONS.finditer(step)]
    return bool(own) and (not gave_up or own[-1] > gave_up[-1])


def raise_if_unreachable(log_path: Path, read_bytes: int = 200_000) -> None:
    """A venv's pip (or git) step or a local build that failed because the network or the index
    could not be reached is the host's failure: BuildUnreachable (retried, then exit 5) naming
    it, not the commit's skip."""
    try:
        text = log_path.read_bytes()[-read_bytes:].decode("utf-8", errors="replace")
    except OSError:
        return
    failure = classify_build_failure("", text)
    if failure is not None:
        raise failure.error(log_path)


def registry_of(image: str) -> str:
    """The registry an image reference is pulled from: its first path component when that names a
    host (has a dot or a port, or is localhost), else Docker Hub."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _last_step(log_text: str) -> str:
    """The output of the last build step that started (where the build failed)."""
    headers = list(_STEP_HEADER.finditer(log_text))
    return log_text[headers[-1].start():] if headers else log_text


def _pull_failure(error: str, log_text: str) -> EnvironmentFailure | None:
    text = error if _PULL_SIGNS.search(error) else ""
    if not text:
        tail = _last_step(log_text)
        # A pull that failed inside the FROM step: podman writes the reason into the log.
        if _PULL_SIGNS.search(tail) and re.search(r"FROM\s", tail[:400]):
            text = tail
    if not text:
        return None
    named = _PULLED_IMAGE.search(text)
    from_step = _FROM_STEP.search(log_text)
    image = named.group("image") if named else (from_step.group("image") if from_step else "")
    host_match = _REGISTRY_HOST.search(text)
    registry = (host_match.group("host") or host_match.group("url")) if host_match else registry_of(image) if image \
        else "its registry"
    if registry == "registry-1.docker.io":
        registry = "docker.io"
    reason = _pull_reason(text)
    network = reason in _NETWORK_REASONS
    what = f"the base image {image}" if image else "a base image"
    advice = (f"check that this host reaches {registry}, or map it to a mirror that holds the image: "
              f"--base-image-map {registry}=MIRROR/{registry} (or build.base_image_map in the recipe); "
              "`bisect-npu plan --pull` fetches every base image of a range ahead")
    if "HTTP response to HTTPS client" in text:
        advice = (f"{registry} speaks plain HTTP: list it as insecure for the engine (registries.conf "
                  "`[[registry]] location=... insecure=true`, or Docker's daemon.json `insecure-registries`)")
    return EnvironmentFailure(f"{what} could not be pulled from {registry} ({reason})", advice, network)


# A pull that failed for these may pass on a later try; access denied, no such image or a plain
# HTTP registry will not (the user changes the setup).
_NETWORK_REASONS = frozenset({"the name does not resolve", "connection refused", "timed out", "network unreachable",
                              "rate limited"})


def _pull_reason(text: str) -> str:
    for pattern, reason in (
            (r"no such host|Could not resolve|name resolution|Name or service not known|server misbehaving",
             "the name does not resolve"),
            (r"connection refused", "connection refused"),
            (r"i/o timeout|timed out|deadline exceeded", "timed out"),
            (r"network is unreachable|no route to host", "network unreachable"),
            (r"toomanyrequests", "rate limited"),
            (r"unauthorized|authentication required|pull access denied|denied", "access denied"),
            (r"manifest unknown|not found", "no such image or tag there"),
            (r"HTTP response to HTTPS client", "the registry answers plain HTTP")):
        if re.search(pattern, text, re.IGNORECASE):
            return reason
    line = text.strip().splitlines()[-1] if text.strip() else "unknown error"
    return line[:160]


def _network_failure(step: str) -> EnvironmentFailure | None:
    for pattern, tool in _NETWORK_LINES:
        match = pattern.search(step)
        if match is None:
            continue
        groups = match.groupdict()
        host = groups.get("host") or _host_of(groups.get("url") or "") or _index_host(step) or "a host"
        what = (groups.get("what") or "unreachable").strip()
        return EnvironmentFailure(
            f"the build could not reach {host} ({tool}: {what}): a network or mirror problem, not the commit",
            "check this host's network and proxy, or point the recipe's build.docker_args at mirrors it reaches "
            "(vllm-ascend: PIP_INDEX_URL, PYTORCH_INDEX_URL, ASCEND_INDEX_URL, VLLM_REPO, APTMIRROR, GIT_PROXY)",
            network=True)
    if _PIP_NO_VERSIONS.search(step) and re.search(r"WARNING: Retrying|ERROR: Could not install packages due to an "
                                                    r"OSError", step):
        host = _index_host(step) or "the package index"
        return EnvironmentFailure(f"pip could not reach {host} during the build (no versions found after retries)",
                                  "check the network, or set PIP_INDEX_URL in the recipe's build.docker_args to "
                                  "an index this host reaches", network=True)
    return None


def _host_of(url: str) -> str:
    match = re.match(r"^[a-z+]+://(?:[^@/]+@)?([^/:]+(?::\d+)?)", url)
    return match.group(1) if match else ""


def _index_host(step: str) -> str:
    match = re.search(r"Looking in indexes: (\S+)", step) or re.search(r"host='([^']+)'", step)
    if not match:
        return ""
    value = match.group(1).rstrip(",")
    return _host_of(value) or value


_PIP_ERROR = re.compile(r"^ERROR: (?P<line>.+)$", re.MULTILINE)
_TOOL_ERROR = re.compile(r"^\s*error: (?P<line>.+)$", re.MULTILINE)


_CONFLICT = re.compile(r"^The conflict is caused by:\n(?P<lines>(?:[ \t]+\S.*\n?)+)", re.MULTILINE)


def pip_cause(output: str) -> str:
    """The line of a failed pip step that says why: pip's first `ERROR:` line (it names the
    requirement; the `ResolutionImpossible` line after it only points at pip's help) with the
    requirements of a conflict it lists, else a build tool's first `error:`, else the last line."""
    for pattern in (_PIP_ERROR, _TOOL_ERROR):
        found = next((m.group("line").strip() for m in pattern.finditer(output)
                      if not m.group("line").startswith("ResolutionImpossible")), None)
        if found:
            conflict = _CONFLICT.search(output)
            if conflict:
                found += " (" + "; ".join(line.strip() for line in conflict.group("lines").splitlines()) + ")"
            return found[:400]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
