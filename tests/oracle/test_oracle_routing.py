"""MoE routing as evidence, on real tiny HF Qwen3-MoE and DeepSeek-V3 dumps made on the CPU.

The routers here are peaked like a trained model's (a large logit part shared by every expert, which
bf16 resolves coarsely), so bf16 moves the choice of several tokens and a router computed in bf16
where the reference routes in fp32 moves clearly more than rounding elsewhere does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.observations import VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps, verdict_from_comparison
from bisect_npu.oracle.dumps.routing import RouterSide, compare_routing

torch = pytest.importorskip("torch")
tiny_moe = pytest.importorskip("tests.helpers.tiny_moe")

PEAKED = 20.0


def _dumps(root: Path, family: str, variants: dict[str, dict]) -> dict[str, Path]:
    spec = tiny_moe.MoeSpec(family=family, router_offset=PEAKED, seed=0)
    ids = tiny_moe.tokens(spec)
    return {name: tiny_moe.dump(tiny_moe.build_model(spec, **kwargs), ids, root / name)
            for name, kwargs in variants.items()}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    bf16 = torch.bfloat16
    return _dumps(tmp_path_factory.mktemp("qwen3-moe"), "qwen3_moe", {
        "golden": {"dtype": torch.float32}, "bf16": {"dtype": bf16}, "eager": {"dtype": bf16, "attn": "eager"},
        "fp32_router": {"dtype": bf16, "router": "fp32", "weights_dtype": bf16},
        "bf16_router": {"dtype": bf16, "router": "bf16", "weights_dtype": bf16}})


def _judge(cand: Path, ref: Path):
    result = compare_dumps(cand, ref, LogitsConfig())
    return result, verdict_from_comparison(result)


def test_clean_bf16_moe_against_its_fp32_golden_is_aligned_and_says_what_flipped(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["bf16"], qwen["golden"])
    flips = sum(len(report.flips) for report in result.routing)
    assert flips > 0, "the pair must move some choices for this test to mean anything"
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert "closer to a tie than rounding can move it" in verdict.reason and "routed alike" in verdict.reason
    layers = verdict.figures["routing"]["layers"]
    assert {layer["module"] for layer in layers} == {"model.layers.1.mlp.gate", "model.layers.2.mlp.gate"}
    assert all(flip["margin"] <= flip["noise"] or layer["unexplained"] <= 1 for layer in layers
               for flip in layer["flips"])


def test_bf16_sdpa_against_bf16_eager_is_aligned(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["eager"], qwen["bf16"])
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert any(report.flips for report in result.routing)


def test_router_in_bf16_where_the_reference_routes_in_fp32_is_named_at_the_router(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["bf16_router"], qwen["fp32_router"])
    assert verdict.kind is VerdictKind.BAD
    first = result.first_divergent
    assert first is not None and first.rule == "routing"
    assert first.name.startswith("Module.model.layers.1.mlp.gate.")
    assert "of tokens route to another expert set; rounding explains at most" in verdict.reason


def test_expert_ids_are_compared_as_sets_never_by_cosine(qwen: dict[str, Path], tmp_path: Path) -> None:
    """The same choices listed in another order are no flip, where cosine over the ids would fire."""
    import shutil

    cand = Path(shutil.copytree(qwen["golden"], tmp_path / "reordered"))
    for ids_file in (cand / "step0" / "rank0" / "dump_tensor_data").glob("*mlp.gate*.output.2.pt"):
        ids = torch.load(ids_file)
        torch.save(ids.flip(-1).contiguous(), ids_file)
    for weights_file in (cand / "step0" / "rank0" / "dump_tensor_data").glob("*mlp.gate*.output.1.pt"):
        torch.save(torch.load(weights_file).flip(-1).contiguous(), weights_file)
    result, verdict = _judge(cand, qwen["golden"])
    assert all(not report.flips for report in result.routing)
    assert verdict.kind is VerdictKind.GOOD, verdict.reason


def test_a_dump_without_router_outputs_is_judged_as_before_and_says_routing_was_not_checked(
        qwen: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    dumps = {}
    for name in ("golden", "eager"):
        dumps[name] = Path(shutil.copytree(qwen[name], tmp_path / name))
        index = dumps[name] / "step0" / "rank0" / "dump.json"
        doc = json.loads(index.read_text())
        doc["data"] = {key: op for key, op in doc["data"].items() if ".mlp.gate." not in key}
        index.write_text(json.dumps(doc))
    result, verdict = _judge(dumps["eager"], dumps["golden"])
    assert not result.routing
    assert "routing could not be checked at 2 MoE layers (model.layers.1.mlp (Qwen3MoeSparseMoeBlock)" in verdict.reason


def _side(experts: int, k: int, tokens: int = 16) -> RouterSide:
    logits = np.random.default_rng(0).normal(size=(tokens, experts))
    return RouterSide(logits=logits, logits_dtype="float32", ids=np.argsort(-logits, axis=1)[:, :k])


@pytest.mark.parametrize(("cand", "words"), [(_side(6, 2), "over 6 experts, the reference over 8"),
                                             (_side(8, 3), "picks 3 experts per token, the reference 2")])
def test_dumps_of_other_expert_counts_or_top_k_are_refused_in_one_line(cand: RouterSide, words: str) -> None:
    with pytest.raises(UsageError) as refused:
        compare_routing(cand, _side(8, 2), "model.layers.1.mlp.gate")
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.heavy
def test_clean_bf16_deepseek_v3_router_with_groups_bias_and_shared_experts_is_aligned(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "deepseek_v3", {"golden": {"dtype": torch.float32},
                                              "bf16": {"dtype": torch.bfloat16}})
    result, verdict = _judge(dumps["bf16"], dumps["golden"])
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert len(result.routing) == 2


def test_a_saturated_sigmoid_score_moves_as_far_as_its_drifted_input_can_take_it_off_the_plateau() -> None:
    """DeepSeek-V3's scores sigmoid(logit) + bias: at a logit of 10 the sigmoid has no slope, so the bias alone
    picks the experts. A token whose hidden state drifted 60% (it flipped at an earlier layer) can move its
    logits off the plateau: its flip is explained. A token whose input did not move, flipped, is not."""
    rng = np.random.default_rng(3)
    tokens, experts, hidden = 32, 8, 16
    bias = np.linspace(0.0, 0.07, experts)
    ref_input = rng.normal(size=(tokens, hidden))
    ref_logits = 10.0 + 0.3 * rng.normal(size=(tokens, experts))
    cand_input, cand_logits = ref_input.copy(), ref_logits.copy()
    typical = float(np.sqrt(np.mean(np.linalg.norm(ref_input, axis=1) ** 2)))
    cand_input[0] += 0.6 * typical * rng.normal(size=hidden) / np.sqrt(hidden)
    cand_logits[0] = [3.0, 3.0, -3.0, -3.0, -3.0, -3.0, -3.0, -3.0]
    cand_logits[1, 6:] -= 20.0  # experts 6 and 7 fall off with nothing in the input to move them

    def side(logits: np.ndarray, hidden_states: np.ndarray) -> RouterSide:
        decision = 1.0 / (1.0 + np.exp(-logits)) + bias
        return RouterSide(logits=logits, logits_dtype="float32", ids=np.argsort(-decision, axis=1)[:, :2],
                          input=hidden_states, input_dtype="float32", bias=bias, sigmoid=True)

    report = compare_routing(side(cand_logits, cand_input), side(ref_logits, ref_input), "model.layers.3.mlp.gate",
                             rerouted=frozenset({0}))
    flips = {flip.token: flip for flip in report.flips}
    assert set(flips) == {0, 1} and flips[0].lost == [6, 7] and flips[0].gained == [0, 1]
    assert flips[0].explained, flips[0].to_dict()
    assert not flips[1].explained and flips[1].margin > 2 * flips[1].noise


def test_routing_weights_are_compared_per_expert_id_not_slot_by_slot() -> None:
    """Two experts of near-equal weight trade slots under rounding: the same routing. Slot by slot the weights
    read as moved by their whole size; per expert id they agree to their rounding."""
    from bisect_npu.oracle.dumps.rows import TensorDiff
    from bisect_npu.oracle.dumps.rules.routing import _RouterOp, _weights_by_expert

    rng = np.random.default_rng(5)
    logits = rng.normal(size=(16, 8))
    ids = np.argsort(-logits, axis=1)[:, :2]
    weights = np.take_along_axis(logits, ids, axis=1)
    cand_ids, cand_weights = ids.copy(), weights * (1 + 1e-3)
    cand_ids[4] = ids[4, ::-1]
    cand_weights[4] = cand_weights[4, ::-1]
    rows = [TensorDiff(f"gate.output.{key}", key, 0, 1, "gate", dtype="bfloat16", metrics={"cosine": 0.5})
            for key in range(3)]

    class Measured:
        def __init__(self, row: TensorDiff) -> None:
            self.row, self.cand, self.ref, self.logits = row, None, None, False

    pairs = [Measured(row) for row in rows]
    pairs[2].row.metrics = {}  # the ids: integers
    op = _RouterOp("model.layers.1.mlp.gate", 0, {("output", "0"): 0, ("output", "1"): 1, ("output", "2"): 2})
    sides = (RouterSide(logits=logits, logits_dtype="float32", ids=cand_ids, weights=cand_weights),
             RouterSide(logits=logits, logits_dtype="float32", ids=ids, weights=weights))
    _weights_by_expert(pairs, op, 0, sides, flipped={9})
    assert rows[1].metrics["cosine"] > 1 - 1e-9 and rows[1].metrics["tokens_left_out"] == 1.0
    assert rows[1].carried_metrics is not None and rows[1].carried_metrics["cosine"] > 1 - 1e-9


@pytest.mark.heavy
def test_a_bf16_deepseek_v3_router_whose_scores_lie_close_together_is_named_at_the_router(tmp_path: Path) -> None:
    """A sigmoid router off its plateau (a shared logit part of 4) whose experts' scores lie close together
    (their own part and the correction bias x0.1): bf16 rounding of its logits reaches their gaps, so a
    gate in bf16 where the reference routes in fp32 flips choices rounding elsewhere does not; the clean
    bf16 model against its fp32 golden stays aligned."""
    spec = tiny_moe.MoeSpec(family="deepseek_v3", router_offset=4.0, router_scale=0.1, bias_scale=0.1, seed=0)
    ids = tiny_moe.tokens(spec, seed=7)
    bf16 = torch.bfloat16
    dumps = {name: tiny_moe.dump(tiny_moe.build_model(spec, **kwargs), ids, tmp_path / name) for name, kwargs in {
        "golden": {"dtype": torch.float32}, "bf16": {"dtype": bf16},
        "fp32_router": {"dtype": bf16, "router": "fp32", "weights_dtype": bf16},
        "bf16_router": {"dtype": bf16, "router": "bf16", "weights_dtype": bf16}}.items()}
    result, verdict = _judge(dumps["bf16_router"], dumps["fp32_router"])
    assert verdict.kind is VerdictKind.BAD and result.first_divergent is not None
    assert ".model.layers.1.mlp.gate." in result.first_divergent.name and "router:" in verdict.reason
    _, clean = _judge(dumps["bf16"], dumps["golden"])
    assert clean.kind is VerdictKind.GOOD, clean.reason


def test_a_verdict_naming_one_router_says_the_other_layers_flips_are_noise_apart_from_it() -> None:
    """A router named for its finding and another MoE layer whose flips lie within rounding: the verdict keeps
    them apart and says, in words a reader follows, why the second is noise."""
    from bisect_npu.oracle.dumps.compare import routing_words
    from bisect_npu.oracle.dumps.routing import Flip, RoutingReport
    from bisect_npu.oracle.dumps.rows import DumpComparison

    named = RoutingReport("model.layers.0.mlp.gate", tokens=96, experts=8, top_k=2, explainable=0,
                          flips=[Flip(token, [1], [2], 1.0, 1e-4, 0.3) for token in range(4)])
    noise = RoutingReport("model.layers.1.mlp.gate", tokens=96, experts=8, top_k=2, explainable=41,
                          flips=[Flip(token, [3], [4], 1e-5, 1e-4, 0.2) for token in range(3)])
    assert named.finding is not None and noise.finding is None
    words = routing_words(DumpComparison(rows=[], seconds=0.0, bytes_read=0, routing=[named, noise]))
    assert words == ("; apart from that router, routing noise at model.layers.1.mlp.gate: 3 of 96 token choices "
                     "went to another expert set, each closer to a tie than rounding can move it (41 of the 96 lie "
                     "that close); that MoE block judged on the tokens that routed alike")
    alone = routing_words(DumpComparison(rows=[], seconds=0.0, bytes_read=0, routing=[noise]))
    assert alone.startswith("; routing noise at model.layers.1.mlp.gate: 3 of 96") and "apart" not in alone
    assert routing_words(DumpComparison(rows=[], seconds=0.0, bytes_read=0, routing=[named])) == ""


def test_a_group_swap_the_gate_itself_moved_is_not_explained_by_the_groups_close_gap() -> None:
    """A grouped top-k (4 groups of 2, the best 2 kept, each scored by its two experts): token 0's last kept group
    leads the first one left out by less than rounding can move it. When the candidate's scores of those groups
    moved by about that much, its group swap is rounding's; when the gate's own output moved them far past it
    (a faulty gate), the swap is the gate's, whatever the reference's gap."""
    from bisect_npu.oracle.dumps.routing import Grouping

    rng = np.random.default_rng(5)
    grouping = Grouping(groups=4, kept=2, best=2)
    ref_logits = rng.normal(size=(48, 8))
    ref_logits[0] = [6.0, 0.0, 3.0, 2.0, 4.5, 0.5005, 1.0, 0.0]  # groups 6, 5, 5.0005, 1: groups 0 and 2 kept

    def side(logits: np.ndarray) -> RouterSide:
        return RouterSide(logits=logits, logits_dtype="bfloat16", ids=grouping.choose(logits, 2),
                          input=np.ones((48, 4)), input_dtype="bfloat16")

    nudged, moved = ref_logits.copy(), ref_logits.copy()
    nudged[0, 2:4] += 0.001  # group 1 overtakes group 2 by rounding's reach
    moved[0, 2:4] += 0.6  # the gate moved group 1 far past it
    for cand, explained in ((nudged, True), (moved, False)):
        report = compare_routing(side(cand), side(ref_logits), "model.layers.2.mlp.gate")
        (flip,) = report.flips
        assert flip.token == 0 and flip.lost == [4] and flip.gained == [2]
        assert flip.explained is explained, flip.to_dict()


@pytest.mark.parametrize("shared", [3.0, 24.0, 100.0])
def test_every_flip_that_bf16_rounding_of_the_logits_alone_makes_lies_within_its_noise_bound(shared: float) -> None:
    """A router whose logits carry a large shared part (a trained router's, scaled up through the layers), its
    candidate the reference's fp32 logits rounded to bf16 by torch and nothing else: each logit moves by up to
    half a bf16 ulp (2^-8 of the logit's binade), so every flip this makes is rounding's and no finding."""
    rng = np.random.default_rng(11)
    ref_logits = (shared + rng.normal(scale=0.3, size=(4000, 16))).astype(np.float32).astype(np.float64)
    cand_logits = torch.from_numpy(ref_logits).to(torch.bfloat16).to(torch.float64).numpy()
    hidden = rng.normal(size=(4000, 8))

    def side(logits: np.ndarray, dtype: str) -> RouterSide:
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :4]
        return RouterSide(logits=logits, logits_dtype=dtype, ids=ids, input=hidden, input_dtype=dtype)

    report = compare_routing(side(cand_logits, "bfloat16"), side(ref_logits, "float32"), "model.layers.2.mlp.gate")
    assert len(report.flips) > 100, "rounding must move choices for this test to mean anything"
    assert report.allowed_dtype == "bfloat16"
    assert report.unexplained == [] and report.finding is None, report.unexplained[0].to_dict()


def _peaked_sigmoid(weight: np.ndarray, hidden_states: np.ndarray) -> RouterSide:
    """A DeepSeek-V3-like sigmoid router's side from its weights and input (plain top 2; no grouping)."""
    logits = hidden_states @ weight.T
    return RouterSide(logits=logits, logits_dtype="float32", ids=np.argsort(-logits, axis=1, kind="stable")[:, :2],
                      input=hidden_states, input_dtype="float32", sigmoid=True)


def test_a_peaked_sigmoid_routers_faulty_weights_are_named_while_its_inputs_drift_is_noise() -> None:
    """A sigmoid router off its plateau whose experts' scores lie close together: every logit carries a shared
    part of about 4, the experts' own parts are a tenth of it. The input's drift (1% of its norm, what a few
    layers of bf16 against an fp32 golden leave) moves that shared part in every logit alike: the two scores'
    gap moves little, and the flips it makes are noise. Weights perturbed by 5% of their rms move each expert's
    logit on its own: most tokens flip, far beyond what the input's drift explains."""
    rng = np.random.default_rng(5)
    tokens, experts, hidden = 128, 8, 64
    shared = rng.normal(size=hidden)
    weight = shared / np.linalg.norm(shared) * 4.0 / np.sqrt(hidden) + 0.1 * rng.normal(size=(experts, hidden)) / 8
    ref_input = rng.normal(size=(tokens, hidden)) * 0.3 + shared / np.linalg.norm(shared) * np.sqrt(hidden)
    drifted = ref_input * (1.0 + 0.01 * rng.normal(size=(tokens, hidden)))
    reference = _peaked_sigmoid(weight, ref_input)
    clean = compare_routing(_peaked_sigmoid(weight, drifted), reference, "model.layers.2.mlp.gate")
    assert clean.flips and clean.finding is None, clean.to_dict()
    faulty = weight + 0.05 * float(np.sqrt(np.mean(weight**2))) * rng.normal(size=weight.shape)
    report = compare_routing(_peaked_sigmoid(faulty, drifted), reference, "model.layers.2.mlp.gate")
    assert report.finding is not None, report.to_dict()
