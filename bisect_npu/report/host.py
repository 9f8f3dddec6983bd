"""The host the bad case ran on, as a maintainer asks for it: the device, its driver, CANN and the
versions of torch-npu, vllm-ascend and vLLM, from what the probes recorded ("not recorded" where
nothing did, so a missing fact is seen as missing), and how each venv the runs used got its
packages (its key's lock, resolved as of its commit's date, or afresh)."""

from __future__ import annotations

from bisect_npu.execute.host import PRODUCTS
from bisect_npu.report.view import SessionView
from bisect_npu.search.retry_policy import rate_said

NOT_RECORDED = "not recorded"
# (label, the probe's version key), in the order a maintainer reads them.
VERSION_ROWS = (("NPU driver", "driver"), ("CANN", "cann"), ("torch", "torch"), ("torch-npu", "torch_npu"),
                ("vllm-ascend", "vllm_ascend"), ("vLLM", "vllm"))


def host_rows(view: SessionView) -> list[tuple[str, str]]:
    """(what, value) rows: the device first, then each version; other versions the probe kept after."""
    context = view.header.context
    device = PRODUCTS.get(context.host, context.host) if context.host else NOT_RECORDED
    if view.request.executor.devices:
        device += f" (devices {','.join(map(str, view.request.executor.devices))})"
    rows = [("device", device)]
    known = {key for _, key in VERSION_ROWS}
    rows += [(label, view.versions.get(key) or NOT_RECORDED) for label, key in VERSION_ROWS]
    rows += [(key, value) for key, value in sorted(view.versions.items()) if key not in known]
    rows += [(f"venv {key}", made) for key, made in sorted(view.venvs.items())]
    if view.host_record.failures:
        failed = view.host_record.failures
        rows.append(("host failures", f"{failed} retr{'y' if failed == 1 else 'ies'}; "
                                      f"{rate_said(view.host_record)}"))
    return rows
