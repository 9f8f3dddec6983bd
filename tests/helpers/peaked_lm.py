"""A tiny HF Qwen3 or Llama whose next-token distributions are peaked as a trained model's are
(random init, nothing downloaded): the final norm's weight is scaled up, so the logits have a
trained model's magnitude (median top-2 logprob gap of a few nats), and greedy outputs of it in
bf16 and fp32 differ by rounding alone. Used by the token tie rule's tests and bench."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bisect_npu.observations import Observation

VOCAB = 2048


@dataclass(frozen=True)
class Run:
    """How one greedy run is made: precision, attention kernel, threads, and an injected fault."""

    dtype: str = "float32"
    attn: str = "sdpa"
    threads: int = 1
    fault: str | None = None  # "o_proj": one layer's o_proj x1.5; "gain": a 2% gain on one MLP's output


def peaked_model(family: str = "Qwen3", *, seed: int = 0, hidden: int = 128, layers: int = 4,
                 logit_scale: float = 10.0, run: Run = Run()) -> Any:
    """The model of `family` (Qwen3 or Llama), its final norm scaled by `logit_scale`, with `run`'s
    fault, kernel and precision."""
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, tie_word_embeddings=True,
        max_position_embeddings=512)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    layer = model.model.layers[1 + seed % (layers - 1)]
    with torch.no_grad():
        model.model.norm.weight.mul_(logit_scale)
        if run.fault == "o_proj":
            layer.self_attn.o_proj.weight.mul_(1.5)
    if run.fault == "gain":
        original = layer.mlp.forward
        layer.mlp.forward = lambda *args, **kwargs: original(*args, **kwargs) * 1.02
    model.set_attn_implementation(run.attn)
    return model.to(getattr(torch, run.dtype))


def greedy(model: Any, run: Run, *, prompts: int, tokens: int, seed: int = 0, top_k: int = 5) -> list[Observation]:
    """Greedy outputs of random prompts with their top-k logprobs, one Observation per prompt, each
    saying its precision as the probe's backends do (`extra.engine_args.dtype`)."""
    generator = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, VOCAB, (prompts, 12), generator=generator)
    before = torch.get_num_threads()
    torch.set_num_threads(run.threads)
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens,
                                 min_new_tokens=tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0, eos_token_id=None)
    finally:
        torch.set_num_threads(before)
    logprobs = [torch.log_softmax(step.float(), dim=-1) for step in out.logits]
    result = []
    for row in range(prompts):
        top = [torch.topk(step[row], top_k) for step in logprobs]
        result.append(Observation(
            case_id=f"p{row}", prompt_token_ids=ids[row].tolist(),
            output_token_ids=out.sequences[row, ids.shape[1]:].tolist(),
            top_logprobs=[list(zip(t.indices.tolist(), t.values.tolist(), strict=True)) for t in top],
            extra={"engine_args": {"dtype": run.dtype, "attn_implementation": run.attn}}))
    return result
