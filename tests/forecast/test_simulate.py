"""Simulation: the real search against a seeded synthetic oracle, on numbers and on a real repo."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from bisect_npu.forecast.simulate import Minutes, simulate
from tests.helpers.gitrepo import make_linear_repo


def test_perfect_exact_search_is_right_and_within_log2():
    summary = simulate(300, 123, bad_rate=1.0, good_rate=0.0, mode="exact", runs=5, seed=0)
    assert summary.accuracy == 1.0
    assert summary.mean_trials <= math.ceil(math.log2(300)) + 2
    assert summary.mean_builds == summary.mean_trials  # every position its own build by default


def test_shared_build_keys_are_counted_once():
    summary = simulate(64, 40, bad_rate=1.0, good_rate=0.0, mode="exact", runs=3, seed=0,
                       build_key_of=lambda i: "before" if i < 32 else "after",
                       costs=Minutes(build=60, run=6))
    assert summary.mean_builds == 2
    assert summary.mean_machine_hours == pytest.approx((2 * 60 + summary.mean_trials * 6) / 60)


def test_told_build_groups_exact_mode_builds_less_and_costs_less():
    # A new compiled key every 12 commits: the midpoint keeps landing in groups nobody built.
    def key_of(i: int) -> str:
        return str(i // 12)

    figures = {}
    for told in (False, True):
        runs = [simulate(120, culprit, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1, build_key_of=key_of,
                         costs=Minutes(build=40, overlay=2, run=5), tell_build_groups=told)
                for culprit in range(1, 121, 3)]
        assert all(r.accuracy == 1.0 for r in runs)
        figures[told] = [sum(getattr(r, f) for r in runs) / len(runs)
                         for f in ("mean_builds", "mean_overlays", "mean_machine_hours", "mean_trials")]
    blind, told = figures[False], figures[True]
    assert told[0] < blind[0] - 0.5  # half a full build fewer on average, or better
    assert told[2] < 0.95 * blind[2]
    b, o, h, t = told
    assert h == pytest.approx((40 * b + 2 * o + 5 * t) / 60)


def test_build_failures_skip_but_stay_honest():
    summary = simulate(100, 50, bad_rate=1.0, good_rate=0.0, build_fail=0.3, mode="exact", runs=40, seed=1)
    assert summary.narrowed > 0
    assert summary.accuracy + summary.narrowed == pytest.approx(1.0)


def test_same_seed_same_summary_and_slots_cut_rounds():
    one = simulate(200, 10, bad_rate=0.9, good_rate=0.1, runs=8, seed=3)
    assert one == simulate(200, 10, bad_rate=0.9, good_rate=0.1, runs=8, seed=3)
    exact1 = simulate(500, 10, bad_rate=1.0, good_rate=0.0, mode="exact", runs=2, seed=0)
    exact7 = simulate(500, 10, bad_rate=1.0, good_rate=0.0, mode="exact", runs=2, seed=0, slots=7)
    assert exact7.mean_rounds < exact1.mean_rounds / 2
    assert exact7.mean_wall_hours < exact1.mean_wall_hours


def test_engine_starts_are_counted_and_priced():
    free = simulate(64, 20, bad_rate=0.8, good_rate=0.2, runs=10, seed=4, costs=Minutes(build=0.0, run=1.0))
    assert free.mean_loads == free.mean_trials  # one trial per query when starts cost nothing
    dear = simulate(64, 20, bad_rate=0.8, good_rate=0.2, runs=10, seed=4,
                    costs=Minutes(build=0.0, run=1.0, load=10.0))
    assert dear.mean_loads < dear.mean_trials / 3
    assert dear.mean_machine_hours == pytest.approx((dear.mean_trials + 10.0 * dear.mean_loads) / 60)
    assert dear.mean_machine_hours < (free.mean_trials * 11.0) / 60 / 2
    assert dear.accuracy >= 0.9


def test_each_bisection_reports_progress():
    seen = []
    simulate(40, [5, 30], bad_rate=1.0, good_rate=0.0, mode="exact", runs=3,
             on_run=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 6) for k in range(1, 7)]


def test_culprit_outside_the_range_is_rejected():
    with pytest.raises(ValueError):
        simulate(10, 11, bad_rate=1.0, good_rate=0.0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bisect_npu", *args], capture_output=True, text=True,
                          check=False)


@pytest.mark.e2e
def test_cli_on_a_real_repository(tmp_path):
    # Commits 10 and 30 touch csrc/: three build keys over the range.
    shas = make_linear_repo(tmp_path, 41, culprit=25,
                            files=lambda i: {"csrc/kernel.cpp": f"// {i}\n"} if i in (10, 30) else {})
    done = _cli("simulate", "--repo", str(tmp_path), "--good", shas[0], "--bad", shas[40],
                "--culprit", shas[25], "--bad-rate", "0.9", "--good-rate", "0.1", "--runs", "20")
    assert done.returncode == 0, done.stderr
    assert "40 candidates, culprit at position 25, 3 build keys, mode noisy" in done.stdout
    assert "accuracy:" in done.stdout and "full builds, mean:" in done.stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("simulated ")]
    assert progress == [f"simulated {k}/20 bisections" for k in range(2, 21, 2)]  # a line per tenth
    earlier = _cli("simulate", "--repo", str(tmp_path), "--good", shas[0], "--bad", shas[40],
                   "--culprit", shas[25], "--bad-rate", "0.9", "--good-rate", "0.1", "--runs", "20",
                   "--earlier-runs", "30")
    assert earlier.returncode == 0, earlier.stderr
    assert "mode noisy, rates 0.9/0.1, slots 1, 30 earlier runs per end" in earlier.stdout

    def mean_trials(out: str) -> float:
        return float(next(line for line in out.splitlines() if line.startswith("trials (runs), mean:")).split()[-1])

    assert mean_trials(earlier.stdout) < mean_trials(done.stdout)
    loads = _cli("simulate", "--repo", str(tmp_path), "--good", shas[0], "--bad", shas[40],
                 "--culprit", shas[25], "--bad-rate", "0.9", "--good-rate", "0.1", "--runs", "20",
                 "--load-cost-min", "20", "--run-cost-min", "1")
    assert loads.returncode == 0, loads.stderr
    starts = float(next(line for line in loads.stdout.splitlines()
                        if line.startswith("engine starts, mean:")).split()[-1])
    assert starts < mean_trials(loads.stdout) / 2


def test_cli_rejects_a_culprit_outside_the_range(tmp_path):
    shas = make_linear_repo(tmp_path, 12, culprit=5)
    done = _cli("simulate", "--repo", str(tmp_path), "--good", shas[4], "--bad", shas[11],
                "--culprit", shas[2])
    assert done.returncode == 2
    assert "not one of the 7 candidates" in done.stderr


def test_candidates_that_cannot_be_built_are_stepped_around_at_no_cost():
    free = simulate(32, list(range(1, 33)), bad_rate=1.0, good_rate=0.0, mode="exact", runs=1)
    holes = simulate(32, list(range(1, 33)), bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                     unbuildable=[10, 11, 12])
    assert free.accuracy == 1.0
    # Culprits 10..13 sit between 9 (testable, good) and 13 (testable, bad) with nothing testable
    # between: those narrow to (9, 13]; every other culprit is found.
    assert holes.accuracy == pytest.approx(28 / 32) and holes.narrowed == pytest.approx(4 / 32)
    assert holes.mean_builds <= free.mean_builds  # a missing Dockerfile costs no build
    with pytest.raises(ValueError, match="strictly between the ends"):
        simulate(32, 5, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1, unbuildable=[0])


def test_a_throughput_forecast_runs_the_sessions_sequential_steps():
    """A throughput regression searched per step (`search: per_step`) is forecast as such a session
    runs it: the good end's runs, then steps that stop when sure, in the likelihood search: right
    nearly always, and a clear drop costs fewer runs than a step's full count at every commit
    would, a drop near the line more."""
    from bisect_npu.forecast.simulate import Throughput
    from bisect_npu.oracle.sequential import REFERENCE_MIN_TRIALS

    clear = simulate(39, list(range(1, 40, 4)), bad_rate=1.0, good_rate=0.0, runs=10, seed=1000,
                     throughput=Throughput(drop=0.07, spread=0.02, search="per_step"),
                     costs=Minutes(build=30, run=5, load=2))
    assert clear.accuracy >= 0.95 and clear.ends_wrong == 0.0
    steps = clear.mean_trials - REFERENCE_MIN_TRIALS
    assert 6 <= steps < 5 * 6  # fewer than the 5-trial count over log2(40) steps
    assert clear.mean_loads > clear.mean_builds  # a step's later trials start the engine again
    near = simulate(39, list(range(1, 40, 4)), bad_rate=1.0, good_rate=0.0, runs=10, seed=1000,
                    throughput=Throughput(drop=0.045, spread=0.02, search="per_step"))
    assert near.mean_trials > clear.mean_trials


def test_a_throughput_forecast_in_levels_mode_runs_one_run_a_step():
    """The default search of a throughput session (levels mode): each round one run, an engine
    start each, right nearly always, and fewer runs than per-step trials at the same drop. Told
    what a build costs (as a session tells it, groups or not), its query weighs a new commit's
    build against another run of a built one, so it builds no more than per-step does, and where
    a build costs six runs its machine hours come out under per-step's."""
    from bisect_npu.forecast.simulate import Throughput

    culprits = list(range(1, 40, 4))
    costs = Minutes(build=30, run=5, load=2)
    levels = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=10, seed=1000,
                      throughput=Throughput(drop=0.07, spread=0.02), costs=costs)
    per_step = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=10, seed=1000,
                        throughput=Throughput(drop=0.07, spread=0.02, search="per_step"), costs=costs)
    assert levels.accuracy >= 0.95 and levels.ends_wrong == 0.0
    assert levels.mean_loads == levels.mean_trials == levels.mean_rounds  # one run a round, one slot
    assert levels.mean_trials < per_step.mean_trials
    assert levels.mean_builds < per_step.mean_builds + 0.5
    assert levels.mean_machine_hours < per_step.mean_machine_hours


def test_a_published_baseline_that_holds_shortens_the_levels_forecast():
    """A recipe's published baseline is the levels search's prior on the good side's level: the
    forecast as if it holds spends fewer runs, as right."""
    from bisect_npu.forecast.simulate import Throughput

    culprits = list(range(1, 40, 6))
    flat = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=4, seed=1000,
                    throughput=Throughput(drop=0.07, spread=0.02))
    published = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=4, seed=1000,
                         throughput=Throughput(drop=0.07, spread=0.02, baseline=1.0))
    assert published.accuracy >= 0.95 and published.ends_wrong == 0.0
    assert published.mean_trials < flat.mean_trials, (published, flat)


def test_a_throughput_forecast_tells_the_search_the_build_groups():
    """As a session with a keyed builder does (levels mode, a throughput session's default): told the
    groups, the search takes the built neighbour of an unbuilt midpoint and builds less, and is as
    right. Two sessions at culprit 100 show it (2.0 builds against 2.5 at seed 1000, as two at each of
    100 and 110 did, in half the time; two at 110 alone build 2.0 either way)."""
    from bisect_npu.forecast.simulate import Throughput

    def key_of(i: int) -> str:
        return "a" if i <= 60 else "c" if i <= 70 else "b"  # the midpoint 64 alone in group c

    runs = {told: simulate(128, [100], bad_rate=1.0, good_rate=0.0, runs=2, seed=1000, build_key_of=key_of,
                           throughput=Throughput(drop=0.07, spread=0.02), costs=Minutes(build=60, overlay=2, run=5),
                           tell_build_groups=told)
            for told in (False, True)}
    assert runs[True].accuracy == runs[False].accuracy == 1.0
    assert runs[True].mean_builds < runs[False].mean_builds


@pytest.mark.heavy  # two dozen simulated sessions
def test_the_failing_nightlys_result_shortens_the_levels_forecast_and_keeps_it_right():
    """`--nightly-result`: the failing nightly's throughput, one run of the bad side on the
    baseline's host, counted as a run at the bad end: fewer runs, as right."""
    from bisect_npu.forecast.simulate import Throughput

    culprits = list(range(1, 40, 6))
    published = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=4, seed=1000,
                         throughput=Throughput(drop=0.07, spread=0.02, baseline=1.0))
    nightly = simulate(39, culprits, bad_rate=1.0, good_rate=0.0, runs=4, seed=1000,
                       throughput=Throughput(drop=0.07, spread=0.02, baseline=1.0, nightly_result=True))
    assert nightly.accuracy >= 0.95 and nightly.ends_wrong == 0.0
    assert nightly.mean_trials < published.mean_trials, (nightly, published)
