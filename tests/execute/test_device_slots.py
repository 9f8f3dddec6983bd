"""Parallel slots on one Ascend host: each running candidate's container sees only its own cards."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.errors import UsageError
from bisect_npu.execute.ascend import ascend_container_spec
from bisect_npu.execute.devices import DevicePool
from bisect_npu.execute.docker import DockerExecutor, container_create_kwargs
from bisect_npu.orchestration.opening.preflight import settle_slots
from bisect_npu.recipe.loader import load_recipe, parse_recipe
from tests.helpers.asked import spec_of
from tests.helpers.gitrepo import make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e


def cards_of(kwargs: dict) -> list[str]:
    return sorted(d.split(":")[0] for d in kwargs["devices"] if d.split(":")[0].removeprefix("/dev/davinci").isdigit())


def test_pool_splits_devices_into_disjoint_shares() -> None:
    pool = DevicePool(list(range(8)), 4)
    leased: list[list[int]] = []
    barrier = threading.Barrier(4)

    def hold() -> None:
        with pool.lease() as cards:
            leased.append(cards)
            barrier.wait(timeout=5)  # all four slots hold their share at the same time

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(tuple, leased)) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_fifth_run_waits_for_a_free_share() -> None:
    pool = DevicePool([0, 1], 2)
    with pool.lease(), pool.lease():
        got: list[list[int]] = []
        waiter = threading.Thread(target=lambda: got.append(pool.lease().__enter__()))
        waiter.start()
        time.sleep(0.2)
        assert got == []  # both shares are busy
    waiter.join(timeout=5)
    assert got and got[0] in ([0], [1])


def test_more_slots_than_cards_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--slots 3"):
        DevicePool([0, 1], 3)


def test_each_container_spec_gets_only_the_leased_cards(tmp_path: Path) -> None:
    """The executor asks the Ascend spec for the slot's cards, not for all of --devices."""
    factory = functools.partial(ascend_container_spec, devices=list(range(8)))
    executor = DockerExecutor(client=None, spec_factory=factory, session_id="t",
                              device_pool=DevicePool(list(range(8)), 4))
    env = Environment(kind="image", commit="a" * 40, image="bisect-npu/x:commit-aaaa")
    with executor.device_pool.lease() as cards:
        spec = executor.spec_for(env, ["true"], tmp_path, cards, {"BISECT_NPU_TRIAL": "3"})
    kwargs = container_create_kwargs(spec)
    assert cards_of(kwargs) == ["/dev/davinci0", "/dev/davinci1"]
    assert kwargs["environment"]["BISECT_NPU_TRIAL"] == "3"
    assert not kwargs.get("privileged")
    whole = container_create_kwargs(executor.spec_for(env, ["true"], tmp_path))
    assert cards_of(whole) == [f"/dev/davinci{i}" for i in range(8)]


@pytest.mark.parametrize(("devices", "slots", "per_run", "settled"), [
    ([], None, 16, 1),                   # no cards: one candidate at a time
    (list(range(8)), None, 1, 8),        # one card per engine: a slot per card
    (list(range(8)), None, 2, 4),
    (list(range(16)), None, 16, 1),      # DeepSeek-R1 at TP 16: all sixteen cards in one container
    (list(range(8)), 2, 4, 2),
    (list(range(8)), 1, 1, 1),           # asked for: kept
])
def test_slots_default_to_as_many_engines_as_the_cards_hold(devices, slots, per_run, settled) -> None:
    options = spec_of(good="g", bad="b", devices=devices, slots=slots)
    settle_slots(options, per_run)
    assert options.executor.slots == settled
    if devices:
        pool = DevicePool(devices, settled)
        with pool.lease() as cards:
            assert len(cards) >= per_run


@pytest.mark.parametrize(("devices", "slots", "per_run", "message"), [
    (list(range(8)), None, 16, "runs on 16 cards .* --devices gives 8; give at least 16"),
    (list(range(8)), 4, 4, "--slots 4 over 8 card.* leaves 2 per slot.* needs 4; use --slots 2 or fewer"),
    ([0, 1], 3, 1, "--slots 3 over 2 card.* leaves 0 per slot, and each slot needs a card; use --slots 2"),
])
def test_slots_that_leave_an_engine_short_of_cards_are_a_usage_error(devices, slots, per_run, message) -> None:
    with pytest.raises(UsageError, match=message):
        settle_slots(spec_of(good="g", bad="b", devices=devices, slots=slots), per_run)


def test_cards_per_run_is_the_recipe_s_parallel_size() -> None:
    assert load_recipe("deepseek-r1-longseq-rope").cards_per_run() == 16
    assert load_recipe("qwen3-moe-presence-penalty-loop").cards_per_run() == 4
    assert load_recipe("qwen3-repetition-penalty-async").cards_per_run() == 1
    spelled = parse_recipe("name: t\nmodel: {path: /m}\ncases: [{id: a, prompt: hi}]\nengine:\n  args:\n"
                           "    tensor-parallel-size: '2'\n    pipeline_parallel_size: 2\n", source="t.yaml")
    assert spelled.cards_per_run() == 4  # the openai backend's dashed flags and quoted numbers count too
    flags = parse_recipe("name: t\nmodel: {path: /m}\ncases: [{id: a, prompt: hi}]\nengine:\n  backend: openai\n"
                         "  server_flags: [--tensor_parallel_size, ' 4', -dp=2, -pcp, '2']\n", source="t.yaml")
    assert flags.cards_per_run() == 16  # what `vllm serve` is told on its command line counts as well
    offline = parse_recipe("name: t\nmodel: {path: /m}\ncases: [{id: a, prompt: hi}]\nengine:\n  backend: vllm\n"
                           "  server_flags: [-tp, '4']\n", source="t.yaml")
    assert offline.cards_per_run() == 1  # no server, no flags read


@pytest.mark.parametrize(("engine", "message"), [
    ("  args: {tensor_parallel_size: 0}\n",
     "args.tensor_parallel_size: 0 is not a whole number of cards from 1 to 4096"),
    ("  args: {tensor_parallel_size: true}\n", "True is not a whole number of cards from 1 to 4096"),
    ("  args: {tensor-parallel-size: 2.5}\n", "2.5 is not a whole number of cards from 1 to 4096"),
    ("  backend: openai\n  args: {tensor_parallel_size: 2}\n  server_flags: [-tp, '4']\n",
     "args.tensor_parallel_size and server_flags -tp disagree \\(2 vs 4\\)"),
    ("  backend: openai\n  server_flags: [--pipeline-parallel-size]\n",
     "server_flags --pipeline-parallel-size has no value"),
    ("  args: {tensor_parallel_size: '4.0'}\n", "'4.0' is not a whole number of cards from 1 to 4096"),
])
def test_a_parallel_size_that_is_no_card_count_is_a_recipe_error(engine: str, message: str) -> None:
    with pytest.raises(UsageError, match=f"t.yaml:4: field 'engine': .*{message}"):
        parse_recipe(f"name: t\nmodel: {{path: /m}}\ncases: [{{id: a, prompt: hi}}]\nengine:\n{engine}",
                     source="t.yaml")


def test_run_refuses_too_few_cards_for_the_recipe_before_anything_runs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 4, tags={0: "good", 3: "bad"})
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", "good", "--bad",
                           "bad", "--recipe", "deepseek-r1-longseq-rope", "--devices", "0-7", "--session",
                           str(tmp_path / "s")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "runs on 16 cards (its parallel sizes multiplied) but --devices gives 8" in done.stderr
    assert not (tmp_path / "s").exists()  # nothing started


def test_a_session_from_before_slots_followed_the_engine_size_is_resettled_on_resume(tmp_path: Path) -> None:
    """Older runs took one slot per card: resuming one with a TP 4 recipe on 8 cards gives 2 slots."""
    from bisect_npu.orchestration.session import Session

    repo = tmp_path / "repo"
    make_linear_repo(repo, 4, tags={0: "good", 3: "bad"})
    options = spec_of(good="good", bad="bad", repo=str(repo), recipe="qwen3-moe-presence-penalty-loop",
                         devices=list(range(8)))
    session = Session.start(options, session_dir=tmp_path / "s")
    assert session.slots == 2
    session.evaluator.close()
    session.journal.close()
    journal = tmp_path / "s" / "journal.jsonl"
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    header["request"]["executor"]["slots"] = 8  # what that version wrote
    journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    resumed = Session.resume(tmp_path / "s")
    try:
        assert resumed.slots == 2
    finally:
        resumed.evaluator.close()
        resumed.journal.close()


def test_local_runs_on_an_npu_host_see_only_their_slot_s_cards(tmp_path: Path) -> None:
    """No container engine (CANN on the host): `--executor local --devices 0-3 --slots 2` gives each
    run ASCEND_RT_VISIBLE_DEVICES of its own share, and the determinism switches as in a container
    (the recipe's environment still wins). Real processes; what cannot exist here is only the NPU."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 17, culprit=9, tags={0: "good", 16: "bad"})
    seen = tmp_path / "seen"
    command = (f"sh -c 'echo $ASCEND_RT_VISIBLE_DEVICES $LCCL_DETERMINISTIC >> {seen}; sleep 0.3; "
               f"grep -qx good state'")
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", "good", "--bad",
                           "bad", "--cmd", command, "--devices", "0-3", "--slots", "2", "--no-fix", "--session",
                           str(tmp_path / "s"), "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[9]
    lines = seen.read_text().splitlines()
    assert {line.split()[0] for line in lines} == {"0,1", "2,3"}  # both shares used, never all four cards
    assert {line.split()[1] for line in lines} == {"1"}


def test_an_empty_devices_list_is_a_usage_error_not_no_devices(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--good", "a", "--bad", "b", "--cmd", "true",
                           "--devices", ""], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "--devices '': expected card numbers" in done.stderr


def test_fix_verification_runs_on_the_devices_it_is_given(tmp_path: Path) -> None:
    """`fix --verify --devices 0-1`: each verification sees those cards (local: the visible-devices
    variable), as a session's runs do; too few for the recipe's engine is refused."""
    from bisect_npu.orchestration.opening.environments import make_evaluator

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 2)
    seen = tmp_path / "seen"
    command = ["sh", "-c", f"echo $ASCEND_RT_VISIBLE_DEVICES $HCCL_DETERMINISTIC > {seen}"]
    with make_evaluator(str(repo), None, command=command, session_dir=tmp_path / "v", devices=[0, 1]) as evaluate:
        assert evaluate(shas[1]).kind.value == "good"
    assert seen.read_text().split() == ["0,1", "true"]
    with pytest.raises(UsageError, match="runs on 16 cards"), \
            make_evaluator(str(repo), "deepseek-r1-longseq-rope", session_dir=tmp_path / "w", devices=[0, 1]):
        pass


def test_a_flag_and_its_value_in_one_server_flags_item_is_a_recipe_error() -> None:
    """The server would get `--tensor-parallel-size 4` as one argument (and refuse it)."""
    with pytest.raises(UsageError, match=r"t.yaml:6: field 'engine.server_flags': .* write \[--tensor-parallel-size"):
        parse_recipe("name: t\nmodel: {path: /m}\ncases: [{id: a, prompt: hi}]\nengine:\n  backend: openai\n"
                     "  server_flags: ['--tensor-parallel-size 4']\n", source="t.yaml")
    ok = parse_recipe("name: t\nmodel: {path: /m}\ncases: [{id: a, prompt: hi}]\nengine:\n  backend: openai\n"
                      "  server_flags: ['--override-generation-config={\"presence_penalty\": 1.5}']\n", source="t.yaml")
    assert ok.engine.server_flags == ['--override-generation-config={"presence_penalty": 1.5}']
