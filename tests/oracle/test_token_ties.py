"""The one tie rule (oracle/ties.py): its margin the pair's noise tail at the tokens compared, bounded by
the pair's precisions, on real greedy outputs of a peaked tiny HF Qwen3 (bf16 SDPA and eager against the fp32
golden: ties; a 1.5x o_proj fault: bad), and the same rule in the stages oracle's text stage and
so in `align`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.alignment.align import align_records
from bisect_npu.alignment.record import Record, read_record
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import LogitsConfig, StagesConfig, TokenMatchConfig
from bisect_npu.oracle.stages import judge_stages
from bisect_npu.oracle.ties import AMPLIFICATION, EPSILON, PROVENANCE, logit_spread, precision, tail_margin, tie_margin
from bisect_npu.oracle.tokens import first_mismatch, judge_tokens
from tests.helpers.records import make_record


def steps(*rows: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    return [list(row) for row in rows]


def pair(noise: float, dtype: str, spread: float = 4.0, agreed: int = 12, moved: float = 0.3,
         ref_dtype: str = "float32") -> tuple[Observation, Observation]:
    """A reference and a candidate agreeing on `agreed` tokens whose other candidate moved by up to `noise`
    (0.5 to 1 times it, varying by step), then a first mismatch whose flip is `moved`."""
    ref_rows = [[(1, -0.1), (2, -0.1 - spread)] for _ in range(agreed)] + [[(3, -0.60), (4, -0.60 - moved / 2)]]
    cand_rows = [[(1, -0.1), (2, -0.1 - spread + noise * (0.5 + (j % 5) / 8))] for j in range(agreed)]
    cand_rows.append([(4, -0.60), (3, -0.60 - moved / 2)])
    ref = Observation(output_token_ids=[1] * agreed + [3], top_logprobs=steps(*ref_rows),
                      extra={"engine_args": {"dtype": ref_dtype}})
    cand = Observation(output_token_ids=[1] * agreed + [4], top_logprobs=steps(*cand_rows),
                       extra={"engine_args": {"dtype": dtype}})
    return cand, ref


def test_the_margin_is_the_pairs_noise_tail_bounded_by_what_its_precisions_explain() -> None:
    quiet = tie_margin(*pair(0.06, "bfloat16", spread=8.0), upto=12, floor=0.05)
    assert quiet.source == "measured noise" and quiet.noise == pytest.approx(0.06)
    assert quiet.noise_margin is not None  # the tail reaches beyond the largest draw:
    assert 0.06 < quiet.margin == quiet.noise_margin < quiet.bound
    beyond = tie_margin(*pair(0.85, "bfloat16", spread=20.0), upto=12, floor=0.05)  # its tail, not its noise
    assert beyond.source.startswith("precision bound") and beyond.margin == pytest.approx(beyond.bound)
    assert beyond.noise_margin is not None and beyond.noise is not None
    assert beyond.noise < beyond.bound < beyond.noise_margin
    loud = tie_margin(*pair(0.9, "bfloat16"), upto=12, floor=0.05)  # its noise itself beyond the bound
    assert loud.amplification is not None and loud.amplification > AMPLIFICATION
    assert loud.margin == 0.05 and "beyond what rounding explains" in loud.source  # a fault moves agreed tokens
    fp32 = tie_margin(*pair(0.02, "float32"), upto=12, floor=0.05)
    assert fp32.margin == 0.05 and fp32.bound < 1e-4
    unmeasured = tie_margin(*pair(0.02, "bfloat16", agreed=2), upto=2, floor=0.05)
    assert unmeasured.noise is None and unmeasured.source == "precision bound"
    verdict = judge_tokens(*pair(0.9, "bfloat16", spread=20.0), TokenMatchConfig())
    assert verdict.kind == VerdictKind.GOOD  # flip 0.3 within what bf16 explains at this logit spread
    assert {"tie_noise", "tie_noise_margin", "tie_margin_used", "tie_precision_bound", "tie_amplification"} <= set(
        verdict.figures)
    assert verdict.figures["tie_rule_provenance"] == PROVENANCE
    assert "margin" in verdict.reason and "noise" in verdict.reason and "one rounding" in verdict.reason
    assert judge_tokens(*pair(0.02, "float32"), TokenMatchConfig()).kind == VerdictKind.BAD


def test_the_noise_tail_is_read_at_the_number_of_tokens_compared() -> None:
    draws = [0.01 * (1 + i % 10) for i in range(200)]
    short, long = tail_margin(draws, 16, 0.01), tail_margin(draws, 4096, 0.01)
    assert max(draws) < short < long  # more tokens compared: a larger largest draw is expected
    assert long - short == pytest.approx((0.1 - 0.08) / math.log(5.0) * math.log(4096 / 16), rel=0.05)


def test_a_deep_models_rounding_is_a_tie_and_a_faults_noise_is_capped() -> None:
    """Rounding amplified by depth (the agreed tokens at ~5x one bf16 rounding, the flip within their tail) is a
    tie; a fault's agreed tokens at ~40x: the margin is the floor and a flip beyond it is bad."""
    unit = EPSILON["bfloat16"] * 4.0
    deep = judge_tokens(*pair(5 * unit, "bfloat16", moved=4.5 * unit, agreed=40), TokenMatchConfig())
    assert deep.kind == VerdictKind.GOOD
    assert deep.figures["tie_margin_used"] > 4.5 * unit > 3.0 * unit  # the previous rule's cap: 3x one rounding
    faulty = judge_tokens(*pair(40 * unit, "bfloat16", moved=15 * unit, agreed=40), TokenMatchConfig())
    assert faulty.kind == VerdictKind.BAD and "beyond what rounding explains" in faulty.figures["tie_margin_source"]
    near = judge_tokens(*pair(40 * unit, "bfloat16", moved=3 * unit, agreed=40), TokenMatchConfig())
    assert near.kind == VerdictKind.BAD  # even a small flip: the pair's agreed tokens already show the fault


def test_a_flip_past_a_sides_top_k_is_at_least_what_its_last_listed_logprob_says() -> None:
    """The candidate's top-k lacks the reference's token: the flip is at least the reference's preference plus
    the candidate's best over its last listed logprob; beyond the margin that is no tie, whatever the reference's
    own gap."""
    cand, ref = pair(0.01, "bfloat16", spread=4.0, agreed=12)
    ref_steps, cand_steps = list(ref.top_logprobs or []), list(cand.top_logprobs or [])
    ref_steps[-1] = [(3, -0.60), (4, -0.62), (5, -0.7)]  # the reference: a near tie between 3 and 4
    cand_steps[-1] = [(4, -0.05), (5, -2.5), (6, -3.0)]  # the candidate: 4 far ahead, 3 not even listed
    far = judge_tokens(cand.model_copy(update={"top_logprobs": cand_steps}),
                       ref.model_copy(update={"top_logprobs": ref_steps}), TokenMatchConfig())
    assert far.kind == VerdictKind.BAD and far.figures["flip_is_lower_bound"] is True
    assert far.figures["flip"] == pytest.approx(0.02 + 2.95) and "at least" in far.reason
    cand_steps[-1] = [(4, -0.60), (5, -0.61), (6, -0.62)]  # listed logprobs close: the least flip is small
    near = judge_tokens(cand.model_copy(update={"top_logprobs": cand_steps}),
                        ref.model_copy(update={"top_logprobs": ref_steps}), TokenMatchConfig())
    assert near.kind == VerdictKind.GOOD and "flip" not in near.figures  # the reference's own gap decides


def test_the_logit_spread_is_the_upper_quartile_of_the_steps() -> None:
    gaps = [1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0, 4.0]
    obs = Observation(output_token_ids=[1] * len(gaps), top_logprobs=[[(1, 0.0), (2, -g)] for g in gaps])
    assert logit_spread(obs) == pytest.approx(4.0)  # a flat output's median (1.0) would understate it


@pytest.mark.parametrize(("given", "read"), [({"engine_args": {"dtype": "torch.bfloat16"}}, "bfloat16"),
                                             ({"dtype": "float16"}, "float16"), ({"dtype": "fp32"}, "float32"),
                                             ({"engine_args": {"dtype": "auto"}}, "bfloat16"), ({}, "bfloat16")])
def test_a_precision_is_read_from_the_observation_and_an_unknown_one_counts_as_bfloat16(given: dict[str, Any],
                                                                                         read: str) -> None:
    assert precision(Observation(extra=given)) == read and read in EPSILON


def test_the_stages_text_stage_and_align_judge_with_the_tie_rule_and_name_it(tmp_path: Path) -> None:
    """The same synthetic pairs: a flip within the rule's margin but above any fixed 0.1 is a tie in the stages
    oracle and in `align`; a flip beyond the bound is the text stage's difference; both name the rule."""
    cand, ref = pair(0.9, "bfloat16", spread=20.0)
    tied = (_with_text(cand), _with_text(ref))
    fixed = TokenMatchConfig(flip_margin=0.1)
    assert judge_tokens(tied[0], tied[1], fixed).kind == VerdictKind.BAD  # a fixed margin would not hold it
    verdict = judge_stages(tied[0], tied[1], StagesConfig(stages=["text"]), LogitsConfig())
    assert verdict.kind == VerdictKind.GOOD
    assert f"[tie rule; {PROVENANCE}]" in verdict.figures["stages"]["text"]["tie"]
    assert verdict.figures["stages"]["text"]["tie_margin_used"] > 0.3
    far_cand, far_ref = pair(0.02, "float32")
    diverged = (_with_text(far_cand), _with_text(far_ref))
    bad = judge_stages(diverged[0], diverged[1], StagesConfig(stages=["text"]), LogitsConfig())
    assert bad.kind == VerdictKind.BAD and "no numerical tie" in bad.reason and "[tie rule;" in bad.reason
    records: dict[str, Record] = {}
    for name, obs in (("golden", tied[1]), ("clean", tied[0])):
        root = make_record(tmp_path / name)
        (root / "obs-c-t0.json").write_text(obs.model_copy(update={"case_id": "c"}).model_dump_json())
        records[name] = read_record(root)
    alignment = align_records(records["golden"], records["clean"])
    assert alignment.aligned and "numerical tie" in alignment.to_markdown()
    assert PROVENANCE in alignment.to_markdown()


@pytest.fixture(scope="module")
def outputs() -> dict[str, list[Observation]]:
    """Greedy outputs of one peaked tiny Qwen3: the fp32 golden, bf16 SDPA and eager, a 1.5x o_proj fault."""
    pytest.importorskip("transformers")
    from tests.helpers.peaked_lm import Run, greedy, peaked_model

    runs = {"fp32": Run(), "bf16-sdpa": Run("bfloat16"), "bf16-eager": Run("bfloat16", "eager"),
            "o_proj-x1.5": Run(fault="o_proj")}
    return {name: greedy(peaked_model("Qwen3", logit_scale=10.0, run=run), run, prompts=8, tokens=24)
            for name, run in runs.items()}


@pytest.mark.e2e  # real greedy decoding of a tiny HF model
def test_clean_bf16_outputs_are_ties_and_a_fault_is_bad(outputs: dict[str, list[Observation]]) -> None:
    reference = outputs["fp32"]
    clean = [(c, r) for name in ("bf16-sdpa", "bf16-eager") for c, r in zip(outputs[name], reference, strict=True)]
    differing = [(c, r) for c, r in clean if first_mismatch(c.output_token_ids, r.output_token_ids) is not None]
    assert differing, "no clean output differs from the golden: the rule is not exercised here"
    verdicts = [judge_tokens(c, r, TokenMatchConfig()) for c, r in clean]
    assert [v.reason for v in verdicts if v.kind == VerdictKind.BAD] == []
    tied = [v for v in verdicts if "tie_at" in v.figures]
    assert tied and all(v.figures["precisions"] == {"candidate": "bfloat16", "reference": "float32"} for v in tied)
    faulty = [judge_tokens(c, r, TokenMatchConfig()) for c, r in zip(outputs["o_proj-x1.5"], reference,
                                                                      strict=True)]
    assert sum(v.kind == VerdictKind.BAD for v in faulty) >= 2


@pytest.mark.e2e  # real greedy decoding of a tiny HF model
def test_the_stages_text_stage_and_align_use_the_same_rule(outputs: dict[str, list[Observation]],
                                                           tmp_path: Path) -> None:
    reference = outputs["fp32"]
    index = next(i for i, (c, r) in enumerate(zip(outputs["bf16-sdpa"] + outputs["bf16-eager"],
                                                  reference + reference, strict=True))
                 if first_mismatch(c.output_token_ids, r.output_token_ids) is not None)
    clean = (outputs["bf16-sdpa"] + outputs["bf16-eager"])[index]
    golden = reference[index % len(reference)]
    faulty = next(c for c, r in zip(outputs["o_proj-x1.5"], reference, strict=True)
                  if judge_tokens(c, r, TokenMatchConfig()).kind == VerdictKind.BAD)
    faulty_golden = reference[outputs["o_proj-x1.5"].index(faulty)]
    with_text = [_with_text(o) for o in (clean, golden, faulty, faulty_golden)]
    tie = judge_stages(with_text[0], with_text[1], StagesConfig(stages=["text"]), LogitsConfig())
    assert tie.kind == VerdictKind.GOOD and "numerical tie" in tie.figures["stages"]["text"]["tie"]
    bad = judge_stages(with_text[2], with_text[3], StagesConfig(stages=["text"]), LogitsConfig())
    assert bad.kind == VerdictKind.BAD and bad.figures["first_differing_stage"] == "text"
    records = {}
    for name, obs in (("golden", with_text[1]), ("clean", with_text[0])):
        root = make_record(tmp_path / name)
        (root / "obs-c-t0.json").write_text(obs.model_copy(update={"case_id": "c"}).model_dump_json())
        records[name] = read_record(root)
    alignment = align_records(records["golden"], records["clean"])
    assert alignment.aligned and "numerical tie" in alignment.to_markdown()


def _with_text(obs: Observation) -> Observation:
    """The observation with its text stage: the token ids as words (a tokenizer's decode)."""
    text = " ".join(f"w{token}" for token in obs.output_token_ids)
    return obs.model_copy(update={"text": text, "extra": {**obs.extra, "stages": {"text": text}}})
