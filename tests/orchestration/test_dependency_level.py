"""Crossing into a dependency: a culprit that moves a declared dependency's pin is bisected into
the dependency's own commits with the upstream held fixed. Real git repositories made here (a
tiny upstream that pins a tiny dependency in its Dockerfile), the real `run` path, local executor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git as gitpython
import pytest

from bisect_npu.builders.dependency import materialize, read_pin, resolve_pin
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.journal import AppendOnlyJournal
from bisect_npu.orchestration.opening.session_spec import parse_dependency_option
from bisect_npu.recipe.schema import DependencySpec
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import add_commit, git, make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]
DEP_CULPRIT, DEP_FIX = 7, 15
TAGS = {3: "v0.1", 12: "v0.2", 18: "v0.3"}
SPEC = "name=minidep,url=https://github.com/example/minidep.git,pin=Dockerfile:DEP_COMMIT/DEP_TAG,package_dir=minidep,installed_by_image=false"
# The bad case: the dependency's `core.BAD` (cwd: the upstream's worktree; the dependency's tree
# is first on PYTHONPATH). An upstream `api` file names the dependency API it calls.
CHECK = """\
import importlib, pathlib, sys
api = pathlib.Path("api").read_text().strip() if pathlib.Path("api").exists() else "core"
try:
    module = importlib.import_module("minidep." + api)
except ImportError as exc:
    print(exc)
    sys.exit(125)  # cannot run: a skip, as the probe makes of an engine that fails to import
sys.exit(1 if module.BAD else 0)
"""


def _dep_files(i: int) -> dict[str, str | None]:
    files: dict[str, str | None] = {"minidep/__init__.py": "", "minidep/util.py": f"STEP = {i}\n"}
    if i == 0:
        files["minidep/core.py"] = "BAD = False\n"
        files["minidep/v1.py"] = "BAD = False\n"
    if i == DEP_CULPRIT:
        files["minidep/core.py"] = "BAD = True\n"
    if i == 9:
        files["minidep/v1.py"] = None  # the old API goes
    if i == 10:
        files["minidep/v2.py"] = "from minidep.core import BAD\n"  # the new API arrives
    if i == DEP_FIX:
        files["minidep/core.py"] = "BAD = False\n"
    return files


def _dep_title(i: int) -> str:
    if i == DEP_CULPRIT:
        return "Drop the presence penalty default in core (#2007)"
    if i == DEP_FIX:
        return "Restore core's presence penalty default, fixing #2007 (#2015)"
    return f"Dependency change {i} (#{2000 + i})"


def make_dependency(path: Path, tags: dict[int, str] | None = None) -> list[str]:
    return make_linear_repo(path, 20, titles=_dep_title, files=_dep_files, tags=TAGS if tags is None else tags)


def make_upstream(path: Path, moves_at: int = 6, api_change: bool = False, old_api: str = "v1") -> list[str]:
    """10 commits; `moves_at` moves the pin v0.1 -> v0.2 (with `api_change`, it also switches the
    upstream to the dependency's new API, which v0.1 lacks; its parent uses the old one, which
    v0.2 has dropped)."""
    def files(i: int) -> dict[str, str | None]:
        tag = "v0.2" if i >= moves_at else "v0.1"
        out: dict[str, str | None] = {"Dockerfile": f"FROM scratch\nARG DEP_COMMIT=\"\"\nARG DEP_TAG={tag}\n",
                                      "check.py": CHECK}
        if api_change:
            out["api"] = "v2\n" if i >= moves_at else f"{old_api}\n"
        return files_at(i, out)

    def files_at(i: int, out: dict[str, str | None]) -> dict[str, str | None]:
        return out if i in (0, moves_at) else {}

    def title(i: int) -> str:
        return f"Move minidep to v0.2 (#{100 + i})" if i == moves_at else f"Upstream change {i} (#{100 + i})"

    return make_linear_repo(path, 10, titles=title, files=files)


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")}


def _run(tmp_path: Path, env: dict[str, str], upstream: Path, good: str, bad: str, *extra: str,
         session: str = "s") -> subprocess.CompletedProcess[str]:
    return cli_in_process(["run", "--repo", str(upstream), "--good", good, "--bad", bad, "--cmd",
                           f"{sys.executable} check.py", "--session", str(tmp_path / session), "--json", "--quiet",
                           *extra], cwd=tmp_path, env=env)


def test_culprit_moving_the_pin_is_bisected_into_the_dependency(tmp_path: Path, env: dict[str, str]) -> None:
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == deps[DEP_CULPRIT]  # the finest level's answer: the dependency's commit
    message = done.stdout
    assert f"{ups[6][:12]} moved minidep v0.1 -> v0.2" in message
    assert (f"first bad minidep commit: {deps[DEP_CULPRIT][:12]} Drop the presence penalty default in core (#2007) "
            "(https://github.com/example/minidep/pull/2007)") in message  # its PR, in the dependency's repository
    assert f"fixed in minidep by {deps[DEP_FIX][:12]}" in message
    assert "(https://github.com/example/minidep/pull/2015)" in message
    assert f"move the pin to >= v0.3, or cherry-pick {deps[DEP_FIX][:12]}" in message
    assert "(verified" not in message  # no --verify-fix: nothing claimed

    upstream_session = tmp_path / "s"
    journal = [json.loads(line) for line in (upstream_session / "journal.jsonl").read_text().splitlines()]
    move = next(r for r in journal if r.get("type") == "dependency_move")
    assert (move["name"], move["old"], move["new"], move["crossed"]) == ("minidep", "v0.1", "v0.2", True)
    assert move["culprit"] == ups[6] and move["where"] == "Dockerfile ARG DEP_COMMIT/DEP_TAG"
    level = next(r for r in journal if r.get("type") == "next_level")
    assert level["dependency"] == "minidep" and level["good"] == deps[3] and level["bad"] == deps[12]

    child = Path(level["session"])
    assert child.parent == upstream_session / "dependency-minidep"
    child_journal = [json.loads(line) for line in (child / "journal.jsonl").read_text().splitlines()]
    header = child_journal[0]
    assert header["level"]["held"]["commit"] == ups[6]  # the upstream held at the culprit
    assert header["range"]["candidates"] == deps[4:13]  # first-parent commits old pin..new pin
    steps = [r for r in child_journal if r.get("type") == "step"]
    by_index = {s["index"]: s["verdict"]["kind"] for s in steps}
    assert by_index[0] == "good" and by_index[9] == "bad"  # the pair: culprit + old pin good, + new pin bad
    fix = next(r for r in child_journal if r.get("type") == "fix")
    assert fix["report"]["proposals"][0]["shas"][0] == deps[DEP_FIX]
    assert fix["first_tags"][deps[DEP_FIX]] == "v0.3"
    # The upstream's report shows the chain; the dependency's names its level.
    upstream_report = (upstream_session / "report.md").read_text()
    assert "moved minidep `v0.1` -> `v0.2`" in upstream_report and "Dependency level" in upstream_report
    assert "the fix is searched in minidep's history" in upstream_report
    # Resuming the finished run answers with the chain again; the upstream gets no fix stage of its own.
    again = subprocess.run([*CLI, "resume", "--session", str(upstream_session), "--json", "--quiet"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["culprit"] == deps[DEP_CULPRIT]
    assert "first bad minidep commit" in again.stdout
    assert '"type": "fix"' not in (upstream_session / "journal.jsonl").read_text().replace('"type":"fix"',
                                                                                          '"type": "fix"')
    child_report = (child / "report.md").read_text()
    assert f"held at {ups[6][:12]}" in child_report
    # Its reproduce line is the upstream run's (the held commit comes from that run's culprit), for
    # another person: the upstream (no GitHub remote here) is their clone, UPSTREAM.
    assert f"bisect-npu run --repo UPSTREAM --good {ups[0]} --bad {ups[-1]}" in child_report
    assert str(tmp_path) not in child_report.split("<details>")[0]


def test_a_dependency_fix_that_does_not_apply_is_not_claimed_verified(tmp_path: Path, env: dict[str, str]) -> None:
    """--verify-fix at the dependency level applies the fix to the dependency's bad end (here
    every commit rewrites `counter`, so it conflicts): the chain claims nothing it did not see.
    A fix that applies is verified on the held upstream (the demo's dependency case shows it)."""
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}", "--verify-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"fixed in minidep by {deps[DEP_FIX][:12]}" in done.stdout and "(verified" not in done.stdout
    session = Path(json.loads(done.stdout.strip().splitlines()[-1])["session"])
    verified = [json.loads(line)["verification"] for line in (session / "journal.jsonl").read_text().splitlines()
                if '"fix_verified"' in line]
    assert verified[0]["proposal"]["shas"][0] == deps[DEP_FIX] and verified[0]["status"] == "conflict"


def test_no_dependency_stops_at_the_upstream_commit(tmp_path: Path, env: dict[str, str]) -> None:
    make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}", "--no-dependency", "--no-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == ups[6]
    journal = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    move = next(r for r in journal if r.get("type") == "dependency_move")
    assert move["crossed"] is False and "--no-dependency" in move["note"]
    assert not [r for r in journal if r.get("type") == "next_level"]
    assert "not crossed (--no-dependency)" in (tmp_path / "s" / "report.md").read_text()


def test_neither_combination_runs_is_an_honest_answer(tmp_path: Path, env: dict[str, str]) -> None:
    """The pin move also switches the upstream to the dependency's new API: the culprit cannot
    import with the old pin, nor its parent with the new one."""
    make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream", api_change=True)
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}")
    assert done.returncode == 4, done.stdout + done.stderr[-3000:]  # precondition failed (exit-codes table)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "ends_wrong"
    assert "no clean good/bad pair" in done.stdout
    assert f"{ups[6][:12]} with minidep v0.1: skip" in done.stdout  # the culprit with the old pin
    assert f"{ups[5][:12]} with minidep v0.2: skip" in done.stdout  # its parent with the new pin
    assert (tmp_path / "s" / "dependency-minidep-at-parent").is_dir()


def test_the_parent_is_held_when_the_culprit_needs_the_new_pin(tmp_path: Path, env: dict[str, str]) -> None:
    """The pin move also switches the upstream to the new API (the culprit cannot run with the
    old pin); its parent runs on both, so the dependency is bisected under the parent."""
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream", api_change=True, old_api="core")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}", "--no-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == deps[DEP_CULPRIT]
    assert Path(result["session"]).parent == tmp_path / "s" / "dependency-minidep-at-parent"
    assert (f"(bisected on its parent {ups[5][:12]}: {ups[6][:12]} could not be judged good with minidep v0.1)"
            in done.stdout)
    lines = [json.loads(line) for line in (Path(result["session"]) / "journal.jsonl").read_text().splitlines()]
    assert lines[0]["level"]["held"]["commit"] == ups[5]
    # The verdict store keeps the two held commits apart: the culprit's session judged v0.2 (bad
    # there too), but under the parent it is another run, tested again.
    steps = [r for r in lines if r.get("type") == "step"]
    assert steps and not [s for s in steps if s.get("stored")]


def test_a_pin_the_clone_lacks_is_an_error_before_anything_runs(tmp_path: Path, env: dict[str, str]) -> None:
    make_dependency(tmp_path / "minidep", tags={3: "v0.1"})  # no v0.2
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}")
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])["message"]
    assert "has no v0.2" in error and f"git -C {tmp_path / 'minidep'} fetch origin tag v0.2" in error
    assert not (tmp_path / "s").exists()  # nothing ran, no session made


def test_an_unknown_dependency_is_an_error(tmp_path: Path, env: dict[str, str]) -> None:
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dep-repo", f"vllm={tmp_path}")
    assert done.returncode == 2
    assert "no dependency named 'vllm' is declared (none)" in done.stdout


def test_pins_read_from_a_dockerfile_and_requirements(tmp_path: Path) -> None:
    repo_path = tmp_path / "up"
    repo_path.mkdir()
    git(repo_path, "init", "-q", "-b", "main")
    sha = add_commit(repo_path, "pins", {
        "Dockerfile": 'FROM x\nARG VLLM_TAG=v0.11.0\nARG VLLM_COMMIT=""\n',
        "requirements.txt": "torch==2.13.0\nvllm==0.11.0  # pinned\n",
        "requirements-git.txt": "vllm @ git+https://github.com/vllm-project/vllm.git@abc1234\n"})
    repo = gitpython.Repo(repo_path)
    tag = parse_dependency_option("name=vllm,pin=Dockerfile:VLLM_COMMIT/VLLM_TAG,package_dir=vllm")
    assert read_pin(repo, sha, tag) == "v0.11.0"  # VLLM_COMMIT empty: the tag
    assert read_pin(repo, sha, tag, build_args={"VLLM_COMMIT": "deadbeef", "OTHER": "x"}) == "deadbeef"
    req = parse_dependency_option("name=vllm,pin=requirements.txt:vllm==,package_dir=vllm")
    assert read_pin(repo, sha, req) == "0.11.0"
    url = DependencySpec.model_validate({"name": "vllm", "package_dir": "vllm",
                                         "pin": {"file": "requirements-git.txt", "requirement": "vllm"}})
    assert read_pin(repo, sha, url) == "abc1234"
    missing = DependencySpec.model_validate({"name": "x", "package_dir": "x", "pin": {"arg": "NOPE"}})
    assert read_pin(repo, sha, missing) is None


def test_resolve_and_materialize(tmp_path: Path) -> None:
    deps = make_dependency(tmp_path / "minidep")
    repo = gitpython.Repo(tmp_path / "minidep")
    spec = parse_dependency_option(SPEC)
    assert resolve_pin(repo, spec, "0.2", "requirements.txt") == deps[12]  # `v` added as tags spell it
    assert resolve_pin(repo, spec, deps[7][:10], "x") == deps[7]
    with pytest.raises(UsageError, match=r"has no deadbeef0 .*fetch origin deadbeef0$"):
        resolve_pin(repo, spec, "deadbeef0", "Dockerfile ARG DEP_TAG at abc")
    tree = materialize(repo, deps[12], "minidep", tmp_path / "trees")
    assert tree == tmp_path / "trees" / deps[12]
    assert sorted(p.name for p in (tree / "minidep").iterdir()) == ["__init__.py", "core.py", "util.py", "v2.py"]
    assert (tree / "minidep" / "core.py").read_text() == "BAD = True\n"
    assert materialize(repo, deps[12], "minidep", tmp_path / "trees") == tree  # once per commit


def test_declaration_in_a_recipe(tmp_path: Path) -> None:
    from bisect_npu.recipe.loader import load_recipe, parse_recipe

    base = load_recipe("qwen3-moe-presence-penalty-loop")
    vllm = base.dependency("vllm")
    assert vllm is not None and vllm.pin.arg == ["VLLM_COMMIT", "VLLM_TAG"]
    assert vllm.image_path == "/vllm-workspace/vllm" and vllm.package_dir == "vllm" and vllm.python_only
    # An image-installed dependency does not enter the digest (sessions of the recipe before it
    # was declared resume); one laid into every candidate does.
    text = Path(str(base.source)).read_text()
    bare = parse_recipe(text.split("dependencies:")[0])
    assert bare.digest() == base.digest()
    laid = parse_recipe(text.replace("installed_by_image: true", "installed_by_image: false"))
    assert laid.digest() != base.digest()
    with pytest.raises(UsageError, match="either `arg`"):
        parse_recipe(text.replace("arg: [VLLM_COMMIT, VLLM_TAG]", "arg: []"))
    with pytest.raises(UsageError, match="--dependency 'name=x': pin"):
        parse_dependency_option("name=x")


KILLER = """\
import os, signal, pathlib
marker = pathlib.Path(os.environ["KILL_MARKER"])
import minidep.util
if minidep.util.STEP not in (3, 12) and marker.exists():  # a dependency commit inside the range
    marker.unlink()
    shell = pathlib.Path(f"/proc/{os.getppid()}/stat").read_text()
    os.kill(int(shell.rsplit(")", 1)[1].split()[1]), signal.SIGKILL)  # the shell's parent: bisect-npu, mid-level
"""


@pytest.mark.heavy  # the resume tests' variant inside a dependency level
def test_a_run_killed_in_the_dependency_level_resumes_there(tmp_path: Path, env: dict[str, str]) -> None:
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    (tmp_path / "killer.py").write_text(KILLER)
    (tmp_path / "kill-once").touch()
    env = {**env, "KILL_MARKER": str(tmp_path / "kill-once")}
    cmd = f"sh -c '{sys.executable} {tmp_path / 'killer.py'} && exec {sys.executable} check.py'"
    args = ["--dependency", SPEC, "--dep-repo", f"minidep={tmp_path / 'minidep'}"]
    killed = subprocess.run([*CLI, "run", "--repo", str(tmp_path / "upstream"), "--good", ups[0], "--bad", ups[-1],
                             "--cmd", cmd, "--session", str(tmp_path / "s"), "--quiet", *args],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stdout + killed.stderr[-2000:]
    child_root = tmp_path / "s" / "dependency-minidep"
    assert (child_root / "latest").exists()
    done = subprocess.run([*CLI, "resume", "--session", str(tmp_path / "s"), "--json", "--quiet"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == deps[DEP_CULPRIT]
    sessions = [p for p in child_root.iterdir() if p.is_dir()]
    assert len(sessions) == 1  # the dependency session was resumed, not started again
    steps = [json.loads(line) for line in (sessions[0] / "journal.jsonl").read_text().splitlines()
             if '"type": "step"' in line or '"type":"step"' in line]
    assert sorted(s["index"] for s in steps if s["index"] in (0, 9)) == [0, 9]  # the ends judged once
    journal = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    assert len([r for r in journal if r.get("type") == "dependency_move"]) == 1
    assert [r["culprit"] for r in journal if r.get("type") == "next_level"] == [deps[DEP_CULPRIT]]


def test_noisy_mode_and_slots_carry_into_the_dependency_level(tmp_path: Path, env: dict[str, str]) -> None:
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}", "--mode", "noisy", "--slots", "2", "--no-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == deps[DEP_CULPRIT]
    header = json.loads((Path(result["session"]) / "journal.jsonl").read_text().splitlines()[0])
    assert header["mode"] == "noisy" and header["request"]["executor"]["slots"] == 2
    assert "no later minidep commit" not in done.stdout  # --no-fix: no fix search claimed


def test_the_declared_url_is_cloned_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.builders.dependency import clone_cache, open_dependency_clone

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    deps = make_dependency(tmp_path / "minidep")
    url = f"file://{tmp_path / 'minidep'}"
    spec = parse_dependency_option(f"name=minidep,url={url},pin=Dockerfile:DEP_TAG,package_dir=minidep")
    clone = open_dependency_clone(spec, None)
    assert Path(clone.git_dir) == clone_cache(spec, url) and str(clone_cache(spec, url)).startswith(str(tmp_path))
    assert resolve_pin(clone, spec, "v0.2", "x") == deps[12]
    add_commit(tmp_path / "minidep", "after the clone", {"later": "1\n"})
    again = open_dependency_clone(spec, None)  # made once, never fetched again
    assert again.git_dir == clone.git_dir and again.commit("main").hexsha == deps[-1]
    assert open_dependency_clone(spec, str(tmp_path / "minidep")).commit("main").hexsha != deps[-1]  # --dep-repo PATH
    nowhere = parse_dependency_option("name=nowhere,url=file:///no/such/repo,pin=Dockerfile:X,package_dir=x")
    with pytest.raises(InfrastructureError, match=r"cannot clone file:///no/such/repo .*--dep-repo nowhere=PATH"):
        open_dependency_clone(nowhere, None)
    bare = parse_dependency_option("name=bare,pin=Dockerfile:X,package_dir=x")
    with pytest.raises(UsageError, match="pass --dep-repo bare=PATH_OR_URL"):
        open_dependency_clone(bare, None)


def test_a_dependency_that_is_not_python_only_is_named_not_crossed(tmp_path: Path, env: dict[str, str]) -> None:
    """The upstream vendors the dependency at its pin (as an image installs a compiled one): the
    culprit that moves it is the answer, and the report names the two versions."""
    deps_path = tmp_path / "minidep"
    make_dependency(deps_path)

    def tree(tag: str) -> dict[str, str | None]:
        names = git(deps_path, "ls-tree", "-r", "--name-only", tag, "--", "minidep").split()
        return {name: git(deps_path, "show", f"{tag}:{name}") + "\n" for name in names}

    old, new = tree("v0.1"), tree("v0.2")
    ups = make_linear_repo(tmp_path / "upstream", 6, files=lambda i: (
        {"Dockerfile": "FROM x\nARG DEP_TAG=v0.1\n", "check.py": CHECK, **old} if i == 0 else
        {"Dockerfile": "FROM x\nARG DEP_TAG=v0.2\n", **new, **{n: None for n in old if n not in new}} if i == 3
        else {}))
    compiled = "name=minidep,pin=Dockerfile:DEP_TAG,package_dir=minidep,python_only=false"
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", compiled, "--no-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == ups[3]
    report = (tmp_path / "s" / "report.md").read_text()
    assert "moved minidep v0.1 -> v0.2 (Dockerfile ARG DEP_TAG); minidep is not Python-only" in report
    assert not (tmp_path / "s" / "dependency-minidep").exists()
    with pytest.raises(UsageError, match="only a python_only dependency"):
        parse_dependency_option(compiled + ",installed_by_image=false")


class JournalReads:
    """Who reads a session's journal, by the module that asks: each journal's opens, its records
    asked by type (`records`) and its entries iterated, counted as a run goes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opens: list[tuple[str, Path]] = []
        self.records: list[str] = []
        self.iterated: list[str] = []
        opened, asked, made = (AppendOnlyJournal.__dict__[name] for name in ("open", "records", "__init__"))
        reads = self

        class CountedEntries(list):  # type: ignore[type-arg]
            def __iter__(self):  # type: ignore[no-untyped-def]
                reads.iterated.append(sys._getframe(1).f_globals["__name__"])
                return super().__iter__()

            def __reversed__(self):  # type: ignore[no-untyped-def]
                reads.iterated.append(sys._getframe(1).f_globals["__name__"])
                return super().__reversed__()

        def counted_open(cls, session_dir, read_only=False):  # type: ignore[no-untyped-def]
            self.opens.append((sys._getframe(1).f_globals["__name__"], Path(session_dir).resolve()))
            return opened.__func__(cls, session_dir, read_only)

        def counted_records(journal, kind):  # type: ignore[no-untyped-def]
            self.records.append(sys._getframe(1).f_globals["__name__"])
            return asked(journal, kind)

        def counted_init(journal, *args, **kwargs):  # type: ignore[no-untyped-def]
            made(journal, *args, **kwargs)
            journal.entries = CountedEntries(journal.entries)

        monkeypatch.setattr(AppendOnlyJournal, "open", classmethod(counted_open))
        monkeypatch.setattr(AppendOnlyJournal, "records", counted_records)
        monkeypatch.setattr(AppendOnlyJournal, "__init__", counted_init)

    def by_orchestration(self, reads: list[str]) -> list[str]:
        return [module for module in reads if module.startswith("bisect_npu.orchestration")]


def _cut_before(journal: Path, kinds: set[str]) -> None:
    """The journal as a run killed just before its first record of `kinds` left it."""
    lines = journal.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if json.loads(line).get("type") in kinds)
    journal.write_text("".join(lines[:first]))


def test_a_resumed_run_with_levels_and_a_fix_stage_reads_each_journal_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dependency case with --verify-fix, killed (as its journals say) after the dependency
    level's end and before its fix stage, then resumed in this process: the levels' descents, the
    fix stage, the chain's sentences and the costs read each session's state, folded once when its
    journal opened, never its journal again."""
    from bisect_npu import api

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    first = api.bisect(tmp_path / "upstream", ups[0], ups[-1], oracle=[sys.executable, "check.py"],
                       session_dir=tmp_path / "s", quiet=True, dependencies=[SPEC],
                       dep_repos=[f"minidep={tmp_path / 'minidep'}"], verify_fix=True)
    assert first.culprit == deps[DEP_CULPRIT]
    child = first.session_dir
    _cut_before(child / "journal.jsonl", {"fix", "fix_verified", "fix_verify"})
    _cut_before(tmp_path / "s" / "journal.jsonl", {"next_level"})

    reads = JournalReads(monkeypatch)
    again = api.resume(tmp_path / "s", quiet=True)
    assert again.culprit == deps[DEP_CULPRIT] and again.steps == first.steps
    assert f"fixed in minidep by {deps[DEP_FIX][:12]}" in again.message  # the fix stage ran again, and only it
    kinds = [json.loads(line)["type"] for line in (child / "journal.jsonl").read_text().splitlines()[1:]]
    assert kinds.count("fix") == 1 and kinds.count("fix_verify") == 1 and kinds.count("end") == 1
    opened = sorted(path for module, path in reads.opens if module.startswith("bisect_npu.orchestration"))
    assert opened == sorted([(tmp_path / "s").resolve(), child.resolve()])  # each session's journal, once
    assert reads.by_orchestration(reads.records) == []
    assert set(reads.by_orchestration(reads.iterated)) == {"bisect_npu.orchestration.opening.state"}


def test_a_resumed_session_s_state_holds_what_its_journal_says(tmp_path: Path, env: dict[str, str]) -> None:
    """The folded fields the levels and the fix stage read, on sessions reopened from a finished
    dependency run with --verify-fix: each as the journal's lines say it."""
    from bisect_npu.orchestration.session import Session

    deps = make_dependency(tmp_path / "minidep")
    ups = make_upstream(tmp_path / "upstream")
    done = _run(tmp_path, env, tmp_path / "upstream", ups[0], ups[-1], "--dependency", SPEC,
                "--dep-repo", f"minidep={tmp_path / 'minidep'}", "--verify-fix")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    child = Path(json.loads(done.stdout.strip().splitlines()[-1])["session"])
    for path in (tmp_path / "s", child):
        lines = [json.loads(line) for line in (path / "journal.jsonl").read_text().splitlines()[1:]]
        of = {kind: [line for line in lines if line["type"] == kind] for kind in {line["type"] for line in lines}}
        session = Session.resume(path)
        try:
            state = session.state
            end = state.ended()
            assert end is not None and (end.status, end.culprit) == (of["end"][0]["status"], of["end"][0]["culprit"])
            assert [s.index for s in state.journaled_steps()] == [s["index"] for s in of["step"]]
            assert [f.culprit for f in state.finer()] == [f["culprit"] for f in of.get("next_level", [])]
            assert state.moved() == {m["name"] for m in of.get("dependency_move", [])}
            fix = state.fix()
            assert (fix is None) == ("fix" not in of)
            assert [v.status for v in state.fix_verified()] == [v["verification"]["status"]
                                                               for v in of.get("fix_verified", [])]
            assert (state.fix_verify() is None) == ("fix_verify" not in of)
        finally:
            session.close()
    assert state.fix() is not None and state.fix().report.proposals[0].shas[0] == deps[DEP_FIX]
    assert state.fix_verified()[0].status == "conflict" and state.fix_verify() is not None
