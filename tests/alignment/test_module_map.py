"""The vLLM-transformers module map and the dumps it lines up: real dumps written by the probes' dump
writer, shaped as each engine's modules return their outputs (vLLM's fused projections, its norms'
and decoder layers' (hidden, residual)), aligned through `align_records` without an engine."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bisect_npu.alignment.align import align_records, check_comparable
from bisect_npu.alignment.line_up import line_up
from bisect_npu.alignment.module_map import (
    FAMILIES,
    MODULE_MAP,
    TRANSFORMERS,
    VLLM,
    Boundary,
    attribute,
    transformers_path,
)
from bisect_npu.alignment.record import FORMAT, MANIFEST, VERSION, cases_digest, read_record, relative_dumps
from bisect_npu.errors import UsageError
from bisect_npu.probe.layer_dump import DumpWriter

TOKENS, HIDDEN, Q, KV, FFN = 5, 8, 8, 4, 12
Ops = list[tuple[str, str, Any]]


def tensor(seed: int, *shape: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape or (TOKENS, HIDDEN)).astype(np.float32))


def write_ops(directory: Path, ops: Ops, rank: int = 0) -> Path:
    """`ops` (module path, class, output) through the probes' dump writer: one prefill step."""
    writer = DumpWriter(str(directory), ["*"], [0], rank)
    writer.begin_step()
    for path, cls, output in ops:
        writer.save(path, cls, output)
    writer.end_step()
    return directory


class Qwen3Layer:
    """One Qwen3 decoder layer's tensors, and each engine's module outputs made of them."""

    def __init__(self, seed: int = 0) -> None:
        self.e, self.n0, self.q, self.k, self.v = tensor(seed), tensor(seed + 1), tensor(seed + 2, TOKENS, Q), \
            tensor(seed + 3, TOKENS, KV), tensor(seed + 4, TOKENS, KV)
        self.o, self.n1, self.g, self.u = tensor(seed + 5), tensor(seed + 6), tensor(seed + 7, TOKENS, FFN), \
            tensor(seed + 8, TOKENS, FFN)
        self.d, self.nf = tensor(seed + 9), tensor(seed + 10)
        self.residual = self.e + self.o

    def transformers(self, *, mlp: str = "Qwen3MLP", prefix: str = "Qwen3", fused_gate_up: bool = False) -> Ops:
        layer = "model.layers.0"
        ffn: Ops = ([(f"{layer}.mlp.gate_up_proj", "Linear", torch.cat([self.g, self.u], -1))] if fused_gate_up else
                    [(f"{layer}.mlp.gate_proj", "Linear", self.g), (f"{layer}.mlp.act_fn", "SiLUActivation", self.g),
                     (f"{layer}.mlp.up_proj", "Linear", self.u)])
        return [("model.embed_tokens", "Embedding", self.e),
                ("model.rotary_emb", f"{prefix}RotaryEmbedding", (tensor(20, TOKENS, 4), tensor(21, TOKENS, 4))),
                (f"{layer}.input_layernorm", f"{prefix}RMSNorm", self.n0),
                (f"{layer}.self_attn.q_proj", "Linear", self.q), (f"{layer}.self_attn.k_proj", "Linear", self.k),
                (f"{layer}.self_attn.v_proj", "Linear", self.v), (f"{layer}.self_attn.o_proj", "Linear", self.o),
                (f"{layer}.self_attn", f"{prefix}Attention", (self.o, tensor(22, 2, TOKENS, TOKENS))),
                (f"{layer}.post_attention_layernorm", f"{prefix}RMSNorm", self.n1), *ffn,
                (f"{layer}.mlp.down_proj", "Linear", self.d), (f"{layer}.mlp", mlp, self.d),
                (layer, f"{prefix}DecoderLayer", self.residual + self.d),
                ("model.norm", f"{prefix}RMSNorm", self.nf), ("lm_head", "Linear", tensor(23, TOKENS, 32))]

    def vllm(self, *, qkv: torch.Tensor | None = None, residual: torch.Tensor | None = None, norm: str = "RMSNorm",
             mlp: str = "Qwen2MLP", attention: str = "Qwen3Attention", layer_cls: str = "Qwen3DecoderLayer") -> Ops:
        layer = "model.layers.0"
        residual = self.residual if residual is None else residual
        return [("model.embed_tokens", "VocabParallelEmbedding", self.e),
                (f"{layer}.input_layernorm", norm, self.n0),
                (f"{layer}.self_attn.qkv_proj", "QKVParallelLinear",
                 (torch.cat([self.q, self.k, self.v], -1) if qkv is None else qkv, None)),
                (f"{layer}.self_attn.rotary_emb", "RotaryEmbedding", (self.q, self.k)),
                (f"{layer}.self_attn.attn", "Attention", tensor(24, TOKENS, Q)),
                (f"{layer}.self_attn.o_proj", "RowParallelLinear", (self.o, None)),
                (f"{layer}.self_attn", attention, self.o),
                (f"{layer}.post_attention_layernorm", norm, (self.n1, residual)),
                (f"{layer}.mlp.gate_up_proj", "MergedColumnParallelLinear", (torch.cat([self.g, self.u], -1), None)),
                (f"{layer}.mlp.act_fn", "SiluAndMul", self.g * self.u),
                (f"{layer}.mlp.down_proj", "RowParallelLinear", (self.d, None)), (f"{layer}.mlp", mlp, self.d),
                (layer, layer_cls, (self.d, residual)),
                ("model.norm", norm, (self.nf, self.residual + self.d))]


def make_record(root: Path, ops: Ops, backend: str, ranks: int = 1, flat: bool = True) -> Path:
    """A complete record of one case whose forward pass is the dump of `ops` (rank 0 .. ranks-1)."""
    root.mkdir(parents=True)
    dump = root / "obs-c-t0.dump"
    for rank in range(ranks):
        write_ops(dump, ops if flat else [(p, c, o.unsqueeze(0) if isinstance(o, torch.Tensor) else o)
                                          for p, c, o in ops], rank)
    observation = {"schema_version": 1, "case_id": "c", "prompt_token_ids": [1, 2], "text": "a b",
                   "output_token_ids": [3, 4], "sampling": {"temperature": 0.0}, "logits_dump": str(dump),
                   "extra": {"stages": {"chat_template": "hi", "prompt_token_ids": [1, 2], "forward": str(dump),
                                        "sampler": {"temperature": 0.0}, "text": "a b"}}}
    (root / "obs-c-t0.json").write_text(json.dumps(relative_dumps(observation, root)))
    (root / MANIFEST).write_text(json.dumps({
        "format": FORMAT, "version": VERSION, "complete": True, "backend": backend, "device": "cpu",
        "recipe": {"name": "r", "digest": "d", "cases_digest": cases_digest([{"id": "c"}])},
        "model_identity": {"vocab_size": 32, "hidden_size": HIDDEN, "num_hidden_layers": 1, "tokenizer": "t"},
        "case_ids": ["c"], "cases": {"c": "obs-c-t0.json"}}))
    return root


def forward(result: Any) -> dict[str, Any]:
    return dict(result.cases[0].verdict.figures["stages"]["forward"])


def test_a_vllm_dump_lines_up_with_transformers_at_attention_mlp_norms_and_layers(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers"))
    vllm = read_record(make_record(tmp_path / "vllm", layer.vllm(), "vllm"))
    for reference, candidate in ((hf, vllm), (vllm, hf)):
        result = align_records(reference, candidate)
        assert result.aligned, result.to_markdown()
        lined = result.cases[0].lined_up
        assert lined is not None and lined.families == ["Qwen3"]
        compared = {point.op for point in lined.points}
        assert compared == {f"Module.{path}.{cls}.forward.0" for path, cls, _ in layer.transformers()
                            if not path.endswith(("rotary_emb", "act_fn", "lm_head"))}
        assert forward(result)["tensors_compared"] == len(compared) == 14
        assert lined.cut == ["model.layers.0.self_attn.qkv_proj (QKVParallelLinear) -> q_proj | k_proj | v_proj",
                             "model.layers.0.mlp.gate_up_proj (MergedColumnParallelLinear) -> gate_proj | up_proj"]
        assert lined.summed == 1 and not lined.unknown and not lined.only_reference and not lined.only_candidate
        assert {"model.layers.0.self_attn.attn (Attention)", "lm_head (Linear)"} <= \
            {label for labels in lined.no_counterpart.values() for label in labels}
    assert "tensors lined up by the vLLM-transformers module map (Qwen3;" in result.to_markdown()


def test_modules_both_engines_name_alike_are_compared_at_their_shared_output(tmp_path: Path) -> None:
    layer = Qwen3Layer()  # transformers' eager attention returns its weights too; vLLM's attention does not
    attention = [(p, c, o) for p, c, o in layer.transformers() if p.endswith("self_attn")]
    hf = read_record(make_record(tmp_path / "hf", attention, "transformers"))
    vllm = read_record(make_record(tmp_path / "vllm", [(p, c, o) for p, c, o in layer.vllm()
                                                       if p.endswith("self_attn")], "vllm"))
    result = align_records(hf, vllm)
    assert result.aligned and forward(result)["tensors_compared"] == 1, result.to_markdown()


def test_a_fault_in_one_piece_of_a_fused_projection_is_named_at_its_transformers_module(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    swapped = torch.cat([layer.q, layer.v, layer.k], -1)  # k and v in each other's place: same sizes
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers"))
    vllm = read_record(make_record(tmp_path / "vllm", layer.vllm(qkv=swapped), "vllm"))
    result = align_records(hf, vllm)
    first = result.first
    assert first is not None and first.first_stage == "forward"
    assert first.first_module == "Module.model.layers.0.self_attn.k_proj.Linear.forward.0"
    assert first.first_vllm_module == "model.layers.0.self_attn.qkv_proj (QKVParallelLinear)"
    assert "(vLLM's model.layers.0.self_attn.qkv_proj (QKVParallelLinear))" in result.summary()
    assert result.to_dict()["first_vllm_module"] == first.first_vllm_module


def test_vllms_decoder_layer_output_is_its_hidden_plus_residual(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers"))
    dropped = read_record(make_record(tmp_path / "vllm", layer.vllm(residual=layer.e), "vllm"))  # lost o_proj's add
    result = align_records(hf, dropped)
    assert result.first is not None  # the norm's own output (0) still agrees: its residual (1) is not compared
    assert result.first.first_module == "Module.model.layers.0.Qwen3DecoderLayer.forward.0"
    assert result.first.first_vllm_module == "model.layers.0 (Qwen3DecoderLayer)"


def test_a_projection_transformers_fuses_too_is_compared_whole(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    glm = [(p.replace("Qwen3", "Glm4"), c.replace("Qwen3", "Glm4").replace("Qwen2MLP", "LlamaMLP"), o)
           for p, c, o in layer.vllm(mlp="LlamaMLP", attention="Glm4Attention", layer_cls="Glm4DecoderLayer")]
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(mlp="Glm4MLP", prefix="Glm4",
                                                                      fused_gate_up=True), "transformers"))
    result = align_records(hf, read_record(make_record(tmp_path / "vllm", glm, "vllm")))
    lined = result.cases[0].lined_up
    assert result.aligned and lined is not None and lined.families == ["GLM-4"]
    assert lined.cut == ["model.layers.0.self_attn.qkv_proj (QKVParallelLinear) -> q_proj | k_proj | v_proj"]
    assert "Module.model.layers.0.mlp.gate_up_proj.Linear.forward.0" in {point.op for point in lined.points}


def test_moe_router_block_and_routed_only_experts_line_up(tmp_path: Path) -> None:
    x, logits, routed = tensor(30), tensor(31, TOKENS, 4), tensor(32)
    ids = torch.tensor([[0, 1]] * TOKENS)
    hf = [("model.layers.1.mlp.gate", "Qwen3MoeTopKRouter", (logits, tensor(33, TOKENS, 2), ids)),
          ("model.layers.1.mlp.experts", "Qwen3MoeExperts", routed),
          ("model.layers.1.mlp", "Qwen3MoeSparseMoeBlock", routed), ("model.layers.1", "Qwen3MoeDecoderLayer", x)]
    vllm = [("model.layers.1.mlp.gate", "GateLinear", (logits, None)),
            ("model.layers.1.mlp.experts", "MoERunner", routed),
            ("model.layers.1.mlp", "Qwen3MoeSparseMoeBlock", routed),
            ("model.layers.1", "Qwen3MoeDecoderLayer", (x - routed, routed))]
    lined = line_up(write_ops(tmp_path / "hf", hf), write_ops(tmp_path / "vllm", vllm), TRANSFORMERS, VLLM)
    assert lined is not None and lined.families == ["Qwen3-MoE"]
    assert [point.op for point in lined.points] == [f"Module.{p}.{c}.forward.0" for p, c, _ in hf]


@pytest.mark.parametrize(("vllm", "hf", "boundary", "why"), [
    (("model.layers.1.mlp.experts", "MoERunner"), ("model.layers.1.mlp.experts", "DeepseekV3Experts"),
     Boundary.NONE, "shared experts"),
    (("model.layers.1.mlp.experts", "AscendFusedMoE"), ("model.layers.1.mlp.experts", "Qwen3MoeExperts"),
     Boundary.SAME, ""),
    (("model.layers.1.mlp.shared_expert", "Qwen2MoeMLP"), ("model.layers.1.mlp.shared_expert", "Qwen2MoeMLP"),
     Boundary.NONE, "sigmoid"),
    (("model.layers.1.mlp.shared_experts", "DeepseekV2MLP"), ("model.layers.1.mlp.shared_experts", "DeepseekV3MLP"),
     Boundary.SAME, ""),
    (("model.layers.1.mlp.gate", "ReplicatedLinear"), ("model.layers.1.mlp.gate", "DeepseekV3TopkRouter"),
     Boundary.SAME, "router logits"),
    (("model.layers.1.mlp", "DeepseekV2MoE"), ("model.layers.1.mlp", "DeepseekV3MoE"), Boundary.SAME, ""),
    (("model.layers.0.self_attn", "DeepseekV2MLAAttention"), ("model.layers.0.self_attn", "DeepseekV3Attention"),
     Boundary.SAME, ""),
    (("model.layers.0.self_attn.kv_a_layernorm", "AscendRMSNorm"),
     ("model.layers.0.self_attn.kv_a_layernorm", "DeepseekV2RMSNorm"), Boundary.SAME, ""),
    (("model.layers.0.self_attn.fused_qkv_a_proj", "DeepSeekV2FusedQkvAProjLinear"),
     ("model.layers.0.self_attn.fused_qkv_a_proj", "Linear"), Boundary.SPLIT, "q_a_proj"),
    (("model.layers.3.block_sparse_moe", "MixtralMoE"), ("model.layers.3.mlp", "MixtralSparseMoeBlock"),
     Boundary.SAME, ""),
    (("model.layers.2", "Qwen2DecoderLayer"), ("model.layers.2", "Qwen2DecoderLayer"), Boundary.LAYER, "residual"),
    (("model.layers.2", "LlamaDecoderLayer"), ("model.layers.2", "MistralDecoderLayer"), Boundary.LAYER, ""),
])
def test_the_map_pairs_each_familys_classes_at_their_boundary(vllm: tuple[str, str], hf: tuple[str, str],
                                                               boundary: Boundary, why: str) -> None:
    assert transformers_path(vllm[0]) == hf[0]
    counterpart = MODULE_MAP.pair(*vllm, *hf)
    assert counterpart is not None and counterpart.boundary is boundary
    assert why in counterpart.why


def test_the_mtp_layer_and_vllm_kernels_have_no_counterpart() -> None:
    for path in ("model.layers.61.mtp_block.self_attn.o_proj", "model.layers.61.eh_proj",
                 "model.layers.0.self_attn.attn", "model.layers.0.self_attn.mla_attn", "model.layers.0.mlp.act_fn",
                 "lm_head"):
        counterpart = MODULE_MAP.one_sided(path)
        assert counterpart is not None and counterpart.boundary is Boundary.NONE, path
    assert MODULE_MAP.one_sided("model.layers.0.self_attn.o_proj") is None
    mtp = MODULE_MAP.lookup(VLLM, "model.layers.61", "DeepSeekMultiTokenPredictorLayer")
    assert [c.boundary for c in mtp] == [Boundary.NONE]
    assert attribute("model.layers.61") == "layers.N" and attribute("model.layers.6.mlp") == "mlp"


def test_modules_the_map_does_not_know_are_said_in_one_line(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    novel = [(p, c.replace("Qwen3Attention", "Qwen9Attention"), o) for p, c, o in layer.vllm()]
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers"))
    result = align_records(hf, read_record(make_record(tmp_path / "vllm", novel, "vllm")))
    lined = result.cases[0].lined_up
    assert lined is not None and result.aligned
    line = lined.unknown_line()
    assert line is not None and "\n" not in line
    assert "vLLM model.layers.*.self_attn (Qwen9Attention) against transformers' Qwen3Attention" in line
    assert line in result.to_markdown()
    assert "Module.model.layers.0.self_attn.Qwen3Attention.forward.0" not in {point.op for point in lined.points}

    alien = read_record(make_record(tmp_path / "alien", [("model.layers.0.mixer", "MambaMixer", tensor(0))], "vllm"))
    with pytest.raises(UsageError, match=r"share no module once lined up .*MambaMixer.*same capture\.layers") as error:
        check_comparable(hf, alien)
    assert "\n" not in str(error.value)


def test_vllm_ascends_replacement_classes_line_up_by_path(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    gpu = read_record(make_record(tmp_path / "gpu", layer.vllm(), "vllm"))
    npu = read_record(make_record(tmp_path / "npu", layer.vllm(norm="AscendRMSNorm"), "vllm"))
    result = align_records(gpu, npu)
    lined = result.cases[0].lined_up
    assert result.aligned and lined is not None and not lined.across_engines
    assert forward(result)["tensors_compared"] == sum(len(o) if isinstance(o, tuple) and o[1] is not None else 1
                                                      for _, _, o in layer.vllm())
    assert "by module path" in result.to_markdown()
    assert align_records(gpu, read_record(make_record(tmp_path / "same", layer.vllm(), "vllm"))).cases[0].lined_up \
        is None
    fewer = read_record(make_record(tmp_path / "fewer", layer.vllm(norm="AscendRMSNorm")[:-1], "vllm"))
    with pytest.raises(UsageError, match="name different modules"):
        check_comparable(gpu, fewer)


def test_a_tensor_parallel_shard_is_left_out_with_its_reason(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    shard = torch.cat([layer.q[:, :Q // 2], layer.k[:, :KV // 2], layer.v[:, :KV // 2]], -1)
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers"))
    vllm = read_record(make_record(tmp_path / "vllm", layer.vllm(qkv=shard), "vllm", ranks=2))
    result = align_records(hf, vllm)
    lined = result.cases[0].lined_up
    assert result.aligned and lined is not None
    assert any("qkv_proj" in said and "tensor-parallel shard" in said for said in lined.left_out)
    assert any("step0/rank1: in one dump only" in said for said in lined.left_out)
    assert "Module.model.layers.0.self_attn.o_proj.Linear.forward.0" in {point.op for point in lined.points}


def test_a_transformers_dump_with_its_batch_dimension_is_lined_up_by_shape(tmp_path: Path) -> None:
    layer = Qwen3Layer()
    hf = read_record(make_record(tmp_path / "hf", layer.transformers(), "transformers", flat=False))
    result = align_records(hf, read_record(make_record(tmp_path / "vllm", layer.vllm(), "vllm")))
    assert result.aligned and forward(result)["tensors_compared"] == 14


def test_an_integer_output_is_not_compared_with_a_float_one(tmp_path: Path) -> None:
    ids = torch.tensor([[0, 1]] * TOKENS)  # transformers 4.x's DeepSeek-V3 router returned the expert ids first
    hf = write_ops(tmp_path / "hf", [("model.layers.1.mlp.gate", "DeepseekV3TopkRouter", (ids, tensor(1, TOKENS, 2))),
                                     ("model.layers.1.mlp", "DeepseekV3MoE", tensor(2))])
    vllm = write_ops(tmp_path / "vllm", [("model.layers.1.mlp.gate", "GateLinear", (tensor(3, TOKENS, 4), None)),
                                         ("model.layers.1.mlp", "DeepseekV2MoE", tensor(2))])
    lined = line_up(hf, vllm, TRANSFORMERS, VLLM)
    assert lined is not None and [point.op for point in lined.points] == \
        ["Module.model.layers.1.mlp.DeepseekV3MoE.forward.0"]
    assert any("int64 against transformers'" in said or "float32 against transformers' int64" in said
               for said in lined.left_out)


def test_every_transformers_class_in_the_map_is_one_transformers_defines() -> None:
    import transformers

    for family in FAMILIES:
        model = getattr(transformers, family.transformers_model)
        module = importlib.import_module(model.__module__)
        named = {cls for counterpart in family.counterparts for cls in counterpart.transformers} - {"Linear"}
        missing = sorted(cls for cls in named if not hasattr(module, cls))
        assert not missing, f"{family.name}: {missing}"


def test_the_reference_page_names_every_family_and_class_of_the_map() -> None:
    from bisect_npu.alignment.module_map import COMMON, ONE_SIDED
    from tests.helpers.paths import REPO_ROOT

    page = (REPO_ROOT / "docs" / "reference" / "module-map.md").read_text(encoding="utf-8")
    named = {cls for family in FAMILIES for counterpart in (*COMMON, *family.counterparts)
             for cls in counterpart.vllm | counterpart.transformers}
    named |= {attr for counterpart in ONE_SIDED for attr in counterpart.attrs}
    missing = sorted(name for name in named if f"`{name}`" not in page)
    assert not missing, missing
    assert all(f"| {family.name}" in page or f"{family.name}," in page for family in FAMILIES)
