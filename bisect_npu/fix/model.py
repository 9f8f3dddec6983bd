"""The ranking model: a conditional logit over one culprit's candidates, weights fitted on real history.

Each candidate is a vector of evidence (FEATURES); its score is a weighted sum, and its confidence the
softmax of the scores over all candidates plus a "none of them" option (the fitted `null_score`), so
confidences of one culprit sum to at most 1 and a lone weak candidate is not called certain. The
weights are data (`weights.json` beside this module), refit by `bench/fit_fix_weights.py` (the fitting lives in
`bench/fix_logit.py`: nothing at run time trains) on the train split of `bench/data/fix_pairs.tsv`,
never tuned by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

FEATURES = (
    "revert",  # 1: reverts the culprit (by title or sha)
    "reference",  # 1: names the culprit's PR, sha or title
    "provenance",  # 1: changes lines the culprit wrote
    "explained",  # share of the fix's removed lines (in the culprit's files) that the culprit wrote
    "coverage",  # share of the culprit's lines the fix changes: small for one fix of a 60-file culprit
    "proximity",  # 1: edits next to the culprit's lines
    "same_function",  # 1: edits a function the culprit changed
    "file_share",  # share of the fix's code files the culprit changed
    "names",  # log(1 + culprit names the fix's changed lines touch), names rare among the candidates
    "names_in_message",  # 1: the fix's message names something the culprit changed
    "tests",  # 1: the fix adds tests naming the culprit's module or functions
    "tag",  # 1: a bug-fix tag in the title
    "symptom",  # BM25 of message and diff against the symptom words, over the best candidate's
    "symptom_any",  # 1: some symptom word matches
    "days",  # log(1 + days after the culprit) / 6
    "twins",  # 1: the same change on several branches
    "cosmetic_title",  # 1: the title says typo, refactor, rename, format
    "cites_cause",  # 1: the line naming the culprit speaks of a bug, a cause or a revert
    "follow_up",  # 1: the title (outside a quoted one) builds on a change: follow-up, perf, feature, refactor
)
CONFIDENT = 0.5  # below this the best proposal is a lead, not a fix


@dataclass(frozen=True)
class RankModel:
    """Weights per feature and the score of "no candidate is the fix"."""

    weights: Mapping[str, float]
    null_score: float
    trained_on: str = ""

    def score(self, features: Mapping[str, float]) -> float:
        return float(sum(self.weights.get(name, 0.0) * value for name, value in features.items()))

    def confidences(self, scores: Sequence[float]) -> list[float]:
        """Softmax over the candidates and the null option: P(this candidate is the fix)."""
        if not scores:
            return []
        values = np.array([*scores, self.null_score], dtype=float)
        exp = np.exp(values - values.max())
        return [float(p) for p in (exp / exp.sum())[:-1]]

    def contributions(self, features: Mapping[str, float]) -> dict[str, float]:
        return {name: self.weights.get(name, 0.0) * value for name, value in features.items() if value}


def load_model() -> RankModel:
    """The shipped weights (bisect_npu/fix/weights.json)."""
    data: dict[str, Any] = json.loads(resources.files("bisect_npu.fix").joinpath("weights.json").read_text())
    return RankModel({k: float(v) for k, v in data["weights"].items()}, float(data["null_score"]),
                     data.get("trained_on", ""))
