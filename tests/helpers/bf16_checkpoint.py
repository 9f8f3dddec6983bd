"""A tiny published-style checkpoint: a random-init HF Qwen3 or Llama whose weights are stored in bf16.

Why: published weights are bf16, so an fp32 golden runs the same weights upcast, and its
embedding output is bit-identical to a bf16 candidate's. Random init (std 0.02) scaled x2.5 on the
2-D weights gives a trained model's activation sizes, as `msprobe_qwen3` does. `record_pair`
records it with the transformers backend in fp32 and bf16 on the CPU, one decoder layer a tensor.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bisect_npu import api
from bisect_npu.alignment.record import Record
from tests.helpers.tiny_qwen3 import FAMILY_SIZES, _tokenizer

# The embedding, each decoder layer (not its submodules), the final norm and the logits.
LAYERS = ["model.embed_tokens", "model.layers.[0-9]", "model.norm", "lm_head"]


def write_bf16_checkpoint(directory: Path, family: str, layers: int = 6, seed: int = 0,
                          scale: float = 2.5, faults: dict[str, float] | None = None) -> Path:
    """The model directory; `faults` scales named weights (after the bf16 rounding: the fault is exact)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    directory.mkdir(parents=True, exist_ok=True)
    bpe = _tokenizer(directory, 2000)
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=bpe.get_vocab_size(), hidden_size=128, intermediate_size=384, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        torch_dtype="bfloat16", eos_token_id=bpe.token_to_id("<|im_end|>"), bos_token_id=None,
        **FAMILY_SIZES[family])
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(scale)
    model.to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    if faults:
        weights = load_file(directory / "model.safetensors")
        for name, factor in faults.items():
            weights[name] = (weights[name].float() * factor).to(torch.bfloat16)
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def record(model: Path, out: Path, dtype: str) -> Record:
    """A transformers record of `model` at `dtype` on the CPU, one greedy case, the layers of `LAYERS`."""
    recipe = out.with_suffix(".yaml")
    recipe.write_text(yaml.safe_dump({
        "name": "bf16-checkpoint", "model": {"path": str(model), "dtype": dtype},
        "engine": {"backend": "transformers", "args": {"device": "cpu"}},
        "cases": [{"id": "chat", "messages": [{"role": "user", "content": "the quick brown fox jumps over the lazy "
                                                                          "dog and some more words"}],
                   "sampling": {"temperature": 0.0, "max_tokens": 4, "seed": 0, "logprobs": 5}}],
        "capture": {"layers": LAYERS, "steps": [0]},
        "oracle": {"kinds": ["stages"]}, "reference": {"kind": "good_end"}}), encoding="utf-8")
    return api.record(recipe, out)
