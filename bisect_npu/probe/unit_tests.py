"""`run --unit-test`'s command: run the named tests of a vllm-ascend checkout and exit by the
`git bisect run` protocol, with the reason in the file `BISECT_NPU_REASON_FILE` names.

    python -m bisect_npu.probe.unit_tests [--present-at-good FILE]... NODEID...

Runs in the candidate's worktree with its pin's venv (bisect_npu/builders/unit_tests.py). The
verdict: every named test that exists passes -> good (0); a named test fails or errors -> bad
(1); a named test the commit does not have (yet) -> good, said so (the culprit often adds the
test that fails); a named test that was only skipped there (a `skip` mark put on a broken test,
which a later commit lifts) -> skip (125); a test module that cannot be collected -> bad when it
exists at the good end (`--present-at-good`), else skip (125): an import error of a module the
good end lacks says nothing about the regression. Stdlib only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .npu_stubs import STUBBED, SUBMODULES_ENV, looked_up_by_name

GOOD, BAD, SKIP = 0, 1, 125
ABORT = 128  # `git bisect run` stops here instead of blaming the commit
# The verdict rules' version (2: a named test that was only skipped skips the commit). The command
# names it, so a verdict stored, or journaled, under other rules is not taken for one of these.
RULES = 2
UNNAMED_RULES = 1  # what a command made before commands named their rules was judged by
REASON_ENV = "BISECT_NPU_REASON_FILE"
REPORT_ENV = "BISECT_NPU_UT_REPORT"
SELECT_ENV = "BISECT_NPU_UT_SELECT"
# vllm-ascend's CI environment for its unit tests (.github/workflows: the CPU unit-test job).
CI_ENV = {
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_USE_MODELSCOPE": "True", "HF_HUB_OFFLINE": "1", "SOC_VERSION": "ascend910b1", "COMPILE_CUSTOM_KERNELS": "0",
}
CONFTEST = "tests/ut/conftest.py"
CONFTEST_KEY = "<conftest>"  # the report's collection error of a conftest pytest could not import
PROBE_DIR = Path(__file__).resolve().parent
NPU_SITE = PROBE_DIR / "npu_site"


@dataclass(frozen=True)
class Judgement:
    code: int
    reason: str


def file_of(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def selects(node_id: str, item_id: str) -> bool:
    """Whether the named `node_id` (a file, a class, a test, a parametrized case) selects `item_id`."""
    return item_id == node_id or item_id.startswith((node_id + "::", node_id + "["))


def mocks_npu_itself(conftest: Path) -> bool:
    """Whether the checkout's unit-test conftest puts mocks in place of `torch_npu` without an NPU
    (vllm-ascend since bb4d0776ee, 2026-06-02); before it, bisect-npu's stubs are needed."""
    try:
        text = conftest.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    # An assignment, not a use: the conftest of 2026-04 reads sys.modules['torch_npu'].npu (the real one).
    return re.search(r"""sys\.modules\[['"]torch_npu['"]\]\s*=""", text) is not None


def in_installed_package(path: str) -> bool:
    """Whether a traceback's file lies in an installed package (a venv's site-packages), not the
    checkout nor this probe (whose NPU stubs stand in for packages the host lacks)."""
    parts = Path(path).parts
    return ("site-packages" in parts or "dist-packages" in parts) and PROBE_DIR not in Path(path).resolve().parents


def installed_packages(frames: list[str]) -> list[str]:
    """The installed distributions a traceback passes through, in order, each as "name version"."""
    found: list[str] = []
    by_module = importlib.metadata.packages_distributions()
    for frame in frames:
        parts = Path(frame).parts
        where = next((i for i, part in enumerate(parts) if part in ("site-packages", "dist-packages")), None)
        if where is None or where + 1 >= len(parts) or not in_installed_package(frame):
            continue
        module = parts[where + 1].removesuffix(".py")
        for dist in by_module.get(module, [module]):
            try:
                named = f"{dist} {importlib.metadata.version(dist)}"
            except importlib.metadata.PackageNotFoundError:
                named = f"{dist} (version unknown)"
            if named not in found:
                found.append(named)
    return found


def judge(node_ids: list[str], present: set[str], report: dict[str, object] | None, returncode: int,
          present_at_good: set[str]) -> Judgement:
    """The verdict of one run from pytest's report (pytest_report.py) and what exists at this commit."""
    absent_files = [n for n in node_ids if file_of(n) not in present]
    if report is None:
        return Judgement(SKIP, f"pytest exited {returncode} without a report (see the log)")
    errors = {str(k): str(v) for k, v in dict(report.get("collect_errors") or {}).items()}  # type: ignore[call-overload]
    tests = {str(k): str(v) for k, v in dict(report.get("tests") or {}).items()}  # type: ignore[call-overload]
    messages = {str(k): str(v) for k, v in dict(report.get("messages") or {}).items()}  # type: ignore[call-overload]
    matched = {str(k): int(v) for k, v in dict(report.get("matched") or {}).items()}  # type: ignore[call-overload]
    broken = sorted({file_of(n) for n in node_ids if file_of(n) in present
                     and any(key == file_of(n) or key.startswith(file_of(n) + "::") for key in errors)})
    conftest = CONFTEST_KEY in errors  # pytest stopped before collecting: every named file is broken
    if errors and not broken and (conftest or "<session>" in errors):
        broken = sorted({file_of(n) for n in node_ids if file_of(n) in present})
    if broken:
        first = broken[0]
        key = CONFTEST_KEY if conftest else next((k for k in errors if k == first or k.startswith(first + "::")),
                                                 "<session>")
        error = errors.get(key, "")
        frames = [str(f) for f in dict(report.get("collect_frames") or {}).get(key) or []]  # type: ignore[call-overload]
        packages = installed_packages(frames)
        importing = str(report.get("conftest") or CONFTEST) if conftest else first
        if frames and packages and in_installed_package(frames[-1]):
            return Judgement(ABORT, f"the environment is broken, not the commit: importing {importing} failed inside "
                                    f"the installed package {packages[-1]} ({error}); import chain: "
                                    f"{', '.join(packages)}; rebuild the pin's venv with the versions it was "
                                    "tested with, then `bisect-npu resume`")
        if conftest:
            return Judgement(SKIP, f"{importing} cannot be imported ({error}): no test ran, so the commit is skipped")
        if first in present_at_good:
            return Judgement(BAD, f"{first} cannot be collected ({error}); it exists at the good end, counted bad")
        return Judgement(SKIP, f"{first} cannot be collected ({error}); the good end does not have it, so this "
                               "says nothing about the regression: skipped")
    failed = sorted(k for k, v in tests.items() if v in ("failed", "error"))
    if failed:
        detail = f" ({messages[failed[0]]})" if messages.get(failed[0]) else ""
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        return Judgement(BAD, f"{failed[0]} {tests[failed[0]]}{detail}{more}")
    skipped_only = [n for n in node_ids if (ran := [v for k, v in tests.items() if selects(n, k)])
                    and all(v == "skipped" for v in ran)]
    if skipped_only:
        first = skipped_only[0]
        why = next((messages[k] for k in tests if selects(first, k) and messages.get(k)), "")
        return Judgement(SKIP, f"{first} was skipped at this commit{f' ({why})' if why else ''}: it says nothing "
                               "about the regression, so the commit is skipped")
    missing = [n for n in node_ids if file_of(n) not in absent_files and not matched.get(n)] + absent_files
    passed = sum(1 for v in tests.values() if v == "passed")
    if missing and not passed:
        return Judgement(GOOD, f"{missing[0]} does not exist at this commit: counted good (a test added by the "
                               "culprit is absent before it)")
    if returncode not in (0, 5) and not tests:
        return Judgement(SKIP, f"pytest exited {returncode} before running a named test (see the log)")
    note = f"; {missing[0]} does not exist at this commit" if missing else ""
    skipped = sum(1 for v in tests.values() if v == "skipped")
    return Judgement(GOOD, f"{passed} named test{'s' if passed != 1 else ''} passed"
                           f"{f', {skipped} skipped' if skipped else ''}{note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bisect_npu.probe.unit_tests")
    parser.add_argument("--present-at-good", action="append", default=[], metavar="FILE",
                        help="a named test file the good end has (its import error then counts bad)")
    parser.add_argument("--tests-from", metavar="SHA", help="the commit the test files were laid in from")
    parser.add_argument("--report", metavar="FILE", help="keep pytest's per-test outcomes (JSON) here")
    parser.add_argument("--rules", type=int, default=UNNAMED_RULES, help="the verdict rules the command was made for")
    parser.add_argument("node_ids", nargs="+")
    args = parser.parse_args(argv)
    node_ids: list[str] = args.node_ids
    if args.rules != RULES:
        return _said(Judgement(ABORT, f"the command was made for the unit-test verdict rules {args.rules} and this "
                                      f"bisect-npu judges by rules {RULES}: start a new session with `run` (a "
                                      "journal or stored verdict of other rules is not reused)"))
    present = {file_of(n) for n in node_ids if Path(file_of(n)).is_file()}
    if args.tests_from:
        print(f"bisect-npu unit tests: the test files are as at {args.tests_from}", flush=True)
    return _said(run(node_ids, present, set(args.present_at_good), Path(args.report) if args.report else None))


# The caller's own pytest settings (options, plugins) would change which tests run and how, and a
# `--basetemp` in them would wipe the caller's temporary files: the commit's tests run with ours only.
CALLER_PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def _said(judgement: Judgement) -> int:
    """The judgement's exit code, its reason printed and written where `REASON_ENV` names."""
    print(f"bisect-npu unit tests: {judgement.reason}", flush=True)
    reason_file = os.environ.get(REASON_ENV)
    if reason_file:
        Path(reason_file).write_text(judgement.reason + "\n", encoding="utf-8")
    return judgement.code


def run(node_ids: list[str], present: set[str], present_at_good: set[str], keep: Path | None = None) -> Judgement:
    if not present:
        return judge(node_ids, present, {}, 0, present_at_good)
    env = {key: value for key, value in os.environ.items() if key not in CALLER_PYTEST_ENV}
    env.update({**CI_ENV, SELECT_ENV: json.dumps(node_ids)})
    package = __package__ or "bisect_npu.probe"  # the probe package may live under another name
    plugins = ["-p", f"{package}.pytest_report"]
    if not mocks_npu_itself(Path(CONFTEST)):
        plugins += ["-p", f"{package}.npu_stubs"]
        env["PYTHONPATH"] = os.pathsep.join([str(NPU_SITE), *filter(None, [env.get("PYTHONPATH")])])
        submodules = looked_up_by_name(Path.cwd())
        env[SUBMODULES_ENV] = ",".join(submodules)
        print("bisect-npu unit tests: this commit's tests/ut/conftest.py does not mock the NPU stack; "
              f"bisect-npu's stubs for {', '.join(STUBBED)} are loaded"
              + (f", with {', '.join(submodules)} (read from sys.modules by name)" if submodules else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="bisect-npu-ut-") as scratch:
        report_path = Path(scratch) / "report.json"
        env[REPORT_ENV] = str(report_path)
        argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *plugins,
                *sorted(present)]
        print("$ " + " ".join(argv), flush=True)
        returncode = subprocess.run(argv, env=env, check=False).returncode
        report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else None
        if keep is not None and report is not None:
            keep.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return judge(node_ids, present, report, returncode, present_at_good)


if __name__ == "__main__":
    raise SystemExit(main())
