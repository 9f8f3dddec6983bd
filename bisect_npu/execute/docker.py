"""DockerExecutor: one candidate run = one container, created from a plain-data ContainerSpec.

The spec says everything the container gets (image, command, devices, mounts, environment,
network); `container_create_kwargs` turns it into the docker SDK's `containers.create(...)`
arguments as a pure function, so what reaches the engine can be checked without one. Every
container carries `org.bisect-npu.session=<id>`: a timeout, Ctrl-C, SIGTERM or `close()` removes
what this executor started, and `remove_session_containers` sweeps a session left by a killed run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bisect_npu import __version__
from bisect_npu.builders.base import (
    DEPENDENCY_KIND,
    LABEL_COMMIT,
    LABEL_KEY,
    LABEL_KIND,
    Environment,
    ImageGone,
    layer_tag,
)
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.execute.base import RunResult, probe_log_path, with_outputs
from bisect_npu.execute.devices import DevicePool

SESSION_LABEL = "org.bisect-npu.session"
PROBE_PACKAGE = "bisect_npu_probe"
PROBE_PARENT = "/opt/bisect-npu"  # the probe lands at /opt/bisect-npu/bisect_npu_probe, read-only
OUT_DIR = "/out"
# A `--cmd` argument naming a host file or directory (`python3 /home/me/check.py`) is mounted
# read-only at COMMAND_FILES/<argument's position>/<its name> and the argument rewritten to that path.
COMMAND_FILES = "/opt/bisect-npu/cmd"
# Absolute paths under these are the image's own (its interpreter, its libraries): never mounted.
IMAGE_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys", "/dev",
              "/run", "/var", "/boot", PROBE_PARENT, OUT_DIR)
# `python -m bisect_npu_probe REQUEST` without touching the image's PYTHONPATH (CANN images set one).
PROBE_BOOTSTRAP = (f"import runpy, sys; sys.path.insert(0, {PROBE_PARENT!r}); "
                   f"runpy.run_module({PROBE_PACKAGE!r}, run_name='__main__', alter_sys=True)")
# A command that runs the probe's own package (a `{probe}` launcher: the demo server) finds it: its
# parent at the end of PYTHONPATH, after the image's entries, then the command exec'd as given.
PROBE_PATH_BOOTSTRAP = ("import os, sys; os.environ['PYTHONPATH'] = os.pathsep.join([*filter(None, "
                        f"os.environ.get('PYTHONPATH', '').split(os.pathsep)), {PROBE_PARENT!r}]); "
                        "os.execvp(sys.argv[1], sys.argv[1:])")
# An image's entrypoint may overwrite the container's environment before our command starts: every
# CANN base image sources ATB's set_env.sh, which exports LCCL_DETERMINISTIC=0 and
# ATB_MATMUL_SHUFFLE_K_ENABLE=1. So each command starts under this shim, which puts back what the
# spec asked for (carried in ENV_CARRIER, which no script touches) and then execs the command. A
# *PATH variable the entrypoint extended keeps the entrypoint's entries after the spec's (CANN's
# library paths stay reachable). A command that cannot start exits 255: above 127, so the run
# aborts with its reason instead of judging every candidate bad.
ENV_CARRIER = "BISECT_NPU_ENV"
ENV_EXIT_CANNOT_START = 255
ENV_BOOTSTRAP = f"""import json, os, sys
for key, value in json.loads(os.environ.pop({ENV_CARRIER!r})).items():
    have = os.environ.get(key)
    if key.endswith("PATH") and have and have != value:
        ours = value.split(os.pathsep)
        value = os.pathsep.join(ours + [p for p in have.split(os.pathsep) if p and p not in ours])
    os.environ[key] = value
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as exc:
    sys.stderr.write(f"bisect-npu: cannot start {{sys.argv[1]}} in the container: {{exc}}\\n")
    sys.exit({ENV_EXIT_CANNOT_START})
"""
LOG_TAIL_LINES = 15
WAIT_POLL_S = 60.0  # a node's container is waited on in steps of this (the engine's read timeout)
SIGNAL_EXIT_BASE = 128  # a container's exit status 128 + N: its command was killed by signal N


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: str
    target: str
    read_only: bool = True


class ContainerSpec(BaseModel):
    """Everything one container gets; plain data so it can be printed, compared and tested."""

    image: str
    command: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)
    devices: list[str] = Field(default_factory=list)  # host device paths, mapped to the same path
    mounts: list[Mount] = Field(default_factory=list)
    working_dir: str | None = None
    network_mode: str = "none"
    labels: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    privileged: bool = False
    shm_size: str | None = None


SpecFactory = Callable[..., ContainerSpec]  # (image, out_dir[, devices=...]) -> spec


def plain_container_spec(image: str, out_dir: Path) -> ContainerSpec:
    """A CPU container: no devices, no network, the output directory at /out."""
    return ContainerSpec(image=image, mounts=[Mount(source=str(out_dir), target=OUT_DIR, read_only=False)])


def container_create_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The exact keyword arguments for `client.containers.create(**kwargs)`."""
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "environment": dict(spec.environment),
        "devices": [f"{path}:{path}:rwm" for path in spec.devices],
        "volumes": {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts},
        "network_mode": spec.network_mode,
        "labels": dict(spec.labels),
        "privileged": spec.privileged,
        "detach": True,
    }
    if spec.working_dir:
        kwargs["working_dir"] = spec.working_dir
    if spec.user:
        kwargs["user"] = spec.user
    if spec.shm_size:
        kwargs["shm_size"] = spec.shm_size
    return kwargs


def host_paths(argv: list[str]) -> list[tuple[int, Path]]:
    """The arguments of a command that name a file or directory of this host, by position: an
    absolute path that exists here and is outside IMAGE_DIRS (an option's `--x=/path` is not
    looked into). Relative paths are the candidate's (the image's working directory)."""
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith("/") or any(arg == d or arg.startswith(d + "/") for d in IMAGE_DIRS):
            continue
        if Path(arg).exists():
            found.append((index, Path(arg)))
    return found


def command_in_container(argv: list[str]) -> tuple[list[str], list[Mount]]:
    """The command as the container runs it, and the read-only mounts that bring the host files
    it names in (`host_paths`): each such argument becomes COMMAND_FILES/<position>/<name>, so two
    files of one name never meet. Still an argument list: nothing goes through a shell."""
    rewritten = list(argv)
    mounts = []
    for index, path in host_paths(argv):
        target = f"{COMMAND_FILES}/{index}/{path.name or 'root'}"
        mounts.append(Mount(source=str(path.resolve()), target=target, read_only=True))
        rewritten[index] = target
    return rewritten, mounts


def check_command_mounts(argv: list[str]) -> None:
    """Refuse, before anything runs, a host path the container could not be given as the command
    names it: a path with `:` (the engine's mount syntax splits there), or a program that is a
    host file without the executable bit or a binary built for this host (either would fail in every
    container, each time read as a verdict)."""
    for index, path in host_paths(argv):
        if ":" in str(path.resolve()):
            raise UsageError(f"--cmd names {path}, which has a ':' that a container mount cannot take; copy it to "
                             "a path without one")
        if index == 0 and path.is_file() and not os.access(path, os.X_OK):
            raise UsageError(f"--cmd runs {path}, which is not executable; run it through its interpreter "
                             f"(e.g. --cmd \"python3 {path}\") or chmod +x it")
        if index == 0 and path.is_dir():
            raise UsageError(f"--cmd runs {path}, which is a directory; give the program to run")
        if index == 0 and path.is_file() and _is_binary(path):
            raise UsageError(f"--cmd runs {path}, a program of this host (a binary, or a venv's interpreter) that the "
                             "candidate's image does not have; give the image's own (e.g. --cmd \"python3 "
                             "/path/check.py\"), the script comes in read-only")


def _is_binary(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"\x7fELF"


def probe_source_dir() -> Path:
    """The host's probe package: mounted into every container under another package name."""
    return Path(__file__).resolve().parent.parent / "probe"


def remove_session_containers(client: Any, session_id: str) -> int:
    """Remove every container of one session (running or not); returns how many went."""
    removed = 0
    for container in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}):
        with contextlib.suppress(Exception):  # already gone: another cleanup got there first
            container.remove(force=True, v=True)
            removed += 1
    return removed


class DockerExecutor:
    """Runs the probe (or a `--cmd`) in a fresh container per call; never leaves one behind."""

    def __init__(self, client: Any, spec_factory: SpecFactory = plain_container_spec,
                 session_id: str | None = None, python: str = "python3",
                 device_pool: DevicePool | None = None, network_mode: str | None = None) -> None:
        self.client = client
        self.spec_factory = spec_factory
        self.session_id = session_id or uuid.uuid4().hex[:12]
        self.python = python
        self.device_pool = device_pool
        self.network_mode = network_mode  # over the factory's (None: the factory's own)
        self._live: dict[str, Any] = {}  # container id -> container, while it runs
        self._lock = threading.Lock()

    def on_host_network(self) -> DockerExecutor:
        """The same executor with its containers on the host's network: a node of an engine across
        hosts, whose ranks meet on the node's own address and a port chosen free on it."""
        return type(self)(self.client, self.spec_factory, self.session_id, self.python, self.device_pool,
                          network_mode="host")

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        out_dir = out_dir.resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        filled, stem = with_outputs(request, out_dir)
        (out_dir / f"request-{stem}.json").write_text(json.dumps(_inside_paths(filled, out_dir), indent=1),
                                                      encoding="utf-8")
        command = [self.python, "-c", PROBE_BOOTSTRAP, f"{OUT_DIR}/request-{stem}.json"]
        result = self._run(env, command, out_dir, probe_log_path(out_dir, stem), timeout_s)
        observation = Path(filled["output"])
        if result.returncode == 0 and observation.exists():
            result = result.model_copy(update={"observation": str(observation)})
        return result

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        """A user command; the host files it names come in read-only (`command_in_container`)."""
        out_dir = log_path.parent.resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        command, mounts = command_in_container(argv)
        return self._run(env, command, out_dir, log_path, timeout_s, extra_env, mounts)

    def spec_for(self, env: Environment, command: list[str], out_dir: Path, devices: list[int] | None = None,
                 extra_env: dict[str, str] | None = None, mounts: list[Mount] | None = None) -> ContainerSpec:
        """The spec of one run: the factory's (on `devices` when a slot leased some), plus the probe
        mount and `mounts`, the command (under ENV_BOOTSTRAP), the candidate's `run_env` (under the
        factory's environment), `extra_env` and our labels."""
        if not env.image:
            raise InfrastructureError(f"candidate {env.commit[:12]} has no image; use the docker builder "
                                      "with --executor docker")
        spec = self.spec_factory(env.image, out_dir, **({"devices": devices} if devices is not None else {}))
        probe = Mount(source=str(probe_source_dir()), target=f"{PROBE_PARENT}/{PROBE_PACKAGE}", read_only=True)
        environment = {**env.run_env, **spec.environment, **(extra_env or {}), "PYTHONDONTWRITEBYTECODE": "1"}
        labels = {**spec.labels, SESSION_LABEL: self.session_id, LABEL_COMMIT: env.commit,
                  **({LABEL_KEY: env.build_key} if env.build_key else {}), "org.bisect-npu.tool-version": __version__}
        return spec.model_copy(update={"command": [self.python, "-c", ENV_BOOTSTRAP, *command],
                                       "mounts": [*spec.mounts, probe, *(mounts or [])],
                                       "environment": {**environment, ENV_CARRIER: json.dumps(environment)},
                                       "labels": labels, "network_mode": self.network_mode or spec.network_mode})

    def spawn(self, env: Environment, argv: list[str], log_path: Path,
              extra_env: dict[str, str] | None = None) -> NodeContainer:
        """A long-lived container of the candidate (a headless node of an engine across hosts)
        running `argv` with `extra_env`, its output appended to `log_path`; `stop_runs` removes it."""
        out_dir = log_path.parent.resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        return NodeContainer(self, self._start(self.spec_for(env, argv, out_dir, None, extra_env)), log_path)

    def stop_runs(self) -> None:
        """Remove the containers this executor started and still runs, and only those (other
        engines of the session on this host go on): each waiting run ends as its container went."""
        with self._lock:
            live = list(self._live.values())
        for container in live:
            self._remove(container)

    def _run(self, env: Environment, command: list[str], out_dir: Path, log_path: Path,
             timeout_s: float, extra_env: dict[str, str] | None = None, mounts: list[Mount] | None = None) -> RunResult:
        with self.device_pool.lease() if self.device_pool else contextlib.nullcontext(None) as cards:
            return self._run_on(self.spec_for(env, command, out_dir, cards, extra_env, mounts), log_path, timeout_s)

    def _run_on(self, spec: ContainerSpec, log_path: Path, timeout_s: float) -> RunResult:
        import docker.errors

        started = time.monotonic()
        timed_out = False
        with _sigterm_as_interrupt(), log_path.open("w", encoding="utf-8") as log:
            container = self._start(spec)
            image_id = str(container.attrs.get("Image", "")).removeprefix("sha256:")[:12]
            log.write(f"# container {container.id[:12]} from {spec.image} (image {image_id})\n")  # which run this is
            for mount in spec.mounts:
                if mount.target.startswith(COMMAND_FILES + "/"):
                    log.write(f"# host {mount.source} at {mount.target} (read-only)\n")
            log.flush()
            try:
                follower = threading.Thread(target=_follow_logs, args=(container, log), daemon=True)
                follower.start()
                try:
                    waited = container.wait(timeout=timeout_s)
                    error = waited.get("Error") or {}
                    if not isinstance(error, dict) or error.get("Message"):  # podman: gone under us, status 0
                        raise _went_away(container, error)
                    container.reload()  # still there? podman may also answer a removal with 137, no error
                    returncode = int(waited["StatusCode"])
                except InfrastructureError:
                    raise
                except Exception as exc:  # the engine's read timeout: requests raises its own types
                    if isinstance(exc, docker.errors.NotFound) or (  # docker's answer to the same;
                            isinstance(exc, docker.errors.APIError)  # podman's is a 500 that says so
                            and "no such container" in str(exc).lower()):
                        raise _went_away(container, exc) from exc
                    if not _is_timeout(exc):
                        raise
                    timed_out = True
                    returncode = 124
                    with contextlib.suppress(Exception):
                        container.kill()
                follower.join(timeout=10)
            finally:
                self._remove(container)
        return RunResult(returncode=returncode, seconds=round(time.monotonic() - started, 3),
                         log_path=str(log_path), timed_out=timed_out, log_tail=_tail(log_path),
                         image_id=str(container.attrs.get("Image", "")) or None)

    def _start(self, spec: ContainerSpec) -> Any:
        """Create and start the container from the candidate's own image (`candidate_image`); an
        engine that refuses the spec (a device or mount this host lacks) is an infrastructure error
        with its own words."""
        import docker.errors

        image = candidate_image(self.client, spec.image, spec.labels.get(LABEL_COMMIT, ""),
                                built=LABEL_KEY in spec.labels)
        try:
            container = self.client.containers.create(**{**container_create_kwargs(spec), "image": image})
        except docker.errors.ImageNotFound as exc:  # removed since candidate_image read it
            raise ImageGone(f"image {spec.image} is gone from the engine") from exc
        except docker.errors.APIError as exc:
            raise _refused(spec, exc) from exc
        try:
            container.start()
        except docker.errors.APIError as exc:
            self._remove(container)
            raise _refused(spec, exc) from exc
        except BaseException:
            self._remove(container)
            raise
        with self._lock:
            self._live[container.id] = container
        return container

    def _remove(self, container: Any) -> None:
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
        with self._lock:
            self._live.pop(container.id, None)

    def close(self) -> None:
        """Remove every container this executor's session still has (a sweep by label)."""
        self.sweep()

    def sweep(self) -> int:
        """Remove this session's containers, a killed earlier process's included (by label)."""
        return remove_session_containers(self.client, self.session_id)

    def __enter__(self) -> DockerExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NodeContainer:
    """A running container of a node of an engine across hosts, its output copied into its log."""

    def __init__(self, executor: DockerExecutor, container: Any, log_path: Path) -> None:
        self.executor = executor
        self.container = container
        self.follower = threading.Thread(target=_follow_into, args=(container, log_path), daemon=True)
        self.follower.start()

    @property
    def image_id(self) -> str | None:
        """The image it started from (`candidate_image`'s: checked to carry the candidate's commit label)."""
        return str(self.container.attrs.get("Image", "")) or None

    def wait(self) -> int:
        """Until the container ends: its command's exit status, as a process's would be, negative
        when the host's doing ended it (killed by signal N: -N; removed under it, or its engine
        gone: -SIGKILL), so the caller reads the node as lost rather than the commit as bad."""
        import docker.errors

        while True:
            try:
                waited = self.container.wait(timeout=WAIT_POLL_S)
                break
            except docker.errors.DockerException:
                return -signal.SIGKILL
            except Exception as exc:  # the engine's read timeout: still running
                if not _is_timeout(exc):
                    return -signal.SIGKILL
        error = waited.get("Error") or {}
        if not isinstance(error, dict) or error.get("Message"):
            return -signal.SIGKILL
        try:
            self.container.reload()  # podman answers a removal with 137 and no error
        except Exception:
            return -signal.SIGKILL
        status = int(waited["StatusCode"])
        return -(status - SIGNAL_EXIT_BASE) if SIGNAL_EXIT_BASE < status <= SIGNAL_EXIT_BASE + 64 else status

    def stop(self) -> None:
        """Remove the container (running or not); its log is complete after this: an ended
        container's output is read to its end before it is removed (a removal first would cut
        the copy of a container that ended before its log was followed)."""
        with contextlib.suppress(Exception):  # gone already: nothing more to read
            self.container.reload()
            if self.container.status != "running":
                self.follower.join(timeout=10)
        self.executor._remove(self.container)
        self.follower.join(timeout=10)


def candidate_image(client: Any, image: str, commit: str, built: bool = False) -> str:
    """The id of the image `commit`'s container starts from, read once, so the name cannot move
    between the check and the start. A tag (`...:commit-<sha>`) is a name that any session on the
    same engine may move or remove (a prune, a rebuild, another build of the same key): where the
    image it names now carries another commit's label, running it would judge that commit under
    this one's name, so the run stops instead; the same where a candidate `built` by our builders
    (its environment names a build key) finds under its name an image without our commit label (a
    `podman tag`, another tool's build took the name). A name gone or moved is ImageGone (the
    evaluator acquires the commit again); an engine that cannot answer, InfrastructureError. A
    dependency's layer carries its upstream commit's label: its name is checked against its key."""
    import docker.errors

    try:
        attrs = client.api.inspect_image(image)
    except docker.errors.ImageNotFound as exc:
        raise ImageGone(f"image {image} is gone from the engine") from exc
    except docker.errors.APIError as exc:
        raise InfrastructureError(f"the container engine could not say what image {image} is "
                                  f"({exc.explanation or exc}); run again (`bisect-npu resume` for a session)") from exc
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL_KIND) == DEPENDENCY_KIND:  # a layer is labelled by its upstream commit, named by its key
        if image.rpartition(":")[2] != layer_tag(labels.get(LABEL_KEY, "")):
            raise ImageGone(f"image {image} now holds the layer {labels.get(LABEL_KEY)}, not the candidate "
                            f"{commit[:12]}'s: something on this container engine moved the name; nothing "
                            "ran: run again (`bisect-npu resume` for a session)")
        return str(attrs["Id"])
    labelled = labels.get(LABEL_COMMIT)
    if built and not labelled:
        raise ImageGone(f"image {image} now holds an image without bisect-npu's labels, not the candidate "
                        f"{commit[:12]}'s build: something on this container engine moved the name (a tag or "
                        "another tool's build); nothing ran: run again (`bisect-npu resume` for a session)")
    if commit and labelled and labelled != commit:
        raise ImageGone(f"image {image} now holds commit {labelled[:12]}, not the candidate {commit[:12]}: "
                        "something on this container engine moved the name (another session's build or "
                        "prune); nothing ran: run again (`bisect-npu resume` for a session)")
    return str(attrs["Id"])


def _follow_into(container: Any, log_path: Path) -> None:
    with log_path.open("a", encoding="utf-8") as log:
        _follow_logs(container, log)


def _inside_paths(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Host paths under `out_dir` in the request, rewritten to where the container sees them."""
    def inside(value: Any) -> Any:
        if isinstance(value, str) and (value == str(out_dir) or value.startswith(f"{out_dir}/")):
            return OUT_DIR + value[len(str(out_dir)):]
        if isinstance(value, dict):
            return {k: inside(v) for k, v in value.items()}
        if isinstance(value, list):
            return [inside(v) for v in value]
        return value

    rewritten: dict[str, Any] = inside(request)
    return rewritten


def _refused(spec: ContainerSpec, exc: Any) -> InfrastructureError:
    devices = f" with devices {', '.join(spec.devices)}" if spec.devices else ""
    return InfrastructureError(f"the container engine refused a container of {spec.image}{devices}: "
                               f"{exc.explanation or exc}; check the host has what the spec names (`bisect-npu "
                               "doctor --executor docker`), then run again (`bisect-npu resume` for a session)")


def _went_away(container: Any, why: object) -> InfrastructureError:
    return InfrastructureError(f"container {container.id[:12]} went away during the run ({why}): something removed "
                               "it (`docker rm`, a prune, another sweep); run again (`bisect-npu resume` for a "
                               "session)")


def _follow_logs(container: Any, log: Any) -> None:
    """Copy the container's output into the log as it comes, so a long run can be watched."""
    with contextlib.suppress(Exception):  # the container was removed under us: the log is complete
        for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
            log.write(chunk.decode("utf-8", errors="replace"))
            log.flush()


def _is_timeout(exc: BaseException) -> bool:
    import requests

    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and "timed out" in str(exc).lower()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a container runs, SIGTERM unwinds like Ctrl-C so the `finally` removes it.

    Only in the main thread, and only when nobody else handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-LOG_TAIL_LINES:])
