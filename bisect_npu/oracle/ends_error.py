"""Where an end's mean may really lie, given the runs that measured it: the nodes (in standard
errors of that mean) and weights of the probabilists' Gauss-Hermite rule over a standard normal.

Every step of a search is measured against the same ends, so the ends' error is shared by all of
them; both oracles that measure (throughput, accuracy) give a step's likelihoods at these nodes,
and the search integrates the error once with the same rule. One rule for both keeps their node
terms comparable.
"""

from __future__ import annotations

from numpy.polynomial.hermite_e import hermegauss

NODES: tuple[float, ...]
WEIGHTS: tuple[float, ...]  # they sum to sqrt(2 pi), the standard normal's unnormalised mass
NODES, WEIGHTS = (tuple(float(x) for x in part) for part in hermegauss(9))
