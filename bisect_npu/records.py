"""The journal's records: one pydantic model per line type, read through the union `JournalRecord`.

A journal is a header line, then records appended as a session goes: `trial` (one probe or command
run), `step` (a commit judged: a `JudgedRun`, the shape every search's judged record shares), `end`
(the search's answer, a `SearchEnd`), `next_level` (a finer level's
answer: a release's commits or a merge's, a culprit's dependency commits), `dependency_move` (the
culprit moved a declared dependency's pin), `fix` (the ranked fix proposals), `fix_verified` (one
proposal verified) and `fix_verify` (the verification stage done). Each line's `type` names its model.

Schema version: the header's `schema_version`. Absent or 1: the shapes bisect-npu 0.1.x wrote,
whose header keeps one flat `options` (read into `request`, `level` and `context`: `_from_0_1`);
every other record keeps 0.1.x's shapes (a writer may spell out a default 0.1.x left out, such
as an empty `told`; the reader takes both alike). 2: 0.2.0's header, `request` (by part), `level`
and `context`. A change of a field's shape bumps it, so a reader can tell which shapes a journal
holds; `Journal.open` reads a newer version's journal but does not append to it.

Extra fields are ignored (pydantic's `extra="ignore"`), deliberately: a field added by a newer
writer must not stop an older reader from resuming or reporting (`"forbid"` would), and a record's
attributes stay exactly the fields declared here (`"allow"` would keep fields this version does not
understand and write them out again, as `fix_verify` copies the `fix_verified` lines, under
shapes it cannot vouch for).
Nothing is lost: the journal file is never rewritten. For the same reason a line of a type this
version does not know is left out of the entries (`parse_record`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

from bisect_npu.fix_proposals import FixReport, FixVerification
from bisect_npu.level import LevelSpec
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.request import RunContext, RunRequest, part_types

JOURNAL_SCHEMA_VERSION = 2
# The case id of a user command's trials (a recipe's cases have their own ids).
COMMAND_CASE = "command"


def _path_text(value: object) -> object:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


PathText = Annotated[str, BeforeValidator(_path_text)]  # a path, kept as text (relative to the session or absolute)


class _Shape(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Record(_Shape):
    """A journal line: `t` is when it was made (unix time)."""

    t: float = Field(default_factory=time.time)


class CandidateRange(_Shape):
    """What is bisected: the commits of a repository in (base, bad], or published versions of a
    package (`kind` "versions"), oldest first, with their titles (and pull requests)."""

    kind: Literal["commits", "versions"]
    good: str
    bad: str
    base: str  # the good end as tested: the merge base where the good end is not an ancestor
    good_ref: str
    bad_ref: str
    merge_base_note: str | None = None
    candidates: list[str]
    titles: dict[str, str] = Field(default_factory=dict)
    prs: dict[str, int] = Field(default_factory=dict)
    package: str | None = None  # kind "versions"
    groups: dict[str, list[str]] = Field(default_factory=dict)  # kind "versions": representative -> rebuilds
    # kind "commits": the merges among the candidates -> how many commits each brings in (itself
    # included), which the search weighs them by; empty with --first-parent-only
    brought_in: dict[str, int] = Field(default_factory=dict)

    def title_of(self, sha: str) -> str:
        return self.titles.get(sha, "")

    def pr_of(self, sha: str) -> int | None:
        return self.prs.get(sha)


class EarlierRunsCounts(_Shape):
    """The ends' runs made before the session ("shown/runs"), as the noisy search counted them."""

    bad_end: str
    good_end: str


class CommandOracle(_Shape):
    """A command oracle as the session started with it: the digest of what it could see, each
    thing seen ("file:PATH", "program:WORD", "variable:NAME") with a digest of it, and the
    directory its relative words were looked up from (orchestration.opening.verdict_reuse.command_oracle)."""

    digest: str
    cwd: str
    seen: dict[str, str] = Field(default_factory=dict)


class HeaderRecord(Record):
    """The journal's first line: what the session bisects and how; resume needs nothing else.
    `request` is what the run was asked (the finer levels' sessions: with their own ends), `level`
    what this session's candidates are, `context` what the run found besides (the host type)."""

    type: Literal["header"] = "header"
    schema_version: int = 1  # absent in 0.1.x's journals, whose shapes are version 1
    tool_version: str = ""
    request: RunRequest
    level: LevelSpec
    context: RunContext = Field(default_factory=RunContext)
    recipe_digest: str | None = None
    mode: Literal["exact", "noisy"] = "exact"  # what the search ran in
    earlier_runs: EarlierRunsCounts | None = None
    range: CandidateRange
    github: str | None = None
    parent_session: str | None = None  # the release-level session of a commit-level one
    # The recipe fields the host type (context.host) changed, by path: {"model.dtype": "float16"} on 310P.
    host_changes: dict[str, str] = Field(default_factory=dict)
    # What a command oracle could see when the session started: resume refuses a command whose
    # script or data changed, as it refuses a changed recipe.
    command_oracle: CommandOracle | None = None
    # How a throughput session searches (the recipe's `oracle.throughput.search` as it started):
    # resume keeps it whatever this version's default (orchestration/opening/throughput_search.py).
    # None: no throughput oracle, or a journal from before it was kept.
    throughput_search: Literal["levels", "per_step"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_0_1(cls, raw: Any) -> Any:
        """A header written by 0.1.x (schema version 1) keeps one flat `options`: the request's
        fields, the level's (`merge_scope`, `held`, `package`, `overlay_on_release`) and the
        context's (`host`, `python_oracle`), read here into the three."""
        if not isinstance(raw, dict) or "options" not in raw or "request" in raw:
            return raw
        options = dict(raw["options"]) if isinstance(raw["options"], dict) else {}
        context = {name: options.pop(name, None) for name in ("host", "python_oracle")}
        scope, held = options.pop("merge_scope", None), options.pop("held", None)
        level: dict[str, Any]
        if options.get("package"):
            level = {"kind": "releases"}
        elif held is not None:
            level = {"kind": "dependency", "held": held}
        elif scope is not None:
            level = {"kind": "merge", "scope": scope, "overlay_on_release": options.get("overlay_on_release")}
        else:
            level = {"kind": "commits", "overlay_on_release": options.get("overlay_on_release")}
        # The request's fields routed to their parts, validated with the header (a value its field
        # refuses is then the header's ValidationError, which the journal names in one line).
        request: dict[str, dict[str, Any]] = {part: {} for part, _model in part_types()}
        for name, value in options.items():
            if name in _REQUEST_FIELDS:
                request[_PART_OF[name]][name] = value
        migrated = {name: value for name, value in raw.items() if name != "options"}
        return {**migrated, "request": request, "level": level, "context": context}


class TrialRun(_Shape):
    """One finished run of the bad case at a commit: a probe trial, or one run of a user command."""

    case_id: str
    trial: int
    observation: PathText | None = None
    seconds: float = 0.0
    log: PathText = ""
    outcome: VerdictKind | None = None  # judged alone (noisy mode, a command); None: judged with its step
    reason: str = ""
    startup_s: float = 0.0  # the engine start's share of `seconds` (its first trial carries it)
    node: str | None = None  # --executor ray: the cluster node that ran it


class TrialRecord(Record, TrialRun):
    """A trial journaled as soon as it finished, so an interrupted step never runs it again."""

    type: Literal["trial"] = "trial"
    index: int
    commit: str


class NodeBuild(_Shape):
    """What one node of a run across hosts (`--executor ray`) ran a step's candidate from: its
    build there, and for a container the image its runs started from, by name and by id (the id
    execute/docker.py's `candidate_image` read and checked to carry the candidate's commit label)."""

    node: str
    how: str  # "built", "overlay", "reused": that node's builder's
    seconds: float = 0.0
    image: str | None = None  # --node-executor docker: the image's name on that node
    image_id: str | None = None  # ... and the id its containers started from

    def image_said(self) -> str:
        """Its image by name and short id, as the logs and the report name it ("" for a worktree)."""
        return f"{self.image} ({self.image_id.removeprefix('sha256:')[:12]})" if self.image_id else ""


class BuildInfo(_Shape):
    """How a step's commit was made runnable: "built", "overlay", "reused", "journaled" (every
    trial was journaled before an interruption: nothing built), "stored" (the verdict store had
    its verdict: nothing built or run) or "failed"."""

    how: str
    key: str | None = None
    image: str | None = None
    seconds: float | None = None
    log: PathText | None = None
    log_tail: str | None = None  # "failed"
    error: str | None = None  # "failed"
    run_env: dict[str, str] = Field(default_factory=dict)  # the candidate's own switches its runs got
    # An overlay on a release's compiled part: the compiled inputs the commit changed since that release.
    compiled_changes: list[str] = Field(default_factory=list)
    venv_made: str | None = None  # how the venv of `key` got its packages: its lock, dated, afresh
    # --executor ray: each node's build the step's runs ran on (the driver builds nothing); absent
    # in journals written before it, whose ray steps said "reused" whatever the nodes did.
    nodes: list[NodeBuild] = Field(default_factory=list)


class StoredFrom(_Shape):
    """Where a step's verdict came from when the verdict store had it (nothing ran): the sessions
    that judged the commit before, and their trials' tally (noisy mode counts them as evidence)."""

    sessions: list[str]
    good: int = 0
    bad: int = 0


class RetryRun(_Shape):
    """One attempt of a probe run that failed on the host, not on the commit (its engine did not
    start, was killed, or its harness lost the server), or of a build that failed on the network:
    retried, never judged."""

    case_id: str  # "" for a build
    trial: int  # the first trial the attempt did not finish (a build: the first trial it was for)
    attempt: int  # 1 for the first failed attempt of this trial at this commit
    kind: str  # orchestration/running/infrastructure.py's FailureKind
    cause: str  # what the host did wrong, with the log line that says so
    log: PathText = ""
    seconds: float = 0.0
    stage: Literal["run", "build"] = "run"  # what failed: a probe run, or the candidate's build


class RetryRecord(Record, RetryRun):
    """A failed attempt journaled the moment it failed, so a resumed session keeps every attempt."""

    type: Literal["retry"] = "retry"
    index: int
    commit: str


class JudgedRun(_Shape):
    """What every judged candidate's record holds, whatever the search: how the candidate was made
    runnable (`build`), its verdict, trials and seconds, where the verdict store gave the verdict
    (`stored`: nothing ran), its failed attempts in order (`retries`), and why the host's failures
    left it unjudged (`host_failure`: a later session runs it again). A search's record is a
    `Record`, this, and the keys that say which candidate it judged."""

    build: BuildInfo | None = None
    verdict: Verdict
    trials: list[TrialRun] = Field(default_factory=list)
    seconds: float = 0.0
    stored: StoredFrom | None = None
    retries: list[RetryRun] = Field(default_factory=list)
    host_failure: str | None = None

    def judged_fields(self) -> dict[str, Any]:
        """The shared fields by name, as they are (not dumped): what a search's record is made of
        besides its keys."""
        return {name: getattr(self, name) for name in JudgedRun.model_fields}

    def judged_run(self) -> JudgedRun:
        """The shared part of a judged record, its keys left out."""
        return JudgedRun(**self.judged_fields())


class _StepKeys(Record):
    """Which commit a step judged (first on its line, before the judged run, as 0.1.x wrote it)."""

    type: Literal["step"] = "step"
    index: int
    commit: str
    title: str = ""


class StepRecord(JudgedRun, _StepKeys):
    """A commit judged, at position `index`; `told` is what the search weighed its choice by (its
    costs, in its unit). `stored`: the verdict was reused from the verdict store (`build.how`
    "stored"), not judged here."""

    told: dict[str, float] = Field(default_factory=dict)


class SearchEnd(_Shape):
    """What every search's end holds: its sentence, its figures, and which end does not behave as
    given where that is the answer."""

    message: str = ""
    figures: dict[str, float] = Field(default_factory=dict)
    which: Literal["good", "bad"] | None = None  # ends_wrong


class _EndStatus(Record):
    """How the search ended (first on its line, as 0.1.x wrote it)."""

    type: Literal["end"] = "end"
    status: Literal["found", "narrowed", "ends_wrong"]


class EndRecord(SearchEnd, _EndStatus):
    """The search's answer: a culprit (`found`, as sure as the confidence asked), a range it could
    not narrow past skipped commits, whose steps disagree, or that holds the confidence around a
    best guess below it (`narrowed`), or an end that does not behave as given (`ends_wrong`)."""

    prefetch_saved_s: float | None = None
    culprit: str | None = None  # found
    index: int | None = None  # found: the culprit's position
    confidence: float | None = None  # found
    lo: str | None = None  # narrowed: the answer is in (lo, hi]
    hi: str | None = None
    lo_index: int | None = None
    hi_index: int | None = None
    best_guess: str | None = None  # narrowed: the commit the search leaned to, below the confidence asked


class NextLevelRecord(Record):
    """A finer level's answer, from a session of its own: a release level's culprit bisected commit
    by commit, or a merge's brought-in commits bisected (`merge`, with how many there were)."""

    type: Literal["next_level"] = "next_level"
    session: str
    status: str
    culprit: str | None = None
    lo: str | None = None  # narrowed: the range (lo, hi] it holds
    hi: str | None = None
    best_guess: str | None = None  # narrowed below the confidence asked: the commit the search leaned to
    message: str = ""
    good: str = ""  # two releases' tags; a merge's first parent and the merge; a dependency's two pins' commits
    bad: str = ""
    merge: str | None = None  # a merge level: the merge descended into
    merged: int = 0  # a merge level: the commits it brought in (the candidates)
    steps: int = 0  # the steps of the finer levels, all together
    dependency: str | None = None  # a dependency level: its name


class DependencyMoveRecord(Record):
    """The culprit moved a declared dependency's pin (`old` -> `new`, as written where `where`
    says); `crossed`: its own commits are bisected next (a Python-only one, unless
    --no-dependency), else `note` says why not."""

    type: Literal["dependency_move"] = "dependency_move"
    name: str
    old: str
    new: str
    where: str = ""
    culprit: str = ""
    crossed: bool = False
    note: str = ""


class FixRecord(Record):
    type: Literal["fix"] = "fix"
    report: FixReport
    first_tags: dict[str, str] = Field(default_factory=dict)  # a dependency level: fix sha -> first tag holding it


class FixVerifiedRecord(Record):
    """One fix proposal verified (journaled as each ends, so a resume verifies only the rest)."""

    type: Literal["fix_verified"] = "fix_verified"
    verification: FixVerification


class FixVerifyRecord(Record):
    """The verification stage done: every proposal verified, the verified ones first."""

    type: Literal["fix_verify"] = "fix_verify"
    verifications: list[FixVerification] = Field(default_factory=list)


_PART_OF = {name: part for part, model in part_types() for name in model.model_fields}  # a request field -> its part
_REQUEST_FIELDS = frozenset(_PART_OF)

JournalRecord = Annotated[
    TrialRecord | RetryRecord | StepRecord | EndRecord | NextLevelRecord | FixRecord | FixVerifiedRecord
    | FixVerifyRecord | DependencyMoveRecord,
    Field(discriminator="type"),
]
_JOURNAL_RECORD: TypeAdapter[JournalRecord] = TypeAdapter(JournalRecord)
RECORD_TYPES = frozenset(model.model_fields["type"].default for model in (
    TrialRecord, RetryRecord, StepRecord, EndRecord, NextLevelRecord, FixRecord, FixVerifiedRecord,
    FixVerifyRecord, DependencyMoveRecord))


def parse_record(raw: dict[str, Any]) -> JournalRecord | None:
    """A journal line (not the header) as its record; None for a type this version does not know
    (a newer writer's). A known type that does not fit its model is a pydantic ValidationError."""
    if raw.get("type") not in RECORD_TYPES:
        return None
    return _JOURNAL_RECORD.validate_python(raw)


def _ran(trial: TrialRecord) -> bool:
    """A journaled trial that ran to an outcome: a probe trial with an observation, a command
    that was not skipped."""
    return bool(trial.observation or (trial.case_id == COMMAND_CASE and trial.outcome != VerdictKind.SKIP))


def trial_seconds(entries: Iterable[Record]) -> tuple[list[float], list[float]]:
    """The startup seconds of each engine start, and the run seconds (startup excluded) of each
    trial that ran to an outcome. What a session's costs are measured by."""
    ran = [e for e in entries if isinstance(e, TrialRecord) and _ran(e)]
    return [e.startup_s for e in ran if e.startup_s > 0], [e.seconds - e.startup_s for e in ran]
