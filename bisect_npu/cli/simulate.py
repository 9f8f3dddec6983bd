"""`bisect-npu simulate`: replay the real search over a real range with a synthetic oracle."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Literal

import click

from bisect_npu.cli.params import FiniteRange


@click.command()
@click.option("--repo", default=".", show_default=True, help="Path or URL of the upstream repository.")
@click.option("--good", required=True, help="A ref where the model behaves.")
@click.option("--bad", required=True, help="A ref where it misbehaves.")
@click.option("--culprit", required=True, help="The commit the synthetic oracle treats as the first bad one.")
@click.option("--bad-rate", type=FiniteRange(0, 1), default=1.0, show_default=True,
              help="Failure rate of a trial at or after the culprit.")
@click.option("--good-rate", type=FiniteRange(0, 1), default=0.0, show_default=True,
              help="Failure rate of a trial before the culprit.")
@click.option("--build-fail", type=FiniteRange(0, 1), default=0.0, show_default=True,
              help="Chance that a candidate does not build (it is skipped).")
@click.option("--slots", type=click.IntRange(1), default=1, show_default=True,
              help="Candidates tested at once (devices or executors).")
@click.option("--runs", type=click.IntRange(1), default=200, show_default=True, help="Bisections to simulate.")
@click.option("--build-cost-min", type=FiniteRange(0), default=30.0, show_default=True,
              help="Minutes per full build: the first commit tested with a build key (the search weighs "
                   "it, as a session does).")
@click.option("--overlay-cost-min", type=FiniteRange(0), default=2.0, show_default=True,
              help="Minutes per python overlay: a commit whose build key has a built image.")
@click.option("--run-cost-min", type=FiniteRange(0, min_open=True), default=5.0, show_default=True,
              help="Minutes per trial once the engine runs.")
@click.option("--load-cost-min", type=FiniteRange(0), default=0.0, show_default=True,
              help="Minutes per engine start (model load); a query's trials share one start, so noisy "
                   "mode asks several trials per query when this is above 0.")
@click.option("--earlier-runs", type=click.IntRange(0), default=0, show_default=True,
              help="Runs of each end made before the session (noisy mode counts them; a recipe's "
                   "trials.earlier_runs).")
@click.option("--dockerfile", default="Dockerfile", show_default=True,
              help="The Dockerfile that builds the images (a recipe's build.dockerfile): it is part of the keys.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="Seed of the simulated trials (a whole number >= 0).")
@click.option("--mode", type=click.Choice(["exact", "noisy"]), default=None,
              help="Search mode; default: exact for a perfect test (rates 1/0), else noisy.")
@click.option("--throughput-drop", type=FiniteRange(0, 1, min_open=True, max_open=True), default=None,
              help="Forecast a throughput regression instead of the rates: the culprit's drop as a share "
                   "(0.07: -7%), searched as a session searches it (--throughput-search).")
@click.option("--throughput-spread", type=FiniteRange(0, 1, min_open=True), default=0.02, show_default=True,
              help="With --throughput-drop: one run's spread as a share of the mean.")
@click.option("--threshold", type=FiniteRange(0, 1, min_open=True, max_open=True), default=0.97,
              show_default=True, help="With --throughput-drop: the recipe's oracle.throughput.threshold.")
@click.option("--trials", type=click.IntRange(1), default=5, show_default=True,
              help="With --throughput-drop and --throughput-search per-step: a step's most trials "
                   "(trials.count; the good end 4 x).")
@click.option("--throughput-search", type=click.Choice(["levels", "per-step"]), default="levels",
              show_default=True,
              help="With --throughput-drop: the session's search, the recipe's oracle.throughput.search (levels: "
                   "one run a step, every run weighed together; per-step: each step's trials stopped when sure).")
@click.option("--published-baseline", is_flag=True,
              help="With --throughput-drop and levels: the recipe publishes oracle.throughput.baseline, a prior on "
                   "the good side's level (forecast as if it holds).")
@click.option("--nightly-result", is_flag=True,
              help="With --throughput-drop and levels: the recipe gives the failing nightly's throughput "
                   "(oracle.throughput.earlier_runs.bad), a run at the bad end on the baseline's host (forecast as "
                   "if that host is this one).")
def simulate(repo: str, good: str, bad: str, culprit: str, bad_rate: float, good_rate: float,
             build_fail: float, slots: int, runs: int, build_cost_min: float, overlay_cost_min: float,
             run_cost_min: float,
             load_cost_min: float, earlier_runs: int, dockerfile: str, seed: int,
             mode: Literal["exact", "noisy"] | None, throughput_drop: float | None, throughput_spread: float,
             threshold: float, trials: int, throughput_search: str, published_baseline: bool,
             nightly_result: bool) -> None:
    """Expected runs, builds, accuracy and hours of bisecting GOOD..BAD when CULPRIT is the answer."""
    from bisect_npu import api

    with _progress() as on_run:
        answer = api.simulate(repo, good, bad, culprit, bad_rate=bad_rate, good_rate=good_rate, build_fail=build_fail,
                              slots=slots, runs=runs, build_cost_min=build_cost_min,
                              overlay_cost_min=overlay_cost_min, run_cost_min=run_cost_min,
                              load_cost_min=load_cost_min, earlier_runs=earlier_runs, dockerfile=dockerfile,
                              seed=seed, mode=mode, on_run=on_run,
                              throughput_drop=throughput_drop, throughput_spread=throughput_spread,
                              threshold=threshold, trials=trials,
                              throughput_search="levels" if throughput_search == "levels" else "per_step",
                              published_baseline=published_baseline, nightly_result=nightly_result)
    heading = (f"{answer.candidates} candidates, culprit at position {answer.position}, "
               f"{answer.build_keys} build keys, mode {answer.mode}, "
               + (f"rates {bad_rate}/{good_rate}" if throughput_drop is None else
                  f"throughput -{throughput_drop:.0%} (spread {throughput_spread:.0%})") + f", slots {slots}"
               + (f", {earlier_runs} earlier runs per end" if earlier_runs else "")
               + (f", {answer.unbuildable} without {dockerfile} (skipped)" if answer.unbuildable else ""))
    if answer.merge_base_note:
        click.echo(answer.merge_base_note)
    rows = answer.rows
    if not sys.stdout.isatty():
        click.echo(heading)
        for label, value in rows.items():
            click.echo(f"{label}: {value}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=heading)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for label, value in rows.items():
        table.add_row(label, value)
    Console().print(table)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[int, int], None]]:
    """Bisections done so far, on stderr: a live bar on a terminal, a line per tenth otherwise
    (a noisy simulation of a long range takes seconds per bisection)."""
    if sys.stderr.isatty():
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("simulating", total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    shown: set[int] = set()

    def line(done: int, total: int) -> None:
        tenth = done * 10 // total
        if tenth not in shown and tenth > 0:
            shown.add(tenth)
            click.echo(f"simulated {done}/{total} bisections", err=True)

    yield line
