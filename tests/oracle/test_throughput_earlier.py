"""A throughput recipe's `earlier_runs` (the failing nightly's throughput, per end): what the
recipe refuses, said so the user can fix it, and what the levels search is given."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bisect_npu.oracle.throughput import ThroughputConfig


def _config(**earlier: object) -> ThroughputConfig:
    return ThroughputConfig.model_validate({"baseline": 1000.0, "reference": "good_end", "earlier_runs": earlier})


def test_the_nightlys_values_reach_the_levels_search_per_end() -> None:
    config = _config(bad=[951.0], good=[1003.5, 998.0], unit="token/s", source="nightly 2026-12-05")
    assert config.earlier_levels() == ((1003.5, 998.0), (951.0,))
    assert ThroughputConfig(baseline=1000.0, reference="good_end").earlier_levels() == ((), ())


@pytest.mark.parametrize(("earlier", "said"), [
    ({"bad": [951.0], "unit": "requests/s"}, "not the runs' unit"),
    ({"bad": [12.5], "unit": "ms"}, "tokens/s"),
    ({}, "gives no run"),
    ({"bad": [], "good": []}, "gives no run"),
    ({"bad": [-951.0]}, "holds -951.0"),
    ({"good": [0.0]}, "a throughput is a positive number"),
    ({"bad": [float("nan")]}, "positive number"),
])
def test_a_wrong_unit_no_value_or_a_value_that_is_no_throughput_is_refused(earlier: dict[str, object],
                                                                         said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        _config(**earlier)


@pytest.mark.parametrize("fields", [{"reference": "baseline"}, {"reference": "good_end", "search": "per_step"}])
def test_earlier_runs_outside_the_levels_search_are_refused(fields: dict[str, str]) -> None:
    """Only the levels search weighs them: elsewhere they would be read and silently unused."""
    with pytest.raises(ValidationError, match="levels search only"):
        ThroughputConfig.model_validate({"baseline": 1000.0, **fields, "earlier_runs": {"bad": [951.0]}})
