"""An engine across hosts before anything runs: what the cluster must hold (refused naming what is
missing), the values each node's flags are filled with, what a recipe's `engine.nodes` accepts, and
the line a lost node leaves, which the retry policy reads as the host's failure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bisect_npu.errors import UsageError
from bisect_npu.execute.ray import check_nodes
from bisect_npu.execute.ray_nodes import node_lost_line
from bisect_npu.orchestration.running.infrastructure import classify
from bisect_npu.recipe.schema import EngineSpec, NodeSpec, NodesSpec

HEADLESS = NodeSpec(flags=["--headless", "--data-parallel-address", "{master_ip}", "--data-parallel-rpc-port",
                           "{rpc_port}"])
SERVING = NodeSpec(flags=["--data-parallel-address={local_ip}", "--data-parallel-rpc-port", "{rpc_port}",
                          "--additional-config", '{"x": {"y": 1}}'])


def nodes(count: int, cards: int) -> NodesSpec:
    return NodesSpec(cards=cards, each=[SERVING, *[HEADLESS] * (count - 1)])


def test_more_nodes_or_cards_than_the_cluster_has_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(UsageError, match=r"spans 2 nodes of 16 NPU each, but the Ray cluster has 1 node\(s\) with 16 "
                                         r"NPU or more \(its nodes' NPU: 16, 8, 8\); missing: 1 node\(s\) with 16 NPU"):
        check_nodes({"a": 8, "b": 16, "c": 8}, nodes(2, 16))
    with pytest.raises(UsageError, match=r"missing: 2 node\(s\) with 8 NPU"):
        check_nodes({"a": 8}, nodes(3, 8))
    assert check_nodes({"a": 16, "b": 16}, nodes(2, 16)) == 1
    assert check_nodes({"a": 16, "b": 16}, nodes(2, 8)) == 2  # two engines, each on both hosts
    assert check_nodes({"a": 8, "b": 8, "c": 8}, nodes(2, 8)) == 1


@given(st.lists(st.integers(min_value=0, max_value=32), max_size=6), st.integers(min_value=2, max_value=4),
       st.integers(min_value=1, max_value=16))
def test_the_engines_counted_fit_the_cluster_at_once(npus: list[int], count: int, cards: int) -> None:
    """However the cards lie, the engines counted can all be placed at once, each on `count`
    distinct nodes, and one more cannot."""
    cluster = {f"n{i}": n for i, n in enumerate(npus)}
    try:
        engines = check_nodes(cluster, nodes(count, cards))
    except UsageError:
        assert sum(n >= cards for n in npus) < count
        return
    room = sorted((n // cards for n in npus), reverse=True)
    for _ in range(engines):
        assert sum(1 for r in room if r) >= count
        room = sorted([r - 1 for r in room[:count]] + room[count:], reverse=True)
    assert sum(1 for r in room if r) < count


def test_each_node_gets_its_address_the_serving_nodes_and_the_chosen_port() -> None:
    assert SERVING.filled("10.0.0.1", "10.0.0.1", 40123) == [
        "--data-parallel-address=10.0.0.1", "--data-parallel-rpc-port", "40123", "--additional-config",
        '{"x": {"y": 1}}']  # braces that are no value of ours stay as written
    assert HEADLESS.filled("10.0.0.2", "10.0.0.1", 40123)[2:] == ["10.0.0.1", "--data-parallel-rpc-port", "40123"]


def test_what_engine_nodes_accepts() -> None:
    with pytest.raises(ValidationError, match=r"asks for \{nic_name\}, which bisect-npu does not fill"):
        NodeSpec(flags=["--nic", "{nic_name}"])
    with pytest.raises(ValidationError, match="serving 2 but there are 2 nodes"):
        NodesSpec(cards=8, serving=2, each=[SERVING, HEADLESS])
    with pytest.raises(ValidationError, match="at least 2"):
        NodesSpec(cards=8, each=[SERVING])
    with pytest.raises(ValidationError, match="nodes start one server per host; the mini backend"):
        EngineSpec(backend="mini", nodes=nodes(2, 1))
    with pytest.raises(ValidationError, match="move server_flags there"):
        EngineSpec(backend="openai", server_flags=["--x"], nodes=nodes(2, 1))


def test_a_lost_node_is_the_hosts_failure_naming_the_node() -> None:
    line = node_lost_line(1, "0fd12ed7ef7ca0bd7562e5acf6c15d68", "its Ray actor or node died (ActorDiedError)")
    failure = classify(75, False, f"# ray node abc cards 0 build none\n{line}\n")
    assert failure is not None and failure.kind == "node_lost" and "ray node 0fd12ed7ef7ca0bd" in failure.line
    assert classify(3, False, "Traceback\nRuntimeError: data parallel rank 1 computed other tokens") is None
