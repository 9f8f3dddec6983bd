"""`run --unit-test`: the runner's verdicts on real pytest runs, the checks before a session, the
pin venv cache, and a whole bisection of a generated vllm-ascend-shaped history (its venv stood
in by this interpreter, which has pytest: nothing is installed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import git as gitpython
import pytest

from bisect_npu.builders import pin_venv
from bisect_npu.builders.unit_tests import (
    check_unit_tests,
    entry_points_of,
    npu_refusal,
    unit_test_command,
    write_package_record,
)
from bisect_npu.builders.venv import COMPLETE_MARKER
from bisect_npu.errors import UsageError
from bisect_npu.probe import npu_stubs
from bisect_npu.probe import unit_tests as runner
from bisect_npu.upstream import dockerfile
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
ROUTED_CONFTEST = 'import sys, types\nsys.modules["torch_npu"] = types.ModuleType("torch_npu")\n'
OLD_CONFTEST = ("import sys\nfrom unittest.mock import MagicMock\n\n"
                "import torch_npu  # the real one: no NPU here without bisect-npu's stubs\n\n"
                "sys.modules['torch_npu'].npu.current_device = MagicMock(return_value=0)\n")
PASSING = "def test_scale():\n    assert 2 * 2 == 4\n\n\ndef test_other():\n    assert True\n"
FAILING = "def test_scale():\n    assert 2 * 2 == 5\n\n\ndef test_other():\n    assert True\n"
SETUP_PY = ('from setuptools import setup\nsetup(name="vllm_ascend", entry_points={\n'
            '    "vllm.platform_plugins": ["ascend = vllm_ascend:register"],\n'
            '    "vllm.general_plugins": ["ascend_model = vllm_ascend:register_model"]})\n')


def run_runner(checkout: Path, *args: str, rules: list[str] | None = None) -> tuple[int, str, str]:
    """The runner as a candidate runs it: in the checkout, this interpreter as the venv's, with the
    command's `--rules` (the product's command, unless `rules` gives other words)."""
    args = (*(["--rules", str(runner.RULES)] if rules is None else rules), *args)
    reason = checkout / "reason.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), runner.REASON_ENV: str(reason)}
    proc = subprocess.run([sys.executable, "-m", "bisect_npu.probe.unit_tests", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    return proc.returncode, reason.read_text().strip() if reason.exists() else "", proc.stdout + proc.stderr


def checkout_with(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "checkout"
    for name, text in {"tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": ROUTED_CONFTEST,
                       **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.e2e
def test_runner_judges_pass_fail_absent_and_import_errors(tmp_path: Path) -> None:
    checkout = checkout_with(tmp_path, {"tests/ut/quant/test_a.py": PASSING, "tests/ut/quant/test_b.py": FAILING,
                                        "tests/ut/quant/test_c.py": "import no_such_module_here\n"})
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_a.py")
    assert (code, reason) == (0, "2 named tests passed")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_b.py::test_other")
    assert (code, reason) == (0, "1 named test passed")  # the failing test of the file is not named
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_b.py::test_scale")
    assert code == 1 and reason.startswith("tests/ut/quant/test_b.py::test_scale failed (assert (2 * 2) == 5)")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_a.py::test_added_later")
    assert code == 0 and reason.startswith("tests/ut/quant/test_a.py::test_added_later does not exist at this commit")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_new.py")
    assert code == 0 and "test_new.py does not exist at this commit" in reason
    code, reason, _ = run_runner(checkout, "--present-at-good", "tests/ut/quant/test_c.py", "tests/ut/quant/test_c.py")
    assert code == 1
    assert "tests/ut/quant/test_c.py cannot be collected (ModuleNotFoundError: No module named " in reason
    assert reason.endswith("it exists at the good end, counted bad")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_c.py")
    assert code == 125 and "the good end does not have it" in reason


def test_the_callers_pytest_options_do_not_reach_the_commits_tests(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A `-k` that deselects the named test, or a `--basetemp` the caller's own run uses, in the
    caller's PYTEST_ADDOPTS: the commit's test still runs and is judged, and the caller's files stay."""
    checkout = checkout_with(tmp_path, {"tests/ut/quant/test_b.py": FAILING})
    callers_temp = tmp_path / "callers-temp"
    (callers_temp / "kept.txt").parent.mkdir()
    (callers_temp / "kept.txt").write_text("the caller's\n")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-k not_this_one --basetemp={callers_temp}")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_b.py::test_scale")
    assert code == 1 and reason.startswith("tests/ut/quant/test_b.py::test_scale failed")
    assert (callers_temp / "kept.txt").read_text() == "the caller's\n"


SKIPPED = ("import pytest\n\n\n@pytest.mark.skip('Execute after the issue is fixed')\ndef test_scale():\n"
           "    assert 2 * 2 == 5\n\n\ndef test_other():\n    assert True\n")


@pytest.mark.e2e
def test_a_named_test_that_was_only_skipped_skips_the_commit(tmp_path: Path) -> None:
    """vllm-ascend 4756a9ad6f put `skip` on the tests f81dd51845 broke and be940519a2 lifted it:
    counted good, the skip would be named as the fix."""
    checkout = checkout_with(tmp_path, {"tests/ut/quant/test_s.py": SKIPPED})
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_s.py::test_scale")
    assert code == 125
    assert reason == ("tests/ut/quant/test_s.py::test_scale was skipped at this commit (Execute after the issue is "
                      "fixed): it says nothing about the regression, so the commit is skipped")
    code, reason, _ = run_runner(checkout, "tests/ut/quant/test_s.py")
    assert (code, reason) == (0, "1 named test passed, 1 skipped")  # the file ran: its other test passed
    code, _, _ = run_runner(checkout, "tests/ut/quant/test_s.py::test_other", "tests/ut/quant/test_s.py::test_scale")
    assert code == 125


@pytest.mark.e2e
def test_a_command_of_other_verdict_rules_aborts_the_run(tmp_path: Path) -> None:
    """A journal or a stored verdict made before a rule changed carries the old command: it is not
    run under the new rules (exit 128 stops `git bisect run` and `run`, which quotes the reason)."""
    checkout = checkout_with(tmp_path, {"tests/ut/quant/test_s.py": SKIPPED})
    assert unit_test_command(["tests/ut/quant/test_s.py"], [])[:5] == ["python", "-m", runner.__name__, "--rules",
                                                                       str(runner.RULES)]
    for words in ([], ["--rules", str(runner.RULES - 1)]):
        code, reason, _ = run_runner(checkout, "tests/ut/quant/test_s.py::test_scale", rules=words)
        assert code == 128
        assert reason.startswith(f"the command was made for the unit-test verdict rules {runner.RULES - 1} and this "
                                 f"bisect-npu judges by rules {runner.RULES}: start a new session with `run`")


@pytest.mark.e2e
def test_runner_stubs_the_npu_stack_where_the_conftest_does_not(tmp_path: Path) -> None:
    """Before 2026-06-02 the conftest imports torch_npu itself: the stubs answer it, also in a
    process the test starts (through sitecustomize)."""
    child = ("import subprocess, sys\n\n\ndef test_child_imports_acl():\n"
             "    code = 'import acl.rt, mooncake.engine; acl.rt.memcpy(1); print(\"ok\")'\n"
             "    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
             "    assert out.stdout.strip() == 'ok', out.stderr\n\n\n"
             "def test_torch_npu_is_a_mock():\n    import torch_npu\n    torch_npu.npu.set_device(0)\n")
    if importlib.util.find_spec("torch") is not None:  # torch.npu, as the real torch_npu sets it
        child += ("\n\ndef test_torch_has_npu():\n    import torch\n    import torch_npu\n"
                  "    assert torch.npu is torch_npu.npu\n")
    checkout = checkout_with(tmp_path, {"tests/ut/conftest.py": OLD_CONFTEST, "tests/ut/test_old.py": child})
    code, reason, output = run_runner(checkout, "tests/ut/test_old.py")
    assert code == 0 and reason.endswith("named tests passed"), output
    assert "does not mock the NPU stack" in output


# vllm-ascend's patches of 2026-04 reload torchair submodules that the real torchair imports itself.
PATCHING_PACKAGE = ("import importlib\nimport sys\n\nimport torchair\n\n"
                    "importlib.reload(sys.modules[\"torchair.fx_summary\"])\n"
                    "torchair.fx_summary.patched = True\n")


@pytest.mark.e2e
def test_stubs_answer_submodules_the_sources_read_from_sys_modules(tmp_path: Path) -> None:
    """A package that reads `sys.modules["torchair.fx_summary"]` at import, without importing it,
    loads from the conftest and in a child process; without the scan the conftest fails."""
    conftest = OLD_CONFTEST + "\nimport vllm_ascend.patch  # noqa: E402\n"
    child = ("import subprocess, sys\n\nimport vllm_ascend.patch\n\n\ndef test_patched():\n"
             "    assert vllm_ascend.patch.torchair.fx_summary.patched is True\n\n\n"
             "def test_child_imports_the_patch():\n"
             "    code = 'import vllm_ascend.patch, sys; print(sys.modules[\"torchair.fx_summary\"].patched)'\n"
             "    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
             "    assert out.stdout.strip() == 'True', out.stderr\n")
    checkout = checkout_with(tmp_path, {"tests/ut/conftest.py": conftest, "tests/ut/test_patch.py": child,
                                        "vllm_ascend/__init__.py": "", "vllm_ascend/patch.py": PATCHING_PACKAGE})
    code, reason, output = run_runner(checkout, "tests/ut/test_patch.py")
    assert (code, reason) == (0, "2 named tests passed"), output
    assert "with torchair.fx_summary (read from sys.modules by name)" in output
    unscanned = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, '.'); "
                                "from bisect_npu.probe import npu_stubs; npu_stubs.install(False); "
                                "import vllm_ascend.patch"], cwd=checkout, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), npu_stubs.SUBMODULES_ENV: ""})
    assert "KeyError: 'torchair.fx_summary'" in unscanned.stderr


def test_lookups_by_name_are_reads_of_stubbed_submodules_only(tmp_path: Path) -> None:
    files = {
        "vllm_ascend/a.py": PATCHING_PACKAGE + "x = sys.modules['torch_npu._inductor.config'].value\n",
        "vllm_ascend/b.py": "import sys\nif sys.modules[\"mooncake.store\"] == None:\n    pass\n",
        "tests/ut/test_m.py": "import sys\nsys.modules[\"mooncake.engine\"] = object()\n"
                              "sys.modules['acl.rt'] = None\nsys.modules['torchair'].x\nsys.modules['vllm.x'].y\n",
        ".hidden/c.py": "import sys\nsys.modules['acl.hidden']\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert npu_stubs.looked_up_by_name(tmp_path) == ["mooncake.store", "torch_npu._inductor.config",
                                                     "torchair.fx_summary"]


@pytest.mark.parametrize("report, code, start", [
    (None, 125, "pytest exited 3 without a report"),
    ({"collect_errors": {"<session>": "INTERNALERROR"}, "tests": {}}, 1, "tests/ut/t.py cannot be collected"),
    ({"tests": {"tests/ut/t.py::a": "passed", "tests/ut/t.py::b": "error"}, "messages": {}}, 1,
     "tests/ut/t.py::b error"),
    ({"tests": {"tests/ut/t.py::a": "skipped"}, "matched": {"tests/ut/t.py": 1}}, 125,
     "tests/ut/t.py was skipped at this commit: it says nothing"),
    ({"tests": {"tests/ut/t.py::a": "skipped", "tests/ut/t.py::b": "passed"}, "matched": {"tests/ut/t.py": 2}}, 0,
     "1 named test passed, 1 skipped"),
])
def test_judge_of_odd_reports(report: dict[str, object] | None, code: int, start: str) -> None:
    judged = runner.judge(["tests/ut/t.py"], {"tests/ut/t.py"}, report, 3, {"tests/ut/t.py"})
    assert judged.code == code and judged.reason.startswith(start)


def test_npu_tests_are_refused_with_the_reason() -> None:
    assert npu_refusal("tests/ut/ops/test_rope.py::test_x") is None
    refused = npu_refusal("tests/ut/ops/a2/test_rope.py::test_x")
    assert refused is not None and "tests under a2/ need NPU cards" in refused
    assert "310p/" in (npu_refusal("tests/ut/worker/310p/test_w.py") or "")
    assert "tests/e2e needs NPU cards" in (npu_refusal("tests/e2e/singlecard/test_x.py") or "")
    assert "a3_2/" in (npu_refusal("tests/ut/ops/a3_2/test_mc2.py::test_x") or "")


def test_the_310p_module_is_not_refused_as_vllm_ascend_runs_it_on_cpu() -> None:
    """`tests/ut/_310p/` is a module of its own, not a `<module>/310p/` card directory: the CPU
    job's file list (select_tests.py with `cpu-ut`) names every file under it, at every sampled
    commit since the CPU routing."""
    assert npu_refusal("tests/ut/_310p/ops/test_conv_310.py::test_x") is None
    assert npu_refusal("tests/ut/_310p/attention/test_attention_v1_310.py") is None
    assert "310p/" in (npu_refusal("tests/ut/_310p/ops/310p/test_conv_310.py") or "")


def sample(tests: dict[str, str], files: list[str], errors: dict[str, str] | None = None) -> dict[str, object]:
    return {"tests": tests, "errors": errors or {}, "files": files,
            "collected": sorted({t.split("::", 1)[0] for t in tests})}


def test_sweep_windows_need_ok_then_fail_then_pass() -> None:
    from tests.helpers.vllm_ascend_ut import sweep_windows

    a, b, c = "tests/ut/a.py::t", "tests/ut/b.py::t", "tests/ut/c.py::t"
    samples = [
        sample({a: "passed", b: "failed"}, ["tests/ut/a.py", "tests/ut/b.py"]),  # c's module absent: ok
        sample({a: "failed", b: "failed", c: "failed"}, ["tests/ut/a.py", "tests/ut/b.py", "tests/ut/c.py"]),
        sample({}, ["tests/ut/a.py", "tests/ut/b.py", "tests/ut/c.py"], {"tests/ut/a.py": "ImportError"}),
        sample({a: "passed", b: "passed", c: "failed"}, ["tests/ut/a.py", "tests/ut/b.py", "tests/ut/c.py"]),
    ]
    # a: its module not collected at 2 says nothing; it passes again at 3. b failed from the first
    # sample on (no ok before it). c never passes again.
    assert sweep_windows(samples) == [(a, 0, 1, 3)]


def pinned_history(path: Path, n: int, culprit: int, pin: dict[str, str | None] | None = None) -> list[str]:
    """A vllm-ascend-shaped history: a pin file, a unit test that breaks at `culprit`."""
    def files(i: int) -> dict[str, str | None]:
        if i == 0:
            return {dockerfile.PIN_FILE: "v0.23.0\n", "requirements.txt": "numpy\ntransformers==5.5.4\n",
                    "setup.py": SETUP_PY, "vllm_ascend/__init__.py": "def register():\n    return None\n",
                    "tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": ROUTED_CONFTEST,
                    "tests/ut/quant/test_q.py": PASSING, **(pin or {})}
        return {"tests/ut/quant/test_q.py": FAILING} if i == culprit else {}
    return make_linear_repo(path, n, files=files)


def test_checks_before_a_session(tmp_path: Path) -> None:
    shas = pinned_history(tmp_path / "up", 4, 2)
    repo = gitpython.Repo(tmp_path / "up")
    assert check_unit_tests(repo, ["tests/ut/quant/test_q.py::test_scale"], shas[0], shas[3], None) == \
        ["tests/ut/quant/test_q.py"]
    with pytest.raises(UsageError, match=r"tests/ut/quant/test_nothing.py exists at neither the good end "):
        check_unit_tests(repo, ["tests/ut/quant/test_nothing.py::test_x"], shas[0], shas[3], None)
    with pytest.raises(UsageError, match="tests under a2/ need NPU cards"):
        check_unit_tests(repo, ["tests/ut/quant/a2/test_q.py"], shas[0], shas[3], None)
    with pytest.raises(UsageError, match=r"--unit-test-from \w+: tests/ut/quant/test_later.py does not exist there"):
        check_unit_tests(repo, ["tests/ut/quant/test_later.py"], shas[0], shas[3], shas[1])
    bare = make_linear_repo(tmp_path / "bare", 3, files=lambda i: {"tests/ut/test_t.py": PASSING} if i == 0 else {})
    with pytest.raises(UsageError, match=r"the good end \w+ has neither \.github/vllm-release-tag\.commit nor a "
                                         "Dockerfile with ARG VLLM_TAG"):
        check_unit_tests(gitpython.Repo(tmp_path / "bare"), ["tests/ut/test_t.py"], bare[0], bare[2], None)


def test_package_record_gives_vllm_the_plugin_entry_points(tmp_path: Path) -> None:
    assert entry_points_of(SETUP_PY) == {"vllm.platform_plugins": ["ascend = vllm_ascend:register"],
                                         "vllm.general_plugins": ["ascend_model = vllm_ascend:register_model"]}
    assert entry_points_of("setup(entry_points=ENTRY_POINTS)") == {
        "vllm.platform_plugins": ["ascend = vllm_ascend:register"]}
    (tmp_path / "setup.py").write_text(SETUP_PY)
    site = write_package_record(tmp_path, "0.23.0rc1")
    code = ("import importlib.metadata as m; print(m.version('vllm_ascend'), "
            "[e.value for e in m.entry_points(group='vllm.general_plugins')])")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0.23.0rc1 ['vllm_ascend:register_model']"


def test_requirements_leave_out_the_npu_and_cuda_stack() -> None:
    lines = pin_venv.requirement_lines(["-r requirements-lint.txt\ntorch==2.10.0\ntorch-npu==2.10.0.post4\n"
                                        "arctic-inference==0.1.1\ntransformers==5.5.4  # pinned\nzmq\nnumpy\n",
                                        "-r requirements.txt\nnumpy\nlm-eval==0.4.12\npytest >= 6.0,<9.0.0\n"])
    assert lines == ["transformers==5.5.4", "pyzmq", "numpy", "pytest >= 6.0,<9.0.0"]
    assert pin_venv.transformers_line(lines) == "transformers==5.5.4"
    assert pin_venv.PinKey("0.23.0", "transformers==5.5.4").name == "vllm-0.23.0--transformers-5.5.4"
    assert pin_venv.PinKey("0.23.0", "").name == "vllm-0.23.0--transformers-any"


@pytest.mark.parametrize("line, slug", [
    ("transformers==5.5.4", "5.5.4"),
    ("transformers>=5.5.4", "ge5.5.4"),
    ("transformers <= 5.5.4", "le5.5.4"),
    ("transformers~=5.5", "compatible5.5"),
    ("transformers>=4.56.0,<5", "ge4.56.0-lt5"),
    ("transformers>=4.56.0, !=4.57.0, <5", "ge4.56.0-ne4.57.0-lt5"),
    ("transformers", "any"),
])
def test_pin_key_names_keep_the_comparison(line: str, slug: str) -> None:
    assert pin_venv.PinKey("0.23.0", line).name == f"vllm-0.23.0--transformers-{slug}"


def test_pin_keys_of_different_requirements_never_share_a_venv() -> None:
    lines = ["transformers==5.5.4", "transformers>=5.5.4", "transformers<=5.5.4", "transformers>5.5.4",
             "transformers!=5.5.4", "transformers===5.5.4", "transformers~=5.5.4", "transformers[torch]==5.5.4",
             "transformers==5.5.4; python_version < '3.12'", "transformers>=5.5.4,<6", "transformers", ""]
    names = {pin_venv.PinKey("0.23.0", line).name for line in lines}
    assert len(names) == len(lines) - 1  # "transformers" and no line at all are the same requirement
    assert pin_venv.PinKey("0.23.0", "transformers  >= 5.5.4").name == pin_venv.PinKey("0.23.0",
                                                                                       "transformers>=5.5.4").name
    commit = "35141a7eeda941a60ad5a4956670c60fd5a77029"
    assert pin_venv.PinKey(commit, "transformers==5.5.4").name == "vllm-commit-35141a7eeda9--transformers-5.5.4"


def fake_venv(cache: Path, key: pin_venv.PinKey, *, layer: bool = False) -> Path:
    """A complete venv of the cache whose interpreter is this one, seeing this one's packages
    (pytest) and nothing else of the host's: `bisect_npu` only through the cache's own host link,
    as in a venv the cache built. `layer`: the cache's torch layer marked built too (empty: the
    venv does not read it), so a run does not install the real 4.4 GB one for it."""
    if layer:
        (cache / pin_venv.TORCH_LAYER).mkdir(parents=True)
        (cache / pin_venv.TORCH_LAYER / COMPLETE_MARKER).write_text("done\n")
    venv = cache / key.name
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.base_prefix) / 'bin'}\ninclude-system-site-packages = false\n")
    (site / "this_interpreters_packages.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    (venv / COMPLETE_MARKER).write_text("done\n")
    return venv


def test_pin_venvs_are_listed_with_sizes_and_pruned_by_age(tmp_path: Path) -> None:
    cache = tmp_path / "venvs"
    venvs = pin_venv.PinVenvs(cache)
    old = fake_venv(cache, pin_venv.PinKey("0.21.0", "transformers==5.5.4"))
    (old / "lib" / "big.bin").write_bytes(b"\0" * 100_000)
    new = fake_venv(cache, pin_venv.PinKey("0.23.0", "transformers==5.5.4"))
    os.utime(old / COMPLETE_MARKER, (time.time() - 10 * 86400,) * 2)
    listed = venvs.listing()
    assert [v.name for v in listed] == [new.name, old.name] and listed[1].bytes >= 100_000
    gone = venvs.prune(older_than_s=7 * 86400)
    assert [v.name for v in gone] == [old.name] and not old.exists() and new.exists()


@pytest.mark.e2e
def test_a_pin_without_an_sdist_is_one_line_naming_the_pin_and_the_index(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-index"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    venvs = pin_venv.PinVenvs(tmp_path / "venvs")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    with (tmp_path / "log").open("w") as log, pytest.raises(UsageError) as refused:
        venvs.vllm_wheel("0.0.1", str(venv / "bin" / "python"), log, tmp_path / "log")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("vLLM pin 0.0.1: no source distribution of vllm==0.0.1 on ")
    assert str(empty) in message


def bisected_unit_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                       n: int, culprit: int) -> tuple[list[str], Path]:
    """`run --unit-test` over a pinned history of n commits (a fake pin venv): its shas and session,
    once the run named `culprit`."""
    from bisect_npu.cli import main

    shas = pinned_history(tmp_path / "up", n, culprit)
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    fake_venv(pin_venv.default_pin_venv_cache(), pin_venv.PinKey("0.23.0", "transformers==5.5.4"), layer=True)
    session = tmp_path / "session"
    with pytest.raises(SystemExit) as exited:
        main(["run", "--repo", str(tmp_path / "up"), "--good", shas[0], "--bad", shas[-1], "--unit-test",
              "tests/ut/quant/test_q.py::test_scale", "--session", str(session), "--no-fix", "--json", "--quiet"])
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert exited.value.code == 0 and summary["culprit"] == shas[culprit], out
    return shas, session


@pytest.mark.e2e
def test_run_bisects_a_unit_test_to_its_culprit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    shas, session = bisected_unit_test(tmp_path, monkeypatch, capsys, 9, 5)
    steps = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()
             if '"step"' in line and '"verdict"' in line]
    reasons = {s["commit"]: s["verdict"]["reason"] for s in steps if "commit" in s and "verdict" in s}
    assert reasons[shas[5]].startswith("command exited 1: tests/ut/quant/test_q.py::test_scale failed")
    assert reasons[shas[0]] == "command exited 0: 1 named test passed"
    assert "--unit-test tests/ut/quant/test_q.py::test_scale" in (session / "report.md").read_text()


@pytest.mark.e2e
def test_resume_refuses_a_session_judged_by_older_verdict_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A journal whose runner command names no rules (made before they were named) or other rules is
    refused at once with the way on, before any step runs; as it was, it resumes."""
    from bisect_npu.cli import main

    shas, session = bisected_unit_test(tmp_path, monkeypatch, capsys, 5, 3)
    journal = session / "journal.jsonl"
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    command = header["request"]["judge"]["command"]
    at = command.index("--rules")
    assert command[at + 1] == str(runner.RULES)
    for older, rules in ((command[:at] + command[at + 2:], 1),
                         ([*command[:at + 1], str(runner.RULES + 1), *command[at + 2:]], runner.RULES + 1)):
        header["request"]["judge"]["command"] = older
        journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
        capsys.readouterr()
        with pytest.raises(SystemExit) as refused:
            main(["resume", "--session", str(session), "--json", "--quiet"])
        err = capsys.readouterr().err
        assert refused.value.code == 2
        assert (f"this session's unit tests were judged by the verdict rules {rules} and this bisect-npu "
                f"judges by rules {runner.RULES}; start a new session with `bisect-npu run`") in err
    header["request"]["judge"]["command"] = command
    journal.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(SystemExit) as resumed:
        main(["resume", "--session", str(session), "--json", "--quiet"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed.value.code == 0 and summary["culprit"] == shas[3]


@pytest.mark.e2e
def test_doctor_shows_the_pin_venvs_with_their_sizes_and_prunes_by_age(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    venvs = pin_venv.default_pin_venv_cache
    env = {**os.environ, "BISECT_NPU_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    old = fake_venv(cache / venvs().name, pin_venv.PinKey("0.21.0", "transformers==5.5.4"))
    (old / "lib" / "big.bin").write_bytes(b"\0" * (300 << 20))
    os.utime(old / COMPLETE_MARKER, (time.time() - 30 * 86400,) * 2)
    fake_venv(cache / venvs().name, pin_venv.PinKey("0.23.0", "transformers==5.5.4"))
    listed = subprocess.run([sys.executable, "-m", "bisect_npu", "doctor"], env=env, capture_output=True, text=True,
                            check=False).stdout
    assert "unit-test venv vllm-0.21.0--transformers-5.5.4: 0.3 GiB, last used 30.0 days ago" in listed
    pruned = subprocess.run([sys.executable, "-m", "bisect_npu", "doctor", "--prune-venvs", "7"], env=env,
                            capture_output=True, text=True, check=False).stdout
    assert "unit-test venvs pruned: 1 unused for over 7 days, 0.3 GiB freed" in pruned
    assert "vllm-0.21.0" not in pruned.split("freed", 1)[1] and "vllm-0.23.0--transformers-5.5.4" in pruned


@pytest.mark.e2e
def test_find_fix_with_the_fix_s_own_test_from_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--unit-test-from FIX --find-fix`: the test the fix added, laid into each older commit, names
    the fix as the first commit where it passes."""
    from bisect_npu.cli import main

    fixed_test = "import vllm_ascend\n\n\ndef test_value():\n    assert vllm_ascend.VALUE == 4\n"

    def files(i: int) -> dict[str, str | None]:
        if i == 0:
            return {dockerfile.PIN_FILE: "v0.23.0\n", "requirements.txt": "transformers==5.5.4\n", "setup.py": SETUP_PY,
                    "vllm_ascend/__init__.py": "VALUE = 5\n", "tests/__init__.py": "", "tests/ut/__init__.py": "",
                    "tests/ut/conftest.py": ROUTED_CONFTEST}
        if i == 6:
            return {"vllm_ascend/__init__.py": "VALUE = 4\n", "tests/ut/quant/test_fix.py": fixed_test}
        return {}

    shas = make_linear_repo(tmp_path / "up", 9, files=files)
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    fake_venv(pin_venv.default_pin_venv_cache(), pin_venv.PinKey("0.23.0", "transformers==5.5.4"), layer=True)
    with pytest.raises(SystemExit) as exited:
        main(["run", "--repo", str(tmp_path / "up"), "--old", shas[0], "--new", shas[8], "--find-fix", "--unit-test",
              "tests/ut/quant/test_fix.py", "--unit-test-from", shas[6], "--session", str(tmp_path / "s"), "--json",
              "--quiet"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert exited.value.code == 0 and summary["culprit"] == shas[6]


VLLM_SETUP = 'from setuptools import setup\nsetup(name="vllm", version="0.19.1.dev7", packages=["vllm"])\n'
LAYER_SETUP = 'from setuptools import setup\nsetup(name="layer_torch", version="1.0", py_modules=["layer_torch"])\n'


def vllm_clone(path: Path) -> list[str]:
    """A vLLM-shaped clone: a pure-Python package `vllm` whose value moves between its commits."""
    return make_linear_repo(path, 3, files=lambda i: {"setup.py": VLLM_SETUP, "vllm/__init__.py": f"AT = {i}\n"})


def commit_pinned_history(path: Path, vllm_commit: str) -> list[str]:
    """vllm-ascend as in 2026-04: a Dockerfile pinning a vLLM commit, no release, in the middle."""
    pinned = "FROM base\nARG VLLM_TAG=v0.19.0\n"

    def files(i: int) -> dict[str, str | None]:
        if i == 0:
            return {"Dockerfile": pinned, "requirements.txt": "transformers==5.5.4\n",
                    "tests/ut/quant/test_q.py": PASSING}
        if i == 2:
            return {"Dockerfile": f"FROM base\n# ARG VLLM_TAG=v0.19.0\nARG VLLM_COMMIT={vllm_commit}\n"}
        if i == 4:
            return {"Dockerfile": pinned}
        return {}
    return make_linear_repo(path, 6, files=files)


def test_a_commit_pin_is_refused_before_the_run_without_a_vllm_clone(tmp_path: Path) -> None:
    vllm = vllm_clone(tmp_path / "vllm")
    shas = commit_pinned_history(tmp_path / "up", vllm[1])
    repo = gitpython.Repo(tmp_path / "up")
    node = ["tests/ut/quant/test_q.py"]
    with pytest.raises(UsageError) as refused:
        check_unit_tests(repo, node, shas[0], shas[5], None, shas[1:])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"vLLM pin {vllm[1][:12]} (pinned by {shas[2][:12]}, and 1 more commits of the range): "
                              "a vLLM commit, not a release")
    assert "pass --vllm-repo CLONE" in message
    assert check_unit_tests(repo, node, shas[0], shas[5], None, shas[1:], tmp_path / "vllm") == node
    other = make_linear_repo(tmp_path / "other-vllm", 2)
    with pytest.raises(UsageError, match=rf"--vllm-repo \S+other-vllm: it does not have vLLM {vllm[1][:12]}, which "
                                         rf"{shas[2][:12]} pins; fetch it there"):
        check_unit_tests(repo, node, shas[0], shas[5], None, shas[1:], tmp_path / "other-vllm")
    assert other  # the clone exists; only the commit is missing
    assert check_unit_tests(repo, node, shas[0], shas[1], None, shas[1:1]) == node  # a range of releases only


@pytest.mark.e2e
def test_a_commit_pin_is_keyed_and_built_from_the_vllm_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole build of a pin venv at the boundary, with small stand-ins for torch: the shared
    layer (a venv of its own, seen through a .pth, not copied), vLLM's wheel built from the clone at
    the pinned commit (cached), vllm-ascend's requirements, and the venv's python seeing all three."""
    from bisect_npu.builders.unit_tests import UnitTestBuilder

    vllm = vllm_clone(tmp_path / "vllm")
    shas = commit_pinned_history(tmp_path / "up", vllm[1])
    wheels = tmp_path / "index"
    (tmp_path / "layer-src" / "layer_torch.py").parent.mkdir()
    (tmp_path / "layer-src" / "setup.py").write_text(LAYER_SETUP)
    (tmp_path / "layer-src" / "layer_torch.py").write_text("VERSION = '1.0'\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(tmp_path / "layer-src")], check=True, capture_output=True, timeout=300)
    # `wheel` (what setuptools 65, the base interpreter's, builds wheels with) from pip's own index.
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:", "-d",
                    str(wheels), "wheel", "packaging"], check=True, capture_output=True, timeout=300)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setattr(pin_venv, "TORCH", ("layer_torch==1.0",))
    monkeypatch.setattr(pin_venv, "SDIST_BUILD", ("wheel",))
    venvs = pin_venv.PinVenvs(tmp_path / "cache", vllm_repo=tmp_path / "vllm")
    builder = UnitTestBuilder(gitpython.Repo(tmp_path / "up"), None, venvs)  # type: ignore[arg-type]  # keys only
    key = builder.pin_key(shas[2])
    assert key == pin_venv.PinKey(vllm[1], "transformers==5.5.4") and builder.pin_key(shas[0]).vllm == "0.19.0"
    venv = venvs.acquire(pin_venv.PinKey(vllm[1], ""), [], tmp_path / "logs")
    assert venv.path.name == f"vllm-commit-{vllm[1][:12]}--transformers-any"
    code = "import layer_torch, vllm; print(vllm.AT, layer_torch.__file__)"
    out = subprocess.run([str(venv.python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "1"  # vLLM as it is at the pinned commit, not at the clone's head
    assert Path(out[1]).is_relative_to(tmp_path / "cache" / pin_venv.TORCH_LAYER)
    assert not list(venv.path.rglob("layer_torch.py"))  # seen through the layer, not installed again
    assert len(list((tmp_path / "cache" / "wheels" / f"commit-{vllm[1]}").glob("vllm-*.whl"))) == 1
    listed = {v.name for v in venvs.listing()}
    assert listed == {venv.path.name, pin_venv.TORCH_LAYER}


def test_run_refuses_a_commit_pin_naming_it_and_what_to_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from bisect_npu.cli import main

    vllm = vllm_clone(tmp_path / "vllm")
    shas = commit_pinned_history(tmp_path / "up", vllm[1])
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as exited:
        main(["run", "--repo", str(tmp_path / "up"), "--good", shas[0], "--bad", shas[5], "--unit-test",
              "tests/ut/quant/test_q.py", "--session", str(tmp_path / "s"), "--no-fix", "--quiet"])
    said = capsys.readouterr()
    assert exited.value.code == 2
    assert f"vLLM pin {vllm[1][:12]} (pinned by {shas[2][:12]}" in said.err + said.out
    assert "--vllm-repo CLONE" in said.err + said.out
    assert not (tmp_path / "cache" / "unit-test-venvs").exists()  # refused before anything was built
