"""`--slots N` under a settings search: the configurations ddmin asks in one round run at once, and
the search names the trigger it names one configuration at a time. The demo upstream, real
worktrees, one build shared by the slots, real forward passes; the probe runs are counted as they
start and end (the runs themselves are real)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.execute.local import LocalExecutor
from bisect_npu.recipe.settings import show
from tests.helpers.cli_exit import run_cli

pytestmark = pytest.mark.e2e

PARTNER_WAIT_S = 3.0  # how long a probe run waits for another to start beside it before it runs alone


def test_two_slots_run_two_configurations_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path / "upstream"
    truth = generate_upstream(repo, seed=0).case("async-penalty")
    assert truth.settings is not None
    in_flight, most = 0, 0
    changed = threading.Condition()
    probe = LocalExecutor.run_probe

    def counted(self: LocalExecutor, *args: Any, **kwargs: Any) -> Any:
        nonlocal in_flight, most
        with changed:
            in_flight += 1
            most = max(most, in_flight)
            changed.notify_all()
            changed.wait_for(lambda: in_flight >= 2, timeout=PARTNER_WAIT_S)
        try:
            return probe(self, *args, **kwargs)
        finally:
            with changed:
                in_flight -= 1

    monkeypatch.setattr(LocalExecutor, "run_probe", counted)
    sets = [part for key, value in truth.settings.good_set.items() for part in ("--good-set", f"{key}={show(value)}")]
    session = tmp_path / "session"
    code, out, err = run_cli(["settings", "--repo", str(repo), "--at", truth.bad_ref, "--recipe", truth.recipe, *sets,
                              "--slots", "2", "--session", str(session), "--no-verdict-store", "--json"], capsys)
    assert code == 0, out + err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["trigger"] == truth.settings.trigger
    assert most == 2  # two configurations' runs at once, never more than the slots
    entries = [json.loads(line) for line in (session / "settings.jsonl").read_text().splitlines()]
    digests = [e["digest"] for e in entries if e["type"] == "configuration"]
    assert len(digests) == len(set(digests))  # none run twice
    assert entries[0]["request"]["executor"]["slots"] == 2


def test_a_good_variant_run_first_as_the_reference_is_not_run_again_beside_the_bad_case(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rope-longseq compares with the good end's output: the good variant runs alone first, as every
    configuration's reference; the round of the ends that follows runs the bad case only."""
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path / "upstream"
    truth = generate_upstream(repo, seed=0).case("rope-longseq")
    session = tmp_path / "session"
    code, out, err = run_cli(["settings", "--repo", str(repo), "--at", truth.bad_ref, "--recipe", truth.recipe,
                              "--good-set", "cases[*].sampling.logprobs=3", "--slots", "2", "--session", str(session),
                              "--no-verdict-store", "--json"], capsys)
    assert code == 4, out + err[-3000:]  # a difference that changes no token: the recipe is good at the commit
    entries = [json.loads(line) for line in (session / "settings.jsonl").read_text().splitlines()]
    assert [e["configuration"] for e in entries if e["type"] == "configuration"] == [[], [0]]
