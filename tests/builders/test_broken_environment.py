"""A pinned environment whose own packages fail at import is the environment's failure, not the
commit's: the unit-test runner stops the run (exit 128, which `run` turns into exit 5) naming the
import that failed and the installed versions it went through, never a verdict."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.base import RunResult
from bisect_npu.orchestration.running.judging import command_verdict
from bisect_npu.probe import unit_tests as runner
from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
CONFTEST = "import pytest\n"
TEST = "import fakeformers\n\n\ndef test_scale():\n    assert fakeformers.SCALE == 2\n"


def installed(site: Path, name: str, version: str, code: str) -> None:
    """A package installed as pip leaves it: its module and its dist-info (name, version, top level)."""
    (site / name).mkdir()
    (site / name / "__init__.py").write_text(code)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")


def broken_venv(tmp_path: Path) -> Path:
    """A real venv with pytest (this one's, through a .pth) whose `fakeformers` 5.5.4 imports
    `kernels` 0.19.1, which raises at import as kernels 0.19.1's LayerRepository did."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "outer.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{ROOT}\n")
    installed(site, "kernels", "0.19.1",
              'raise ValueError("Either a revision or a version must be specified")\n')
    installed(site, "fakeformers", "5.5.4", "import kernels\nSCALE = 2\n")
    return python


@pytest.mark.e2e
def test_a_venv_whose_imports_fail_at_collection_stops_the_run_naming_the_import(tmp_path: Path) -> None:
    python = broken_venv(tmp_path)
    checkout = tmp_path / "checkout"
    for name, text in {"tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": CONFTEST,
                       "tests/ut/quant/test_k.py": TEST}.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    reason_file = tmp_path / "reason.txt"
    env = {**os.environ, runner.REASON_ENV: str(reason_file)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(python), "-m", "bisect_npu.probe.unit_tests", "--rules", str(runner.RULES),
                           "--present-at-good", "tests/ut/quant/test_k.py", "tests/ut/quant/test_k.py"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False)
    reason = reason_file.read_text().strip()
    assert done.returncode == runner.ABORT, done.stdout[-2000:] + done.stderr[-2000:]
    assert reason.startswith("the environment is broken, not the commit: importing tests/ut/quant/test_k.py failed "
                             "inside the installed package kernels 0.19.1 (ValueError: Either a revision or a "
                             "version must be specified)")
    assert "import chain: fakeformers 5.5.4, kernels 0.19.1" in reason
    with pytest.raises(InfrastructureError, match=r"kernels 0\.19\.1") as stopped:  # `run` stops: exit 5, not a verdict
        command_verdict(RunResult(returncode=done.returncode, seconds=1.0, log_path="ut.log"), said=reason)
    assert stopped.value.exit_code == 5


@pytest.mark.e2e
def test_the_commits_own_import_error_is_still_its_verdict(tmp_path: Path) -> None:
    """An import the commit's own test gets wrong fails in the checkout, not in an installed package."""
    python = broken_venv(tmp_path)
    checkout = tmp_path / "checkout"
    for name, text in {"tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": CONFTEST,
                       "tests/ut/quant/test_k.py": "from os import no_such_name\n"}.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    env = {**os.environ, runner.REASON_ENV: str(tmp_path / "reason.txt")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(python), "-m", "bisect_npu.probe.unit_tests", "--rules", str(runner.RULES),
                           "--present-at-good", "tests/ut/quant/test_k.py", "tests/ut/quant/test_k.py"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == runner.BAD, done.stdout[-2000:]
    reason = (tmp_path / "reason.txt").read_text()
    assert "cannot be collected (ImportError: cannot import name 'no_such_name'" in reason


def probe(python: Path, checkout: Path, files: dict[str, str], reason_file: Path) -> subprocess.CompletedProcess[str]:
    """The unit-test runner on `tests/ut/quant/test_k.py` of a checkout made of `files`."""
    for name, text in files.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    env = {**os.environ, runner.REASON_ENV: str(reason_file)}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(python), "-m", "bisect_npu.probe.unit_tests", "--rules", str(runner.RULES),
                           "--present-at-good", "tests/ut/quant/test_k.py", "tests/ut/quant/test_k.py"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.e2e
def test_a_conftest_whose_imports_fail_in_the_venv_stops_the_run_naming_the_import(tmp_path: Path) -> None:
    """vllm-ascend's tests/ut/conftest.py imports vLLM, and through it transformers and kernels:
    pytest stops loading the conftest (its exit 4) before any collection hook runs."""
    python = broken_venv(tmp_path)
    reason_file = tmp_path / "reason.txt"
    done = probe(python, tmp_path / "checkout",
                 {"tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": "import fakeformers\n",
                  "tests/ut/quant/test_k.py": "def test_scale():\n    assert True\n"}, reason_file)
    reason = reason_file.read_text().strip()
    assert done.returncode == runner.ABORT, done.stdout[-2000:] + done.stderr[-2000:]
    assert reason.startswith("the environment is broken, not the commit: importing tests/ut/conftest.py failed "
                             "inside the installed package kernels 0.19.1 (ValueError: Either a revision or a "
                             "version must be specified)"), reason
    assert "import chain: fakeformers 5.5.4, kernels 0.19.1;" in reason  # pytest's own frames are not in it
    with pytest.raises(InfrastructureError, match=r"tests/ut/conftest\.py.*kernels 0\.19\.1") as stopped:
        command_verdict(RunResult(returncode=done.returncode, seconds=1.0, log_path="ut.log"), said=reason)
    assert stopped.value.exit_code == 5


@pytest.mark.e2e
def test_a_conftest_the_commit_broke_skips_the_commit(tmp_path: Path) -> None:
    """A conftest that fails on the checkout's own code says nothing about the named test: a skip."""
    python = broken_venv(tmp_path)
    reason_file = tmp_path / "reason.txt"
    done = probe(python, tmp_path / "checkout",
                 {"tests/__init__.py": "", "tests/ut/__init__.py": "", "tests/ut/conftest.py": "import mypkg\n",
                  "mypkg/__init__.py": "from os import no_such_name\n",
                  "tests/ut/quant/test_k.py": "def test_scale():\n    assert True\n"}, reason_file)
    assert done.returncode == runner.SKIP, done.stdout[-2000:] + done.stderr[-2000:]
    assert reason_file.read_text().startswith("tests/ut/conftest.py cannot be imported (ImportError: cannot import "
                                              "name 'no_such_name'")
