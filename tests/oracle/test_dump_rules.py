"""The dump rules as one family: declared order, a verdict that names the rule and where its line came from,
and a rule added as one class that the comparison runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps import rules
from bisect_npu.oracle.dumps.compare import compare_dumps, judge_logits, write_dump
from bisect_npu.oracle.dumps.entries import EXPERT_CALL, INPUT, ROUTING
from bisect_npu.oracle.dumps.noise import mixes_tokens
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule


def stack(root: Path, broken: int | None = None, size: float = 0.05, seed: int = 0) -> Path:
    """Eight layers' outputs of a residual stack (float32) with rounding-sized noise; `broken` adds an error
    of `size` (relative norm) to that layer's output alone."""
    rng, noise = np.random.default_rng(0), np.random.default_rng(seed)
    state = rng.standard_normal((16, 64)).astype(np.float32)
    tensors = []
    for layer in range(8):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        out = np.tanh(state @ w) * (1 + 1e-3 * noise.standard_normal((16, 64))).astype(np.float32)
        if layer == broken:
            err = noise.standard_normal(out.shape).astype(np.float32)
            out = out + err * (size * np.linalg.norm(out) / np.linalg.norm(err))
        tensors.append((f"model.layers.{layer}.mlp", out.astype(np.float32)))
        state = state + out
    return write_dump(root, tensors).parent


def test_the_rules_run_in_their_declared_order_each_named_with_what_it_measures() -> None:
    assert [rule.name for rule in rules.TENSOR_RULES] == ["integer_equality", "absolute"]
    assert [rule.name for rule in rules.MODULE_RULES] == ["msprobe_amplification", "cosine_amplification",
                                                          "norm_ratio", "cosine_amplification"]
    assert all(rule.measures for rule in (*rules.TENSOR_RULES, *rules.MODULE_RULES))


def test_a_peer_rule_verdict_names_its_rule_and_that_its_line_was_measured_on_the_pair(tmp_path: Path) -> None:
    ref, cand = stack(tmp_path / "ref", seed=1), stack(tmp_path / "cand", broken=5, seed=2)
    assert compare_dumps(stack(tmp_path / "clean", seed=3), ref, LogitsConfig()).first_divergent is None
    verdict = judge_logits(Observation(logits_dump=str(cand)), Observation(logits_dump=str(ref)), LogitsConfig())
    first = verdict.figures["first_divergent"]
    assert verdict.kind == VerdictKind.BAD and first["layer"] == 5
    assert first["rule"] == "cosine_amplification"
    assert first["provenance"].startswith("measured on the pair: 6 peers")
    assert "dump_noise_bench" in first["provenance"] and first["provenance"] in verdict.reason


def test_an_absolute_line_names_the_tool_that_set_it(tmp_path: Path) -> None:
    ref = stack(tmp_path / "ref", seed=1)
    cand = stack(tmp_path / "cand", broken=0, size=1.0, seed=2)
    first = compare_dumps(cand, ref, LogitsConfig()).first_divergent
    assert first is not None and first.rule == "absolute" and "msprobe" in (first.provenance or "")


class _AnyDriftAtLayerThree(ModuleRule):
    name: ClassVar[str] = "layer_three"
    measures: ClassVar[str] = "a rule made here: any output of layer 3"

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        return Finding(self.name, "layer 3", "this test") if row.layer == 3 else None


def test_a_new_rule_is_one_class_the_comparison_runs_in_its_place(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ref, cand = stack(tmp_path / "ref", seed=1), stack(tmp_path / "cand", seed=2)
    assert compare_dumps(cand, ref, LogitsConfig()).first_divergent is None
    monkeypatch.setattr(rules, "MODULE_RULES", (*rules.MODULE_RULES, _AnyDriftAtLayerThree()))
    first = compare_dumps(cand, ref, LogitsConfig()).first_divergent
    assert first is not None and first.layer == 3 and first.rule == "layer_three" and first.provenance == "this test"


# ---------------------------------------------------------------- integer tensors, refusals


def with_ids(root: Path, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, seed: int = 1) -> Path:
    """The float stack beside a router's chosen expert ids ([tokens, k]), position ids and a boolean mask."""
    stack(root / "floats", seed=seed)
    floats = [(f"model.layers.{i}.mlp", np.load(root / "floats" / f"{i:05d}.npy")) for i in range(8)]
    tensors = [("model.positions", positions), ("model.attention_mask", mask), *floats[:4],
               ("model.layers.3.mlp.gate.topk_ids", ids), *floats[4:]]
    return write_dump(root / "dump", tensors).parent


def test_expert_ids_are_compared_as_sets_per_token_and_other_integers_element_by_element(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(16, 4, replace=False) for _ in range(32)]).astype(np.int64)
    positions, mask = np.arange(32, dtype=np.int64), np.tril(np.ones((32, 32), dtype=np.bool_))
    ref = with_ids(tmp_path / "ref", ids, positions, mask)
    # The same experts listed in another order: the same choice, where cosine saw a large change.
    reordered = with_ids(tmp_path / "reordered", ids[:, ::-1].copy(), positions, mask, seed=2)
    result = compare_dumps(reordered, ref, LogitsConfig())
    assert result.first_divergent is None
    row = next(row for row in result.rows if row.name.endswith("topk_ids"))
    assert row.integer and "cosine" not in row.metrics and row.metrics["rows_differ"] == 0
    # Two tokens that chose another expert: named at the router, counted in rows.
    flipped = ids.copy()
    flipped[[3, 9], 0] = next(e for e in range(16) if e not in ids[3]), next(e for e in range(16) if e not in ids[9])
    first = compare_dumps(with_ids(tmp_path / "flipped", flipped, positions, mask, seed=2), ref,
                          LogitsConfig()).first_divergent
    assert first is not None and first.rule == "integer_equality" and first.name.endswith("topk_ids")
    assert "2 of 32 rows chose another set" in (first.problem or "")
    # Positions are compared element by element: a permutation is not the same.
    moved = with_ids(tmp_path / "moved", ids, positions[::-1].copy(), mask, seed=2)
    first = compare_dumps(moved, ref, LogitsConfig()).first_divergent
    assert first is not None and first.name == "model.positions" and "element by element" in (first.problem or "")
    # A mask with one entry flipped.
    holed = mask.copy()
    holed[5, 0] = False
    first = compare_dumps(with_ids(tmp_path / "holed", ids, positions, holed, seed=2), ref,
                          LogitsConfig()).first_divergent
    assert first is not None and first.name == "model.attention_mask" and first.rule == "integer_equality"


def test_ids_of_another_integer_width_are_compared_not_refused(tmp_path: Path) -> None:
    ids = np.arange(64, dtype=np.int64).reshape(16, 4) % 16
    positions, mask = np.arange(16, dtype=np.int64), np.ones((16, 16), dtype=np.bool_)
    ref = with_ids(tmp_path / "ref", ids, positions, mask)
    cand = with_ids(tmp_path / "cand", ids.astype(np.int32), positions.astype(np.int32), mask, seed=2)
    assert compare_dumps(cand, ref, LogitsConfig()).first_divergent is None


@pytest.mark.parametrize("what", ["experts", "top_k", "hidden"])
def test_dumps_of_two_model_configs_are_refused_in_one_line(tmp_path: Path, what: str) -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 16)).astype(np.float32)
    hidden = [(f"model.layers.{i}.mlp", rng.standard_normal((8, 32)).astype(np.float32)) for i in range(4)]
    ref = write_dump(tmp_path / "ref", [*hidden[:2], ("model.layers.1.mlp.gate", logits),
                                        ("model.layers.1.mlp.gate.topk_ids", np.zeros((8, 2), np.int64)), *hidden[2:]])
    other = {"experts": [*hidden[:2], ("model.layers.1.mlp.gate", logits[:, :8]),
                         ("model.layers.1.mlp.gate.topk_ids", np.zeros((8, 2), np.int64)), *hidden[2:]],
             "top_k": [*hidden[:2], ("model.layers.1.mlp.gate", logits),
                       ("model.layers.1.mlp.gate.topk_ids", np.zeros((8, 4), np.int64)), *hidden[2:]],
             "hidden": [(name, np.zeros((8, 64), np.float32)) for name, _ in hidden[:2]]
             + [("model.layers.1.mlp.gate", logits), ("model.layers.1.mlp.gate.topk_ids", np.zeros((8, 2), np.int64))]
             + [(name, np.zeros((8, 64), np.float32)) for name, _ in hidden[2:]]}[what]
    cand = write_dump(tmp_path / "cand", other)
    with pytest.raises(UsageError) as refused:
        compare_dumps(cand.parent, ref.parent, LogitsConfig())
    message = str(refused.value)
    assert "\n" not in message and message.endswith(("compare dumps of one model config",
                                                     "compare dumps of one model and one prompt"))
    assert ("expert count or top-k" in message) == (what != "hidden")


def test_one_tensor_of_another_shape_is_a_finding_not_a_refusal(tmp_path: Path) -> None:
    ref = stack(tmp_path / "ref", seed=1)
    tensors = [(f"model.layers.{i}.mlp", np.load(ref / f"{i:05d}.npy")) for i in range(8)]
    tensors[4] = (tensors[4][0], tensors[4][1][:8])
    first = compare_dumps(write_dump(tmp_path / "cand", tensors).parent, ref, LogitsConfig()).first_divergent
    assert first is not None and first.layer == 4 and "shape" in (first.problem or "")


# ---------------------------------------------------------------- the fixed line on a model too short for peers


def _one_layer_qwen3_dumps(root: Path, seed: int) -> dict[str, Path]:
    """A one-layer dense HF Qwen3 (bf16-exact weights, x2.5 init): fp32 golden, bf16, and bf16 with one head's
    `o_proj` columns x1.2; every submodule dumped as `record` dumps them."""
    import copy

    import torch
    import transformers

    from tests.helpers.tiny_moe import dump

    torch.manual_seed(seed)
    config = transformers.Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      max_position_embeddings=512)
    golden = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for param in golden.parameters():
            param.copy_((param * (2.5 if param.dim() == 2 else 1.0)).to(torch.bfloat16).float())
    fault = copy.deepcopy(golden).to(torch.bfloat16)
    with torch.no_grad():
        fault.model.layers[0].self_attn.o_proj.weight[:, :32].mul_(1.2)
    ids = torch.randint(0, 512, (1, 128), generator=torch.Generator().manual_seed(seed + 7))
    return {name: dump(model, ids, root / name) for name, model in
            (("golden", golden), ("bf16", copy.deepcopy(golden).to(torch.bfloat16)), ("fault", fault))}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_fixed_line_leaves_a_clean_bf16_o_proj_its_own_rounding_and_names_a_fault_there(
        tmp_path: Path, seed: int) -> None:
    """`o_proj`'s baseline is `v_proj` (attention's core is not a module): the roundings between, and the
    output's own, add one bf16 rounding's distance to the amplified input's, which bf16 alone explains."""
    dumps = _one_layer_qwen3_dumps(tmp_path, seed)
    clean = compare_dumps(dumps["bf16"], dumps["golden"], LogitsConfig())
    assert clean.first_divergent is None
    distance = {part: 1 - next(row for row in clean.rows if part in row.name).metrics["cosine"]
                for part in (".v_proj.", ".o_proj.")}
    assert distance[".o_proj."] > LogitsConfig().amplification * distance[".v_proj."]
    first = compare_dumps(dumps["fault"], dumps["golden"], LogitsConfig()).first_divergent
    assert first is not None and ".o_proj." in first.name and first.rule == "cosine_amplification"


# ---------------------------------------------------------------- baselines on the tokens that routed alike


def _metrics(distance: float) -> dict[str, float]:
    return {"cosine": 1.0 - distance, "within_1e3": 0.5, "within_tol": 0.5, "max_rel_error": 1.0,
            "max_abs_error": 1.0, "norm_ratio": 1.0}


def _routed_alike_mlp(fault_layer: int | None = None) -> list[TensorDiff]:
    """A shared expert's gate projection and activation in four MoE layers, each measured on the tokens that
    routed alike; from the second layer on, the whole tensors carry the flipped tokens' drift (50x)."""
    rows: list[TensorDiff] = []
    for layer in range(1, 5):
        for part, distance in (("gate_proj", 2.0e-5), ("act_fn", 2.3e-5 * (20 if layer == fault_layer else 1))):
            module = f"Module.model.layers.{layer}.mlp.shared_experts.{part}.Module.forward.0"
            rows.append(TensorDiff(f"{module}.output.0", len(rows), 0, layer, module, dtype="bfloat16",
                                   shape=(128, 128), metrics=_metrics(distance),
                                   carried_metrics=_metrics(distance * (1 if layer == 1 else 50))))
    return rows


def test_an_output_on_the_tokens_that_routed_alike_is_measured_against_its_input_on_the_same_tokens() -> None:
    """The whole input (flipped tokens' drift in it) over an output without them would make every later
    layer's activation look quiet and the first MoE layer's stand out."""
    clean = _routed_alike_mlp()
    rules.apply_relative_rules(clean, LogitsConfig())
    assert [row.name for row in clean if row.problem] == []
    faulty = _routed_alike_mlp(fault_layer=3)
    rules.apply_relative_rules(faulty, LogitsConfig())
    assert [row.name for row in faulty if row.problem] == [faulty[5].name]


def test_attention_outputs_keep_their_whole_inputs_as_baseline() -> None:
    """Attention mixes tokens: a flipped token's drift reaches the others, so its input is measured whole."""
    row = TensorDiff("Module.model.layers.2.self_attn.o_proj.Linear.forward.0.output.0", 0, 0, 2,
                     "Module.model.layers.2.self_attn.o_proj.Linear.forward.0", metrics=_metrics(1e-5),
                     carried_metrics=_metrics(1e-3))
    assert mixes_tokens(row) and not mixes_tokens(_routed_alike_mlp()[0])


@pytest.mark.parametrize(("part", "mixes"), [("q_proj.Linear", False), ("k_norm.Qwen3RMSNorm", False),
                                             ("kv_b_proj.Linear", False), ("o_proj.Linear", True),
                                             ("Qwen3MoeAttention", True)])
def test_only_attentions_core_and_what_follows_it_mix_tokens(part: str, mixes: bool) -> None:
    """The projections before attention's core work token by token: measured on the tokens that routed alike,
    they are measured against their input on the same tokens, as an MLP's are."""
    module = f"Module.model.layers.2.self_attn.{part}.forward.0"
    assert mixes_tokens(TensorDiff(f"{module}.output.0", 0, 0, 2, module)) is mixes


# ---------------------------------------------------------------- an MoE layer's experts and router


def _moe_layer(layer: int, experts_distance: float, call_distance: float) -> list[TensorDiff]:
    """One MoE layer as `record` dumps it: the router's input, its logits and routing weights, one call inside
    the experts, the experts' output."""
    gate = f"Module.model.layers.{layer}.mlp.gate.Qwen3MoeTopKRouter.forward.0"
    call = f"Module.model.layers.{layer}.mlp.experts.act_fn.SiLUActivation.forward.0"
    experts = f"Module.model.layers.{layer}.mlp.experts.Qwen3MoeExperts.forward.0"
    return [TensorDiff(f"{gate}.input.0", 0, 0, layer, gate, role=INPUT, dtype="bfloat16", shape=(128, 64),
                       metrics=_metrics(4e-5)),
            TensorDiff(f"{gate}.output.0", 0, 0, layer, gate, dtype="bfloat16", shape=(128, 8), metrics=_metrics(6e-5)),
            TensorDiff(f"{gate}.output.1", 0, 0, layer, gate, role=ROUTING, dtype="bfloat16", shape=(128, 2),
                       metrics=_metrics(1e-5)),
            TensorDiff(f"{call}.output.0", 0, 0, layer, call, role=EXPERT_CALL, dtype="bfloat16",
                       shape=(9, 64), metrics=_metrics(call_distance)),
            TensorDiff(f"{experts}.output.0", 0, 0, layer, experts, dtype="bfloat16", shape=(128, 64),
                       metrics=_metrics(experts_distance))]


def test_the_experts_output_is_measured_against_the_routers_input_and_weights_not_a_call_inside() -> None:
    """A call inside the experts holds one expert's tokens, other tokens on each side once one flipped: its
    distance says nothing of the experts' input. The experts combine the router's input by its weights."""
    rows = _moe_layer(1, experts_distance=9e-5, call_distance=1e-9)
    rules.apply_relative_rules(rows, LogitsConfig(noise_from_peers=False))
    assert [row.name for row in rows if row.problem] == []
    faulty = _moe_layer(1, experts_distance=2e-3, call_distance=1e-9)
    rules.apply_relative_rules(faulty, LogitsConfig(noise_from_peers=False))
    assert [row.name for row in faulty if row.problem] == [faulty[4].name]
    assert faulty[4].baseline is not None and faulty[4].baseline["tensors"] == [faulty[0].name, faulty[2].name]


def _moe_layers(distances: dict[int, tuple[float, float, float]]) -> list[TensorDiff]:
    """MoE layers as `record` dumps them, each (router input's, routing weights', experts' output) distance."""
    rows: list[TensorDiff] = []
    for layer, (hidden, weights, experts) in distances.items():
        for row in _moe_layer(layer, experts, 1e-9):
            if row.name.endswith("mlp.gate.Qwen3MoeTopKRouter.forward.0.input.0"):
                row.metrics = _metrics(hidden)
            if row.role == ROUTING:
                row.metrics = _metrics(weights)
            row.index = len(rows)
            rows.append(row)
    return rows


# Measured on moe_family_bench's many-small-experts family (64 experts, top-8, seed 40, 5 layers, bf16 eager
# against SDPA): the weights' distance on the tokens that routed alike lies 5-20x above the hidden state's in most
# layers and falls to it in layer 3, where the experts' output carries both (1.5e-4 there, x2.9 the worse
# factor's, 0.83 of its line; 2e-4 here, x4, past the line the other layers' x1.1-1.5 draw).
_NEAR_TIES_LEFT = {1: (3.5e-5, 1.5e-4, 2.3e-4), 2: (3.2e-5, 5.7e-4, 6.4e-4), 3: (3.0e-5, 5.0e-5, 2.0e-4),
                   4: (3.0e-5, 3.7e-4, 4.3e-4), 5: (3.3e-5, 2.6e-4, 3.0e-4)}


def test_the_experts_are_measured_against_both_factors_errors_not_the_worse_one() -> None:
    """The experts combine the hidden state by the routing weights: both factors' errors reach their output. A
    layer whose weights agree as well as its hidden state still carries both, not a jump in amplification."""
    clean = _moe_layers(_NEAR_TIES_LEFT)
    rules.apply_relative_rules(clean, LogitsConfig())
    assert [row.name for row in clean if row.problem] == []
    faulty = _moe_layers({**_NEAR_TIES_LEFT, 3: (3.0e-5, 5.0e-5, 1.0e-3)})
    rules.apply_relative_rules(faulty, LogitsConfig())
    assert [row.name for row in faulty if row.problem] == [faulty[14].name]


def _router_logits(norm_ratio: float, input_distance: float) -> list[TensorDiff]:
    """Four MoE layers' router logits: three move their norm 1e-4, layer 3 `norm_ratio`."""
    rows: list[TensorDiff] = []
    for layer in range(1, 5):
        gate = f"Module.model.layers.{layer}.mlp.gate.Qwen3MoeTopKRouter.forward.0"
        rows.append(TensorDiff(f"{gate}.input.0", len(rows), 0, layer, gate, role=INPUT, dtype="bfloat16",
                               shape=(128, 64), metrics=_metrics(input_distance)))
        ratio = norm_ratio if layer == 3 else 1.0001
        rows.append(TensorDiff(f"{gate}.output.0", len(rows), 0, layer, gate, dtype="bfloat16", shape=(128, 8),
                               metrics={**_metrics(1.5 * input_distance), "norm_ratio": ratio}))
    return rows


def test_a_norm_change_within_its_inputs_error_size_is_no_gain_and_one_beyond_it_is() -> None:
    """A router's logits (a large part shared by every expert) project the input's error onto few directions:
    their norm moves by up to that error's size, sqrt(2 x 4e-5) ~ 0.009, without a gain. With an input
    exact to 1e-8 the same 0.5% is beyond it, and beyond the peers' 1e-4: a gain."""
    noisy = _router_logits(1.005, input_distance=4e-5)
    rules.apply_relative_rules(noisy, LogitsConfig())
    assert [row.name for row in noisy if row.problem] == []
    exact = _router_logits(1.005, input_distance=1e-8)
    rules.apply_relative_rules(exact, LogitsConfig())
    assert [(row.name, row.rule) for row in exact if row.problem] == [(exact[5].name, "norm_ratio")]
    assert "input's error size" in (exact[5].problem or "")


def _measured(module: str, index: int, distance: float, input_distance: float,
              routed_alike: bool = False) -> tuple[TensorDiff, dict[str, Any]]:
    """One bf16 output measured against a float32 golden: its cosine distance and its input's."""
    metrics = {"cosine": 1.0 - distance, "norm_ratio": 1.0}
    row = TensorDiff(name=f"Module.{module}.Linear.forward.0.output.0", index=index, step=0, layer=None,
                     module=f"Module.{module}.Linear.forward.0", dtype="bfloat16", metrics=metrics,
                     carried_metrics=dict(metrics) if routed_alike else None)
    return row, {"cosine": 1.0 - input_distance, "norm_change": 0.0}


def test_an_exact_input_module_of_a_shallow_moe_is_measured_against_its_kind_in_every_other_layer() -> None:
    """Layer 0's `o_proj` of a 4-layer MoE model: its input exact, the later layers' `o_proj` measured on the
    tokens that routed alike (another kind for their amplification): their output distances are still its
    peers, so its distance meets its kind's line, not a fixed one drawn for an amplification."""
    from bisect_npu.oracle.dumps.noise import PeerLines

    measured = [_measured("model.layers.0.self_attn.o_proj", 0, 7.4e-5, 2.8e-6),
                _measured("model.layers.1.self_attn.o_proj", 1, 7.3e-5, 2.2e-4),
                _measured("model.layers.2.self_attn.o_proj", 2, 1.2e-4, 2.1e-4, routed_alike=True),
                _measured("model.layers.3.self_attn.o_proj", 3, 1.0e-4, 1.7e-4, routed_alike=True)]
    lines = PeerLines.of(measured, LogitsConfig())
    row, base = measured[0]
    assert lines.distance[0][0] == "distance" and lines.distance[0][1].peers == 3
    allowed = lines.allowed_distance(row, base)
    assert allowed is not None and allowed > 1e-4
    faulty = [_measured("model.layers.0.self_attn.o_proj", 0, 5e-3, 2.8e-6), *measured[1:]]
    allowed = PeerLines.of(faulty, LogitsConfig()).allowed_distance(*faulty[0])
    assert allowed is not None and allowed < 5e-3


def test_a_kind_with_too_few_peers_for_a_spread_is_measured_against_its_own_few_not_another_kinds_line() -> None:
    """The experts of a 4-layer MoE model (three MoE layers): two peers each, too few for a spread. Another kind
    (attention, four layers) has a line, quieter than the experts' noise: the experts meet the higher of the
    two, their few peers' worst times the spread floor; a fault far beyond both is still beyond it."""
    from bisect_npu.oracle.dumps.noise import PeerLines

    cfg = LogitsConfig()
    attention = [_measured(f"model.layers.{layer}.self_attn", layer, 2e-4 * (1 + layer / 10), 2e-4)
                 for layer in range(4)]
    experts = [_measured(f"model.layers.{layer}.mlp.experts", 10 + layer, 2.5e-4 * factor, 1e-4)
               for layer, factor in ((1, 1.0), (2, 1.1), (3, 2.7))]
    lines = PeerLines.of([*attention, *experts], cfg)
    for row, base in experts:
        allowed = lines.allowed_distance(row, base)
        assert allowed is not None and 1.0 - row.metrics["cosine"] < allowed
    assert lines.distance[13][1].peers == 2
    faulty = [*attention, *experts[:2], _measured("model.layers.3.mlp.experts", 13, 1e-2, 1e-4)]
    allowed = PeerLines.of(faulty, cfg).allowed_distance(*faulty[-1])
    assert allowed is not None and allowed < 1e-2


# ---------------------------------------------------------------- attention's norm change after a router


def _attention(layer: int, norm_ratio: float, input_distance: float, distance: float = 1e-5,
               routed_alike: bool = False, module: str = "self_attn.Qwen3MoeAttention",
               index: int | None = None) -> tuple[TensorDiff, dict[str, Any]]:
    """One layer's attention output (bf16 against a float32 golden), measured whole or on the tokens that routed
    alike (after the first MoE layer), against its whole input."""
    metrics = {**_metrics(distance), "norm_ratio": norm_ratio}
    name = f"Module.model.layers.{layer}.{module}.forward.0"
    row = TensorDiff(f"{name}.output.0", layer if index is None else index, 0, layer, name, dtype="bfloat16",
                     metrics=metrics,
                     carried_metrics=dict(metrics) if routed_alike else None)
    return row, {"cosine": 1.0 - input_distance, "norm_change": 0.0}


def _five_layer_attention(gain_layer: int | None, gain: float, input_distance: float,
                          distance: float = 1e-5) -> list[tuple[TensorDiff, dict[str, Any]]]:
    """A 5-layer MoE model's attention (layer 0 dense, the first router in layer 1: layers 2-4 measured on the
    tokens that routed alike), norm ratios as measured on a clean bf16 pair, `gain` at `gain_layer`."""
    ratios = [1.00038, 1.00101, 1.0012, 1.0068, 1.00352]
    return [_attention(layer, gain if layer == gain_layer else ratio, input_distance, distance,
                       routed_alike=layer >= 2) for layer, ratio in enumerate(ratios)]


def _router_norms() -> list[tuple[TensorDiff, dict[str, Any]]]:
    """Four routers' logits whose norm changes spread widely: a kind with a high line of its own."""
    return [_attention(layer, ratio, 1e-3, module="mlp.gate.Qwen3MoeTopKRouter", index=10 + layer)
            for layer, ratio in zip(range(1, 5), (1.0, 1.02, 1.05, 1.09), strict=True)]


def _norm_findings(measured: list[tuple[TensorDiff, dict[str, Any]]], cfg: LogitsConfig) -> list[str]:
    from bisect_npu.oracle.dumps.noise import PeerLines
    from bisect_npu.oracle.dumps.rules.peer_norm import PeerNorm

    ctx = Context(cfg, PeerLines.of(measured, cfg))
    return [row.name for row, base in measured if PeerNorm().judge(row, base, ctx) is not None]


def test_attentions_norm_peers_are_every_layers_attention_not_those_that_routed_alike_alone() -> None:
    """A 5% gain on layer 2's attention of a 5-layer MoE model. Split by the routing, layers 2-4 are a kind of
    two peers each and meet the highest line of another kind (the routers' logits, 0.1); a norm change is a
    gain on any set of tokens, so every layer's attention is its peer, and the gain stands out of them."""
    cfg = LogitsConfig(peer_mads=12, peer_min_factor=5)
    faulty = _five_layer_attention(2, 1.05065, input_distance=3.8e-4)
    assert _norm_findings([*faulty, *_router_norms()], cfg) == [faulty[2][0].name]
    clean = _five_layer_attention(None, 1.0, input_distance=3.8e-4)
    assert _norm_findings([*clean, *_router_norms()], cfg) == []


def test_attentions_norm_change_along_its_output_is_a_gain_even_within_its_inputs_error_size() -> None:
    """After a flip, attention's whole input carries the flipped tokens' drift (error size 0.067), which reaches
    the tokens that routed alike only through attention's weights. A 5% gain leaves the output's error across it
    small (0.017): the change lies along the output. A clean layer's 2% norm change after flips comes with an
    error across the output larger than it (0.065): no gain. A router's logits keep the input's error size."""
    cfg = LogitsConfig()
    faulty = _five_layer_attention(2, 1.0522, input_distance=2.27e-3, distance=1.5e-4)
    findings = _norm_findings(faulty, cfg)
    assert findings == [faulty[2][0].name]
    row, base = faulty[2]
    from bisect_npu.oracle.dumps.noise import PeerLines
    from bisect_npu.oracle.dumps.rules.peer_norm import PeerNorm

    finding = PeerNorm().judge(row, base, Context(cfg, PeerLines.of(faulty, cfg)))
    assert finding is not None and "along the output" in finding.problem
    clean = _five_layer_attention(2, 1.0223, input_distance=1.25e-2, distance=2.1e-3)
    assert _norm_findings(clean, cfg) == []
    router = [_attention(layer, 1.0522 if layer == 2 else ratio, 2.27e-3, 1.5e-4, module="mlp.gate.TopKRouter")
              for layer, ratio in enumerate([1.00038, 1.00101, 1.0012, 1.0068, 1.00352])]
    assert _norm_findings(router, cfg) == []


def _norm_output(layer: int, norm_ratio: float, input_distance: float, input_change: float) -> tuple[TensorDiff,
                                                                                                      dict[str, Any]]:
    """One layer's post-attention RMSNorm output, bf16 against a float32 golden, and its input's agreement."""
    module = f"Module.model.layers.{layer}.post_attention_layernorm.DeepseekV3RMSNorm.forward.0"
    row = TensorDiff(name=f"{module}.output.0", index=layer, step=0, layer=layer, module=module, dtype="bfloat16",
                     metrics={"cosine": 1.0 - input_distance, "norm_ratio": norm_ratio, "max_abs_error": 1.0})
    return row, {"cosine": 1.0 - input_distance, "norm_change": input_change}


def test_a_norms_gain_stands_out_of_its_peers_whose_input_a_gain_upstream_moved() -> None:
    """Five layers' post-attention norms: layer 2's weight x1.1 (its output's norm moves 0.096 in log), and the
    two layers after it take in a stream whose norm its MoE block moved 5-6%. A norm's output does not follow its
    input's norm: taken off theirs, those input moves left the later norms at -0.05, a spread that hid the gain."""
    from bisect_npu.oracle.dumps.noise import PeerLines
    from bisect_npu.oracle.dumps.rules.base import Context
    from bisect_npu.oracle.dumps.rules.peer_norm import PeerNorm

    cfg = LogitsConfig(peer_mads=12, peer_min_factor=5)
    measured = [_norm_output(0, 1.00001, 4e-6, 2e-4), _norm_output(1, 1.00003, 2e-5, 2e-4),
                _norm_output(2, 1.1015, 3.4e-5, 3.5e-6), _norm_output(3, 1.00003, 5.2e-3, 0.063),
                _norm_output(4, 0.99999, 6.4e-3, 0.047)]
    ctx = Context(cfg, PeerLines.of(measured, cfg))
    found = {row.layer: PeerNorm().judge(row, base, ctx) for row, base in measured}
    assert [layer for layer, finding in found.items() if finding is not None] == [2]
    assert "norm ratio 1.1015" in (found[2].problem if found[2] is not None else "")
