"""bisect_npu.api's names: each one is there, the object its home module defines, and a command
imports only the rooms its own call needs (each `bisect-npu` process starts with what it uses)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import bisect_npu.api as api


def test_every_public_name_is_the_object_of_its_home_module() -> None:
    assert sorted(api._HOMES) == sorted(api.__all__)
    for name in api.__all__:
        assert getattr(api, name) is getattr(importlib.import_module(api._HOMES[name]), name), name
    assert set(api.__all__) <= set(dir(api))


def test_a_name_the_api_lacks_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_call"):
        api.no_such_call  # noqa: B018
    assert not hasattr(api, "no_such_call")


@pytest.mark.parametrize(("name", "not_imported"), [
    ("render_report", ["bisect_npu.api.bisection", "bisect_npu.alignment.record", "numpy"]),
    ("list_recipes", ["bisect_npu.api.bisection", "bisect_npu.alignment.record"]),
    ("bisect", ["bisect_npu.api.alignment", "bisect_npu.api.demo", "bisect_npu.api.ci"]),
])
def test_a_call_imports_its_own_room_and_not_the_others(name: str, not_imported: list[str]) -> None:
    code = ("import sys\nfrom bisect_npu import api\n"
            f"api.{name}\nprint(' '.join(m for m in {not_imported!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
