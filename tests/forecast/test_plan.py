"""`bisect-npu plan`: a range resolved and priced on a real repository, nothing run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bisect_npu import api
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import make_linear_repo

N = 120
COMPILED_AT = range(7, N, 13)  # a new compiled key every 13 commits, as on vllm-ascend (1 in ~17)
CANN_UPGRADE = 59  # one of them moves the Dockerfile to a newer CANN base and vLLM, as #2036 did
DOCKERFILE = "FROM quay.io/ascend/cann:{cann}-910b-ubuntu22.04-py3.11\nARG VLLM_TAG={vllm}\n"


def files(i: int) -> dict[str, str]:
    if i not in COMPILED_AT:
        return {}
    changed = {"csrc/kernel.cpp": f"// {i}\n"}
    if i in (COMPILED_AT[0], CANN_UPGRADE):
        cann, vllm = ("8.1.rc1", "v0.9.0") if i < CANN_UPGRADE else ("8.2.rc1", "v0.9.1")
        changed["Dockerfile"] = DOCKERFILE.format(cann=cann, vllm=vllm)
    return changed


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("plan") / "repo"
    return path, make_linear_repo(path, N + 1, culprit=60, tags={0: "good", N: "bad"}, files=files)


@pytest.fixture(scope="module")
def repo(upstream: tuple[Path, list[str]]) -> Path:
    return upstream[0]


def plan(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`bisect-npu plan` in this process: these tests read what it prints and its exit code."""
    return cli_in_process(["plan", "--repo", str(repo), *args])


def midpoint_figures(build_min: float, overlay_min: float, run_min: float,
                     culprits: list[int]) -> tuple[float, float]:
    """Plain bisection over the same history, counted by hand: mean full builds and hours."""
    def key(i: int) -> int:
        return sum(1 for c in COMPILED_AT if c <= i)

    builds, minutes = [], []
    for culprit in culprits:
        built = {key(0), key(N)}
        cost = len(built) * build_min + 2 * run_min
        lo, hi = 0, N
        while hi - lo > 1:
            x = (lo + hi) // 2
            cost += run_min + (overlay_min if key(x) in built else build_min)
            built.add(key(x))
            lo, hi = (lo, x) if x >= culprit else (x, hi)
        builds.append(len(built))
        minutes.append(cost)
    return sum(builds) / len(builds), sum(minutes) / len(minutes) / 60


def test_plan_prices_the_range_and_beats_the_midpoint(repo: Path) -> None:
    done = plan(repo, "--good", "good", "--bad", "bad", "--json", "--build-minutes", "40")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["candidates"] == N
    assert summary["build_keys"] == len(COMPILED_AT) + 1
    assert sum(group["commits"] for group in summary["build_groups"]) == N
    midpoint = summary["midpoint"]
    assert summary["expected"]["culprits"] == midpoint["culprits"] == 64
    spread = sorted({1 + (i * (N - 1)) // 63 for i in range(64)})  # 64 culprits spread over 1..N
    builds, hours = midpoint_figures(40, 2, 5, spread)
    assert midpoint["full_builds"] == pytest.approx(builds, abs=0.01)
    assert midpoint["hours"] == pytest.approx(hours, abs=0.01)
    expected = summary["expected"]
    assert expected["full_builds"] < midpoint["full_builds"]
    assert expected["hours"] < midpoint["hours"]


def test_plan_names_what_each_build_group_is_made_of(upstream: tuple[Path, list[str]]) -> None:
    path, shas = upstream
    summary = json.loads(plan(path, "--good", "good", "--bad", "bad", "--json").stdout)
    made_of = {shas.index(g["first"]): (g["base_image"], g["vllm_tag"]) for g in summary["build_groups"]}
    assert made_of[1] == ("", "")  # no Dockerfile yet
    assert made_of[COMPILED_AT[0]] == ("quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.11", "v0.9.0")
    assert made_of[CANN_UPGRADE] == ("quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11", "v0.9.1")
    assert made_of[max(made_of)] == made_of[CANN_UPGRADE]
    text = plan(path, "--good", "good", "--bad", "bad").stdout
    assert f"commits from {shas[CANN_UPGRADE][:12]} (FROM quay.io/ascend/cann:8.2.rc1" in text
    assert "vLLM v0.9.1)" in text


def test_plan_text_and_a_bad_ref(repo: Path) -> None:
    done = plan(repo, "--good", "good", "--bad", "bad")
    assert done.returncode == 0, done.stderr
    assert f"candidates: {N} first-parent commits" in done.stdout
    assert "plain midpoint bisection:" in done.stdout and "full builds" in done.stdout
    wrong = plan(repo, "--good", "v0.9.0", "--bad", "bad")
    assert wrong.returncode == 2
    assert "v0.9.0" in wrong.stderr


def test_plan_warns_about_candidates_without_the_dockerfile(upstream: tuple[Path, list[str]]) -> None:
    path, shas = upstream
    summary = json.loads(plan(path, "--good", "good", "--bad", "bad", "--json").stdout)
    assert summary["lacking_dockerfile"] == COMPILED_AT[0] - 1  # the Dockerfile arrives with commit 7
    a3 = plan(path, "--good", "good", "--bad", "bad", "--dockerfile", "Dockerfile.a3")
    assert a3.returncode == 0, a3.stderr
    assert (f"warning: {N} of {N} candidates have no Dockerfile.a3 (from {shas[1][:12]} to {shas[N][:12]})"
            in a3.stdout)
    assert "warning: the good end has no Dockerfile.a3: `run --executor docker` refuses this range" in a3.stdout
    assert summary["ends_lacking_dockerfile"] == ["good"]  # the Dockerfile arrives with commit 7
    # From commit 7 on both ends have it; a candidate without it would be a skip the search steps around.
    inside = json.loads(plan(path, "--good", shas[COMPILED_AT[0]], "--bad", "bad", "--json").stdout)
    assert inside["ends_lacking_dockerfile"] == [] and inside["lacking_dockerfile"] == 0


def test_the_library_plan_is_what_the_command_prints(repo: Path) -> None:
    import git

    from bisect_npu.forecast.plan import plan_range

    result = plan_range(git.Repo(repo), "good", "bad", build_minutes=30, overlay_minutes=2, run_minutes=5)
    assert sum(group.commits for group in result.groups) == N and len(result.groups) == len(COMPILED_AT) + 1
    printed = json.loads(plan(repo, "--good", "good", "--bad", "bad", "--json").stdout)
    assert api.plan(repo, "good", "bad").to_json() == printed
    assert {**result.to_json(), "find_fix": False, "warning": None} == printed


def test_a_command_run_is_planned_as_checkouts_without_builds_or_made_up_costs(repo: Path) -> None:
    """A 4-second `--cmd` run was priced as image builds at 30 min each (hours for seconds of work)."""
    text = plan(repo, "--good", "good", "--bad", "bad", "--cmd", "grep -qx good state")
    assert text.returncode == 0, text.stderr
    assert f"candidates: {N} first-parent commits" in text.stdout
    assert "nothing is built" in text.stdout and "give --run-minutes for hours" in text.stdout
    assert "key " not in text.stdout and "build keys" not in text.stdout
    assert "min/build" not in text.stdout and " h " not in text.stdout
    summary = json.loads(plan(repo, "--good", "good", "--bad", "bad", "--cmd", "grep -qx good state",
                              "--json").stdout)
    assert summary["executor"] == "local" and summary["build_keys"] == 0 and summary["build_groups"] == []
    assert summary["expected"]["full_builds"] == 0 and summary["expected"]["hours"] is None
    assert summary["expected"]["steps"] <= 2 + 7 + 1  # the two end checks and about log2(120) steps
    declared = json.loads(plan(repo, "--good", "good", "--bad", "bad", "--cmd", "grep -qx good state",
                               "--run-minutes", "0.1", "--json").stdout)
    assert declared["expected"]["hours"] == pytest.approx(declared["expected"]["steps"] * 0.1 / 60, abs=0.01)
    # In containers the images are what costs: the build keys are back.
    docker = json.loads(plan(repo, "--good", "good", "--bad", "bad", "--cmd", "python3 check.py", "--executor",
                             "docker", "--json").stdout)
    assert docker["executor"] == "docker" and docker["build_keys"] == len(COMPILED_AT) + 1
    shell = plan(repo, "--good", "good", "--bad", "bad", "--cmd", "make && pytest")
    assert shell.returncode == 2 and "runs without a shell" in shell.stderr
