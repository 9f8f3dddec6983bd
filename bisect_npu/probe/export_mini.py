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
    """The demo engine's model (`tinyvllm.model.Qwen3Model`) as transformers' `Qwen3ForCausalLM`,
    fp32, its weights loaded under their own names and the embeddings tied."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = engine_model.config
    config: Any = Qwen3Config  # its typed keywords do not take a **dict
    hf_cfg = config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": cfg.rope_scaling_factor, "rope_theta": cfg.rope_theta},
        attention_bias=False, use_sliding_window=False, **token_ids)
    hf: Any = Qwen3ForCausalLM(hf_cfg)
    hf.to(torch.float32).eval()
    missing, unexpected = hf.load_state_dict(engine_model.w, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"the demo weights do not fit Qwen3ForCausalLM: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    hf.tie_weights()
    return hf


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bisect_npu.probe.export_mini MODEL DEST", file=sys.stderr)
        return 2
    print(export(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
