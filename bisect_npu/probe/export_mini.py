"""Write the demo engine's model as a Hugging Face model directory: the golden for an alignment.

``python -m bisect_npu.probe.export_mini MODEL DEST`` (MODEL as the demo recipes give it,
``seed:0``) with a `tinyvllm` on PYTHONPATH, as `serve_mini` serves whichever one it finds. The
weights already carry the names of transformers' `Qwen3ForCausalLM`; the config says the same
sizes, RoPE (linear scaling) and tied embeddings; the tokenizer is the engine's word vocabulary as a
`tokenizers` WordLevel model (lower-cased, split on whitespace, the same ids); its chat template
renders messages as the demo engine does (``role: content`` lines). A word outside the vocabulary
becomes ``<unk>`` here where the engine hashes it to a word: prompts for an alignment use
vocabulary words.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}"
                 "{% if not loop.last %}\n{% endif %}{% endfor %}")


def export(model: str, dest: Path) -> Path:
    """Write config, weights (safetensors) and tokenizer of the demo model `model` to `dest`."""
    from tinyvllm.config import load_model_config
    from tinyvllm.model import Qwen3Model
    from tinyvllm.tokenizer import SPECIAL_TOKENS, WordTokenizer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    cfg = load_model_config(model)
    words = WordTokenizer(cfg.vocab_size)
    hf = as_transformers(Qwen3Model(cfg), eos_token_id=words.eos_token_id, pad_token_id=0, bos_token_id=None)
    dest.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(dest)
    vocab = Tokenizer(models.WordLevel(vocab=dict(words.ids), unk_token="<unk>"))
    vocab.normalizer = normalizers.Lowercase()
    vocab.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast: Any = PreTrainedTokenizerFast  # untyped constructor
    tokenizer = fast(tokenizer_object=vocab, eos_token="<eos>", pad_token="<pad>",
                                        unk_token="<unk>", bos_token=None, chat_template=CHAT_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.save_pretrained(dest)
    return dest


def as_transformers(engine_model: Any, **token_ids: int | None) -> Any:
    """The demo engine's model (`tinyvllm.model.Qwen3Model`) as transformers' `Qwen3ForCausalLM`, or
    `Qwen3MoeForCausalLM` for its MoE variant (a config with `num_experts`), fp32, its weights loaded
    under their own names (an MoE layer's experts stacked as transformers holds them) and the
    embeddings tied."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = engine_model.config
    experts = int(getattr(cfg, "num_experts", 0))
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": cfg.rope_scaling_factor, "rope_theta": cfg.rope_theta},
        attention_bias=False, use_sliding_window=False, **token_ids)
    config: Any  # the configs' typed keywords do not take a **dict
    model_class: Any
    if experts:
        config, model_class = Qwen3MoeConfig, Qwen3MoeForCausalLM
        common.update(num_experts=experts, num_experts_per_tok=cfg.num_experts_per_tok, decoder_sparse_step=1,
                      moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
                      mlp_only_layers=[])
        weights = _stacked_experts(engine_model.w, cfg.num_hidden_layers, experts)
    else:
        config, model_class, weights = Qwen3Config, Qwen3ForCausalLM, engine_model.w
    hf: Any = model_class(config(**common))
    hf.to(torch.float32).eval()
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"the demo weights do not fit {model_class.__name__}: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    hf.tie_weights()
    return hf


def _stacked_experts(weights: dict[str, Any], layers: int, experts: int) -> dict[str, Any]:
    """The MoE layers' per-expert projections as transformers' `Qwen3MoeExperts` holds them: `gate_up_proj`
    `[experts, 2 x intermediate, hidden]` (each expert's gate rows, then its up rows) and `down_proj`."""
    import torch

    out = {name: value for name, value in weights.items() if ".mlp.experts." not in name}
    for layer in range(layers):
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = torch.stack([torch.cat([weights[f"{p}{e}.gate_proj.weight"],
                                                          weights[f"{p}{e}.up_proj.weight"]]) for e in range(experts)])
        out[p + "down_proj"] = torch.stack([weights[f"{p}{e}.down_proj.weight"] for e in range(experts)])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bisect_npu.probe.export_mini MODEL DEST", file=sys.stderr)
        return 2
    print(export(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
