"""The accuracy harness venvs install under their committed locks (containers/harness-locks).

A harness pinned by its own version alone resolves its dependencies as of the day its venv is
built; the lock holds them at what the harness was tested with. These tests read the Makefile
through `make -n` (what the targets would run, nothing installed, no network) and the lock files
themselves; one compares a venv `make harnesses` built with its lock (marked `harness`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bisect_npu.probe.harness import INSTALLS, HarnessInstall, harness_home
from tests.helpers.paths import REPO_ROOT

LOCKS = REPO_ROOT / "containers" / "harness-locks"
# An exact pin without a local build tag (`+cpu`): each host's index picks its build of the release.
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!_-]*)$")
REQUIREMENT_PIN = re.compile(r"'?([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[a-z,]+\])?==([0-9][0-9A-Za-z.!_-]*)'?")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_of(install: HarnessInstall) -> Path:
    """The lock the probe names to a user (the one the Makefile must use)."""
    return REPO_ROOT / install.lock


def read_lock(path: Path) -> dict[str, str]:
    """The lock as canonical name -> version; any line that is not a comment nor `name==version`
    fails the test, naming it."""
    pins: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}:{number}: {line!r} is not name==version"
        name = canonical(match.group(1))
        assert name not in pins, f"{path.name}:{number}: {name} pinned twice"
        pins[name] = match.group(2)
    return pins


def make_dry_run(workdir: Path, *args: str) -> list[str]:
    """What `make -n` would run, backslash continuations joined into one line each."""
    done = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=workdir, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.replace("\\\n", " ").splitlines()


def copy_of_the_targets(tmp_path: Path) -> Path:
    """The Makefile and the locks in a directory of their own, so mtimes can be moved freely."""
    work = tmp_path / "repo"
    (work / "containers").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "Makefile", work / "Makefile")
    shutil.copytree(LOCKS, work / "containers" / "harness-locks")
    return work


def test_every_harness_has_a_lock_of_exact_pins_holding_its_own_version():
    """One lock per pinned harness and no other; every line `name==version`, the harness at the
    version the probe asks for, no local build tag (a host's index picks its torch build)."""
    assert sorted(LOCKS.glob("*.txt")) == sorted(lock_of(install) for install in INSTALLS.values())
    for install in INSTALLS.values():
        pins = read_lock(lock_of(install))
        assert pins.get(canonical(install.package)) == install.version, install
    assert read_lock(lock_of(INSTALLS["aisbench"]))["torch"] == "2.13.0"


def test_harness_targets_install_under_their_lock_and_agree_with_it(tmp_path):
    """Every pip install of a harness target passes its lock as constraints, and every version the
    target names itself is the lock's (else pip stops on the conflict)."""
    home = tmp_path / "home"
    commands = make_dry_run(REPO_ROOT, "harnesses", f"HARNESS_HOME={home}")
    for install in INSTALLS.values():
        venv = f"{home}/{install.venv_name}/"
        installs = [line for line in commands if line.startswith(venv) and " install " in line]
        assert installs, f"no pip install into {venv} in {commands}"
        pins = read_lock(lock_of(install))
        named: dict[str, str] = {}
        for line in installs:
            assert f" -c {install.lock} " in line, line
            named.update((canonical(name), version) for name, version in REQUIREMENT_PIN.findall(line))
        assert named.get(canonical(install.package)) == install.version, installs
        assert {name: pins.get(name) for name in named} == named, installs

    afresh = make_dry_run(REPO_ROOT, "harnesses", f"HARNESS_HOME={home}", "HARNESS_AFRESH=1")
    assert [line for line in afresh if " install " in line]
    assert not [line for line in afresh if " -c " in line]


def test_a_lock_whose_text_changed_rebuilds_only_its_venv(tmp_path):
    """A venv's stamp holds the text of the lock it was built under: a fresh clone's lock, newer on
    disk with the same text, leaves every venv as built; a lock whose text changed makes only its
    own venv stale, and so does a stamp that holds no lock (an older checkout's empty one)."""
    work = copy_of_the_targets(tmp_path)
    home = tmp_path / "home"
    stamps = {}
    for install in INSTALLS.values():
        stamp = home / install.venv_name / ".installed"
        stamp.parent.mkdir(parents=True)
        shutil.copyfile(work / install.lock, stamp)
        os.utime(stamp, (1_000_000, 1_000_000))
        os.utime(work / install.lock, (2_000_000, 2_000_000))
        stamps[install.name] = stamp

    def up_to_date(stamp: Path) -> bool:
        done = subprocess.run(["make", "-q", str(stamp), f"HARNESS_HOME={home}"], cwd=work, capture_output=True,
                              timeout=60, check=False)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode == 0

    assert all(up_to_date(stamp) for stamp in stamps.values())
    changed = INSTALLS["lm_eval"]
    with (work / changed.lock).open("a", encoding="utf-8") as lock:
        lock.write("zipp==3.99.0\n")
    os.utime(work / changed.lock, (500_000, 500_000))
    assert not up_to_date(stamps["lm_eval"])
    assert up_to_date(stamps["aisbench"])
    stamps["aisbench"].write_text("")
    assert not up_to_date(stamps["aisbench"])


@pytest.mark.harness
@pytest.mark.e2e  # pip freeze over the harness venvs make harnesses built
@pytest.mark.parametrize("name", sorted(INSTALLS))
def test_an_installed_harness_venv_is_its_lock(tmp_path, name):
    """The venv `make harnesses` built holds exactly the lock's packages: frozen again by the script
    that wrote the locks, it gives the same pins (a venv built without the lock, or a lock edited
    by hand, shows here)."""
    install = INSTALLS[name]
    venv = Path(harness_home()) / install.venv_name
    if not os.access(venv / "bin" / "pip", os.X_OK):
        message = f"{install.package}=={install.version} is not installed at {venv}: run `make {install.make_target}`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    frozen = tmp_path / f"{install.venv_name}.txt"
    subprocess.run(["sh", str(LOCKS / "freeze.sh"), str(venv), str(frozen)], capture_output=True, text=True,
                   timeout=300, check=True)
    assert read_lock(frozen) == read_lock(lock_of(install))


def test_freezing_a_missing_venv_keeps_the_lock(tmp_path):
    """`make harness-locks` before `make harnesses` says what to do and leaves the lock as it was."""
    lock = tmp_path / "lm-eval-0.4.13.txt"
    shutil.copy2(lock_of(INSTALLS["lm_eval"]), lock)
    done = subprocess.run(["sh", str(LOCKS / "freeze.sh"), str(tmp_path / "no-venv"), str(lock)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "is not a venv (no bin/pip); build it first (make harnesses)" in done.stderr
    assert lock.read_bytes() == lock_of(INSTALLS["lm_eval"]).read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lm-eval-0.4.13.txt"]
