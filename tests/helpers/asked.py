"""A session's spec from fields by name, for tests: `spec_of(good="a", bad="b", command=["true"], host="A3")`.
The request's fields go to their parts (`RunRequest.of`), `host` and `python_oracle` to the context,
and the level is the request's first (`first_level`)."""

from __future__ import annotations

from typing import Any

from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.request import RunContext, RunRequest


def spec_of(**fields: Any) -> SessionSpec:
    context = RunContext(**{name: fields.pop(name) for name in ("host", "python_oracle") if name in fields})
    spec = SessionSpec.of(RunRequest.of(**fields))
    spec.context = context
    return spec
