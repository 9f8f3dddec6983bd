"""Oracle settings as they appear in a recipe's `oracle:` section.

Defaults are the field's usual pass lines (cosine > 0.99, vLLM's repetition_detection shape).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from bisect_npu.defaults import CONFIDENCE
from bisect_npu.observations import StrictModel
from bisect_npu.oracle.throughput import ThroughputConfig


class RepetitionConfig(StrictModel):
    """Exact loops (vLLM's rule, extended to long periods) and near-loops."""

    min_pattern_size: int = Field(1, strict=True, ge=1,
                                  description="shortest loop period (vLLM's repetition_detection)")
    max_pattern_size: int = Field(20, strict=True, ge=1, description="longest loop period the streaming guard watches")
    min_count: int = Field(3, strict=True, ge=2, description="repetitions of the period that make a loop")
    offline_max_period: int = Field(2048, strict=True, ge=1,
                                    description="offline judge only: longest period searched over "
                                                "a whole observation")
    min_loop_tokens: int = Field(32, strict=True, ge=0,
                                 description="fewest tokens a loop must cover to count (short legit "
                                             "repeats are fine); 0 is vLLM's rule exactly")
    ngram: int = Field(4, strict=True, ge=1, description="near-loop: n-gram size of the distinct-n-gram ratio")
    window: int = Field(256, strict=True, ge=8, description="near-loop: tokens per window")
    min_distinct_ratio: float = Field(0.2, ge=0.0, le=1.0, description="near-loop: a window's distinct-n-gram "
                                                                      "ratio below this looks loop-like")
    max_periodic_share: float = Field(0.6, ge=0.0, le=1.0, description="near-loop: best-period share of positions "
                                                                      "equal to the token one period back, at or "
                                                                      "above this, looks loop-like")
    near_min_windows: int = Field(2, strict=True, ge=1,
                                  description="consecutive half-overlapping windows that must look "
                                              "loop-like before a near-loop counts")
    require_length_finish: bool = Field(False, description="call a loop bad only when the output also ran out "
                                                         "of tokens (finish_reason=length)")
    stop_early: bool = Field(True, description="the probe's streaming detector stops generation when it fires")




class TokenMatchConfig(StrictModel):
    """Deterministic token match against a reference observation."""

    min_match_rate: float = Field(1.0, ge=0.0, le=1.0, description="share of tokens that must match the reference")
    tie_margin: float = Field(0.05, ge=0.0, description="a logprob gap that is a numerical tie in any run: the "
                                                        "least flip margin, the reference's gap that is a tie "
                                                        "where the candidate has no logprobs, and how far below "
                                                        "its own best a candidate's token may be after a tie")
    flip_margin: float | None = Field(None, ge=0.0, le=100.0,
                                      description="a fixed margin for the flip (how far the two tokens' logprob "
                                                  "difference moved between the runs) at a first mismatch where "
                                                  "both sides have top logprobs; unset: the margin is measured on "
                                                  "the pair and bounded by its precisions (oracle/ties.py)")
    compare_tokens: int | None = Field(None, strict=True, ge=1,
                                       description="compare only the first N tokens; unset: all")


class LogitsConfig(StrictModel):
    """Dump diff pass lines (MindStudio Probe compare conventions).

    msprobe's own rule: a tensor fails when its cosine is below 0.99 *and* its max absolute error
    above 0.001, or its cosine is below 0.9, or its max absolute error above 1. A cosine below
    ``min_cosine`` therefore fails only with a max absolute error above ``cosine_abs_floor`` (a
    near-zero tensor's cosine says little), and below ``min_cosine_always`` whatever its errors.
    msprobe's absolute line (``max_abs_error: 1``) is off by default: one bf16 ulp is 2 at 256, and
    hidden states carry outliers that large, so it flags harmless rounding. The shares within
    1/1000 and 5/1000 are a trend in msprobe, not a pass line: one bf16 ulp is 4e-3 relative, so
    ``min_within_1e3`` flags harmless reorderings; set it only for fp32 dumps.

    Relative rules (``relative``) judge a module's output against its inputs (or the output before
    it): msprobe's amplification rule (``msprobe_rule``: inputs within 1/1000 > 0.9, output < 0.1),
    and the cosine distance growing ``amplification`` times, above a floor set by the dtype's
    precision. ``chunk_elements`` bounds what one worker reads at a time.
    """

    min_cosine: float = Field(0.99, ge=-1.0, le=1.0, description="a cosine below this fails when the max "
                                                                 "absolute error is above cosine_abs_floor")
    cosine_abs_floor: float = Field(0.001, ge=0.0, description="max absolute error under which a low cosine "
                                                               "passes (a near-zero tensor)")
    min_cosine_always: float = Field(0.9, ge=-1.0, le=1.0, description="a cosine below this fails whatever the "
                                                                       "errors")
    max_abs_error: float | None = Field(None, description="msprobe's absolute line (1); unset: off")
    max_rel_error: float | None = Field(None, description="largest relative error; unset: off")
    min_within_1e3: float | None = Field(None, ge=0.0, le=1.0, description="share of elements within 1/1000; "
                                                                           "set only for fp32 dumps")
    min_within_5e3: float | None = Field(None, ge=0.0, le=1.0, description="share of elements within 5/1000; "
                                                                           "unset: off")
    max_kl: float | None = Field(None, ge=0.0, description="largest KL divergence of the logits; unset: off")
    top_k: int = Field(5, strict=True, ge=1, description="k of the top-k overlap figure of logits tensors")
    workers: int = Field(2, strict=True, ge=1,
                         description="threads comparing tensor pairs (a tensor larger than 8 chunks is shared "
                                     "between them)")
    relative: bool = Field(True, description="judge each module's output against its inputs (or the output "
                                             "before it): msprobe's amplification rule and the cosine distance's")
    msprobe_rule: bool = Field(True, description="msprobe's rule: the inputs' share within 1/1000 above 0.9 and "
                                                 "the output's below 0.1")
    amplification: float = Field(5.0, gt=1.0, description="times the input's cosine distance an output's must "
                                                          "reach (above the dtype's floor) to diverge")
    noise_from_peers: bool = Field(True, description="judge each module's amplification and norm change against "
                                                     "the same module kind in the other layers of the pair (their "
                                                     "median and MAD: the pair's own noise); off: the fixed "
                                                     "amplification line")
    peer_mads: float = Field(8.0, gt=0.0, le=1000.0,
                             description="robust standard deviations (1.4826 MAD) above its peers' median a module "
                                         "must stand to diverge")
    peer_min_factor: float = Field(3.0, gt=1.0, le=1e6,
                                   description="times its peers' median amplification a module's must also exceed "
                                               "(peers that agree too well have no spread)")
    min_peers: int = Field(3, strict=True, ge=2, le=10_000,
                           description="other layers a module kind needs for its own noise line; fewer: the higher of "
                                       "the other kinds' highest line and its few peers' worst times "
                                       "peer_min_factor")
    chunk_elements: int = Field(1 << 17, strict=True, ge=1,
                                description="elements one worker reads at a time (whole vocabulary rows for "
                                            "logits); bounds peak memory, and the default keeps a chunk's "
                                            "buffers in a core's cache")


class StatsConfig(StrictModel):
    """Verdict over repeated trials."""

    trials: int = Field(5, strict=True, ge=1, description="trials asked before the first decision")
    max_trials: int = Field(40, strict=True, ge=1,
                            description="at this many trials an undecided test is settled by the rate")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="confidence of the test and of the Wilson interval")
    good_rate: float = Field(0.0, ge=0.0, le=1.0, description="rate of bad trials at the good end when not "
                                                             "measured")
    bad_rate: float = Field(0.2, ge=0.0, le=1.0, description="rate of bad trials at the bad end when not "
                                                            "measured")
    method: Literal["sprt", "doubling"] = Field(
        "sprt", description="sprt: Wald's test between the good-end and the bad-end rate; doubling: twice the "
                            "trials until the Wilson interval separates the two")


class AcceptanceConfig(StrictModel):
    """Speculative decoding: share of proposed draft tokens the target model accepted."""

    min_acceptance_rate: float = Field(0.3, ge=0.0, le=1.0, description="draft acceptance rate below this is bad")
    min_token_agreement: float | None = Field(None, ge=0.0, le=1.0, description="also require token agreement "
                                                                               "with the reference run at this "
                                                                               "rate")


class PenaltyConfig(StrictModel):
    """Effective sampling parameters: what the engine applied must equal what the case expects."""

    expected: dict[str, float | int | str | bool | None] = Field(
        default_factory=dict, description="sampling parameters the engine must apply, e.g. {presence_penalty: 1.5}")
    rel_tolerance: float = Field(1e-6, ge=0.0, description="relative tolerance of a numeric comparison")


StageName = Literal["chat_template", "prompt_token_ids", "forward", "sampler", "text"]


def _all_stages() -> list[StageName]:
    return ["chat_template", "prompt_token_ids", "forward", "sampler", "text"]


class StagesConfig(StrictModel):
    """Precision alignment: compare each stage with the reference's, in pipeline order."""

    stages: list[StageName] = Field(default_factory=_all_stages, description="stages compared, in pipeline order")


class FocusConfig(StrictModel):
    """Focusing: after the two ends ran the whole dataset, a candidate runs only the samples whose
    results differ between the ends, plus a random control set of samples the ends agree on (it
    catches a candidate broken in another way)."""

    enabled: bool = Field(True, description="candidates run the discordant samples plus the control set; false: "
                                            "every step runs the whole dataset")
    control: float = Field(0.05, ge=0.0, allow_inf_nan=False,
                           description="control samples (the ends agree on them) each candidate also runs: a "
                                       "count (10), or a share of the agreeing samples below 1 (0.1)")
    min_discordant: int = Field(4, strict=True, ge=1,
                                description="fewer discordant samples than this cannot decide a step: candidates "
                                            "then run the whole dataset")
    batch: int = Field(8, strict=True, ge=0,
                       description="discordant samples in a candidate's first round, most telling first (its "
                                   "share of control samples rides along): the sequential test stops after the "
                                   "first round that settles it; 0: all of them in one round")
    growth: float = Field(2.0, ge=1.0, le=16.0, allow_inf_nan=False,
                          description="each further round of a candidate runs this many times the previous "
                                      "round's discordant samples (1: every round `batch`)")

    @field_validator("control")
    @classmethod
    def _count_or_share(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError(f"{value} is neither a count (a whole number) nor a share (below 1)")
        return value

    def control_count(self, agreeing: int) -> int:
        """How many of `agreeing` samples the control set holds (a share rounds up: never 0 of a share)."""
        wanted = int(self.control) if self.control >= 1 else math.ceil(self.control * agreeing)
        return min(agreeing, wanted)


class AccuracyConfig(StrictModel):
    """How the `accuracy` oracle decides: per-sample results paired against the good end, a
    one-sample test against a published baseline, or both (the recipe's `accuracy:` section)."""

    metric: Literal["accuracy", "loop_rate"] = Field(
        "accuracy", description="accuracy: a sample is correct when the harness scores it so; loop_rate: when "
                                "it finishes with `stop` inside its token budget and the loop detector finds no "
                                "loop (the share of looping runs is the figure)")
    repeats: int = Field(1, strict=True, ge=1, le=1000,
                         description="runs of every sample per round (a sampled evaluation, temperature > 0): a "
                                     "sample's correctness is then the share of its runs that were correct")
    max_rounds: int = Field(3, strict=True, ge=1, le=100,
                            description="a candidate the sequential test cannot settle after one round runs "
                                        "another `repeats` runs of the same samples, up to this many rounds; then "
                                        "the likelier side decides")
    reference: Literal["good_end", "baseline", "both"] = Field(
        "good_end", description="good_end: paired per sample against the good end (and the bad end, which "
                                "focusing needs); baseline: a one-sample test against `baseline` - `threshold`; "
                                "both: bad when either says bad")
    baseline: float | None = Field(None, ge=0.0, le=100.0, allow_inf_nan=False,
                                   description="published score in points (0-100), as vllm-ascend's nightly "
                                               "configs write it; needed by reference baseline and both")
    threshold: float = Field(1.0, ge=0.0, le=100.0, allow_inf_nan=False,
                             description="points below `baseline` a score may fall and still pass (the nightly "
                                         "configs' `threshold`; their default is 1)")
    confidence: float = Field(CONFIDENCE, gt=0.5, lt=1.0,
                              description="confidence of each step's verdict: the sequential tests stop when the "
                                          "evidence reaches it, and the intervals are drawn at it")
    focus: FocusConfig = Field(default_factory=FocusConfig, description="which samples a candidate runs")

    @property
    def greedy(self) -> bool:
        """Whether every answer is the model's likeliest (temperature 0): a sample's runs then agree
        by construction, so the ends' spreads are known rather than estimated. Unknown here (the
        recipe's sampling says it: `recipe.schema.AccuracySpec`), so taken as sampled."""
        return False

    @model_validator(mode="after")
    def _baseline_when_asked(self) -> AccuracyConfig:
        if self.reference in ("baseline", "both") and self.baseline is None:
            raise ValueError(f"reference {self.reference} needs `baseline`, the published score in points "
                             "(e.g. baseline: 80.0)")
        return self


OracleKind = Literal["repetition", "tokens", "logits", "stats", "acceptance", "penalty", "stages", "command",
                     "accuracy", "throughput"]


def _default_kinds() -> list[OracleKind]:
    return ["repetition"]


class OracleConfig(StrictModel):
    """Which judges run (all must pass), with their thresholds."""

    kinds: list[OracleKind] = Field(default_factory=_default_kinds, description="judges that run; every "
                                                                             "per-trial kind must pass")
    repetition: RepetitionConfig = Field(default_factory=RepetitionConfig)
    tokens: TokenMatchConfig = Field(default_factory=TokenMatchConfig)
    logits: LogitsConfig = Field(default_factory=LogitsConfig)
    stats: StatsConfig = Field(default_factory=StatsConfig)
    acceptance: AcceptanceConfig = Field(default_factory=AcceptanceConfig)
    penalty: PenaltyConfig = Field(default_factory=PenaltyConfig)
    stages: StagesConfig = Field(default_factory=StagesConfig)
    throughput: ThroughputConfig | None = Field(None, description="kind throughput: the line a commit's output token "
                                                                  "throughput must reach")

    @field_validator("kinds")
    @classmethod
    def _some_judge(cls, kinds: list[OracleKind]) -> list[OracleKind]:
        if not kinds:
            raise ValueError("lists no judge, so every commit would be judged good; name at least one (repetition, "
                             "tokens, logits, ...), or leave `kinds` out for the default (repetition)")
        return kinds

    def line_from_end(self) -> ThroughputConfig | None:
        """The throughput judge's settings where it draws its line from an end's own runs (`reference:
        good_end`: the good end's, a fix search's new end's) rather than a published baseline; None
        where throughput is not judged or its line is the baseline. The levels search, the steps
        that stop when sure and a fix search's reference end all rest on that line."""
        throughput = self.throughput
        return throughput if "throughput" in self.kinds and throughput is not None and \
            throughput.reference == "good_end" else None

    @model_validator(mode="after")
    def _throughput_line(self) -> OracleConfig:
        if "throughput" in self.kinds and self.throughput is None:
            raise ValueError("oracle.kinds lists throughput but oracle.throughput is unset (baseline: TOKENS_PER_S, "
                             "threshold: 0.97)")
        return self
