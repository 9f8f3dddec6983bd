"""The ends' evaluations the user already made, taken instead of running the whole dataset there.

A user who reports a score drop has run the harness at both ends: that is how they know. Their
per-sample results (the command harness's lines, lm-eval's samples JSONL, AISBench's output
directory) are read with the harness's own readers and checked against the recipe: the commit
each ran on, the harness, the dataset's sample ids, the sampling. Then a small control share of
the dataset is run again at the end; when it agrees, the earlier results stand for the end. Any
difference is said in one line and the end runs the whole dataset, as without them.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bisect_npu.errors import UsageError
from bisect_npu.nightly.outputs import aisbench_run, check_nightly_model, nightly_differences, read_run
from bisect_npu.observations import SampleOutcome
from bisect_npu.oracle.accuracy.samples import SampleFormatError, read_samples_jsonl
from bisect_npu.oracle.accuracy.stats import pool
from bisect_npu.probe.harness import HarnessError, dataset, lm_eval
from bisect_npu.recipe.schema import AccuracySpec, EarlierEndSpec, EarlierResultsSpec, Recipe

MIN_CONTROL = 5  # control samples at least: fewer says nothing
FIRST_STAGE = 2  # control samples run first at least: when every one agrees, the rest is not run
ROLES = {"good": "good_end", "bad": "bad_end"}  # --earlier-results END: the session's role of that end
FORM = "END=COMMIT:PATH (END good or bad, COMMIT the sha the run was made at), e.g. good=86797d44a7:runs/good.jsonl"
WRITES = {"command": "the JSONL file your program wrote",
          "lm_eval": "lm-eval's samples_*.jsonl or its --output_path directory",
          "aisbench": "AISBench's run directory (a TIMESTAMP directory with results/ in it), the directory above it, "
                      "or the vllm-ascend checkout a nightly ran in (its outputs/default and benchmark_results)"}
_SHA = re.compile(r"[0-9a-fA-F]{7,40}")


@dataclass(frozen=True)
class Earlier:
    """One end's earlier results, or why they are set aside (`samples` None)."""

    samples: list[SampleOutcome] | None
    source: str
    why_not: str = ""


def parse_given(text: str) -> tuple[str, EarlierEndSpec]:
    """One `--earlier-results END=COMMIT:PATH` as (the end's role, its results). A ref name cannot
    hold a ':', so the path after the first one may hold anything."""
    end, equals, rest = text.partition("=")
    commit, colon, path = rest.partition(":")
    if not equals or not colon or not path.strip():
        raise UsageError(f"--earlier-results {text}: give {FORM}")
    if end.strip() not in ROLES:
        raise UsageError(f"--earlier-results {text}: {end.strip() or 'nothing'} before '=' is not an end; name the "
                         f"end the results are of, good or bad ({FORM})")
    if not _SHA.fullmatch(commit.strip()):
        raise UsageError(f"--earlier-results {text}: {commit.strip() or 'nothing'} is not a commit sha; give the sha "
                         "(7 to 40 hex digits) the run was made at, as `git rev-parse` prints it")
    return ROLES[end.strip()], EarlierEndSpec(path=path.strip(), commit=commit.strip().lower())


def given_ends(texts: Sequence[str]) -> dict[str, EarlierEndSpec]:
    """The ends' results `--earlier-results` gives, by role (each end at most once)."""
    ends: dict[str, EarlierEndSpec] = {}
    for text in texts:
        role, end = parse_given(text)
        if role in ends:
            raise UsageError(f"--earlier-results names the {role.replace('_', ' ')} twice; give each end once")
        ends[role] = end
    return ends


def settled_given(texts: Sequence[str]) -> list[str]:
    """`--earlier-results` as the session keeps it: each path absolute (resume may start elsewhere)."""
    settled = []
    for text in texts:
        role, end = parse_given(text)
        name = next(name for name, named in ROLES.items() if named == role)
        settled.append(f"{name}={end.commit}:{Path(end.path).expanduser().resolve()}")
    return settled


def check_given(texts: Sequence[str], recipe: Recipe | None) -> None:
    """`--earlier-results` before anything runs: an accuracy recipe to judge with, and each path
    there and readable as the recipe's harness writes it (a UsageError naming the cause). What it
    says against the session (another commit, other sample ids) is no error: that end runs whole."""
    ends = given_ends(texts)
    if not ends:
        return
    if recipe is None or recipe.accuracy is None:
        raise UsageError("--earlier-results gives an accuracy harness's per-sample results: it needs a recipe with "
                         "an accuracy section (oracle kinds [accuracy]); drop it for this recipe or command")
    harness = recipe.accuracy.harness
    try:
        ids: list[str] | None = dataset_ids(recipe)
    except (HarnessError, OSError):
        ids = None  # the dataset is not on this host: the end reads them when it runs
    for text in texts:
        path = Path(parse_given(text)[1].path)
        if not path.exists():
            raise UsageError(f"--earlier-results {text}: {path} does not exist; give {WRITES[harness]} (harness "
                             f"{harness}, the recipe's)")
        if ids is None:
            continue
        try:
            read_earlier(harness, path, ids)
        except (SampleFormatError, HarnessError, OSError) as exc:
            raise UsageError(f"--earlier-results {text}: {path} is not what harness {harness} (the recipe's) writes "
                             f"({exc}); give {WRITES[harness]}") from None


def check_models(recipe: Recipe, texts: Sequence[str] = ()) -> None:
    """Each end's AISBench results (`--earlier-results` `texts`, else the recipe's
    `earlier_results`) from a nightly whose benchmark JSON names another model than the case's,
    refused before anything runs, named as given (`check_nightly_model`): another case's run is
    never this end's, where another commit's only sets the results aside. A path not there is left
    to the end's step, which says so."""
    spec, settings = recipe.accuracy, earlier_settings(recipe, given_ends(texts))
    if spec is None or settings is None:
        return
    flags = {parse_given(text)[0]: f"--earlier-results {text}" for text in texts}
    for role, end in (("good_end", settings.good), ("bad_end", settings.bad)):
        if end is None or (end.harness or spec.harness) != "aisbench":
            continue
        path = _beside(recipe, end.path)
        if not path.exists():
            continue
        try:
            check_nightly_model(path, recipe)
        except UsageError as exc:
            named = flags.get(role, f"the recipe's earlier_results.{role.removesuffix('_end')}")
            raise UsageError(f"{named}: {exc}") from None


def earlier_settings(recipe: Recipe, given: Mapping[str, EarlierEndSpec] | None = None) -> EarlierResultsSpec | None:
    """The recipe's `accuracy.earlier_results` with each end `given` (by role) in its place."""
    spec = recipe.accuracy
    if spec is None:
        return None
    if not given:
        return spec.earlier_results
    base = spec.earlier_results or EarlierResultsSpec()
    return base.model_copy(update={"good": given.get("good_end", base.good), "bad": given.get("bad_end", base.bad)})


def earlier_for(recipe: Recipe, role: str, commit: str,
                given: Mapping[str, EarlierEndSpec] | None = None) -> Earlier | None:
    """The earlier results of the end in `role` at `commit` (`given` by --earlier-results, else the
    recipe's), checked against the recipe; None when neither gives any for that end."""
    spec, settings = recipe.accuracy, earlier_settings(recipe, given)
    if spec is None or settings is None or role not in ("good_end", "bad_end"):
        return None
    end = settings.good if role == "good_end" else settings.bad
    if end is None:
        return None
    path = _beside(recipe, end.path)
    differs = _differences(spec, end, commit)
    if (end.harness or spec.harness) == "aisbench":
        differs += nightly_differences(path, recipe, commit)
    if differs:
        return Earlier(None, str(path), "; ".join(differs))
    try:
        ids = dataset_ids(recipe)
        samples = read_earlier(end.harness or spec.harness, path, ids)
    except (SampleFormatError, HarnessError, OSError) as exc:
        return Earlier(None, str(path), f"cannot be read ({exc})")
    got = {s.id for s in samples}
    missing, extra = [i for i in ids if i not in got], sorted(got - set(ids))
    if missing or extra:
        said = [f"{len(missing)} dataset samples missing (first {missing[0]})" if missing else "",
                f"{len(extra)} samples not in the dataset (first {extra[0]})" if extra else ""]
        return Earlier(None, str(path), "the sample ids differ from the dataset's: " + ", ".join(filter(None, said)))
    return Earlier(samples, str(path))


def _differences(spec: AccuracySpec, end: EarlierEndSpec, commit: str) -> list[str]:
    """What the earlier run says it was that this session's end is not."""
    said = []
    if not commit.startswith(end.commit.lower()):
        said.append(f"they ran at {end.commit}, this end is {commit[:12]}")
    if end.harness is not None and end.harness != spec.harness:
        said.append(f"they come from harness {end.harness}, the recipe's is {spec.harness}")
    if end.sampling is not None:
        ours = spec.sampling.model_dump()
        for key, value in sorted(end.sampling.items()):
            if key in ours and ours[key] is not None and ours[key] != value:
                said.append(f"sampling {key} was {value}, the recipe's is {ours[key]}")
    return said


def read_earlier(harness: str, path: Path, ids: list[str]) -> list[SampleOutcome]:
    """One end's per-sample outcomes from the harness's own output (its own reader, as a trial's)."""
    if harness == "command":
        return read_samples_jsonl(path)
    if not path.exists():
        raise HarnessError(f"{path} does not exist")
    if harness == "aisbench":
        rows = read_run(aisbench_run(path), ids)
    else:  # lm_eval reads `<work>/output/**/samples_*.jsonl`: the file or directory is laid there
        with tempfile.TemporaryDirectory(prefix="bisect-npu-earlier-") as work:
            os.makedirs(os.path.join(work, "output"))
            link = os.path.join(work, "output", "samples_earlier.jsonl" if path.is_file() else "run")
            os.symlink(path.resolve(), link)
            try:
                rows = lm_eval.read_samples(work, ids)
            except HarnessError as exc:  # said of the path given, not of the link
                raise HarnessError(str(exc).replace(link, str(path)).replace(os.path.join(work, "output"), str(path))) \
                    from None
    return pool([SampleOutcome.model_validate(row) for row in rows])


def dataset_ids(recipe: Recipe) -> list[str]:
    """The sample ids of the recipe's dataset, in order, as many as `limit` keeps."""
    spec = recipe.accuracy
    assert spec is not None
    rows = dataset.read_rows(str(spec.dataset_path(recipe.source)))
    ids = [dataset.sample_id(row, index) for index, row in enumerate(rows)]
    return ids[:spec.limit] if spec.limit else ids


def control_ids(ids: Sequence[str], share: float, commit: str) -> list[str]:
    """The control share of the dataset for the end at `commit`: a fixed pseudo-random choice (the
    same on a resume), in dataset order."""
    chosen = {i for stage in control_stages(ids, share, commit) for i in stage}
    return [i for i in ids if i in chosen]


def control_stages(ids: Sequence[str], share: float, commit: str) -> list[list[str]]:
    """The control share in the order it runs, each stage in dataset order: half of its samples,
    rounded down (``FIRST_STAGE`` at least), then the rest, run only when one of the first
    differs (`control_standing`). Rounded down: the first stage is what every end with results
    that stand pays, the second only an end whose first samples differ."""
    count = min(len(ids), max(MIN_CONTROL, math.ceil(share * len(ids))))
    drawn = sorted(ids, key=lambda i: hashlib.sha256(f"{commit}:{i}".encode()).hexdigest())[:count]
    first = max(FIRST_STAGE, count // 2)
    stages = [set(drawn[:first]), set(drawn[first:])]
    return [[i for i in ids if i in stage] for stage in stages if stage]


def control_standing(earlier: Sequence[SampleOutcome], control: Sequence[SampleOutcome], max_disagreement: float,
                     complete: bool) -> bool | None:
    """Whether the earlier results stand after the control samples run so far: yes when none of
    them differs, or once the whole control share ran, when at most `max_disagreement` of it does;
    None while a stage is left to run. The first stage, half the share, must agree on every
    sample: against results of another run, whose samples each agree by chance, that is about
    as strict as the whole share's `max_disagreement`; it lets through what the whole share
    would set aside only when every differing sample is among those it did not run."""
    differ, of = disagreement(earlier, control)
    if differ == 0 and of > 0:
        return True
    if not complete:
        return None
    return differ <= max_disagreement * of


def disagreement(earlier: Sequence[SampleOutcome], control: Sequence[SampleOutcome]) -> tuple[int, int]:
    """(control samples whose outcome differs from the earlier one's by more than half, control samples)."""
    before = {s.id: s.correct for s in earlier}
    differ = sum(1 for s in control if s.id in before and abs(before[s.id] - s.correct) > 0.5)
    return differ, len(control)


def _beside(recipe: Recipe, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and recipe.source and not recipe.source.startswith("<"):
        path = Path(recipe.source).resolve().parent / path
    return path
