"""The recipe digest's compatibility rule: a field 0.1.0 did not have enters only when set."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from pydantic import BaseModel


@functools.cache
def fields_of_0_1_0() -> frozenset[str]:
    """The recipe fields of bisect-npu 0.1.0, the first release, as dotted paths."""
    text = (resources.files("bisect_npu.recipe") / "fields_0_1_0.txt").read_text()
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def without_new_defaults(value: Any, dumped: Any, prefix: str) -> Any:
    """`dumped` (value's JSON dump) less the fields unknown to 0.1.0 that hold their defaults."""
    if isinstance(value, BaseModel):
        known = fields_of_0_1_0()
        kept = {}
        for name, field in type(value).model_fields.items():
            if name not in dumped:
                continue
            path = prefix + name
            attr = getattr(value, name)
            if path not in known and not field.is_required() and attr == field.get_default(call_default_factory=True):
                continue
            kept[name] = without_new_defaults(attr, dumped[name], path + ".")
        return kept
    if isinstance(value, list | tuple) and isinstance(dumped, list):
        return [without_new_defaults(item, raw, prefix) for item, raw in zip(value, dumped, strict=True)]
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {key: without_new_defaults(value.get(key, raw), raw, prefix) for key, raw in dumped.items()}
    return dumped
