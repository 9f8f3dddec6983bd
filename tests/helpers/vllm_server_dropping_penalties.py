"""Real vLLM OpenAI server with regression 4 put back: server-side penalty defaults never arrive.

The historical bug (docs/design/field.md, "A server-side default that never arrives"): the defaults built
from `--override-generation-config` lost `presence_penalty`/`frequency_penalty` without a warning.
This launcher drops them at the same place, in the server's own process, then runs the stock
server module, so the probe can be tested on a server that really behaves like the broken one.
Run as: python tests/helpers/vllm_server_dropping_penalties.py --model DIR [server flags].
"""

from __future__ import annotations

import runpy

DROPPED = ("presence_penalty", "frequency_penalty")


def _drop_penalties() -> None:
    from vllm.config.model import ModelConfig

    original = ModelConfig.get_diff_sampling_param

    def without_penalties(self: ModelConfig) -> dict:
        return {key: value for key, value in original(self).items() if key not in DROPPED}

    ModelConfig.get_diff_sampling_param = without_penalties


if __name__ == "__main__":  # the engine starts its processes with spawn: they re-import this file
    _drop_penalties()
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
