"""DockerBuilder: each candidate as an image, built through the Docker Engine API (podman's too).

Per candidate, the cheapest of three ways (Environment.how):

- `reused`: an image labelled with this commit and key is already in the engine (a later
  session reuses what an earlier one built), or the commit is a release tag whose published
  image (builders/releases.py) stands for its key;
- `overlay`: a full image with the same BuildKey exists, so only the candidate's Python tree is
  laid over it as one committed layer (no build step), a second instead of a compile;
- `built`: the candidate's own Dockerfile on a `git archive` of the commit, with the recipe's
  build args, tagged `bisect-npu/<repo>:key-<digest>`.

Every image carries the LABEL_* labels below; the engine is whatever DOCKER_HOST / the docker
context names.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import re
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import IO, Any, Literal

import git

from bisect_npu import __version__
from bisect_npu.builders.base import (
    DEPENDENCY_KIND,
    LABEL_COMMIT,
    LABEL_KEY,
    LABEL_KIND,
    LABEL_PARENT,
    BuildFailed,
    Environment,
    layer_tag,
    tail,
)
from bisect_npu.builders.cache import ImageCache, list_images
from bisect_npu.builders.failures import classify_build_failure
from bisect_npu.builders.key import BuildKey, BuildKeyReader, is_compiled_input
from bisect_npu.builders.registry import BaseImageMap
from bisect_npu.builders.releases import ReleaseImages, fetch_release
from bisect_npu.builders.submodules import commit_archive
from bisect_npu.builders.version import SCM_VERSION_ARG, candidate_version
from bisect_npu.errors import InfrastructureError

LABEL_TOOL_VERSION = "org.bisect-npu.tool-version"
LABEL_VERSION = "org.bisect-npu.candidate-version"  # the version the candidate's package reports
OVERLAY_HELPER_DIR = "/tmp/bisect-npu-overlay"
# Listings of a build key's images one acquire makes at most while the images they name leave the
# engine before their use (`_make`); then the commit is built.
LISTINGS = 3
_CONTEXT_COPY = re.compile(r"^\s*(?:COPY|ADD)\s+(?:--\S+\s+)*\.\/?\s+(/\S*)\s*$", re.IGNORECASE | re.MULTILINE)


def overlay_helper() -> bytes:
    """The stdlib-only script an overlay container runs to remove deleted files: shipped inside the
    package and read through importlib.resources, so an installed wheel can build overlays too."""
    return (resources.files("bisect_npu.builders") / "overlay_apply.py").read_bytes()


def connect_engine(timeout_s: int = 3600) -> Any:
    """A docker SDK client for the engine DOCKER_HOST (or the docker context) names, pinged."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=timeout_s)
        client.ping()
    except docker.errors.DockerException as exc:
        raise InfrastructureError(
            f"container engine not reachable ({exc}); start one (containers/setup-podman.sh prints the "
            "DOCKER_HOST to export) or use --executor local") from None
    return client


def image_repository(repo: git.Repo) -> str:
    """`bisect-npu/<name>`: the image repository for one upstream, from its directory name."""
    root = Path(repo.working_tree_dir or repo.git_dir)
    name = root.name.removesuffix(".git") if root.name != ".git" else root.parent.name
    return "bisect-npu/" + (re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "upstream")


def context_source_dir(dockerfile_text: str) -> str | None:
    """Where the Dockerfile copies its whole build context (`COPY . /dir/`), or None.

    That directory holds the installed (editable) Python tree the overlay replaces; without one
    an overlay cannot know where the code lives, so every candidate gets a full build.
    """
    match = _CONTEXT_COPY.search(dockerfile_text)
    return match.group(1).rstrip("/") or "/" if match else None


class DockerBuilder:
    """Builds (or reuses, or overlays) one image per candidate commit. Safe to call from two threads."""

    def __init__(self, repo: git.Repo, client: Any, build_args: Mapping[str, str] | None = None,
                 cache: ImageCache | None = None, dockerfile: str = "Dockerfile",
                 python: str = "python3", overlays: bool = True, base_images: BaseImageMap | None = None,
                 release_images: str | None = None) -> None:
        self.repo = repo
        self.client = client
        self.build_args = dict(build_args or {})
        self.base_images = base_images or BaseImageMap()
        self.cache = cache
        self.dockerfile = dockerfile
        self.python = python
        self.overlays = overlays
        self.repository = image_repository(repo)
        self._keys = BuildKeyReader(repo, self.build_args, dockerfile,
                                    self.base_images.apply if self.base_images else None)
        self._git_lock = threading.Lock()  # GitPython's object readers are not thread-safe (prefetch, slots)
        self.releases = (ReleaseImages(repo, release_images, lambda sha: self._keys.key(sha).digest,
                                       self.base_images.apply) if release_images else None)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._reaper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bisect-npu-reaper")
        atexit.register(self.close)

    def close(self) -> None:
        """Wait until the overlays' helper containers are removed (also runs at exit)."""
        self._reaper.shutdown(wait=True)

    def key(self, commit: str) -> BuildKey:
        with self._git_lock:
            return self._keys.key(commit)

    def build_key(self, commit: str) -> str | None:
        return self.key(commit).digest

    def built_keys(self) -> frozenset[str]:
        """Keys with a full image of a commit of this repository in the engine: ``acquire`` lays any
        commit of those keys over that image. Empty without overlays (every commit builds)."""
        import docker.errors
        import requests

        if not self.overlays:
            return frozenset()
        try:
            rows = list_images(self.client.api, {"label": f"{LABEL_KIND}=full"})
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return frozenset()  # a price hint only: the next build meets the engine's error and says it
        labels = [row.get("Labels") or {} for row in rows]
        return frozenset(label[LABEL_KEY] for label in labels
                         if label.get(LABEL_KEY) and self._known(label.get(LABEL_COMMIT, "")))

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        with self._git_lock:
            commit = self.repo.commit(commit).hexsha
            key = self._keys.key(commit)
            if not key.has_dockerfile:
                raise BuildFailed(f"{commit[:12]} has no {self.dockerfile}: it cannot be built for this target "
                                  f"(older commits may have only Dockerfile); bisect a range where it exists")
            source_dir = self._source_dir(commit)
            version = candidate_version(self.repo, commit)
        started = time.monotonic()
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"build-{commit[:12]}.log"
        with self._lock_for(key.digest):
            image_id, how = self._make(commit, key, source_dir, version, log_path)
        if self.cache is not None:
            self.cache.use(image_id, pin=True)
            with log_path.open("a", encoding="utf-8") as log:
                self.cache.prune(log)
        return Environment(kind="image", commit=commit, build_key=key.digest, image=self.tag(commit), how=how,
                           seconds=round(time.monotonic() - started, 3), log_path=str(log_path))

    def _make(self, commit: str, key: BuildKey, source_dir: str | None, version: str,
              log_path: Path) -> tuple[str, Literal["built", "overlay", "reused"]]:
        """The commit's image id and how it was made: its own image reused, an overlay on a full
        image of its key, or a full build. An image the listing named that leaves the engine before
        it is used (another session's prune, a removal) is a cache miss: listed again without it,
        and at the end built; the build log says so. An engine that fails otherwise: exit 5."""
        import docker.errors
        import requests

        gone: list[str] = []
        made: tuple[str, Literal["built", "overlay", "reused"]] | None = None
        for _ in range(LISTINGS):
            # Low-level API calls throughout: the SDK's objects re-inspect every image, and on an
            # overlay (a second) those extra round trips would be most of the time.
            same_key = [row for row in list_images(self.client.api, {"label": f"{LABEL_KEY}={key.digest}"})
                        if row["Id"] not in gone]
            if not same_key and not gone and self._adopt_release(key, log_path):  # a release is this key's build
                same_key = list_images(self.client.api, {"label": f"{LABEL_KEY}={key.digest}"})
            mine = [row for row in same_key if (row.get("Labels") or {}).get(LABEL_COMMIT) == commit]
            full = [row for row in same_key if (row.get("Labels") or {}).get(LABEL_KIND) == "full"
                    and self._known((row.get("Labels") or {}).get(LABEL_COMMIT, ""))]
            row = mine[0] if mine else full[0] if full and self.overlays and source_dir is not None else None
            if row is None:
                break
            try:
                if mine:
                    made = self._reuse(commit, row, log_path), "reused"
                else:
                    assert source_dir is not None  # a full image is `row` only with a source dir to lay over it
                    made = self._overlay(commit, key, row, source_dir, version, log_path), "overlay"
                break
            except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
                if not self._gone(str(row["Id"])):
                    raise InfrastructureError(f"the container engine failed on image {row['Id']} of {commit[:12]} "
                                              f"({getattr(exc, 'explanation', None) or exc}); run again "
                                              "(`bisect-npu resume` for a session)") from exc
                gone.append(str(row["Id"]))
        if made is None:
            built: tuple[str, Literal["built", "overlay", "reused"]] = (
                self._full_build(commit, key, source_dir, version, log_path), "built")
            made = built
        if gone:
            with log_path.open("a", encoding="utf-8") as log:
                log.write(f"# {made[1]}: image(s) {', '.join(gone)} of key {key.digest} left the container engine "
                          "between their listing and their use (another session's prune, a removal): a cache miss\n")
        return made

    def _gone(self, image_id: str) -> bool:
        """Whether the engine no longer has `image_id` (an engine that cannot say: not gone)."""
        import docker.errors

        try:
            self.client.api.inspect_image(image_id)
        except docker.errors.ImageNotFound:
            return True
        except docker.errors.DockerException:
            return False
        return False

    def release(self, env: Environment) -> None:
        """The candidate is done: its image may be pruned later (full images stay pinned as bases)."""
        if self.cache is not None and env.image and env.how != "built":
            import docker.errors

            with contextlib.suppress(docker.errors.ImageNotFound):
                self.cache.unpin(self.client.api.inspect_image(env.image)["Id"])

    def tag(self, commit: str) -> str:
        return f"{self.repository}:commit-{commit[:12]}"

    def _lock_for(self, digest: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(digest, threading.Lock())

    def _reuse(self, commit: str, row: Mapping[str, Any], log_path: Path) -> str:
        """The listed image of the commit, named `tag(commit)` again even where the listing shows
        that name on it: the tag costs what a check would, puts back a name moved since, and fails
        (NotFound) where the image left the engine since the listing (`_make`: a cache miss)."""
        tags = {re.sub(r"^(docker\.io|localhost)/", "", t) for t in row.get("RepoTags") or []}
        self.client.api.tag(row["Id"], self.repository, f"commit-{commit[:12]}")
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"reused image {row['Id']} ({', '.join(sorted(tags))})\n")
        return str(row["Id"])

    def _adopt_release(self, key: BuildKey, log_path: Path) -> bool:
        """Make a published release image of this key the key's full image (builders/releases.py):
        pulled, checked against its tag's commit, labelled as ours. False when none can be."""
        if self.releases is None:
            return False
        with self._git_lock:
            releases = self.releases.for_key(key.digest)
        for release in reversed(releases):
            image_id, note = fetch_release(self.client, release, LABEL_COMMIT)
            with log_path.open("a", encoding="utf-8") as log:
                log.write(f"# {note}\n")
                if image_id is None:
                    continue
                with self._git_lock:
                    version = candidate_version(self.repo, release.commit)
                labels = self._labels(release.commit, key, "full", release.image, version)
                context = _labelled_context(io.BytesIO(_tar({"Dockerfile": f"FROM {release.image}\n".encode()})),
                                            "Dockerfile", labels)
                labelled = self._build(context, "Dockerfile", {}, f"{self.repository}:key-{key.digest}", log,
                                       log_path)
            self.client.api.tag(labelled, self.repository, f"commit-{release.commit[:12]}")
            return True
        return False

    def _known(self, commit: str) -> bool:
        """Is `commit` in this repository? (An image of the same key may come from another clone.)"""
        try:
            with self._git_lock:
                self.repo.commit(commit)
        except (ValueError, git.BadName):
            return False
        return True

    def _source_dir(self, commit: str) -> str | None:
        try:
            blob = self.repo.commit(commit).tree / self.dockerfile
        except KeyError:
            return None
        return context_source_dir(blob.data_stream.read().decode("utf-8", errors="replace"))

    def _labels(self, commit: str, key: BuildKey, kind: str, parent: str, version: str) -> dict[str, str]:
        return {LABEL_COMMIT: commit, LABEL_KEY: key.digest, LABEL_TOOL_VERSION: __version__,
                LABEL_KIND: kind, LABEL_PARENT: parent, LABEL_VERSION: version}

    def _full_build(self, commit: str, key: BuildKey, source_dir: str | None, version: str, log_path: Path) -> str:
        facts_base = key.inputs.get("base_image", "")
        with log_path.open("w", encoding="utf-8") as log:
            log.write(f"# full build of {commit} (key {key.digest}, version {version})\n"
                      f"# inputs: {json.dumps(dict(key.inputs))}\n")
            if self.base_images:
                log.write(f"# base image map: {' '.join(self.base_images.entries())}\n")
            context = _labelled_context(commit_archive(self.repo, commit), self.dockerfile,
                                        self._labels(commit, key, "full", facts_base, version), source_dir,
                                        lambda text: self.base_images.rewrite_dockerfile(text, self.build_args))
            # Not in self.build_args: those are part of the key, and every commit has its own version.
            build_args = {**self.build_args, SCM_VERSION_ARG: version} if source_dir else self.build_args
            image_id = self._build(context, self.dockerfile, build_args,
                                   f"{self.repository}:key-{key.digest}", log, log_path)
        self.client.api.tag(image_id, self.repository, f"commit-{commit[:12]}")
        return image_id

    def _overlay(self, commit: str, key: BuildKey, base: Mapping[str, Any], source_dir: str, version: str,
                 log_path: Path) -> str:
        """Lay the commit's Python tree over `base` in one new layer: create a container, let the
        helper remove deleted files and set the package's version, copy the tree in, commit it.
        No build step: a second or two, where a Dockerfile build is several minutes."""
        base_commit = (base.get("Labels") or {}).get(LABEL_COMMIT, "")
        deleted = self._deleted_paths(base_commit, commit)
        with log_path.open("w", encoding="utf-8") as log:
            log.write(f"# overlay of {commit} on {base_commit} (key {key.digest}, image {base['Id']}): "
                      f"python tree -> {source_dir}, {len(deleted)} file(s) deleted, version {version}\n")
            image_id = self._commit_layer(
                base["Id"], {"source_dir": source_dir, "delete": deleted, "version": version},
                _python_tree(self.repo, commit, source_dir, self.dockerfile),
                self._labels(commit, key, "overlay", base["Id"], version), f"commit-{commit[:12]}", log, log_path)
            log.write(f"committed {self.tag(commit)} ({image_id})\n")
        return image_id

    def lay_over(self, env: Environment, tree: bytes, plan: dict[str, object], key: str,
                 log_path: Path) -> Environment:
        """`env`'s image with one more layer: the overlay helper runs `plan` (clearing the tree
        being replaced), then `tree` (a tar rooted at `/`) is copied in and committed, tagged by
        `key` (builders/dependency.py: an upstream commit with a dependency's tree at one of its
        commits). An image of that key made before is reused; one the listing named that has left
        the engine since (another session's prune) is made again. The cache is pruned after a new
        layer, as after any acquire."""
        assert env.image is not None
        tag = layer_tag(key)
        api = self.client.api
        made = list_images(api, {"label": f"{LABEL_KEY}={key}"})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w", encoding="utf-8") as log:
            if made and self._pin_layer(f"{self.repository}:{tag}"):
                log.write(f"reused {self.repository}:{tag} ({made[0]['Id']})\n")
                return env.model_copy(update={"image": f"{self.repository}:{tag}", "how": "reused",
                                              "log_path": str(log_path)})
            if made:
                log.write(f"# {self.repository}:{tag} ({made[0]['Id']}) left the container engine since its listing "
                          "(another session's prune, a removal): a cache miss, made again\n")
            base = str(api.inspect_image(env.image)["Id"])
            labels = {LABEL_COMMIT: env.commit, LABEL_KEY: key, LABEL_TOOL_VERSION: __version__,
                      LABEL_KIND: DEPENDENCY_KIND, LABEL_PARENT: base}
            log.write(f"# {key}: tree laid over {env.image} ({base}); plan {json.dumps(plan)}\n")
            image_id = self._commit_layer(base, plan, tree, labels, tag, log, log_path)
            log.write(f"committed {self.repository}:{tag} ({image_id})\n")
            if self.cache is not None:
                self.cache.use(image_id, pin=True)
                self.cache.prune(log)
        return env.model_copy(update={"image": f"{self.repository}:{tag}", "how": "overlay", "log_path": str(log_path)})

    def _pin_layer(self, image: str) -> bool:
        """Held until unpin_layer (by the id inspect gives, as unpin_layer finds it): a prune must
        not take a layer while its candidate runs. False when the engine no longer has it."""
        import docker.errors

        try:
            image_id = str(self.client.api.inspect_image(image)["Id"])
        except docker.errors.ImageNotFound:
            return False
        if self.cache is not None:
            self.cache.use(image_id, pin=True)
        return True

    def unpin_layer(self, env: Environment) -> None:
        """A layer's candidate is done: its image may be pruned later."""
        if self.cache is not None and env.image:
            import docker.errors

            with contextlib.suppress(docker.errors.ImageNotFound):
                self.cache.unpin(self.client.api.inspect_image(env.image)["Id"])

    def _commit_layer(self, base: str, plan: Mapping[str, object], tree: bytes, labels: Mapping[str, str],
                      tag: str, log: IO[str], log_path: Path) -> str:
        """A container of `base` that runs the overlay helper's `plan`, gets `tree` copied in and
        is committed as `self.repository:tag`."""
        api = self.client.api
        command = [self.python, f"{OVERLAY_HELPER_DIR}/apply.py", f"{OVERLAY_HELPER_DIR}/plan.json"]
        container = api.create_container(base, command=command, labels=dict(labels),
                                         host_config=api.create_host_config(network_mode="none"))["Id"]
        try:
            self._apply_plan_in(container, plan, log, log_path)
            put_tree(api, container, tree)
            cmd = api.inspect_image(base)["Config"].get("Cmd")
            changes = f"CMD {json.dumps(cmd)}" if cmd else None  # undo the helper's command
            return str(api.commit(container, repository=self.repository, tag=tag, changes=changes)["Id"])
        finally:
            # Never started, so nothing runs in it: removing it (0.1-0.2 s) need not delay the run.
            self._reaper.submit(_remove_container, api, container)

    def _apply_plan_in(self, container: str, plan: Mapping[str, object], log: IO[str], log_path: Path) -> None:
        """Remove the files the candidate no longer has and give the package installed from the
        plan's `source_dir` the candidate's version, with the overlay helper (overlay_apply.py) inside."""
        api = self.client.api
        put_tree(api, container, _tar({f"{OVERLAY_HELPER_DIR[1:]}/apply.py": overlay_helper(),
                                              f"{OVERLAY_HELPER_DIR[1:]}/plan.json": json.dumps(plan).encode()}))
        api.start(container)
        status = int(api.wait(container, timeout=600)["StatusCode"])
        log.write(api.logs(container, stdout=True, stderr=True).decode("utf-8", errors="replace"))
        log.flush()
        if status != 0:
            raise BuildFailed(f"overlay could not apply its plan (remove deleted files, set the version; exit "
                              f"{status})", log_path, tail(log_path))

    def _deleted_paths(self, base_commit: str, commit: str) -> list[str]:
        """Files the base commit has and the candidate does not (renames count as deletions)."""
        if not base_commit:
            return []
        out = self.repo.git.diff("--name-only", "--no-renames", "--diff-filter=D", "-z", base_commit, commit)
        return [p for p in out.split("\0") if p and not is_compiled_input(p, self.dockerfile)]

    def _build(self, context: IO[bytes], dockerfile: str, build_args: Mapping[str, str],
               tag: str, log: IO[str], log_path: Path) -> str:
        import docker.errors
        import requests

        error = ""
        built = ""  # the id the build itself reports: `tag` is a name another build of the same key may take meanwhile
        try:
            for chunk in self.client.api.build(
                    fileobj=context, custom_context=True, dockerfile=dockerfile, buildargs=dict(build_args),
                    tag=tag, rm=True, forcerm=True, pull=False, decode=True):
                if isinstance(chunk.get("aux"), dict) and chunk["aux"].get("ID"):
                    built = str(chunk["aux"]["ID"])
                if "stream" in chunk:
                    log.write(chunk["stream"])
                elif "error" in chunk:
                    error = str(chunk.get("error", "")).strip()
                    log.write(f"ERROR: {error}\n")
                log.flush()
        except requests.exceptions.ConnectionError as exc:
            raise InfrastructureError(f"container engine went away during a build ({exc}); "
                                      "restart it and resume the session") from None
        except docker.errors.APIError as exc:
            error = str(exc.explanation or exc)
            log.write(f"ERROR: {error}\n")
        log.flush()
        if error:
            environment = classify_build_failure(error, log_path.read_text(encoding="utf-8", errors="replace"))
            if environment is not None:  # not the commit's fault: a skip would misread as a verdict
                raise environment.error(log_path)
            raise BuildFailed(f"image build failed: {error.splitlines()[-1] if error else 'unknown error'}",
                              log_path, tail(log_path))
        try:
            return str(self.client.api.inspect_image(built or tag)["Id"])
        except docker.errors.ImageNotFound:
            raise BuildFailed(f"image build produced no image {tag}", log_path, tail(log_path)) from None


def declare_version_arg(text: str, source_dir: str) -> str:
    """The Dockerfile with `ARG SETUPTOOLS_SCM_PRETEND_VERSION` declared just before the first RUN
    that names `source_dir` (the candidate's install), else after its COPY: a declared ARG is in
    the RUN's environment, where setuptools_scm reads it instead of the missing `.git`. Not at the
    top: every RUN after the declaration would rebuild for each version, and an earlier RUN that
    installs another setuptools_scm package (vLLM) would take the candidate's version."""
    lines = text.split("\n")
    declaration = f"ARG {SCM_VERSION_ARG}"
    copy_at = None
    for index, line in enumerate(lines):
        if copy_at is None and _CONTEXT_COPY.match(line):
            copy_at = index
        if copy_at is not None and line.lstrip().upper().startswith("RUN"):
            instruction = [line]
            for continued in lines[index + 1:]:
                if not instruction[-1].rstrip().endswith("\\"):
                    break
                instruction.append(continued)
            if source_dir.rstrip("/") in "\n".join(instruction):
                return "\n".join([*lines[:index], declaration, *lines[index:]])
    if copy_at is None:
        return text
    return "\n".join([*lines[:copy_at + 1], declaration, *lines[copy_at + 1:]])


def _labelled_context(context: IO[bytes], dockerfile: str, labels: Mapping[str, str],
                      source_dir: str | None = None, rewrite: Callable[[str], str] | None = None) -> IO[bytes]:
    """The build context with our labels appended to the Dockerfile as its last instructions (and,
    with `source_dir`, the candidate's version declared: declare_version_arg; its FROM lines
    through `rewrite`, the lab's mirror map).

    Not the build API's `labels`: podman puts those on every intermediate layer image too, so a
    failed build would leave a half-built image that looks finished.
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=context, mode="r:") as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source:
            if member.type == tarfile.XGLTYPE:
                continue
            data = source.extractfile(member) if member.isfile() else None
            if member.name == dockerfile and data is not None:
                text = data.read().decode("utf-8", errors="replace").rstrip("\n") + "\n"
                text = rewrite(text) if rewrite else text
                if source_dir:
                    text = declare_version_arg(text, source_dir)
                text += "LABEL " + " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in labels.items()) + "\n"
                member.size = len(text.encode())
                data = io.BytesIO(text.encode())
            target.addfile(member, data)
    out.seek(0)
    return out


def _remove_container(api: Any, container: str) -> None:
    with contextlib.suppress(Exception):  # already gone
        api.remove_container(container, force=True)


def put_tree(api: Any, container: str, tree: bytes) -> None:
    """Copy `tree` (a tar rooted at `/`) into `container`, without its record padding: podman's
    copier stops reading at the end-of-archive blocks, and the padding written after them then fails
    with a 500 ("passing bulk input to subprocess: write |1: broken pipe"), more often under load."""
    api.put_archive(container, "/", without_record_padding(tree))


def without_record_padding(tree: bytes) -> bytes:
    """`tree` ending right after its two end-of-archive blocks, as tar needs and no more."""
    with tarfile.open(fileobj=io.BytesIO(tree), mode="r:") as archive:
        archive.getmembers()
        end = archive.offset
    return tree[:end] + bytes(2 * tarfile.BLOCKSIZE)


def _tar(files: Mapping[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _python_tree(repo: git.Repo, commit: str, source_dir: str, dockerfile: str) -> bytes:
    """The commit's files minus compiled inputs, as a tar rooted at `/` placing them in `source_dir`."""
    prefix = source_dir.strip("/")
    out = io.BytesIO()
    with tarfile.open(fileobj=commit_archive(repo, commit), mode="r:") as tree, \
            tarfile.open(fileobj=out, mode="w") as archive:
        for member in tree:
            if member.type == tarfile.XGLTYPE or is_compiled_input(member.name.rstrip("/"), dockerfile):
                continue
            fileobj = tree.extractfile(member) if member.isfile() else None
            member.name = f"{prefix}/{member.name}" if prefix else member.name
            archive.addfile(member, fileobj)
    return out.getvalue()
