"""MoE routing compared as what it is: which experts each token went to, and whether rounding explains a change.

A router (a module named `...gate`) gives logits `[tokens, experts]` and, in HF transformers, the
routing weights and the chosen expert ids `[tokens, k]`. Expert ids are integers: two sides are
compared by the set each token routed to, never by cosine. A token whose set differs is a flip;
each flip has a margin (in the reference, the gap between the decision scores of the expert it
lost and the one it gained) and a noise bound, what the pair's rounding can move that gap by:

* the rounding of each logit at its side's allowed precision (half an ulp times the logit's
  magnitude, both experts, both sides). The candidate's router is allowed the precision the
  reference gives its router when both run the model at one precision (a reference that routes in
  fp32 under a bf16 model sets fp32 as the standard), and its own when the reference is a golden
  of another precision (a bf16 model's router against an fp32 golden is judged at bf16);
* what the router's input difference moves the gap by: the input's per-token disagreement |dh|
  over its typical norm, times the spread of that expert pair's logit gap over the tokens, times
  `INPUT_TAIL` (a linear map of an input perturbation; 4 sigma of a normal); for a sigmoid, each
  logit's own spread (their common part does not cancel) and the score's move is the sigmoid's over
  that logit move, not its slope's. That bounds where each score may lie; a sigmoid flip whose gap the
  candidate's own scores moved beyond what the pair explains for the gap (the logits' common move
  carried through both sigmoids together, the gap's spread beside it) has that move for its margin,
  except for a token an earlier router already rerouted. Without the router's
  input in the dump, the perturbation of the logits themselves on the tokens that routed alike
  stands in: lenient, it cannot tell a router rounding coarser than its reference's.

A flip within its noise bound is noise; "rounding explains at most X%" is the share of tokens
whose own margin lies within their bound. Flips beyond their bound are a finding at the router.
Decision scores are the logits for a softmax router (monotone: same order, margins in logit units)
and sigmoid(logits) + the score-correction bias for DeepSeek-V3's. A grouped top-k (DeepSeek-V3:
experts in groups, a group scored by its best two, the best groups kept) is read off the
reference itself: the grouping that reproduces every token's choice from its scores. A flip to an
expert of a group the reference left out has the groups' gap for its margin, unless the candidate's
group scores moved that gap by more than its bound: the gate's own output moved it, and the move is
the margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bisect_npu.errors import UsageError

# Half an ulp, relative: what rounding a value to the dtype moves it by at most.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-53}
# How many of its typical sizes an input perturbation's effect on a logit gap may reach (4 sigma of a
# normal: exceeded by rounding in about 6e-5 of token-expert pairs).
INPUT_TAIL = 4.0
# Common logit moves tried between the extremes when bounding a sigmoid gap's move (odd: 0 among them).
_COMMON_STEPS = 9
# Flips beyond their noise bound that a router may show before it is a finding, unless one of them
# lies `FAR_BEYOND` times past its bound. Set on bench/moe_family_bench.py's tune split (seeds 0-2, 3 and
# 5 layers): a clean pair's routers showed none; every router fault and bf16 router 3 or more, or one at 2.1
# times or more. Re-measured with bf16's unit roundoff at 2^-8 on bench/moe_downstream_bench.py's tune split
# (DeepSeek-V3, seeds 30-31, router faults at layers 2-3 after layer 1's flips): 180 clean routers, at most 2
# flips beyond (8 routers with any), one at 3.56 times; the faulty routers 0-7 beyond at 0.93-2.58 times while a
# sigmoid flip's margin was the reference's gap alone, 18-112 beyond at 25-165 times with the gate's own move.
UNEXPLAINED_ALLOWED = 2
FAR_BEYOND = 2.0


@dataclass
class RouterSide:
    """One side's router at one MoE layer, as arrays: logits `[T, E]`, ids and weights `[T, k]`, input `[T, H]`."""

    logits: np.ndarray
    logits_dtype: str
    ids: np.ndarray | None = None
    weights: np.ndarray | None = None
    input: np.ndarray | None = None
    input_dtype: str | None = None
    bias: np.ndarray | None = None
    sigmoid: bool = False

    @property
    def experts(self) -> int:
        return int(self.logits.shape[-1])

    @property
    def top_k(self) -> int | None:
        return int(self.ids.shape[-1]) if self.ids is not None else None

    def decision(self) -> np.ndarray:
        """The scores the router picks its top k by."""
        if not self.sigmoid:
            return self.logits
        scores: np.ndarray = 1.0 / (1.0 + np.exp(-self.logits))
        return scores + self.bias if self.bias is not None else scores

    def slope(self) -> np.ndarray:
        """d(decision)/d(logit), elementwise."""
        if not self.sigmoid:
            return np.ones_like(self.logits)
        scores: np.ndarray = 1.0 / (1.0 + np.exp(-self.logits))
        return np.asarray(scores * (1.0 - scores))


@dataclass
class Flip:
    """One token routed to another expert set: the reference's margin for the swap, its noise bound, the
    reference's routed weight on the experts it lost."""

    token: int
    lost: list[int]
    gained: list[int]
    margin: float
    noise: float
    weight_moved: float | None

    @property
    def explained(self) -> bool:
        return self.margin <= self.noise

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"token": self.token, "lost": self.lost, "gained": self.gained,
                               "margin": float(f"{self.margin:.4g}"), "noise": float(f"{self.noise:.4g}")}
        if self.weight_moved is not None:
            out["weight_moved"] = float(f"{self.weight_moved:.4g}")
        return out


@dataclass
class RoutingReport:
    """One MoE layer's routing compared: the flips, how many rounding explains, the finding if any."""

    module: str
    tokens: int
    experts: int
    top_k: int
    flips: list[Flip] = field(default_factory=list)
    explainable: int = 0
    noise_from: str = "router input"
    allowed_dtype: str = ""

    @property
    def flipped_tokens(self) -> list[int]:
        return [flip.token for flip in self.flips]

    @property
    def unexplained(self) -> list[Flip]:
        return [flip for flip in self.flips if not flip.explained]

    @property
    def finding(self) -> str | None:
        """The router's finding in words, None when its flips are noise."""
        beyond = self.unexplained
        far = any(flip.margin > FAR_BEYOND * flip.noise for flip in beyond)
        if len(beyond) <= UNEXPLAINED_ALLOWED and not far:
            return None
        return (f"router: {self.rate(len(self.flips))} of tokens route to another expert set; rounding explains "
                f"at most {self.rate(max(self.explainable, len(self.flips) - len(beyond)))} "
                f"({len(beyond)} flips beyond their noise, worst margin {self.worst_ratio():.3g} times its bound; "
                f"noise from the {self.noise_from}, router judged at {self.allowed_dtype})")

    def rate(self, count: int) -> str:
        return f"{100.0 * count / max(1, self.tokens):.3g}%"

    def worst_ratio(self) -> float:
        return max((flip.margin / flip.noise if flip.noise > 0 else math.inf for flip in self.flips), default=0.0)

    def summary(self) -> str:
        """One line: what flipped and why it is (or is not) noise."""
        if not self.flips:
            return f"{self.module}: every token of {self.tokens} routed alike"
        finding = self.finding
        if finding is not None:
            return f"{self.module}: {finding}"
        return (f"{self.module}: {len(self.flips)} of {self.tokens} tokens routed to another expert set, each at a "
                f"margin within its rounding noise (at most {self.rate(self.explainable)} of tokens lie that "
                f"close; noise from the {self.noise_from}, router judged at {self.allowed_dtype}); the block is "
                "judged on the tokens that routed alike")

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "tokens": self.tokens, "experts": self.experts, "top_k": self.top_k,
                "flipped": len(self.flips), "explainable": self.explainable,
                "unexplained": len(self.unexplained), "noise_from": self.noise_from,
                "allowed_dtype": self.allowed_dtype, "flips": [flip.to_dict() for flip in self.flips[:20]],
                "finding": self.finding}


def _chosen(side: RouterSide, k: int) -> np.ndarray:
    """The ids each token chose: as dumped, else the top k of its decision scores."""
    if side.ids is not None:
        return side.ids.astype(np.int64)
    return np.argsort(-side.decision(), axis=1, kind="stable")[:, :k]


def check_shapes(cand: RouterSide, ref: RouterSide, module: str) -> int:
    """The pair's top k; dumps of different expert counts or top k are refused in one line."""
    if cand.experts != ref.experts:
        raise UsageError(f"{module}: the candidate routes over {cand.experts} experts, the reference over "
                         f"{ref.experts}: not the same model; compare dumps of one MoE configuration")
    if cand.top_k is not None and ref.top_k is not None and cand.top_k != ref.top_k:
        raise UsageError(f"{module}: the candidate picks {cand.top_k} experts per token, the reference "
                         f"{ref.top_k}: not the same model; compare dumps of one MoE configuration")
    if cand.logits.shape[0] != ref.logits.shape[0]:
        raise UsageError(f"{module}: the candidate routed {cand.logits.shape[0]} tokens, the reference "
                         f"{ref.logits.shape[0]}; compare dumps of the same prompt")
    k = ref.top_k or cand.top_k
    if k is None:
        raise UsageError(f"{module}: neither dump holds the chosen expert ids")
    return k


def allowed_dtype(cand: RouterSide, ref: RouterSide) -> str:
    """The precision the candidate's router is judged at: its reference's where both run the model at one
    precision, its own where the reference is a golden of another."""
    same_model = cand.input_dtype is not None and cand.input_dtype == ref.input_dtype
    if same_model:
        return ref.logits_dtype
    own, theirs = UNIT_ROUNDOFF.get(cand.logits_dtype, 0.0), UNIT_ROUNDOFF.get(ref.logits_dtype, 0.0)
    return cand.logits_dtype if own >= theirs else ref.logits_dtype


class _Noise:
    """Noise bounds on the gap between two experts' decision scores, per token."""

    def __init__(self, cand: RouterSide, ref: RouterSide, alike: np.ndarray) -> None:
        self.dtype = allowed_dtype(cand, ref)
        self.roundoff = UNIT_ROUNDOFF.get(self.dtype, 0.0) + UNIT_ROUNDOFF.get(ref.logits_dtype, 0.0)
        self.ref = ref
        self.abs_logits = np.abs(ref.logits)
        self.slope = ref.slope()
        if cand.input is not None and ref.input is not None and cand.input.shape == ref.input.shape:
            self.noise_from = "router input"
            norms = np.linalg.norm(ref.input, axis=1)
            typical = float(np.sqrt(np.mean(norms**2))) or 1.0
            self.input_share = np.linalg.norm(cand.input - ref.input, axis=1) / typical
            self.logit_moves: np.ndarray | None = None
        else:
            self.noise_from = "logits (router input not in the dump)"
            self.input_share = np.zeros(ref.logits.shape[0])
            centred = (cand.logits - cand.logits.mean(axis=1, keepdims=True)) - (
                ref.logits - ref.logits.mean(axis=1, keepdims=True))
            moved = np.abs(centred[alike]) if alike.any() else np.abs(centred)
            self.logit_moves = np.full(ref.logits.shape[0], 2.0 * INPUT_TAIL * float(np.sqrt(np.mean(moved**2))))
        self._spread: dict[tuple[int, int], float] = {}
        self._size: dict[int, float] = {}

    def spread(self, a: int, b: int) -> float:
        """The rms over tokens of the reference's logit gap between experts a and b."""
        key = (min(a, b), max(a, b))
        if key not in self._spread:
            gap = self.ref.logits[:, key[0]] - self.ref.logits[:, key[1]]
            self._spread[key] = float(np.sqrt(np.mean(gap**2)))
        return self._spread[key]

    def bound(self, token: int, a: int, b: int) -> float:
        """What rounding can move expert a's decision score minus expert b's by, at `token`."""
        slope_a, slope_b = float(self.slope[token, a]), float(self.slope[token, b])
        rounding = self.roundoff * (float(self.abs_logits[token, a]) * slope_a + float(self.abs_logits[token, b])
                                    * slope_b)
        if self.logit_moves is not None:
            carried = float(self.logit_moves[token]) * max(slope_a, slope_b)
        elif self.ref.sigmoid:  # each score moves on its own: a logit's common part does not cancel
            carried = self.sigmoid_moved(token, a) + self.sigmoid_moved(token, b)
        else:
            carried = INPUT_TAIL * float(self.input_share[token]) * self.spread(a, b) * max(slope_a, slope_b)
        return rounding + carried

    def sigmoid_moved(self, token: int, expert: int) -> float:
        """How far a sigmoid score can move when its logit moves by what the input difference explains: the
        sigmoid itself, not its slope at the reference's logit (a saturated score has no slope, yet a token
        whose hidden state drifted far moves its logit off the plateau)."""
        logit = float(self.ref.logits[token, expert])
        reach = INPUT_TAIL * float(self.input_share[token]) * self.size(expert)
        here = _sigmoid(logit)
        return max(_sigmoid(logit + reach) - here, here - _sigmoid(logit - reach))

    def gap_bound(self, token: int, a: int, b: int) -> float:
        """What rounding and the input difference can move two sigmoid scores' gap by, their common move carried
        through both (`sigmoid_gap_moved`): the bound an observed move of the gap is held to."""
        slope_a, slope_b = float(self.slope[token, a]), float(self.slope[token, b])
        rounding = self.roundoff * (float(self.abs_logits[token, a]) * slope_a + float(self.abs_logits[token, b])
                                    * slope_b)
        return rounding + self.sigmoid_gap_moved(token, a, b)

    def sigmoid_gap_moved(self, token: int, a: int, b: int) -> float:
        """How far the gap between two sigmoid scores can move when the input difference moves the logits: b's
        logit by up to what its own size explains (a common move, off the plateau for a saturated score whose
        token drifted far), a's by that and the gap's share beside (what the two logits' difference explains,
        as for a softmax). The sigmoid itself, not its slope at the reference's logit. Why the common move is
        carried through both scores, not added once per score: two close scores move alike under it; summed, it
        bounds where each score may lie, many times what their gap can move on a peaked router."""
        logit_a, logit_b = float(self.ref.logits[token, a]), float(self.ref.logits[token, b])
        share = INPUT_TAIL * float(self.input_share[token])
        common, apart = share * self.size(b), share * self.spread(a, b)
        here = _sigmoid(logit_a) - _sigmoid(logit_b)
        return max(abs(_sigmoid(logit_a + shift + side) - _sigmoid(logit_b + shift) - here)
                   for shift in np.linspace(-common, common, _COMMON_STEPS) for side in (-apart, apart))

    def size(self, expert: int) -> float:
        """The rms over tokens of the reference's logit of `expert`."""
        if expert not in self._size:
            self._size[expert] = float(np.sqrt(np.mean(self.ref.logits[:, expert] ** 2)))
        return self._size[expert]


def _sigmoid(value: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * value))


def _routed_weights(side: RouterSide, chosen: np.ndarray) -> np.ndarray:
    """Each chosen expert's share of the token's routed weight (as dumped, else the softmax of the chosen logits)."""
    if side.weights is not None and side.weights.shape == chosen.shape:
        weights = np.abs(side.weights.astype(np.float64))
    else:
        picked = np.take_along_axis(side.logits, chosen, axis=1)
        weights = np.exp(picked - picked.max(axis=1, keepdims=True))
    total = weights.sum(axis=1, keepdims=True)
    return np.asarray(weights / np.where(total > 0, total, 1.0))


@dataclass(frozen=True)
class Grouping:
    """A grouped top-k: `groups` contiguous groups of experts, each scored by the sum of its best `best`
    decision scores, the `kept` best groups searched for the top k."""

    groups: int
    kept: int
    best: int

    def scores(self, decision: np.ndarray) -> np.ndarray:
        grouped = np.sort(decision.reshape(decision.shape[0], self.groups, -1), axis=2)
        return np.asarray(grouped[:, :, -self.best:].sum(axis=2))

    def choose(self, decision: np.ndarray, k: int) -> np.ndarray:
        kept = np.argsort(-self.scores(decision), axis=1, kind="stable")[:, :self.kept]
        mask = np.zeros((decision.shape[0], self.groups), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=1)
        allowed = np.repeat(mask, decision.shape[1] // self.groups, axis=1)
        return np.argsort(-np.where(allowed, decision, -np.inf), axis=1, kind="stable")[:, :k]


def infer_grouping(side: RouterSide, k: int) -> Grouping | None:
    """The grouping under which the side's decision scores give exactly its chosen ids; None when a plain
    top k does (or no grouping does: the margins are then taken as for a plain top k)."""
    if side.ids is None:
        return None
    decision, chosen = side.decision(), np.sort(side.ids.astype(np.int64), axis=1)

    def reproduces(picked: np.ndarray) -> bool:
        return bool((np.sort(picked, axis=1) == chosen).all())

    if reproduces(np.argsort(-decision, axis=1, kind="stable")[:, :k]):
        return None
    experts = side.experts
    for groups in (g for g in range(2, experts) if experts % g == 0):
        for best in sorted({1, min(2, experts // groups)}):
            for kept in range(1, groups):
                if kept * (experts // groups) < k:
                    continue
                grouping = Grouping(groups, kept, best)
                if reproduces(grouping.choose(decision, k)):
                    return grouping
    return None


def compare_routing(cand: RouterSide, ref: RouterSide, module: str,
                    rerouted: frozenset[int] = frozenset()) -> RoutingReport:
    """The flips of one MoE layer, each with its margin, noise bound and routed weight moved; `rerouted`: the tokens
    an earlier router of the pass already sent elsewhere (their input moved by their other experts' work)."""
    k = check_shapes(cand, ref, module)
    chosen_c, chosen_r = _chosen(cand, k), _chosen(ref, k)
    sorted_c, sorted_r = np.sort(chosen_c, axis=1), np.sort(chosen_r, axis=1)
    alike = (sorted_c == sorted_r).all(axis=1)
    noise = _Noise(cand, ref, alike)
    decision = ref.decision()
    weights = _routed_weights(ref, chosen_r)
    grouping = infer_grouping(ref, k)
    groups = _GroupGaps(grouping, decision, noise) if grouping is not None else None
    # The groups the candidate kept: a lost expert's group that the candidate dropped may explain its flip.
    cand_groups = grouping.scores(cand.decision()) if grouping is not None else None
    cand_kept = [set(row.tolist()) for row in np.argsort(-cand_groups, axis=1, kind="stable")[
        :, :grouping.kept]] if cand_groups is not None and grouping is not None else None
    # A sigmoid router's candidate scores: a swap whose gap they moved beyond what the pair explains is the gate's.
    moved_gaps = cand.decision() if ref.sigmoid and noise.logit_moves is None else None
    report = RoutingReport(module, tokens=int(ref.logits.shape[0]), experts=ref.experts, top_k=k,
                           noise_from=noise.noise_from, allowed_dtype=noise.dtype)
    for token in range(report.tokens):
        row = decision[token]
        picked = set(chosen_r[token].tolist())
        open_experts = groups.open_experts(token) if groups is not None else range(report.experts)
        kth = min(picked, key=lambda e: row[e])
        below = [e for e in open_experts if e not in picked and row[e] <= row[kth]]
        close = groups is not None and groups.margin_of(token, None)[0] <= groups.margin_of(token, None)[1]
        if below:
            nxt = max(below, key=lambda e: row[e])
            close = close or row[kth] - row[nxt] <= noise.bound(token, kth, nxt)
        report.explainable += int(close)
        if alike[token]:
            continue
        lost = sorted(picked - set(chosen_c[token].tolist()))
        gained = sorted(set(chosen_c[token].tolist()) - picked)
        # Each gained expert overtook some lost one (or its group another group): the swap the least
        # rounding explains sets the margin.
        # A lost expert of the last group kept may have left with its group (the candidate dropped it): the
        # experts gained then refill the top k from the groups still open, and the groups' gap is the margin
        # that rounding had to cross.
        # That gap explains the swap only where rounding is what moved it (`_GroupGaps.crossed`).
        dropped = groups.crossed(token, None, cand_groups) if groups is not None and cand_groups is not None \
            and cand_kept is not None and any(groups.in_last_kept(token, lo) and lo // groups.size not in
                                              cand_kept[token] for lo in lost) else None
        swaps = []
        for g in gained:
            if groups is not None and cand_groups is not None and g not in open_experts:
                swaps.append(groups.crossed(token, g, cand_groups))
                continue
            swap = (min(float(row[lo] - row[g]) for lo in lost), max(noise.bound(token, lo, g) for lo in lost))
            # Not for a token an earlier router sent to other experts: its input moved by their work, not by a
            # perturbation whose effect on the gap a linear map's tail bounds; where its scores may lie still does.
            if moved_gaps is not None and token not in rerouted:
                swap = _moved_beyond(swap, [(float(moved_gaps[token, lo] - row[lo] + row[g] - moved_gaps[token, g]),
                                             noise.gap_bound(token, lo, g)) for lo in lost])
            swaps.append(swap if dropped is None else min(swap, dropped, key=lambda pair: pair[0] - pair[1]))
        margin, bound = max(swaps, key=lambda pair: pair[0] - pair[1])
        moved = float(sum(weights[token, list(chosen_r[token]).index(lo)] for lo in lost))
        report.flips.append(Flip(token, lost, gained, margin, bound, moved))
    return report


def _moved_beyond(swap: tuple[float, float], moves: list[tuple[float, float]]) -> tuple[float, float]:
    """(margin, bound) of a swap: the reference's gap against the bound of where the scores may lie, unless the
    candidate's own scores moved the gap beyond what rounding and the input can move it by (`_Noise.gap_bound`):
    then the move is the margin. Why: a sigmoid's common logit move, counted once per score, bounds where each
    score may lie, loosely for two close scores (a peaked router) that move alike; that explains a flip the
    scores made, not one a faulty gate's own output made by moving the gap itself."""
    beyond = [(abs(move), bound) for move, bound in moves if abs(move) > bound]
    return max(beyond, key=lambda pair: pair[0] / pair[1] if pair[1] > 0 else math.inf) if beyond else swap


class _GroupGaps:
    """The reference's group scores under a grouped top-k, and the noise bound of a gap between two groups."""

    def __init__(self, grouping: Grouping, decision: np.ndarray, noise: _Noise) -> None:
        self.grouping, self.decision, self.noise = grouping, decision, noise
        self.scores = grouping.scores(decision)
        self.order = np.argsort(-self.scores, axis=1, kind="stable")
        self.size = decision.shape[1] // grouping.groups

    def open_experts(self, token: int) -> list[int]:
        kept = self.order[token, :self.grouping.kept]
        return [int(g) * self.size + e for g in sorted(kept) for e in range(self.size)]

    def in_last_kept(self, token: int, expert: int) -> bool:
        """Whether `expert` lies in the last group the reference kept for `token` (the one a group swap drops)."""
        return bool(expert // self.size == int(self.order[token, self.grouping.kept - 1]))

    def _best(self, token: int, group: int) -> list[int]:
        members = range(group * self.size, (group + 1) * self.size)
        return sorted(members, key=lambda e: -self.decision[token, e])[:self.grouping.best]

    def crossed(self, token: int, expert: int | None, cand_scores: np.ndarray) -> tuple[float, float]:
        """(margin, noise bound) of a group swap: the groups' gap (`margin_of`), or, where the candidate's group
        scores moved that gap by more than its bound, the move itself. Why: a gap within rounding explains a swap
        only if rounding is what moved it; a gate whose own output moved the gap further (a faulty gate on a
        router whose groups lie close) made the swap, whatever the reference's gap."""
        gap, bound = self.margin_of(token, expert)
        last = int(self.order[token, self.grouping.kept - 1])
        other = int(self.order[token, self.grouping.kept]) if expert is None else expert // self.size
        moved = abs(gap - float(cand_scores[token, last] - cand_scores[token, other]))
        return (moved, bound) if moved > bound else (gap, bound)

    def margin_of(self, token: int, expert: int | None) -> tuple[float, float]:
        """(gap, noise bound) between the last kept group and `expert`'s group (the best left out for None)."""
        last = int(self.order[token, self.grouping.kept - 1])
        other = int(self.order[token, self.grouping.kept]) if expert is None else expert // self.size
        gap = float(self.scores[token, last] - self.scores[token, other])
        bound = sum(self.noise.bound(token, a, b) for a, b in zip(self._best(token, last), self._best(token, other),
                                                                   strict=True))
        return gap, bound
