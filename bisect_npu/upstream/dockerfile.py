"""What a commit's Dockerfile and pin file say: ARG defaults, the first FROM image, the vLLM pin.

Read from git objects (no checkout), argument lists only.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import git


@dataclass(frozen=True)
class DockerfileFacts:
    """What a commit's own Dockerfile says to build it on (ARG defaults, first FROM image)."""

    base_image: str | None
    vllm_tag: str | None
    args: dict[str, str]


def parse_dockerfile(text: str) -> DockerfileFacts:
    """Read ARG defaults and the first FROM image from Dockerfile text.

    ARGs declared before the first FROM are substituted into its image, as docker does; a later
    ARG may reference earlier ones. ARGs without a default are left out of `args`.
    """
    args: dict[str, str] = {}
    base_image: str | None = None
    for instruction, rest in _instructions(text):
        if instruction == "ARG":
            for word in _split_words(rest):
                name, sep, value = word.partition("=")
                if sep and name not in args:
                    args[name] = substitute_args(value, args)
        elif instruction == "FROM" and base_image is None:
            words = [w for w in _split_words(rest) if not w.startswith("--")]
            if words:
                base_image = substitute_args(words[0], args)
    return DockerfileFacts(base_image=base_image, vllm_tag=args.get("VLLM_TAG"), args=args)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and line continuations joined."""
    lines = text.splitlines()
    escape = "\\"
    directive = re.match(r"\s*#\s*escape\s*=\s*(\S)", lines[0]) if lines else None
    if directive:
        escape = directive.group(1)
    result: list[tuple[str, str]] = []
    pending = ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#") or (pending and not stripped):
            continue  # comments and blank lines inside a continuation do not end it
        if stripped.endswith(escape):
            pending += stripped[: -len(escape)] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            instruction, _, rest = full.partition(" ")
            result.append((instruction.upper(), rest.strip()))
    if pending.strip():
        instruction, _, rest = pending.strip().partition(" ")
        result.append((instruction.upper(), rest.strip()))
    return result


def _split_words(rest: str) -> list[str]:
    try:
        return shlex.split(rest, comments=False)
    except ValueError:  # unbalanced quotes: keep the raw words rather than fail the whole commit
        return rest.split()


_VARIABLE = re.compile(r"\$(?:\{(?P<braced>\w+)(?::(?P<op>[-+])(?P<word>[^}]*))?\}|(?P<plain>\w+))")


def substitute_args(value: str, args: dict[str, str]) -> str:
    """`value` with its `$NAME`, `${NAME}`, `${NAME:-word}` and `${NAME:+word}` expanded from the
    Dockerfile's `args`, as docker expands them (an unknown name is empty)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        current = args.get(name, "")
        if match.group("op") == "-":
            return current or match.group("word")
        if match.group("op") == "+":
            return match.group("word") if current else ""
        return current

    return _VARIABLE.sub(replace, value)


def dockerfile_facts(repo: git.Repo, sha: str, path: str = "Dockerfile") -> DockerfileFacts | None:
    """Facts from the Dockerfile blob at `sha` (no checkout); None when the commit has none."""
    return DockerfileReader(repo, path).facts(sha)


class DockerfileReader:
    """Parses each distinct Dockerfile blob once: most commits in a range share one (history's
    facts and the build keys both read Dockerfiles through one of these)."""

    def __init__(self, repo: git.Repo, path: str) -> None:
        self._repo = repo
        self._path = path
        self._by_blob: dict[str, DockerfileFacts] = {}

    def facts(self, sha: str) -> DockerfileFacts | None:
        """The facts of the commit's Dockerfile; None when the commit has none."""
        try:
            blob, kind, _ = self._repo.git.get_object_header(f"{sha}:{self._path}")
        except ValueError:  # the commit has no such file
            return None
        blob = blob.decode() if isinstance(blob, bytes) else blob
        kind = kind.decode() if isinstance(kind, bytes) else kind
        return self.facts_of_blob(blob) if kind == "blob" else None

    def facts_of_blob(self, blob: str) -> DockerfileFacts:
        if blob not in self._by_blob:
            data = self._repo.git.get_object_data(blob)[3]
            self._by_blob[blob] = parse_dockerfile(data.decode("utf-8", errors="replace"))
        return self._by_blob[blob]


PIN_FILE = ".github/vllm-release-tag.commit"
_FULL_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class VllmPin:
    """The vLLM a vllm-ascend commit is built against: a release tag, a vLLM commit, or both
    (a Dockerfile with `VLLM_COMMIT` set keeps its `VLLM_TAG`; the commit is what it builds)."""

    tag: str | None  # "v0.27.1"
    commit: str | None  # a vLLM sha; when set, the tag is only an approximation
    source: str  # the file it was read from: PIN_FILE or the Dockerfile's path

    @property
    def release(self) -> str | None:
        """The tag as a PyPI version ("v0.27.1" -> "0.27.1"); None when there is no tag."""
        return self.tag.removeprefix("v") if self.tag else None

    def __str__(self) -> str:
        if self.commit:
            return f"vLLM {self.commit[:12]}" + (f" (near {self.tag})" if self.tag else "") + f" from {self.source}"
        return f"vLLM {self.tag} from {self.source}"


def vllm_pin(repo: git.Repo, sha: str, dockerfile: str = "Dockerfile") -> VllmPin | None:
    """The vLLM pin of a commit: `.github/vllm-release-tag.commit` where the commit has it, else
    the Dockerfile's `ARG VLLM_TAG=` and `ARG VLLM_COMMIT=`; None when it has neither.

    Read from git objects, no checkout: the unit-test builders key a venv on it per candidate."""
    try:
        text = repo.git.show(f"{sha}:{PIN_FILE}")
    except git.GitCommandError:
        text = ""
    words = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
    if words:
        value = words[0]
        if _FULL_SHA.fullmatch(value.lower()):
            return VllmPin(tag=None, commit=value.lower(), source=PIN_FILE)
        return VllmPin(tag=value, commit=None, source=PIN_FILE)
    facts = dockerfile_facts(repo, sha, dockerfile)
    if facts is None:
        return None
    tag = facts.args.get("VLLM_TAG") or None
    commit = facts.args.get("VLLM_COMMIT") or None
    if commit and _FULL_SHA.fullmatch(commit.lower()):
        commit = commit.lower()
    if tag is None and commit is None:
        return None
    return VllmPin(tag=tag, commit=commit, source=dockerfile)
