"""The nightly's inputs read from the upstream's history: a case file at a commit (it changes
along history, so each candidate runs its own), and the good table's good end checked against
the clone and the commit's vLLM pin."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git
import yaml
from pydantic import ValidationError

from bisect_npu.errors import UsageError, validation_problem
from bisect_npu.nightly.cases import (
    CaseRef,
    case_names,
    import_case,
    import_notes,
    pick_benchmark,
    picked_case,
    read_case_file,
)
from bisect_npu.nightly.good_table import Frequency, GoodRow, Lookup, frequency_of, last_good, read_rows
from bisect_npu.nightly.outputs import OTT, nightly_throughput
from bisect_npu.nightly.soc import SCHEDULE_CONFIGS, soc_of
from bisect_npu.oracle.throughput import EarlierThroughput, ThroughputConfig
from bisect_npu.paths import cache_root
from bisect_npu.recipe.schema import Recipe
from bisect_npu.upstream import dockerfile, history


class CaseAbsent(UsageError):
    """The commit predates the case file (or the case in it)."""


def case_text_at(repo: git.Repo, sha: str, path: str) -> str:
    """The case file as the commit has it; a commit without it is a CaseAbsent saying so."""
    try:
        return str(repo.git.show(f"{sha}:{path}"))
    except git.GitCommandError:
        raise CaseAbsent(f"{path} does not exist at {sha[:12]}: the nightly case was added later or moved; "
                         "give a path the commit has") from None


def recipe_at(repo: git.Repo, sha: str, ref: CaseRef, datasets: str | None = None) -> Recipe:
    """The recipe of `ref` as the case file reads at `sha` (datasets: import_case's)."""
    raw = read_case_file(case_text_at(repo, sha, ref.file), f"{ref.file}@{sha[:12]}")
    if ref.case is not None and ref.case not in case_names(raw) and "test_cases" in raw:
        raise CaseAbsent(f"{ref.file} at {sha[:12]} has no case {ref.case!r} yet (its cases: "
                         f"{', '.join(case_names(raw))})")
    soc = soc_of(ref.file, schedules_at(repo, sha))
    recipe = import_case(raw, ref.file, ref.case, ref.benchmark, datasets, soc=soc)
    recipe.source = f"{ref}@{sha[:12]}"
    return recipe


def schedules_at(repo: git.Repo, sha: str) -> dict[str, str]:
    """The nightly's schedule configs as the commit has them, by path (those it has)."""
    found = {}
    for path in SCHEDULE_CONFIGS:
        try:
            found[path] = str(repo.git.show(f"{sha}:{path}"))
        except git.GitCommandError:
            continue
    return found


def newest_recipe_at(repo: git.Repo, sha: str, ref: CaseRef, datasets: str | None = None) -> tuple[Recipe, str]:
    """The case at `sha`, else (a case added after the regression, as most are) the clone's
    HEAD's: (recipe, the commit read)."""
    try:
        return recipe_at(repo, sha, ref, datasets), sha
    except CaseAbsent:
        head = repo.head.commit.hexsha
        if head == sha:
            raise
        return recipe_at(repo, head, ref, datasets), head


def recipe_dump(recipe: Recipe) -> str:
    """The recipe as a YAML file `--recipe` (and `recipes validate`) reads back."""
    body = recipe.model_dump(mode="json", exclude_defaults=True)
    return str(yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120))


NIGHTLY_RESULT_FORM = ("END=TOKENS_PER_S or END=PATH (END good or bad; PATH the nightly's benchmark_results JSON, "
                       "its folder or the checkout it ran in), e.g. bad=951.2")


@dataclass(frozen=True)
class CaseBenchmark:
    """The nightly case's benchmark as its JSON names it: the case's name, the benchmark's key and
    its entry (the task's name and test inputs come from it), and the model the case serves (the
    JSON's `model_name` tells several multi-node files apart)."""

    case: str
    key: str
    bench: dict[str, Any]
    model: str = ""

    @classmethod
    def at(cls, repo: git.Repo, sha: str, ref: CaseRef) -> CaseBenchmark:
        """The benchmark `ref` names, as the case file reads at `sha`."""
        raw = read_case_file(case_text_at(repo, sha, ref.file), f"{ref.file}@{sha[:12]}")
        case = picked_case(raw, ref.file, ref.case)
        key, bench = pick_benchmark(case, ref.benchmark, f"{ref.file}::{case.get('name')}")
        return cls(str(case.get("name")), key, bench, str(case.get("model") or raw.get("model") or ""))


def nightly_results(texts: list[str], benchmark: CaseBenchmark | None = None,
                    commits: dict[str, str | None] | None = None) -> tuple[EarlierThroughput | None, list[str]]:
    """`--nightly-result END=TOKENS_PER_S|PATH` (repeatable) as the recipe's
    `oracle.throughput.earlier_runs`, and a line for each value read from a file (which file, the
    model it says it served, and why when the path held several). A PATH is read for `benchmark`,
    run at `commits[END]`; the runs' `source` names each file with the model it says it served
    (the report shows it)."""
    ends: dict[str, list[float]] = {"good": [], "bad": []}
    sources, said = [], []
    for text in texts:
        end, equals, value = (part.strip() for part in text.partition("="))
        if not equals or end not in ends:
            raise UsageError(f"--nightly-result {text}: give {NIGHTLY_RESULT_FORM}")
        try:
            ends[end].append(float(value.removesuffix("token/s").removesuffix("tokens/s")))
            sources.append(f"{end}={value}")
            continue
        except ValueError:
            path = Path(value).expanduser()
        if not value or not (path.exists() or "/" in value or value.endswith(".json")) or benchmark is None:
            raise UsageError(f"--nightly-result {text}: {value or 'nothing'} is not a number of tokens/s nor a "
                             f"nightly's results ({NIGHTLY_RESULT_FORM})")
        read = nightly_throughput(path, benchmark.key, benchmark.bench, benchmark.case, (commits or {}).get(end),
                                  benchmark.model)
        ends[end].append(read.value)
        served = f"model_name {read.model}" if read.model else "no model_name: its model not checked"
        sources.append(f"{end}={read.file.resolve()} ({'; '.join(filter(None, (served, read.unknown_commit)))})")
        why = "; ".join(part for part in (served, read.why, read.unknown_commit) if part)
        said.append(f"--nightly-result {text}: {read.value} tokens/s ({OTT}) from {read.file} ({why})")
    if not texts:
        return None, []
    try:
        return EarlierThroughput(good=ends["good"], bad=ends["bad"],
                                 source=f"--nightly-result {'; '.join(sources)}"), said
    except ValidationError as exc:
        raise _refused(exc) from None


def _refused(exc: ValidationError) -> UsageError:
    """--nightly-result's values refused by the recipe's model, in one line."""
    return UsageError(f"--nightly-result: {validation_problem(exc)[1]}")


def write_recipe_at(repo: git.Repo, sha: str, ref: CaseRef, datasets: str | None = None,
                    earlier: EarlierThroughput | None = None) -> Path:
    """The bad end's recipe written where resume finds it again (named by its digest); `earlier`:
    the nightly's own throughput results (`--nightly-result`), the recipe's `earlier_runs`."""
    recipe, _ = newest_recipe_at(repo, sha, ref, datasets)
    if earlier is not None:
        recipe = with_earlier_runs(recipe, earlier, ref)
    folder = cache_root() / "nightly-recipes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{recipe.name}-{recipe.digest()}.yaml"
    path.write_text(f"# imported by bisect-npu from {ref} at {sha}\n" + recipe_dump(recipe), encoding="utf-8")
    return path


def performance(recipe: Recipe, ref: CaseRef) -> ThroughputConfig:
    """The recipe's throughput section: --nightly-result gives nothing to an accuracy benchmark."""
    if recipe.oracle.throughput is None:
        raise UsageError(f"--nightly-result gives a performance benchmark's throughput; --nightly-case {ref} is an "
                         "accuracy benchmark (give its results with --earlier-results)")
    return recipe.oracle.throughput


def with_earlier_runs(recipe: Recipe, earlier: EarlierThroughput, ref: CaseRef) -> Recipe:
    """The performance benchmark's recipe with `earlier` as its `oracle.throughput.earlier_runs`."""
    throughput = performance(recipe, ref)
    try:
        changed = ThroughputConfig.model_validate({**throughput.model_dump(), "earlier_runs": earlier.model_dump()})
    except ValidationError as exc:
        raise _refused(exc) from None
    return recipe.model_copy(update={"oracle": recipe.oracle.model_copy(update={"throughput": changed})})


@dataclass(frozen=True)
class GoodEnd:
    sha: str
    row: GoodRow
    note: str


def good_from_table(repo: git.Repo, table: Path, lookup: Lookup, frequency: Frequency | None) -> GoodEnd:
    """`--good last-good --good-table FILE`: the matching row's vllm-ascend commit, which must be
    in the clone; the note says how its recorded vLLM stands against the commit's own pin."""
    try:
        text = table.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise UsageError(f"--good-table {table}: cannot read it ({exc.strerror})") from None
    kind = frequency_of(str(table.resolve()))
    if frequency is not None and kind is not None and kind != frequency:
        raise UsageError(f"--good-table {table} is the {kind} table and --frequency is {frequency}: nightly and "
                         "weekly keep their own good commits; pass the other table")
    row = last_good(read_rows(text, str(table)), lookup, str(table))
    try:
        sha = history.resolve_ref(repo, row.vllm_ascend_commit)
    except UsageError:
        raise UsageError(f"{table}:{row.line}: the good row ({row.name}, {row.time}) records vllm-ascend "
                         f"{row.vllm_ascend_commit}, which is not in {repo.working_tree_dir}: fetch it (git fetch "
                         f"origin {row.vllm_ascend_commit}) or pass --good REF") from None
    pin = dockerfile.vllm_pin(repo, sha)
    note = f"--good last-good: {sha[:12]} from {table}:{row.line} ({row.name}, {row.status}, {row.time})"
    if row.vllm_commit and pin is not None:
        recorded = row.vllm_commit.lower()
        if pin.commit and not (pin.commit.startswith(recorded) or recorded.startswith(pin.commit)):
            note += (f"; the row ran vLLM {recorded[:12]} but the commit pins {pin}: each candidate runs at its "
                     "own pin")
        elif pin.commit is None:
            note += f"; the row ran vLLM {recorded[:12]}, the commit pins {pin} (each candidate runs at its own pin)"
        else:
            note += f"; its vLLM {recorded[:12]} is the commit's pin"
    return GoodEnd(sha, row, note)


@dataclass(frozen=True)
class NightlyRun:
    """What `run --nightly-case/--good-table` settle before the run starts."""

    recipe: str | None  # the bad end's imported recipe file, when --nightly-case
    good: str  # the good ref (the table's commit for `--good last-good --good-table`)
    notes: list[str]
    # Said before building, one line each: what --nightly-result read, what the host still owes the case.
    owed: list[str] = field(default_factory=list)


def settle_run(repo_path: str, bad: str, good: str, nightly_case: str | None, good_table: Path | None,
               name: str | None, config_yaml: str | None, soc: str | None, scene: str,
               frequency: Frequency | None, datasets: str | None = None,
               results: tuple[str, ...] = (), find_fix: bool = False) -> NightlyRun:
    """--nightly-case: the bad end's recipe, written out, with `results` (--nightly-result) as its
    earlier runs, each read for the commit of its end (`bad=`, the failing nightly's: the old end
    `good` under --find-fix); --good-table: the good end (the dimensions default to the case's name
    and file)."""
    repo = history.open_repo(repo_path)
    ref = CaseRef.parse(nightly_case) if nightly_case else None
    table_end = None
    if good_table is not None:
        if good != "last-good":
            raise UsageError("--good-table gives the good end: pass --good last-good with it (or drop --good-table)")
        if not soc:
            raise UsageError("--good-table needs --soc, the hardware generation of the table's rows (a2, a3)")
        lookup = Lookup(soc=soc.strip(), scene=scene, name=name or (ref.case if ref else None),
                        config_yaml=config_yaml or (ref.file if ref else None))
        table_end = good_from_table(repo, good_table, lookup, frequency)
    good_sha = table_end.sha if table_end else good
    if ref is None:
        return NightlyRun(None, good_sha, [table_end.note] if table_end else [])
    bad_sha = history.resolve_ref(repo, bad)
    recipe, read_at = newest_recipe_at(repo, bad_sha, ref, datasets)
    earlier: EarlierThroughput | None = None
    said: list[str] = []
    if results:
        performance(recipe, ref)
        old = None if good_sha == "last-good" else history.resolve_ref(repo, good_sha)
        ends = {"bad": old, "good": bad_sha} if find_fix else {"bad": bad_sha, "good": old}
        earlier, said = nightly_results(list(results), CaseBenchmark.at(repo, read_at, ref), ends)
    recipe_file = str(write_recipe_at(repo, bad_sha, ref, datasets, earlier))
    notes = [f"--nightly-case {ref}: the bad end's recipe is {recipe_file}; each candidate runs the case "
             "as its own commit has the file", *([table_end.note] if table_end else [])]
    owed = [f"--nightly-case {ref}: {note}" for note in import_notes(recipe, datasets)]
    return NightlyRun(recipe_file, good_sha, notes, [*said, *owed])


NIGHTLY_DIR = "tests/e2e/nightly"


def locate_case(repo: git.Repo, sha: str, case: str) -> str:
    """`FILE[::CASE]` as given, or a bare case name found in the commit's nightly case files."""
    if "::" in case or case.endswith((".yaml", ".yml")):
        return case
    paths = [p for p in str(repo.git.ls_tree("-r", "--name-only", sha, NIGHTLY_DIR)).splitlines()
             if p.endswith((".yaml", ".yml"))]
    found = []
    for path in paths:
        try:
            raw = read_case_file(case_text_at(repo, sha, path), path)
        except UsageError:
            continue
        names = [str(c.get("name")) for c in raw.get("test_cases") or [] if isinstance(c, dict)]
        found += [f"{path}::{case}"] if case in names else []
    if len(found) != 1:
        what = "no nightly case file has" if not found else f"{len(found)} case files have"
        raise UsageError(f"{what} a case named {case!r} at {sha[:12]}; name it as FILE::CASE")
    return found[0]
