"""The module map on families the first map did not name (Gemma, Gemma2, Gemma3, Phi3, OLMo2, OLMoE): every module
of a real tiny transformers model of the family is known to the map or named as one engine's, and each pairs with
the vLLM class vLLM's model of that family builds at its place (read from vLLM's model sources)."""

from __future__ import annotations

from typing import Any

import pytest

from bisect_npu.alignment.module_map import MODULE_MAP, TRANSFORMERS, Boundary, attribute

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# vLLM's linear layers and embedding, every family's.
_LINEARS = {"qkv_proj": "QKVParallelLinear", "o_proj": "RowParallelLinear",
            "gate_up_proj": "MergedColumnParallelLinear", "down_proj": "RowParallelLinear",
            "embed_tokens": "VocabParallelEmbedding"}
# vLLM's classes by attribute, per family: its decoder layer, attention, MLP or MoE block, router and norms.
VLLM_CLASSES: dict[str, dict[str, str]] = {
    "Gemma": {"layers.N": "GemmaDecoderLayer", "self_attn": "GemmaAttention", "mlp": "GemmaMLP",
              "norm": "GemmaRMSNorm"},
    "Gemma2": {"layers.N": "Gemma2DecoderLayer", "self_attn": "Gemma2Attention", "mlp": "Gemma2MLP",
               "norm": "GemmaRMSNorm"},
    "Gemma3": {"layers.N": "Gemma3DecoderLayer", "self_attn": "Gemma3Attention", "mlp": "Gemma3MLP",
               "norm": "GemmaRMSNorm"},
    "Phi3": {"layers.N": "LlamaDecoderLayer", "self_attn": "LlamaAttention", "mlp": "LlamaMLP", "norm": "RMSNorm"},
    "Olmo2": {"layers.N": "Olmo2DecoderLayer", "self_attn": "Olmo2Attention", "mlp": "Olmo2MLP", "norm": "RMSNorm"},
    "Olmoe": {"layers.N": "OlmoeDecoderLayer", "self_attn": "OlmoeAttention", "mlp": "OlmoeMoE", "gate": "GateLinear",
              "experts": "FusedMoE", "norm": "RMSNorm"},
}
# transformers' attributes vLLM fuses (compared through the fused module) or computes inside another module.
# Containers have no forward of their own: nothing is dumped for them.
Containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
_FUSED_IN_VLLM = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def _tiny(arch: str) -> Any:
    extra: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2} if arch == "Olmoe" else {}
    config_class = getattr(transformers, "Gemma3TextConfig" if arch == "Gemma3" else f"{arch}Config")
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                          pad_token_id=0, bos_token_id=None, eos_token_id=None, **extra)
    return getattr(transformers, f"{arch}ForCausalLM")(config)


def _vllm_class(arch: str, attr: str) -> str | None:
    own = VLLM_CLASSES[arch]
    if attr in own:
        return own[attr]
    if attr.endswith(("norm", "layernorm")):
        return own["norm"]
    return _LINEARS.get(attr)


@pytest.mark.parametrize("arch", list(VLLM_CLASSES))
def test_every_module_of_a_real_model_of_the_family_is_known_and_pairs_with_vllms(arch: str) -> None:
    model = _tiny(arch)
    unknown, unpaired, paired = [], [], []
    for path, module in model.named_modules():
        if not path or path == "model" or MODULE_MAP.one_sided(path) is not None or isinstance(module, Containers) \
                or "dropout" in path:
            continue
        cls, attr = type(module).__name__, attribute(path)
        if attr in _FUSED_IN_VLLM:  # cut out of vLLM's fused output (test_module_map.py)
            continue
        if not MODULE_MAP.lookup(TRANSFORMERS, path, cls):
            unknown.append(f"{path} ({cls})")
            continue
        vllm_cls = _vllm_class(arch, attr)
        counterpart = MODULE_MAP.pair(path, vllm_cls or "", path, cls) if vllm_cls else None
        (paired if counterpart is not None else unpaired).append((path, cls, vllm_cls, counterpart))
    assert not unknown, f"{arch}: transformers modules the map does not know: {unknown}"
    assert not unpaired, f"{arch}: no counterpart for {[(p, c, v) for p, c, v, _ in unpaired]}"
    kinds = {counterpart.kind for _, _, _, counterpart in paired}
    assert {"decoder layer", "attention", "norm"} <= kinds, kinds
    assert ("MoE block" in kinds and "router" in kinds) if arch == "Olmoe" else "MLP" in kinds, kinds


@pytest.mark.parametrize("arch", ["Gemma", "Gemma2", "Gemma3"])
def test_gemmas_scaled_embedding_is_not_compared_with_vllms_unscaled_one(arch: str) -> None:
    model = _tiny(arch)
    cls = type(model.model.embed_tokens).__name__
    counterpart = MODULE_MAP.pair("model.embed_tokens", "VocabParallelEmbedding", "model.embed_tokens", cls)
    assert counterpart is not None and counterpart.boundary is Boundary.NONE and "sqrt" in counterpart.why


def test_phi3s_fused_projections_are_compared_whole_as_vllms() -> None:
    model = _tiny("Phi3")
    layer = model.model.layers[0]
    assert type(layer.self_attn.qkv_proj).__name__ == "Linear" and hasattr(layer.mlp, "gate_up_proj")
    for path, vllm_cls in (("model.layers.0.self_attn.qkv_proj", "QKVParallelLinear"),
                           ("model.layers.0.mlp.gate_up_proj", "MergedColumnParallelLinear")):
        counterpart = MODULE_MAP.pair(path, vllm_cls, path, "Linear")
        assert counterpart is not None and counterpart.boundary is Boundary.SPLIT
