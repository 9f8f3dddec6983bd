"""Fitting the fix ranking's conditional logit (bisect_npu/fix/model.py scores with the result).

Training is a bench task, not a run-time one: `bench/fit_fix_weights.py` fits on the train pairs and
writes bisect_npu/fix/weights.json, which the package reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from bisect_npu.fix.model import FEATURES


def vector(features: Mapping[str, float]) -> np.ndarray:
    """One candidate's evidence as a row in FEATURES order (a missing feature is 0)."""
    return np.array([features.get(name, 0.0) for name in FEATURES], dtype=float)


def fit(queries: Sequence[tuple[np.ndarray, int | None]], *, l2: float = 0.05, steps: int = 3000,
        rate: float = 0.05) -> tuple[np.ndarray, float]:
    """Fit a conditional logit: per query, a matrix of candidate features (rows) and the row of the
    true fix (None when the fix is not among them: then "none" is the answer). Returns (weights,
    null score), by full-batch gradient descent with Adam on the mean negative log-likelihood."""
    width = len(FEATURES)
    theta = np.zeros(width + 1)  # weights, then the null score
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    for step in range(1, steps + 1):
        grad = np.zeros_like(theta)
        for matrix, answer in queries:
            scores = np.append(matrix @ theta[:width], theta[width]) if len(matrix) else np.array([theta[width]])
            exp = np.exp(scores - scores.max())
            prob = exp / exp.sum()
            rows = np.vstack([matrix, np.zeros(width)]) if len(matrix) else np.zeros((1, width))
            target = np.zeros(len(scores))
            target[len(scores) - 1 if answer is None else answer] = 1.0
            diff = prob - target
            grad[:width] += rows.T @ diff
            grad[width] += diff[-1]
        grad /= max(len(queries), 1)
        grad[:width] += l2 * theta[:width]
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad ** 2
        theta -= rate * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
    return theta[:width], float(theta[width])
