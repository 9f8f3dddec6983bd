"""The module map: which of vLLM's modules hold the same tensor as which of Hugging Face transformers'.

vLLM builds the models transformers builds, from other classes and with other boundaries, so a
vLLM dump and a transformers dump of the same model name their modules differently (vLLM's Qwen3
MLP is a `Qwen2MLP`, its norms are `RMSNorm`, vllm-ascend swaps in `AscendRMSNorm`) and some of
vLLM's tensors exist nowhere in transformers. This map says, family by family, where the two hold
the same tensor, so `align` compares attention, MLP or MoE block, router and norms across engines:

* **same**: the first output on both sides. vLLM's linear layers return `(output, bias)`, its
  norms with a residual `(normed, residual + input)` (the residual add fused into the norm),
  transformers' attention `(output, weights)`: the first is the tensor both hold.
* **split**: vLLM fuses projections transformers keeps apart, concatenated along the last axis:
  `qkv_proj` = `q_proj | k_proj | v_proj`, `gate_up_proj` = `gate_proj | up_proj`, MLA's
  `fused_qkv_a_proj` = `q_a_proj | kv_a_proj_with_mqa`. The fused output is cut at transformers'
  sizes (read from its dump) and each piece compared with its module; where transformers fuses
  too (GLM-4's `gate_up_proj`) the two are compared whole.
* **layer**: vLLM's decoder layer returns `(hidden, residual)` and leaves their sum to the next
  layer's fused add+norm; that sum is transformers' layer output.
* **none**: no counterpart: vLLM's attention kernel (`attn`, `mla_attn`), rotary embedding and
  `act_fn` (silu(gate) * up, where transformers' `act_fn` is silu(gate) alone), transformers'
  `lm_head` (vLLM computes the sampled rows' logits outside the model's forward: the text stage
  compares the tokens), and the per-family cases below (the MoE experts where vLLM adds the
  shared experts inside them, Qwen2-MoE's gated shared expert, DeepSeek's MTP layer).

A module is looked up by its attribute (the last part of its path) and its class on each side;
one the map does not know is left out of the comparison and named. Routing for the MoE families:
vLLM's router scores are the output of `mlp.gate` (`GateLinear`, or `ReplicatedLinear` in older
releases: the logits before softmax or sigmoid, transformers' router output 0); the experts each
token chose are picked inside `mlp.experts` (`MoERunner`, `FusedMoE` before) by its `router`
(`FusedMoERouter.select_experts`, not a module, so no forward hook sees them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Boundary(StrEnum):
    """Where a vLLM module and its transformers counterpart hold the same tensor."""

    SAME = "same"
    SPLIT = "split"
    LAYER = "layer"
    NONE = "none"


VLLM, TRANSFORMERS = "vllm", "transformers"
# The decoder layers' place in a path: `model.layers.N` is looked up as the attribute `layers.N`.
DECODER_LAYER = "layers.N"
_DECODER_PATH = re.compile(r"(?:^|\.)layers\.\d+$")


@dataclass(frozen=True)
class Counterpart:
    """One module kind: the attributes it sits at, each engine's classes, and the boundary both hold."""

    kind: str
    attrs: tuple[str, ...]
    vllm: frozenset[str]
    transformers: frozenset[str]
    boundary: Boundary = Boundary.SAME
    parts: tuple[str, ...] = ()
    why: str = ""

    def classes(self, engine: str) -> frozenset[str]:
        return self.vllm if engine == VLLM else self.transformers


@dataclass(frozen=True)
class Family:
    """A model family: its causal-LM class in each engine and its module kinds."""

    name: str
    vllm_model: str
    transformers_model: str
    counterparts: tuple[Counterpart, ...]


def _set(*names: str) -> frozenset[str]:
    return frozenset(names)


# vLLM's layers (vllm-ascend registers its own in their place: the `Ascend...` classes).
V_NORM = _set("RMSNorm", "AscendRMSNorm", "GemmaRMSNorm", "AscendGemmaRMSNorm")
V_EMBED = _set("VocabParallelEmbedding", "AscendVocabParallelEmbedding")
V_QKV = _set("QKVParallelLinear", "AscendQKVParallelLinear")
V_MERGED = _set("MergedColumnParallelLinear", "AscendMergedColumnParallelLinear", "DeepSeekV2FusedQkvAProjLinear",
                "CustomDeepseekV2MergedReplicatedLinear")
V_ROW = _set("RowParallelLinear", "AscendRowParallelLinear", "RowParallelScatterLinear",
             "CustomDeepseekV2RowParallelLinear", "CustomDeepseekV2RowParallelLinearReplaceAllreduce",
             "ReplicatedLinear", "AscendReplicatedLinear")
V_COLUMN = _set("ColumnParallelLinear", "AscendColumnParallelLinear", "ReplicatedLinear", "AscendReplicatedLinear")
V_GATE = _set("GateLinear", "AscendGateLinear", "ReplicatedLinear", "AscendReplicatedLinear")
V_EXPERTS = _set("MoERunner", "AscendMoERunner", "FusedMoE", "SharedFusedMoE", "AscendFusedMoE",
                 "AscendSharedFusedMoE", "AscendFusedMoE310", "AscendSharedFusedMoE310")
T_LINEAR = _set("Linear")

_SHARED_EXPERTS_INSIDE = ("vLLM's experts add the shared experts (and the routed scaling) that transformers "
                          "adds in the MoE block: compared at the block")

# Module kinds every family shares: the embedding and the projections (transformers' are nn.Linear).
COMMON = (
    Counterpart("embedding", ("embed_tokens",), V_EMBED, _set("Embedding")),
    Counterpart("output projection", ("o_proj", "down_proj"), V_ROW, T_LINEAR),
    Counterpart("attention projections", ("qkv_proj",), V_QKV, T_LINEAR, Boundary.SPLIT, ("q_proj", "k_proj", "v_proj"),
                "vLLM's fused q|k|v output cut at transformers' q_proj, k_proj, v_proj sizes"),
    Counterpart("MLP projections", ("gate_up_proj",), V_MERGED, T_LINEAR, Boundary.SPLIT, ("gate_proj", "up_proj"),
                "vLLM's fused gate|up output cut at transformers' gate_proj, up_proj sizes; compared whole where "
                "transformers fuses them too"),
    Counterpart("MLA down projections", ("fused_qkv_a_proj",), V_MERGED, T_LINEAR, Boundary.SPLIT,
                ("q_a_proj", "kv_a_proj_with_mqa"),
                "vLLM's fused q_a|kv_a output cut at transformers' q_a_proj, kv_a_proj_with_mqa sizes"),
    Counterpart("MLA projections", ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"), V_COLUMN,
                T_LINEAR),
    Counterpart("shared-expert gate", ("shared_expert_gate",), V_GATE, T_LINEAR),
)

# Modules of one engine only, whatever their class: compared nowhere (the `why` says so).
ONE_SIDED = (
    Counterpart("attention kernel", ("attn", "mla_attn"), frozenset(), frozenset(), Boundary.NONE,
                why="vLLM's attention kernel: transformers calls a function, not a module"),
    Counterpart("rotary embedding", ("rotary_emb",), frozenset(), frozenset(), Boundary.NONE,
                why="vLLM rotates q and k in place, transformers returns the cos and sin tables"),
    Counterpart("activation", ("act_fn", "activation_fn"), frozenset(), frozenset(), Boundary.NONE,
                why="vLLM's act_fn is silu(gate) * up, transformers' silu(gate) alone"),
    Counterpart("logits", ("lm_head", "logits_processor"), frozenset(), frozenset(), Boundary.NONE,
                why="vLLM computes the sampled rows' logits outside the model's forward: the text stage compares "
                    "the tokens"),
    Counterpart("routed experts", ("routed_experts", "quant_method"), frozenset(), frozenset(), Boundary.NONE,
                why="vLLM's expert kernels inside its experts module"),
    Counterpart("MTP layer", ("mtp_block", "shared_head", "enorm", "hnorm", "eh_proj"), frozenset(), frozenset(),
                Boundary.NONE, why="transformers has no MTP layer (it drops DeepSeek-V3's MTP weights)"),
)
# The causal LM's base model (`model`): transformers returns an output object, not a tensor.
BASE_MODEL = Counterpart("base model", ("model",), frozenset(), frozenset(), Boundary.NONE,
                         why="transformers' base model returns an output object; its last norm is compared")


def _dense(t: str, *, v_decoder: tuple[str, ...], v_attention: tuple[str, ...], v_mlp: tuple[str, ...],
           t_mlp: str | None = None, t_norm: str | None = None, norms: tuple[str, ...] = ()) -> tuple[Counterpart, ...]:
    """The decoder layer, attention, dense MLP and norms of a family whose transformers classes are `t...`."""
    mlp = (Counterpart("MLP", ("mlp", "shared_experts"), _set(*v_mlp), _set(t_mlp or f"{t}MLP")),) if v_mlp else ()
    return (
        Counterpart("decoder layer", (DECODER_LAYER,), _set(*v_decoder), _set(f"{t}DecoderLayer"), Boundary.LAYER,
                    why="vLLM's (hidden, residual) summed: transformers' layer output"),
        Counterpart("attention", ("self_attn",), _set(*v_attention), _set(f"{t}Attention")),
        *mlp,
        Counterpart("norm", ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm", *norms),
                    V_NORM, _set(t_norm or f"{t}RMSNorm")),
    )


def _scaled_embedding(t: str) -> Counterpart:
    """Gemma's embedding: transformers' module returns it times sqrt(hidden), vLLM's unscaled (the model scales
    it after the module), so the two outputs are not one tensor."""
    return Counterpart("scaled embedding", ("embed_tokens",), V_EMBED, _set(f"{t}TextScaledWordEmbedding"),
                       Boundary.NONE, why="transformers' embedding module returns it times sqrt(hidden), vLLM scales "
                                          "it after the module: compared from the first decoder layer on")


_SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def _moe(t: str, *, v_block: tuple[str, ...], t_block: str, t_router: str,
         experts_same: bool) -> tuple[Counterpart, ...]:
    """A family's MoE block, router and experts (compared only where vLLM's experts are routed-only).

    transformers before 5 had an nn.Linear router (the logits, as vLLM's) and a list of expert MLPs."""
    experts = (Counterpart("experts", ("experts",), V_EXPERTS, _set(f"{t}Experts"))
               if experts_same else
               Counterpart("experts", ("experts",), V_EXPERTS, _set(f"{t}Experts"), Boundary.NONE,
                           why=_SHARED_EXPERTS_INSIDE))
    return (Counterpart("MoE block", ("mlp",), _set(*v_block), _set(t_block)),
            Counterpart("router", ("gate",), V_GATE, _set(t_router, "Linear"),
                        why="the router logits (transformers' router output 0; its weights and expert ids have no "
                            "vLLM module output)"),
            experts)


FAMILIES: tuple[Family, ...] = (
    Family("Llama", "LlamaForCausalLM", "LlamaForCausalLM",
           _dense("Llama", v_decoder=("LlamaDecoderLayer",), v_attention=("LlamaAttention",),
                  v_mlp=("LlamaMLP",))),
    Family("Mistral", "MistralForCausalLM", "MistralForCausalLM",
           _dense("Mistral", v_decoder=("MistralDecoderLayer", "LlamaDecoderLayer"),
                  v_attention=("MistralAttention", "LlamaAttention"), v_mlp=("MistralMLP", "LlamaMLP"))),
    Family("Qwen2", "Qwen2ForCausalLM", "Qwen2ForCausalLM",
           _dense("Qwen2", v_decoder=("Qwen2DecoderLayer", "CustomQwen2DecoderLayer", "AscendQwen2DecoderLayer"),
                  v_attention=("Qwen2Attention", "CustomQwen2Attention", "AscendQwen2Attention"), v_mlp=("Qwen2MLP",))),
    Family("Qwen3", "Qwen3ForCausalLM", "Qwen3ForCausalLM",
           _dense("Qwen3", v_decoder=("Qwen3DecoderLayer", "CustomQwen3DecoderLayer"),
                  v_attention=("Qwen3Attention", "CustomQwen3Attention"),
                  v_mlp=("Qwen2MLP", "Qwen3MLP", "CustomQwen3MLP"))),
    Family("Qwen2-MoE", "Qwen2MoeForCausalLM", "Qwen2MoeForCausalLM",
           _dense("Qwen2Moe", v_decoder=("Qwen2MoeDecoderLayer",), v_attention=("Qwen2MoeAttention",),
                  v_mlp=("Qwen2MoeMLP",))
           + _moe("Qwen2Moe", v_block=("Qwen2MoeSparseMoeBlock",), t_block="Qwen2MoeSparseMoeBlock",
                  t_router="Qwen2MoeTopKRouter", experts_same=False)
           + (Counterpart("shared expert", ("shared_expert",), _set("Qwen2MoeMLP"), _set("Qwen2MoeMLP"), Boundary.NONE,
                          why="vLLM multiplies by sigmoid(shared_expert_gate) inside, transformers in the block: "
                              "compared at its down_proj and the shared_expert_gate"),)),
    Family("Qwen3-MoE", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM",
           _dense("Qwen3Moe", v_decoder=("Qwen3MoeDecoderLayer", "CustomQwen3MoeDecoderLayer",
                                                     "AscendQwen3MoeDecoderLayer"),
                  v_attention=("Qwen3MoeAttention",), v_mlp=("Qwen3MoeMLP",))
           + _moe("Qwen3Moe", v_block=("Qwen3MoeSparseMoeBlock", "CustomSparseMoeBlock", "AscendSparseMoeBlock"),
                  t_block="Qwen3MoeSparseMoeBlock", t_router="Qwen3MoeTopKRouter", experts_same=True)),
    Family("Mixtral", "MixtralForCausalLM", "MixtralForCausalLM",
           _dense("Mixtral", v_decoder=("MixtralDecoderLayer",), v_attention=("MixtralAttention",),
                  v_mlp=())
           + _moe("Mixtral", v_block=("MixtralMoE",), t_block="MixtralSparseMoeBlock", t_router="MixtralTopKRouter",
                  experts_same=True)),
    *(Family(f"DeepSeek-{version}", f"Deepseek{version}ForCausalLM", f"Deepseek{version}ForCausalLM",
             _dense(f"Deepseek{version}",
                    v_decoder=("DeepseekV2DecoderLayer", "CustomDeepseekV2DecoderLayer",
                               "CustomDeepseekDBODecoderLayer"),
                    v_attention=("DeepseekV2MLAAttention", "DeepseekV2Attention", "CustomDeepseekV2MLAAttention",
                                 "CustomDeepseekDBOMLAAttention"),
                    v_mlp=("DeepseekV2MLP", "CustomDeepseekV2MLP", "CustomDeepseekDBOMLP"),
                    norms=("q_a_layernorm", "kv_a_layernorm"))
             + _moe(f"Deepseek{version}", v_block=("DeepseekV2MoE", "CustomDeepseekV2MoE", "CustomDeepseekDBOMoE"),
                    t_block="DeepseekV2Moe" if version == "V2" else "DeepseekV3MoE",
                    t_router=f"Deepseek{version}TopkRouter", experts_same=False)
             + (Counterpart("MTP layer", (DECODER_LAYER,), _set("DeepSeekMultiTokenPredictorLayer",
                                                                "CustomDeepSeekMultiTokenPredictorLayer"),
                            frozenset(), Boundary.NONE, why="transformers has no MTP layer"),))
      for version in ("V2", "V3")),
    *(Family(name, f"{t}ForCausalLM", f"{t}ForCausalLM",
             (*_dense(t, v_decoder=(f"{t}DecoderLayer",), v_attention=(f"{t}Attention",), v_mlp=(f"{t}MLP",),
                      norms=norms), _scaled_embedding(t)))
      for name, t, norms in (("Gemma", "Gemma", ()), ("Gemma2", "Gemma2", _SANDWICH_NORMS),
                             ("Gemma3", "Gemma3", _SANDWICH_NORMS))),
    # vLLM's Phi3 is its Llama with Phi3's weights (older releases: Phi3 subclasses of Llama's); both engines fuse
    # q|k|v and gate|up, so those are compared whole.
    Family("Phi3", "Phi3ForCausalLM", "Phi3ForCausalLM",
           _dense("Phi3", v_decoder=("Phi3DecoderLayer", "LlamaDecoderLayer"),
                  v_attention=("Phi3Attention", "LlamaAttention"), v_mlp=("LlamaMLP", "Phi3MLP"))),
    # OLMo2 normalises attention's and the MLP's outputs before the residual add; vLLM's layer returns the sum.
    Family("OLMo2", "Olmo2ForCausalLM", "Olmo2ForCausalLM",
           _dense("Olmo2", v_decoder=("Olmo2DecoderLayer",), v_attention=("Olmo2Attention",), v_mlp=("Olmo2MLP",),
                  norms=("post_feedforward_layernorm",))),
    Family("OLMoE", "OlmoeForCausalLM", "OlmoeForCausalLM",
           _dense("Olmoe", v_decoder=("OlmoeDecoderLayer",), v_attention=("OlmoeAttention",), v_mlp=())
           + _moe("Olmoe", v_block=("OlmoeMoE",), t_block="OlmoeSparseMoeBlock", t_router="OlmoeTopKRouter",
                  experts_same=True)),
    Family("GLM-4", "Glm4ForCausalLM", "Glm4ForCausalLM",
           _dense("Glm4", v_decoder=("Glm4DecoderLayer",), v_attention=("Glm4Attention",),
                  v_mlp=("LlamaMLP", "Glm4MLP"), norms=("post_self_attn_layernorm", "post_mlp_layernorm"))),
    Family("GLM-4-MoE", "Glm4MoeForCausalLM", "Glm4MoeForCausalLM",
           _dense("Glm4Moe", v_decoder=("Glm4MoeDecoderLayer",), v_attention=("Glm4MoeAttention",),
                  v_mlp=("Glm4MoeMLP",))
           + _moe("Glm4Moe", v_block=("Glm4MoE",), t_block="Glm4MoeMoE", t_router="Glm4MoeTopkRouter",
                  experts_same=False)),
)

# vLLM's Mixtral calls its MoE block `block_sparse_moe`, transformers 5 `mlp`.
VLLM_ATTR_RENAMES = {"block_sparse_moe": "mlp"}


def attribute(path: str) -> str:
    """The attribute a module sits at: the last part of its path, `layers.N` for a decoder layer."""
    return DECODER_LAYER if _DECODER_PATH.search(path) else path.rsplit(".", 1)[-1]


class ModuleMap:
    """The families' counterparts indexed by (engine, attribute, class), plus the one-engine modules."""

    def __init__(self, families: tuple[Family, ...] = FAMILIES) -> None:
        self.families = families
        self._index: dict[tuple[str, str, str], list[tuple[Counterpart, str]]] = {}
        for name, counterparts in (("", COMMON), *((family.name, family.counterparts) for family in families)):
            for counterpart in counterparts:
                for engine in (VLLM, TRANSFORMERS):
                    for attr in counterpart.attrs:
                        for cls in counterpart.classes(engine):
                            self._index.setdefault((engine, attr, cls), []).append((counterpart, name))
        self._one_sided = {attr: counterpart for counterpart in ONE_SIDED for attr in counterpart.attrs}

    def one_sided(self, path: str) -> Counterpart | None:
        """The engine-only kind a module is or sits inside (vLLM's `attn`, an MTP layer's modules, ...)."""
        if path == BASE_MODEL.attrs[0]:
            return BASE_MODEL
        return next((self._one_sided[part] for part in path.split(".") if part in self._one_sided), None)

    def lookup(self, engine: str, path: str, cls: str) -> list[Counterpart]:
        """The counterparts (one per distinct kind) that name `cls` at this module's attribute on `engine`."""
        found: list[Counterpart] = []
        for counterpart, _ in self._index.get(self._key(engine, path, cls), []):
            if counterpart not in found:
                found.append(counterpart)
        return found

    def pair(self, vllm_path: str, vllm_cls: str, hf_path: str, hf_cls: str) -> Counterpart | None:
        """The counterpart that holds both classes at these paths, None when no family pairs them."""
        theirs = self.lookup(TRANSFORMERS, hf_path, hf_cls)
        return next((c for c in self.lookup(VLLM, vllm_path, vllm_cls) if c in theirs), None)

    def families_of(self, engine: str, path: str, cls: str) -> tuple[str, ...]:
        """The families whose own modules (not the projections all share) include this one."""
        return tuple(dict.fromkeys(name for _, name in self._index.get(self._key(engine, path, cls), []) if name))

    @staticmethod
    def _key(engine: str, path: str, cls: str) -> tuple[str, str, str]:
        """The index key: the attribute under transformers' name (vLLM's Mixtral `block_sparse_moe` is `mlp`)."""
        return engine, attribute(transformers_path(path) if engine == VLLM else path), cls


def transformers_path(vllm_path: str) -> str:
    """vLLM's module path in transformers' naming (the attributes the two engines name apart)."""
    return ".".join(VLLM_ATTR_RENAMES.get(part, part) for part in vllm_path.split("."))


MODULE_MAP = ModuleMap()
