"""Entry point: ``python -m bisect_npu.probe REQUEST.json`` writes one observation.

Exit 0 with an observation written; exit 3 when the engine could not run the case (the host
turns that into a ``skip``); the last lines of stderr explain why.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from .request import read_request, write_json_atomic

BACKENDS = {"mini": "mini", "vllm": "vllm", "openai": "openai"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bisect_npu.probe REQUEST.json", file=sys.stderr)
        return 2
    request = read_request(argv[0])
    backend = BACKENDS.get(request.get("backend", ""))
    if backend is None:
        print(f"unknown probe backend {request.get('backend')!r}; known: {', '.join(BACKENDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f".backends.{backend}", __package__)
    try:
        observation = module.run_case(request)
    except Exception:  # the host reads the tail of stderr into the skip reason
        traceback.print_exc()
        return 3
    write_json_atomic(request["output"], observation)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
