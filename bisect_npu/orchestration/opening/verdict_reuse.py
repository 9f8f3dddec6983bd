"""The verdict store seen from a session: the scope its verdicts hold under, what it may reuse,
what it keeps, and `--good last-good`.

A verdict is reused only under the same oracle and environment: the oracle is the recipe's digest
(with its golden reference's files) or, for a command, what the command can see (`command_view`):
its words, the content of every file they name (absolute, or relative to the directory `run`
starts in, the clone, or a directory a `cd` inside a shell string moves to; `sh -c '...'` strings
are split with shlex, never run), the programs it resolves on PATH, and the environment variables
its words reference plus those `--verdict-env` declares. What the command reads that none of its
words names (a script its script calls) is caught after the search: a session that reused a
verdict runs its culprit and the culprit's parent fresh before it answers, a settings search its
trigger and the configurations one key short of it (`SessionVerdicts.confirm`). The
environment is every fact of this host and run that changes what a run shows (the
executor, the NPU host type, the architecture, the timeout and what a timeout counts as, the base
image mirrors and release images, the package index, the bisect-npu version). Anything else that
changes results on a host (a driver or CANN upgrade) goes into `BISECT_NPU_ENVIRONMENT`, which
enters the environment as it is.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic

import git

from bisect_npu import __version__
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.level import held_of
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.orchestration.opening.state import StoreLedger, Thing
from bisect_npu.progress import Progress
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import CommandOracle, StoredFrom
from bisect_npu.store import Scope, StoredVerdict, StoreUnavailable, VerdictStore
from bisect_npu.upstream import history

ENVIRONMENT_VARIABLE = "BISECT_NPU_ENVIRONMENT"
# Files above this size are keyed on their size and modification time, not read through (a model's
# weights named on the command line would cost seconds to hash at every start).
_HASHED_BYTES = 64 * 2**20
# A `$NAME` or `${NAME}` in a word: the command reads that variable.
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_SHELL_OPERATORS = frozenset(";&|<>()")
_NESTING = 4  # sh -c "sh -c '...'" at most this deep
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})  # redirections to a file the command writes


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _content_key(path: Path) -> str:
    """What a file holds, as a key: its content's digest, or for a large one its size and mtime."""
    try:
        facts = path.stat()
        if facts.st_size > _HASHED_BYTES:
            return f"size {facts.st_size} mtime {facts.st_mtime_ns}"
        return _file_digest(path)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _shell_words(text: str) -> list[str]:
    """The words of a shell string as a shell would split them (operators as words of their own);
    a string shlex cannot split (an unclosed quote) by its whitespace."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return text.split()


def _all_words(words: list[str], depth: int = 0) -> list[str]:
    """`words` and, for each word a shell would split further (a `sh -c` script, any word with
    blanks or operators), its words too, recursively."""
    found: list[str] = []
    for word in words:
        found.append(word)
        if depth < _NESTING and (any(c.isspace() for c in word) or _SHELL_OPERATORS & set(word)):
            found += _all_words(_shell_words(word), depth + 1)
    return found


def _path_candidates(word: str) -> list[str]:
    """The paths a word may name: itself, the value of `--opt=VALUE` / `NAME=VALUE`, and each
    part of a `a:b` list such as PYTHONPATH's."""
    if not word or (word.startswith("-") and "=" not in word):
        return []
    values = {word, word.partition("=")[2]} if "=" in word else {word}
    return sorted({part for value in values for part in [value, *value.split(":")] if part})


@dataclass(frozen=True)
class CommandView:
    """What a command oracle can see on this host, beyond the commit it judges."""

    files: dict[str, str]  # resolved path -> content key
    programs: dict[str, str]  # a word PATH resolves -> "resolved path content key"
    variables: dict[str, str | None]  # referenced or declared variable -> its value (None: unset)

    def digest(self, command: list[str]) -> str:
        return _digest({"command": command, "files": self.files, "programs": self.programs,
                        "variables": self.variables})

    def seen(self) -> dict[str, str]:
        """Each thing seen with a digest of it, for the journal header (a variable's value is kept
        as a digest only: it may be a secret)."""
        return {**{f"file:{path}": key[:16] for path, key in self.files.items()},
                **{f"program:{word}": _digest(found) for word, found in self.programs.items()},
                **{f"variable:{name}": _digest(value) for name, value in self.variables.items()}}


def command_view(command: list[str], bases: list[Path], declared: list[str] | None = None,
                 environ: Mapping[str, str] | None = None, clone: Path | None = None) -> CommandView:
    """Every file the command's words name (absolute, or relative to one of `bases` or to a
    directory a `cd` in one of its shell strings names), every program a word resolves to on PATH,
    and every variable a word references or `declared` names, with its value. Nothing is run.

    A relative name that lands in `clone` (the upstream's own checkout) is left out: the command
    runs in each candidate's checkout, where such a file is the commit's own, which the commit's sha
    keys already (the clone's copy is not what it sees)."""
    environ = os.environ if environ is None else environ
    words = _all_words(command)
    directories = list(bases)
    written: set[int] = set()  # the word after `>`, `>>`: what the command writes, not what it reads
    for at, (before, after) in enumerate(itertools.pairwise(words)):
        if before in ("cd", "pushd"):
            target = Path(after)
            directories += [target] if target.is_absolute() else [base / target for base in bases]
        if before in _WRITES:
            written.add(at + 1)
    files: dict[str, str] = {}
    programs: dict[str, str] = {}
    for at, word in enumerate(words):
        for candidate in _path_candidates(word) if at not in written else []:
            path = Path(candidate)
            for place in [path] if path.is_absolute() else [base / path for base in directories]:
                if place.is_file() and (path.is_absolute() or clone is None
                                        or not place.resolve().is_relative_to(clone)):
                    files[str(place.resolve())] = _content_key(place)
        if "/" not in word and word and not word.startswith("-"):
            resolved = shutil.which(word, path=environ.get("PATH"))
            if resolved is not None:
                programs[word] = f"{Path(resolved).resolve()} {_content_key(Path(resolved))}"
    names = {match.group(1) for word in words for match in _VARIABLE.finditer(word)} | set(declared or [])
    return CommandView(files=files, programs=programs, variables={name: environ.get(name) for name in sorted(names)})


def _view_of(command: list[str], spec: SessionSpec | None, start: Path) -> CommandView:
    repo = spec.range.repo if spec is not None else None
    clone = (start / repo).resolve() if repo and not history.is_url(repo) else None
    declared = spec.store.verdict_env if spec is not None else []
    return command_view(command, [start], declared, clone=clone)


def command_digest(command: list[str], spec: SessionSpec | None = None, cwd: Path | None = None) -> str:
    """A command oracle's digest: its words and what they let it see (`command_view`), relative
    names looked for from the directory `run` started in (`cwd`, default the current one)."""
    return _view_of(command, spec, cwd or Path.cwd()).digest(command)


def command_oracle(spec: SessionSpec) -> CommandOracle | None:
    """A command oracle as the journal header keeps it: the digest of what it sees, each thing seen,
    and the directory its relative names were looked up from."""
    command = spec.judge.command
    if not command:
        return None
    cwd = Path.cwd()
    view = _view_of(command, spec, cwd)
    return CommandOracle(digest=view.digest(command), cwd=str(cwd), seen=view.seen())


def command_changed(spec: SessionSpec, started: CommandOracle | None) -> list[str]:
    """What the command sees now that differs from when the session started: a file whose content
    changed, a program PATH resolves otherwise, a variable with another value. A file that appeared
    or went away since is not counted (a marker or log the runs themselves make or remove); a
    journal from before the header kept this: nothing."""
    if not spec.judge.command or started is None:
        return []
    now = _view_of(spec.judge.command, spec, Path(started.cwd)).seen()
    return sorted(name for name, digest in now.items() if name in started.seen and started.seen[name] != digest) + \
        sorted(name for name in {*now, *started.seen} - ({*now} & {*started.seen}) if not name.startswith("file:"))


def oracle_digest(spec: SessionSpec, recipe: Recipe | None) -> str | None:
    """What judges a commit, as a digest; None for a Python callable (its code has no stable digest)."""
    if recipe is not None:
        golden = [_file_digest(f) for f in recipe.golden_files()] if recipe.reference.kind == "golden" else []
        return _digest({"recipe": recipe.digest(), "golden": golden})
    if spec.judge.command:
        return command_digest(spec.judge.command, spec)
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


class VerdictReuse:
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


    def keep_judged(self, commit: str, build_key: str, verdict: Verdict,
                    outcomes: Sequence[VerdictKind | None] | None) -> None:
        """Keep what a session judged of the thing it tested at `commit`: in noisy mode (`outcomes`:
        every trial this session ran of it, not the ones it reused) their tally, bad where any was;
        in exact mode (None) the verdict alone."""
        if outcomes is None:
            good, bad = int(verdict.kind == VerdictKind.GOOD), int(verdict.kind == VerdictKind.BAD)
        else:
            good, bad = outcomes.count(VerdictKind.GOOD), outcomes.count(VerdictKind.BAD)
            kind = VerdictKind.BAD if bad else VerdictKind.GOOD if good else VerdictKind.SKIP
            verdict = verdict.model_copy(update={"kind": kind})
        self.keep(commit, build_key, verdict, good, bad)


class SessionVerdicts(Generic[Thing]):
    """The verdict store's part in one search's loop, over the things it tests (a commit search's
    positions, a settings search's configurations): journal what the store holds instead of running
    it (once per thing; never for one in `always_run`), keep what the search runs, and run fresh what
    an answer rests on where only the store judged it. Once a thing run here is judged otherwise than
    the store judged it, the store's verdicts no longer hold for this search: it neither reuses nor
    counts them (a fact of the journal, in `ledger`, so a resumed search knows it too).

    `reuse` gives a thing's store scope (one for every commit of a session; a configuration's own
    recipe digest); `outcomes`, in noisy mode, every trial's outcome this search ran of a thing;
    `noun` names a thing in what the user is told."""

    def __init__(self, reuse: Callable[[Thing], VerdictReuse], ledger: StoreLedger[Thing], progress: Progress, *,
                 outcomes: Callable[[Thing], Sequence[VerdictKind | None]] | None = None,
                 always_run: frozenset[Thing] = frozenset(), noun: str = "commit") -> None:
        self.reuse = reuse
        self.ledger = ledger
        self.progress = progress
        self.outcomes = outcomes
        self.always_run = always_run
        self.noun = noun
        self._lock = threading.Lock()  # one slot at a time reads or writes a thing's stored verdict

    def dropped(self) -> bool:
        return self.ledger.store_disagreed()

    def recall(self, thing: Thing, commit: str, build_key: str, journal: Callable[[Reused], None]) -> Reused | None:
        """`journal` the store's verdict of `thing` (run at `commit`) instead of testing it, and
        return it; None where it must run (noisy mode: the search asks for more trials there if it
        wants them)."""
        if thing in self.always_run or self.dropped():
            return None
        with self._lock:
            if self.ledger.stored_at(thing):
                return None
            reused = self.reuse(thing).recall(commit, build_key)
            if reused is not None:
                journal(reused)
        return reused

    def recall_all(self, things: Iterable[Thing], recall: Callable[[Thing], bool]) -> None:
        """Before the search decides anything, `recall` every thing not judged yet, so the search
        starts from what earlier sessions judged and spends its runs on the rest (asked one by one,
        a cost-aware search could wander to commits they never judged)."""
        reused = [thing for thing in things if recall(thing)]
        if reused:
            self.progress.note(f"{len(reused)} verdict(s) reused from the verdict store "
                               f"{self.reuse(reused[0]).store.path}")

    def keep(self, thing: Thing, commit: str, build_key: str, verdict: Verdict) -> None:
        """Keep this search's verdict of `thing`: in noisy mode with the tally of every trial this
        search ran of it (not the ones it reused)."""
        with self._lock:  # the tally counted and kept at once: a slot's later count is never overwritten
            self.reuse(thing).keep_judged(commit, build_key, verdict,
                                          self.outcomes(thing) if self.outcomes is not None else None)

    def confirm(self, resting: Sequence[Thing], run: Callable[[Thing], object]) -> bool:
        """Before answering from evidence that holds a stored verdict, `run` the things the answer
        rests on (`resting`: `search.rests_on`, `ddmin.rests_on`) fresh where only the store judged
        them: a check may read what its key does not see (a script its script calls). True when it
        ran any, so the search decides again (without the store's verdicts if one disagreed)."""
        if self.dropped():
            return False
        stored = self.ledger.stored_kinds()
        if not stored:
            return False
        fresh = self.ledger.fresh_kinds()
        unconfirmed = [thing for thing in resting if thing in stored and thing not in fresh]
        if not unconfirmed:
            return False
        self.progress.note(f"running {len(unconfirmed)} {self.noun}(s) the answer rests on fresh: their verdicts came "
                           "from the verdict store")
        for thing in unconfirmed:
            run(thing)
        if self.dropped():
            self.progress.note(f"a {self.noun} run fresh disagrees with the verdict store's verdict of it: this "
                               "session drops the store's verdicts and searches again (the check reads something its "
                               "key does not see; --verdict-env names a variable, --no-verdict-store turns reuse off)")
        return True


def open_verdict_reuse(spec: SessionSpec, recipe: Recipe | None, session_dir: Path, reference: str,
                progress: Progress) -> VerdictReuse | None:
    """The session's VerdictReuse, or None without a store (or for an oracle whose verdicts cannot be shared)."""
    if spec.store.verdict_store is None:
        return None
    scope = scope_of(spec, recipe, reference)
    if scope is None:
        return None
    try:
        store = VerdictStore(Path(spec.store.verdict_store))
    except StoreUnavailable as exc:  # as when it fails mid-run: the host's work goes on
        progress.note(f"{exc}; this session goes on without it: it tests every commit and keeps no verdict")
        return None
    if store.set_aside:
        progress.note(store.set_aside)
    return VerdictReuse(store, scope, str(session_dir), progress)


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

    store = VerdictStore(Path(spec.store.verdict_store))
    good = store.judged_good(scope)
    bad = history.resolve_ref(repo, spec.range.bad)
    if good:
        for sha in repo.git.rev_list("--first-parent", bad).split():
            if sha in good and sha != bad:
                return sha, (f"--good last-good: {sha[:12]}, judged good in session {good[sha].session} on "
                             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(good[sha].t))}")
    raise UsageError(f"--good last-good: the verdict store {spec.store.verdict_store} holds no commit judged good "
                     f"on {spec.range.bad}'s first-parent line for this {'recipe' if recipe else 'command'} and "
                     "environment (a different recipe, command, executor, host type or timeout does not count); name a "
                     f"good ref for the first bisection{f' ({store.set_aside})' if store.set_aside else ''}")
