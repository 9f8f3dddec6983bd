"""The token match's tie margin, measured on greedy outputs of correct kernels and precisions.

    .venv/bin/python bench/token_tie_bench.py [--tokens 64] [--prompts 12]

A tiny HF transformers Qwen3 (random init, nothing downloaded; the final norm scaled x10 so that
next-token distributions are peaked as a trained model's are) decodes greedily, with its top-5
logprobs, 12 random prompts per seed. The fp32 SDPA run is the reference; the clean candidates are
bf16 SDPA, bf16 eager and fp32 on one thread (correct kernels and precisions); the faulty ones
scale one layer's o_proj x1.5 or put a 2% gain on one MLP (fp32).

At a candidate's first mismatch with the reference, the *flip* is how far the logprob difference
of the two tokens moved between the runs: the reference's preference for its token plus the
candidate's for its own. Tune split (seeds 0, 1): the margin is the largest flip any clean
candidate shows there (the smallest margin with no false alarm), rounded up to two digits.
Report split (seeds 2, 3): false alarms and faults called bad at that margin, beside the
reference-gap rule (`tie_margin` 0.05 and the tune split's largest clean reference gap).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import TokenMatchConfig
from bisect_npu.oracle.tokens import first_mismatch, judge_tokens

RUNS: dict[str, dict[str, Any]] = {
    "bf16-sdpa": {"dtype": torch.bfloat16, "attn": "sdpa", "threads": 2, "fault": None},
    "bf16-eager": {"dtype": torch.bfloat16, "attn": "eager", "threads": 2, "fault": None},
    "fp32-1thread": {"dtype": torch.float32, "attn": "sdpa", "threads": 1, "fault": None},
    "o_proj-x1.5": {"dtype": torch.float32, "attn": "sdpa", "threads": 2, "fault": "o_proj"},
    "mlp-gain-2%": {"dtype": torch.float32, "attn": "sdpa", "threads": 2, "fault": "gain"},
}
REFERENCE = {"dtype": torch.float32, "attn": "sdpa", "threads": 2, "fault": None}
SPLITS = {"tune": (0, 1), "report": (2, 3)}


def model(seed: int, spec: dict[str, Any]) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
    torch.manual_seed(seed)
    out = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        out.model.norm.weight.mul_(10.0)
        layer = out.model.layers[2 + seed % 3]
        if spec["fault"] == "o_proj":
            layer.self_attn.o_proj.weight.mul_(1.5)
    if spec["fault"] == "gain":
        original = layer.mlp.forward
        layer.mlp.forward = lambda *a, **k: original(*a, **k) * 1.02
    out.set_attn_implementation(spec["attn"])
    return out.to(spec["dtype"])


def generate(seed: int, spec: dict[str, Any], prompts: int, tokens: int) -> list[Observation]:
    """Greedy outputs with top-5 logprobs, one Observation per prompt."""
    net = model(seed, spec)
    generator = torch.Generator().manual_seed(100 + seed)
    ids = torch.randint(0, 4096, (prompts, 12), generator=generator)
    before = torch.get_num_threads()
    torch.set_num_threads(spec["threads"])
    try:
        with torch.no_grad():
            out = net.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens,
                               min_new_tokens=tokens, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=0, eos_token_id=None)
    finally:
        torch.set_num_threads(before)
    logprobs = [torch.log_softmax(step.float(), dim=-1) for step in out.logits]
    result = []
    for row in range(prompts):
        top = [torch.topk(step[row], 5) for step in logprobs]
        result.append(Observation(output_token_ids=out.sequences[row, ids.shape[1]:].tolist(),
                                  top_logprobs=[list(zip(t.indices.tolist(), t.values.tolist(), strict=True))
                                                for t in top]))
    return result


def _lp(step: list[Any], token: int) -> float | None:
    return next((float(lp) for tok, lp in step if int(tok) == token), None)


def mismatch_figures(cand: Observation, ref: Observation) -> dict[str, float] | None:
    """At the first mismatch: the reference's gap between the two tokens, and the flip (None: no mismatch)."""
    index = first_mismatch(cand.output_token_ids, ref.output_token_ids)
    if index is None:
        return None
    want, got = ref.output_token_ids[index], cand.output_token_ids[index]
    ref_step, cand_step = (ref.top_logprobs or [])[index], (cand.top_logprobs or [])[index]
    ref_want, ref_got = _lp(ref_step, want), _lp(ref_step, got)
    cand_got, cand_want = _lp(cand_step, got), _lp(cand_step, want)
    ref_gap = math.inf if ref_want is None or ref_got is None else ref_want - ref_got
    cand_gap = math.inf if cand_got is None or cand_want is None else cand_got - cand_want
    return {"index": index, "reference_gap": ref_gap, "flip": ref_gap + cand_gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=12)
    args = parser.parse_args()
    started = time.perf_counter()
    outputs: dict[tuple[str, int], tuple[list[Observation], list[Observation]]] = {}
    for split, seeds in SPLITS.items():
        for seed in seeds:
            ref = generate(seed, REFERENCE, args.prompts, args.tokens)
            for name, spec in RUNS.items():
                outputs[(name, seed)] = (generate(seed, spec, args.prompts, args.tokens), ref)
        print(f"{split}: generated ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    figures = {key: [mismatch_figures(c, r) for c, r in zip(*pair, strict=True)] for key, pair in outputs.items()}
    clean = [name for name, spec in RUNS.items() if spec["fault"] is None]
    tune_clean = [f for (name, seed), rows in figures.items() if name in clean and seed in SPLITS["tune"]
                  for f in rows if f is not None]
    flip_margin = math.ceil(max(f["flip"] for f in tune_clean if math.isfinite(f["flip"])) * 100) / 100
    gap_margin = math.ceil(max(f["reference_gap"] for f in tune_clean if math.isfinite(f["reference_gap"])) * 100) / 100
    print(f"tune split {SPLITS['tune']}: {len(tune_clean)} clean first mismatches; largest flip -> flip_margin "
          f"{flip_margin}; largest reference gap {gap_margin}")
    rules = {"reference gap 0.05 (0.2.0)": TokenMatchConfig(tie_margin=0.05, flip_margin=None),
             f"reference gap {gap_margin} (tuned)": TokenMatchConfig(tie_margin=gap_margin, flip_margin=None),
             f"flip {flip_margin} (tuned)": TokenMatchConfig(flip_margin=flip_margin)}
    print("\n| rule | split | " + " | ".join(RUNS) + " |")
    print("|---|---|" + "---|" * len(RUNS))
    for label, cfg in rules.items():
        for split, seeds in SPLITS.items():
            cells = []
            for name in RUNS:
                verdicts = [judge_tokens(c, r, cfg).kind for seed in seeds
                            for c, r in zip(*outputs[(name, seed)], strict=True)]
                bad = sum(v == VerdictKind.BAD for v in verdicts)
                cells.append(f"{bad}/{len(verdicts)} bad")
            print(f"| {label} | {split} {seeds} | " + " | ".join(cells) + " |")
    print("\nfirst mismatches (report split): run, reference gap, flip")
    for (name, seed), rows in sorted(figures.items()):
        if seed in SPLITS["report"]:
            shown = [f"{f['reference_gap']:.2f}/{f['flip']:.2f}" for f in rows if f is not None]
            print(f"  {name} seed {seed}: {' '.join(shown) or 'no mismatch'}")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
