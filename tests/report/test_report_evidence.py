"""The report's evidence sentences: what the culprit's and its parent's trials showed, in words."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.level import CommitsLevel
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.records import CandidateRange, EndRecord, HeaderRecord
from bisect_npu.report import (
    SessionView,
    StepView,
    evidence_summary,
    host_line,
    render_json,
    render_markdown,
    switch_lines,
)
from bisect_npu.request import RunContext, RunRequest
from tests.helpers.npu_throughput import perf_recipe

NOISY = {"posterior": 0.995, "culprit_rate": 0.9, "culprit_rate_lo": 0.6, "culprit_rate_hi": 0.98,
         "culprit_trials": 10.0, "parent_rate": 0.1, "parent_rate_lo": 0.02, "parent_rate_hi": 0.4,
         "parent_trials": 10.0, "separation": 0.99965, "bad_rate_estimate": 0.8, "good_rate_estimate": 0.25,
         "trials": 60.0}


def view(figures: dict, *, find_fix: bool = False, steps: list[StepView] | None = None, status: str = "found",
         index: int = 2, recipe: Path | None = None, digest: str | None = None) -> SessionView:
    header = HeaderRecord(range=CandidateRange(kind="commits", good="b" * 40, bad="3" * 40, base="b" * 40,
                                               good_ref="good", bad_ref="bad",
                                               candidates=["1" * 40, "2" * 40, "3" * 40]),
                          request=RunRequest.of(good="good", bad="bad", find_fix=find_fix,
                                                recipe=str(recipe) if recipe else None),
                          level=CommitsLevel(), recipe_digest=digest)
    end = EndRecord(status=status, culprit="2" * 40, index=index, figures=figures)
    return SessionView(Path("."), header, steps or [], end, None, None)


def step(order: int, index: int, verdict: str) -> StepView:
    return StepView(order, index, str(index) * 40, "", verdict, "", 0.0, "", 0.0, 1, {}, [])


def test_noisy_evidence_counts_the_runs_that_show_the_symptom() -> None:
    lines = evidence_summary(view(NOISY))
    assert lines[0] == "the culprit: the symptom in 9 of 10 trials (90%; 95% interval 60%-98%)"
    assert lines[1] == f"its parent `{'1' * 12}`: the symptom in 1 of 10 trials (10%; 95% interval 2%-40%)"
    # 0.99965 is not certainty: never rounded up to 100.0%.
    assert lines[2] == ("P(the culprit shows the symptom more often than its parent, from their own trials) "
                        "= >99.9%")
    assert "first bad commit: 99.5%" in lines[3]
    assert "the symptom in 80% of runs after the change, 25% before" in lines[3]


def test_with_find_fix_the_figures_count_runs_without_the_symptom_and_the_words_say_so() -> None:
    """--find-fix searches for the first commit without the symptom: the search's "bad" runs are
    the clean ones, so 9 of 10 "bad" at the fixed commit is the symptom in 1 of 10."""
    lines = evidence_summary(view(NOISY, find_fix=True))
    assert lines[0] == "the fix: the symptom in 1 of 10 trials (10%; 95% interval 2%-40%)"
    assert lines[1] == f"its parent `{'1' * 12}`: the symptom in 9 of 10 trials (90%; 95% interval 60%-98%)"
    assert "P(the fix shows the symptom less often than its parent" in lines[2]
    assert "first fixed commit" in lines[3] and "the symptom in 20% of runs after the change, 75% before" in lines[3]


@pytest.mark.parametrize("tested", [2, 5])
def test_exact_evidence_names_the_bracketing_steps(tested: int) -> None:
    steps = [step(1, 3, "bad"), step(2, 2, "bad"), step(3, 1, "good")]
    lines = evidence_summary(view({"tested": float(tested)}, steps=steps))
    assert lines == ["**bad** at the culprit (step 2)", f"**good** at its parent `{'1' * 12}` (step 3)",
                     f"{tested} of 4 commits tested (the candidates and the good end)"]


def test_an_untested_parent_is_said_to_be_an_end_taken_as_given() -> None:
    lines = evidence_summary(view({"tested": 2.0}, steps=[step(1, 1, "bad")], index=1))
    assert lines[1] == f"its parent `{'b' * 12}` is an end taken as given, not tested (--no-check-ends)"


def test_ends_judged_wrong_in_noisy_mode_say_what_each_end_showed() -> None:
    figures = {"good_end_rate": 0.0, "good_end_rate_lo": 0.0, "good_end_rate_hi": 0.06, "good_end_trials": 64.0,
               "bad_end_rate": 0.0, "bad_end_rate_lo": 0.0, "bad_end_rate_hi": 0.06, "bad_end_trials": 64.0,
               "change_probability": 0.0004}
    lines = evidence_summary(view(figures, status="ends_wrong"))
    assert lines == ["the good end: the symptom in 0 of 64 trials (0%; 95% interval 0%-6%)",
                     "the bad end: the symptom in 0 of 64 trials (0%; 95% interval 0%-6%)",
                     "P(the two ends differ) = <0.1%"]


def test_an_untested_culprit_is_said_to_be_the_bad_end_taken_as_given() -> None:
    lines = evidence_summary(view({"tested": 1.0}, steps=[step(1, 1, "good")], index=2))
    assert lines[0] == "the culprit is the bad end, taken as given, not tested (--no-check-ends)"
    assert lines[1] == f"**good** at its parent `{'1' * 12}` (step 1)"


def ran(index: int, how: str, run_env: dict[str, str]) -> StepView:
    return StepView(index, index, str(index) * 40, "", "good", "", 0.0, how, 0.0, 1, {}, [], run_env=run_env)


def test_a_switch_on_in_every_step_is_said_once_and_a_mixed_one_is_a_warning() -> None:
    on = {"VLLM_BATCH_INVARIANT": "1"}
    assert switch_lines([ran(1, "built", on), ran(2, "overlay", on), ran(3, "failed", {})]) == [
        "`VLLM_BATCH_INVARIANT=1` (the candidate's own switch) in the runs of 2 of 2 steps"]
    mixed = switch_lines([ran(1, "built", on), ran(2, "reused", {}), ran(3, "journaled", {})])
    assert mixed[0].startswith("`VLLM_BATCH_INVARIANT=1` (the candidate's own switch) in the runs of 1 of 2 steps; ")
    assert "may be the switch, not a regression" in mixed[0]
    assert switch_lines([ran(1, "built", {})]) == []


def test_the_host_line_names_the_host_type_and_what_it_changed() -> None:
    plain = view({})
    assert host_line(plain) is None  # no --devices, no npu-smi: nothing to say
    header = plain.header.model_copy(update={"context": RunContext(host="A3"),
                                             "host_changes": {"build.dockerfile": "Dockerfile.a3"}})
    a3 = SessionView(Path("."), header, [], None, None, None)
    assert host_line(a3) == "NPU host type: A3; the recipe as this host ran it: `build.dockerfile: Dockerfile.a3`"


LEVELS = {"posterior": 0.995, "confidence_asked": 0.99, "good_mean": 1000.0, "bad_mean": 930.0, "runs": 14.0,
          "earlier_bad_runs": 1.0, "earlier_bad_mean": 951.2}


def test_the_nightly_evidence_counted_is_said_with_where_it_was_measured(tmp_path: Path) -> None:
    """The recipe's `earlier_runs.source` (for `--nightly-result`, each file with the model it
    served) follows the line of the runs it gave; not where the recipe changed since the session
    read it (it may name other runs), nor where it gives none."""
    source = "--nightly-result bad=/nightly/benchmark_results/speed-a2.json (model_name tiny)"
    recipe = perf_recipe(tmp_path / "perf.yaml", earlier_runs={"bad": [951.2], "source": source})
    digest = load_recipe(str(recipe)).digest()
    lines = evidence_summary(view(LEVELS, recipe=recipe, digest=digest))
    assert lines[-2:] == ["the failing nightly's 951 tokens/s counted as a run at the bad end (as far as the "
                          "baseline's host is this one: a value of another host costs runs, not the answer)",
                          f"where they were measured: {source}"]
    perf_recipe(recipe, earlier_runs={"bad": [951.2], "source": "another nightly"})
    assert not any("measured" in line for line in evidence_summary(view(LEVELS, recipe=recipe, digest=digest)))
    unsaid = perf_recipe(tmp_path / "unsaid.yaml", earlier_runs={"bad": [951.2]})
    lines = evidence_summary(view(LEVELS, recipe=unsaid, digest=load_recipe(str(unsaid)).digest()))
    assert lines[-1].startswith("the failing nightly's 951 tokens/s") and not any("measured" in x for x in lines)


def measured(order: int, index: int, *runs: float) -> StepView:
    """A levels-mode step at `index` with its runs' tokens/s, as the journal keeps them."""
    return StepView(order, index, str(index) * 40, "", "good", "", 0.0, "built", 0.0, len(runs),
                    {"throughput_samples": list(runs), "threshold": 0.97, "line": 970.0}, [])


def test_ends_judged_wrong_in_levels_mode_show_each_ends_runs_the_line_and_the_nightly(tmp_path: Path) -> None:
    """Exit 4 in levels mode ("the bad end is not under the good end's line"): the report's evidence
    gives each end's own runs (count, mean, spread), the line and P(under it), the published
    baseline, and the failing nightly's run with where it was measured, said not to be weighed in
    judging the ends, so a reader sees the nightly was slow where this host's bad end was not."""
    source = "--nightly-result bad=/nightly/benchmark_results/speed-a2.json (model_name tiny)"
    recipe = perf_recipe(tmp_path / "perf.yaml", baseline=1000.0, earlier_runs={"bad": [930.0], "source": source})
    steps = [measured(1, 0, 1000.0), measured(2, 3, 1050.0), measured(3, 0, 1010.0), measured(4, 3, 1040.0)]
    ended = view({"under_line": 0.0004, "earlier_bad_runs": 1.0, "earlier_bad_mean": 930.0}, status="ends_wrong",
                 steps=steps, recipe=recipe, digest=load_recipe(str(recipe)).digest())
    ended.session_dir = tmp_path
    report = render_markdown(ended)
    evidence = report[report.index("Evidence:"):].split("\n\n")[1].splitlines()
    assert evidence == [
        "- the good end: 2 runs, mean 1005.0 tokens/s, spread 7.1 (standard deviation; 1000.0-1010.0)",
        "- the bad end: 2 runs, mean 1045.0 tokens/s, spread 7.1 (standard deviation; 1040.0-1050.0)",
        "- the line: 0.97 x the good end's mean = 974.9 tokens/s; P(the bad end's mean is under it, from every run "
        "of the session) = <0.1%",
        "- the recipe's published baseline: 1000.0 tokens/s (the search's prior for the level without the symptom, "
        "as far as its host is this one; the line is drawn from the runs)",
        "- the failing nightly's 930 tokens/s at the bad end, not weighed in judging the ends (they are judged on "
        "this session's runs alone: an earlier run may be another host's)",
        f"- where they were measured: {source}"]


def test_a_fix_searchs_ends_judged_wrong_hold_the_old_end_to_the_new_ends_line(tmp_path: Path) -> None:
    """--find-fix in levels mode: the new end draws the line, the old end (the failing nightly's)
    should lie under it; one run says it has no spread; the nightly's runs are the end record's (as
    report.json's evidence), said whatever the recipe, and where they were measured only while the
    recipe is the one the session ran."""
    recipe = perf_recipe(tmp_path / "perf.yaml", earlier_runs={"bad": [930.0], "source": "nightly 12-05"})
    steps = [measured(1, 3, 1000.0), measured(2, 0, 1050.0), measured(3, 3, 990.0)]
    figures = {"under_line": 0.2, "earlier_bad_runs": 2.0, "earlier_bad_mean": 925.0}
    lines = evidence_summary(view(figures, find_fix=True, status="ends_wrong", steps=steps,
                                  recipe=recipe, digest=load_recipe(str(recipe)).digest()))
    assert lines[:3] == ["the old end: 1 run, 1050.0 tokens/s (one run: no spread of its own)",
                         "the new end: 2 runs, mean 995.0 tokens/s, spread 7.1 (standard deviation; 990.0-1000.0)",
                         "the line: 0.97 x the new end's mean = 965.1 tokens/s; P(the old end's mean is under it, "
                         "from every run of the session) = 20.0%"]
    assert lines[3].startswith("the recipe's published baseline")
    assert lines[4].startswith("the failing nightly's 2 runs averaging 925 tokens/s at the old end, not weighed")
    assert lines[5:] == ["where they were measured: nightly 12-05"]
    changed = evidence_summary(view(figures, find_fix=True, status="ends_wrong", steps=steps,
                                    recipe=recipe, digest="another"))
    assert changed == [*lines[:3], lines[4]]
    assert evidence_summary(view({"under_line": 0.2}, find_fix=True, status="ends_wrong", steps=steps,
                                 recipe=recipe, digest=load_recipe(str(recipe)).digest())) == lines[:4]


@pytest.mark.parametrize("disagreeing", [True, False])
def test_a_narrowed_range_says_whether_its_steps_disagree_or_were_skipped(tmp_path: Path, disagreeing: bool) -> None:
    """A likelihood search whose culprit its parent's spent steps contradict names the range its
    steps agree on: the report says the steps disagree, not that commits were skipped."""
    narrowed = view({"disagreeing_culprit": 3.0} if disagreeing else {}, status="narrowed")
    narrowed.end = EndRecord(status="narrowed", lo="b" * 40, hi="3" * 40, lo_index=0, hi_index=3,
                             figures=narrowed.end.figures)
    narrowed.session_dir = tmp_path
    report = render_markdown(narrowed)
    assert ("the steps in it disagree with each other" in report) is disagreeing
    assert ("could not be tested (skipped)" in report) is not disagreeing


def test_a_best_guess_below_the_confidence_is_named_inside_its_range_in_both_reports(tmp_path: Path) -> None:
    """A likelihood search that stopped below the confidence asked answers with the range that
    holds it (narrowed): report.md names the best guess and its evidence, report.json carries it
    beside the range, and no culprit is given as found."""
    figures = {"posterior": 0.93, "culprit_log_lr": 8.5, "parent_log_lr": -2.6, "steps": 15.0, "best_guess": 2.0,
               "range_posterior": 0.9998}
    guessed = view(figures, status="narrowed")
    guessed.end = EndRecord(status="narrowed", lo="1" * 40, hi="3" * 40, lo_index=1, hi_index=3, best_guess="2" * 40,
                            figures=figures)
    guessed.session_dir = tmp_path
    assert evidence_summary(guessed) == [
        "the best guess: log likelihood ratio +8.5 for the bad side over its steps",
        f"its parent `{'1' * 12}`: -2.6 (0 at an end: the reference)",
        "posterior that this is the first bad commit: 93.0% after 15 steps"]
    report = render_markdown(guessed)
    assert (f"**The culprit is one of the 2 commits in (`{'1' * 12}`, `{'3' * 12}`]**: no commit reached the "
            f"confidence asked; the best guess is `{'2' * 12}`") in report
    assert "posterior that this is the first bad commit: 93.0% after 15 steps" in report
    assert "could not be tested (skipped)" not in report and "the steps in it disagree" not in report
    summary = render_json(guessed)
    assert summary["status"] == "narrowed" and summary["culprit"] is None
    assert summary["best_guess"] == "2" * 40 and summary["range"] == ["1" * 40, "3" * 40]
