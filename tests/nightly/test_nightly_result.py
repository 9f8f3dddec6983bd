"""`--nightly-result`: the throughput a nightly measured at an end, put into the performance
benchmark's recipe as `oracle.throughput.earlier_runs` (the levels search counts it as a run)."""

from __future__ import annotations

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.nightly.at_commit import nightly_results, with_earlier_runs
from bisect_npu.nightly.cases import CaseRef, import_case, read_case_file
from tests.helpers.npu_throughput import CASE_PATH, PERF_CASE


def test_the_values_given_per_end_become_the_recipes_earlier_runs() -> None:
    earlier = nightly_results(["bad=951.2", "good=1003 token/s", "bad=948"])
    assert earlier is not None and earlier.bad == [951.2, 948.0] and earlier.good == [1003.0]
    recipe = import_case(read_case_file(PERF_CASE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    changed = with_earlier_runs(recipe, earlier, CaseRef.parse(f"{CASE_PATH}::speed-a2::perf"))
    assert changed.oracle.throughput is not None
    assert changed.oracle.throughput.earlier_levels() == ((1003.0,), (951.2, 948.0))
    assert changed.digest() != recipe.digest()  # a resume finds the recipe it ran
    assert nightly_results([]) is None


@pytest.mark.parametrize(("text", "said"), [("951", "END=TOKENS_PER_S"), ("worst=951", "END=TOKENS_PER_S"),
                                            ("bad=fast", "not a number"), ("bad=-951", "positive number"),
                                            ("bad=0", "positive number")])
def test_what_is_no_end_or_no_throughput_is_refused_naming_the_form(text: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        nightly_results([text])
