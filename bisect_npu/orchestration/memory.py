"""The verdict store seen from a session: the scope its verdicts hold under, what it may reuse,
what it keeps, and `--good last-good`.

A verdict is reused only under the same oracle and environment: the oracle is the recipe's digest
(with its golden reference's files) or the command's words (with the scripts it names by absolute
path); the environment is every fact of this host and run that changes what a run shows (the
executor, the NPU host type, the architecture, the timeout and what a timeout counts as, the base
image mirrors and release images, the package index, the bisect-npu version). Anything else that
changes results on a host (a driver or CANN upgrade) goes into `BISECT_NPU_ENVIRONMENT`, which
enters the environment as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import git

from bisect_npu import __version__
from bisect_npu.contracts import Verdict, VerdictKind
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.level import held_of
from bisect_npu.orchestration.options import SessionSpec
from bisect_npu.progress import Progress
from bisect_npu.recipe import Recipe
from bisect_npu.records import StoredFrom
from bisect_npu.store import Scope, StoredVerdict, VerdictStore

ENVIRONMENT_VARIABLE = "BISECT_NPU_ENVIRONMENT"
# A host file a command names by absolute path is part of the oracle when it is a program or a script
# (its content is hashed); data files it writes, such as a log or a counter, are not.
_SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".pl", ".rb", ".js", ".yaml", ".yml")


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def command_digest(command: list[str]) -> str:
    """A command oracle's digest: its words and the content of the scripts it names by absolute path."""
    scripts = {}
    for word in command:
        path = Path(word)
        if path.is_absolute() and path.is_file() and (path.suffix in _SCRIPT_SUFFIXES or os.access(path, os.X_OK)):
            scripts[word] = _file_digest(path)
    return _digest({"command": command, "scripts": scripts})


def oracle_digest(spec: SessionSpec, recipe: Recipe | None) -> str | None:
    """What judges a commit, as a digest; None for a Python callable (its code has no stable digest)."""
    if recipe is not None:
        golden = [_file_digest(f) for f in recipe.golden_files()] if recipe.reference.kind == "golden" else []
        return _digest({"recipe": recipe.digest(), "golden": golden})
    if spec.judge.command:
        return command_digest(spec.judge.command)
    return None


def environment_facts(spec: SessionSpec, recipe: Recipe | None) -> dict[str, object]:
    """The facts of this host and run that change what a run of a commit shows (at a dependency
    level, the upstream commit its candidates are laid into: the same dependency commit under
    another upstream commit is another run)."""
    facts: dict[str, object] = {
        "bisect_npu": __version__,
        "executor": spec.executor.executor,
        "node_executor": spec.executor.node_executor if spec.executor.executor == "ray" else None,
        "host": spec.context.host,
        "machine": platform.machine(),
        "system": platform.system(),
        "timeout_s": spec.judge.timeout_s,
        "timeout_is": spec.judge.timeout_is or (recipe.trials.timeout_is if recipe else None) or "skip",
        "base_image_map": sorted(spec.executor.base_image_map),
        "release_images": spec.executor.release_images,
        "package": spec.range.package,
        "index_url": spec.range.index_url,
        "environment": os.environ.get(ENVIRONMENT_VARIABLE, ""),
        # Commits run on a release's compiled part, not built (named only when set: the digests
        # of the verdicts stored before this fact existed stay as they were).
        **({"overlay_on_release": spec.range.overlay_on_release} if spec.range.overlay_on_release else {}),
    }
    if (held := held_of(spec.level)) is not None:  # only then: the other sessions' scopes stay as they were
        facts["held"] = held.model_dump(mode="json")
    return facts


def scope_of(spec: SessionSpec, recipe: Recipe | None, reference: str = "") -> Scope | None:
    """The scope a session's verdicts hold under; None when they cannot be shared."""
    oracle = oracle_digest(spec, recipe)
    if oracle is None:
        return None
    facts = environment_facts(spec, recipe)
    mode = spec.search.mode or (recipe.trials.mode if recipe else "exact")
    return Scope(oracle=oracle, environment=_digest(facts), mode=mode, reference=reference,
                 facts=json.dumps(facts, sort_keys=True))


@dataclass(frozen=True)
class Reused:
    """A verdict the store holds for a commit, as the session journals it."""

    verdict: Verdict
    stored: StoredFrom


class Memory:
    """One session's use of the verdict store: recall other sessions' verdicts, keep its own."""

    def __init__(self, store: VerdictStore, scope: Scope, session: str, progress: Progress) -> None:
        self.store = store
        self.scope = scope
        self.session = session
        self.progress = progress
        self.failed = False  # the store failed once: the session goes on without it, told once

    def _fail(self, exc: InfrastructureError) -> None:
        if not self.failed:
            self.progress.note(f"the verdict store failed ({exc}); this session goes on without it: it tests every "
                               "commit and keeps no verdict")
        self.failed = True

    def recall(self, commit: str, build_key: str) -> Reused | None:
        """The store's verdict of `commit`: in exact mode the one every session gave (sessions that
        disagree are tested again), in noisy mode the sum of their trials."""
        if self.failed:
            return None
        try:
            rows = self.store.get(self.scope, commit, build_key, besides=self.session)
        except InfrastructureError as exc:
            self._fail(exc)
            return None
        if not rows:
            return None
        sessions = sorted({row.session for row in rows})
        if self.scope.mode == "noisy":
            good, bad = sum(row.good for row in rows), sum(row.bad for row in rows)
            kind = VerdictKind.BAD if bad else VerdictKind.GOOD
            reason = f"from the verdict store: {bad} of {good + bad} trials bad in {len(sessions)} earlier session(s)"
            return Reused(Verdict(kind=kind, reason=reason, figures={"bad": bad, "good": good}, trials=good + bad),
                          StoredFrom(sessions=sessions, good=good, bad=bad))
        kinds = {row.kind for row in rows}
        if len(kinds) > 1:
            self.progress.note(f"{commit[:12]}: earlier sessions' verdicts disagree ({', '.join(sorted(kinds))}); "
                               "testing it again")
            return None
        latest = rows[-1]
        reason = f"from the verdict store: {latest.reason}" + (f" ({len(sessions)} sessions agree)"
                                                                 if len(sessions) > 1 else "")
        return Reused(Verdict(kind=latest.kind, reason=reason), StoredFrom(sessions=sessions))

    def keep(self, commit: str, build_key: str, verdict: Verdict, good: int, bad: int) -> None:
        """Keep this session's verdict of `commit` (a good or bad one: a skip may be the host's
        passing trouble); `good`/`bad` count its own trials there (noisy mode). A store that cannot
        be written to costs the reuse, not the bisection."""
        if verdict.kind == VerdictKind.SKIP or self.failed:
            return
        try:
            self.store.put(self.scope, StoredVerdict(commit, build_key, self.session, verdict.kind, good, bad,
                                                     verdict.reason, time.time()))
        except InfrastructureError as exc:
            self._fail(exc)


def open_memory(spec: SessionSpec, recipe: Recipe | None, session_dir: Path, reference: str,
                progress: Progress) -> Memory | None:
    """The session's Memory, or None without a store (or for an oracle whose verdicts cannot be shared)."""
    if spec.store.verdict_store is None:
        return None
    scope = scope_of(spec, recipe, reference)
    if scope is None:
        return None
    return Memory(VerdictStore(Path(spec.store.verdict_store)), scope, str(session_dir), progress)


def resolve_last_good(spec: SessionSpec, recipe: Recipe | None, repo: git.Repo) -> tuple[str, str]:
    """`--good last-good`: the newest commit on the bad end's first-parent line that the verdict
    store holds judged good under this oracle and environment (any good end it was compared with);
    (sha, the sentence that says where it came from)."""
    if spec.store.verdict_store is None:
        raise UsageError("--good last-good reads the verdict store; drop --no-verdict-store or name a good ref")
    if spec.search.find_fix:
        raise UsageError("--good last-good names a commit without the symptom, and --find-fix's old end has it; "
                         "name the old ref")
    scope = scope_of(spec, recipe)
    if scope is None:
        raise UsageError("--good last-good needs a recipe or a command oracle; name a good ref")
    from bisect_npu import history

    good = VerdictStore(Path(spec.store.verdict_store)).judged_good(scope)
    bad = history.resolve_ref(repo, spec.range.bad)
    if good:
        for sha in repo.git.rev_list("--first-parent", bad).split():
            if sha in good and sha != bad:
                return sha, (f"--good last-good: {sha[:12]}, judged good in session {good[sha].session} on "
                             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(good[sha].t))}")
    raise UsageError(f"--good last-good: the verdict store {spec.store.verdict_store} holds no commit judged good "
                     f"on {spec.range.bad}'s first-parent line for this {'recipe' if recipe else 'command'} and "
                     "environment (a different recipe, command, executor, host type or timeout does not count); name a "
                     "good ref for the first bisection")
