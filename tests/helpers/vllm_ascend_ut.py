"""Breakage pairs mined from a real vllm-ascend clone for `make test-vllm-ascend-ut`.

A pair is (culprit, node id, repair): the test passes at the culprit's parent (or does not exist
there), fails at the culprit, and passes again at the repair, all on the first-parent line of
main. Mining is cheap where it can be: candidate repairs come from history (a first-parent commit
whose title says it fixes something and that edits a CPU-routed test file); each is checked by
running that file at the repair's parent and at the repair (one venv per pin, cached); only a
test that fails before the repair and passes at it is narrowed, by `git bisect run` over the
first-parent commits of a bounded range before it, and the culprit is confirmed by running its
parent. `git bisect run`'s steps on that range are what `run`'s are compared with.

    python tests/helpers/vllm_ascend_ut.py mine CLONE OUT.json [--segment-of SHA]... [--limit N]

A sweep finds more than titles do: the whole CPU-routed set run at every K-th first-parent commit
of one pin segment, each test's outcome kept; a test that passes (or is absent) at one sample,
fails at a later one and passes again at a still later one is a window. The culprit is narrowed
with `git bisect run` between the first two samples, the repair between the last two, and both
flips are run directly before the pair is written (split "eval").

    python tests/helpers/vllm_ascend_ut.py sweep CLONE OUT.json --segment-of SHA [--every K] [--offset J]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from bisect_npu.builders.pin_venv import PinKey, PinVenvs, default_pin_venv_cache, requirement_lines
from bisect_npu.builders.unit_tests import (
    BUILD_INFO,
    BUILD_INFO_TEXT,
    UnitTestBuilder,
    npu_refusal,
    unit_test_command,
    write_package_record,
)
from bisect_npu.probe.unit_tests import CI_ENV, REPORT_ENV, SELECT_ENV
from bisect_npu.upstream import history

ROOT = Path(__file__).resolve().parents[2]
ROUTING = "bb4d0776ee"  # [CI] Refactor test folder (#9807), 2026-06-02: the CPU routing
FIXING = re.compile(r"\bfix|\bbug|repair|broken|\bfail", re.I)
TEST_TITLE = re.compile(r"\bUT\b|\btests?\b|\bCI\b", re.I)
PAIRS = ROOT / "tests" / "data" / "vllm_ascend_ut_pairs.json"
RANGE_BEFORE = 64  # first-parent commits before the repair's parent where a range starts


@dataclass
class Pair:
    culprit: str
    node_id: str
    repair: str
    good: str  # the range bisected: (good, bad]
    bad: str
    pin: str
    title: str = ""
    repair_title: str = ""
    git_bisect_steps: int = 0
    git_bisect_seconds: float = 0.0
    split: str = ""  # "train" or "eval"
    # Written when the pair is confirmed (its culprit bisected, the flip run on both sides):
    parent_verdict: str = ""
    culprit_verdict: str = ""
    evidence: list[str] = field(default_factory=list)
    ground_truth: str = ""
    repair_verified: bool = False
    notes: list[str] = field(default_factory=list)


class Tester:
    """Runs named tests at commits of a clone in one worktree of its own, through the runner of
    `run --unit-test` (bisect_npu/probe/unit_tests.py), with each commit's pin venv."""

    def __init__(self, clone: Path, worktree: Path) -> None:
        self.repo = git.Repo(clone)
        self.worktree = worktree
        self.venvs = PinVenvs(default_pin_venv_cache())
        self.builder = UnitTestBuilder(self.repo, None, self.venvs)  # type: ignore[arg-type]  # keys only
        self.runs = 0
        if not worktree.exists():
            self.repo.git.worktree("add", "--detach", str(worktree), "HEAD")

    def key(self, sha: str) -> PinKey:
        return self.builder.pin_key(sha)

    def has_venv(self, sha: str) -> bool:
        return (self.venvs.cache_dir / self.key(sha).name / ".bisect-npu-complete").is_file()

    def checkout(self, sha: str) -> Path:
        wt = git.Repo(self.worktree)
        wt.git.checkout("--force", "--detach", sha)
        wt.git.clean("-fdxq", "-e", ".bisect-npu-site")
        (self.worktree / BUILD_INFO).write_text(BUILD_INFO_TEXT)
        return write_package_record(self.worktree, "0.0.0")

    def run(self, sha: str, node_ids: list[str], present_at_good: list[str] | None = None,
            log_dir: Path | None = None) -> tuple[int, str, dict[str, object]]:
        """(exit code, reason, pytest's report) of the named tests at `sha`."""
        key = self.key(sha)
        venv = self.venvs.acquire(key, requirement_lines(self.builder.requirements(sha)),
                                  log_dir or Path(tempfile.gettempdir()), self.repo.commit(sha).committed_datetime)
        site = self.checkout(sha)
        self.runs += 1
        with tempfile.TemporaryDirectory() as scratch:
            report, reason = Path(scratch) / "report.json", Path(scratch) / "reason"
            env = {**os.environ, "PYTHONPATH": f"{site}:{self.worktree}", "BISECT_NPU_REASON_FILE": str(reason)}
            # The product's command (its verdict rules included), with the venv's python.
            argv = [str(venv.python), *unit_test_command(node_ids, present_at_good or [])[1:], "--report", str(report)]
            proc = subprocess.run(argv, cwd=self.worktree, env=env, capture_output=True, text=True, check=False,
                                  timeout=1800)
            said = reason.read_text().strip() if reason.exists() else proc.stdout[-300:]
            data = json.loads(report.read_text()) if report.exists() else {}
        return proc.returncode, said, data

    def run_all(self, sha: str, log_dir: Path | None = None) -> dict[str, object]:
        """pytest's report of the whole CPU-routed set at `sha` in one process (as vllm-ascend's
        CPU job runs it), a module that cannot be collected kept as a collection error while
        the other modules run."""
        files = cpu_test_files(self.repo, sha)
        venv = self.venvs.acquire(self.key(sha), requirement_lines(self.builder.requirements(sha)),
                                  log_dir or Path(tempfile.gettempdir()), self.repo.commit(sha).committed_datetime)
        site = self.checkout(sha)
        self.runs += 1
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.json"
            # Offline, modelscope's client retries a lookup and a download with backoff for minutes
            # (quantization tests ask it for paths that do not exist): one retry, the least it takes.
            env = {**os.environ, **CI_ENV, "MODELSCOPE_API_MAX_RETRIES": "1", "MODELSCOPE_DOWNLOAD_MAX_RETRIES": "1",
                   "PYTHONPATH": f"{site}:{self.worktree}:{ROOT}",
                   SELECT_ENV: json.dumps(files), REPORT_ENV: str(report)}
            argv = [str(venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                    "bisect_npu.probe.pytest_report", "--continue-on-collection-errors", *files]
            subprocess.run(argv, cwd=self.worktree, env=env, capture_output=True, check=False, timeout=3600)
            return dict(json.loads(report.read_text())) if report.exists() else {}


def cpu_test_files(repo: git.Repo, sha: str) -> list[str]:
    """The test modules of tests/ut at `sha` that vllm-ascend routes to CPU runners."""
    return [path for path in repo.git.ls_tree("-r", "--name-only", sha, "tests/ut").split()
            if Path(path).name.startswith("test_") and path.endswith(".py") and npu_refusal(path) is None]


def first_parent(repo: git.Repo) -> list[str]:
    return repo.git.rev_list("--first-parent", "--reverse", f"{ROUTING}..HEAD").split()


def candidate_repairs(repo: git.Repo, line: list[str], keys: dict[str, str], wanted: set[str]) -> list[tuple[str, str]]:
    """(repair, test file) for the first-parent commits of the wanted venv keys that say they fix
    something and edit a CPU-routed test file."""
    found = []
    for sha in line:
        if keys[sha] not in wanted:
            continue
        title = repo.git.log("-1", "--format=%s", sha)
        if not FIXING.search(title):
            continue
        for change in repo.git.diff_tree("--no-commit-id", "--name-status", "-r", sha).splitlines():
            status, _, path = change.partition("\t")
            if status == "M" and path.startswith("tests/ut/") and Path(path).name.startswith("test_") \
                    and path.endswith(".py") and npu_refusal(path) is None:
                found.append((sha, path))
    # Titles that name a unit test or CI first: the likeliest repairs of a test that broke.
    return sorted(found, key=lambda entry: not TEST_TITLE.search(repo.git.log("-1", "--format=%s", entry[0])))


def failing(report: dict[str, object]) -> list[str]:
    tests = dict(report.get("tests") or {})  # type: ignore[call-overload]
    return sorted(k for k, v in tests.items() if v in ("failed", "error"))


def passing(report: dict[str, object]) -> set[str]:
    tests = dict(report.get("tests") or {})  # type: ignore[call-overload]
    return {k for k, v in tests.items() if v == "passed"}


def git_bisect(tester: Tester, good: str, bad: str, node_id: str, repair: bool = False) -> tuple[str, int, float]:
    """`git bisect run` over the first-parent commits of (good, bad] with the runner as its
    command, in the tester's worktree: (first bad commit, runs, seconds). With `repair` the
    verdicts are turned round (`good` fails, `bad` passes): the first commit where the test passes."""
    wt = git.Repo(tester.worktree)
    counter = tester.worktree.parent / f"{tester.worktree.name}.bisect-runs"
    counter.write_text("")
    script = tester.worktree.parent / f"{tester.worktree.name}.bisect.py"
    script.write_text(
        "import sys, subprocess\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.helpers.vllm_ascend_ut import Tester\n"
        f"t = Tester(__import__('pathlib').Path({str(tester.repo.working_dir)!r}), "
        f"__import__('pathlib').Path({str(tester.worktree)!r}))\n"
        "sha = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True).stdout.strip()\n"
        f"open({str(counter)!r}, 'a').write(sha + '\\n')\n"
        f"code, reason, _ = t.run(sha, [{node_id!r}])\n"
        "print(sha[:12], code, reason)\n"
        + ("sys.exit({0: 1, 1: 0}.get(code, code))\n" if repair else "sys.exit(code)\n"))
    started = time.monotonic()
    wt.git.bisect("reset")
    wt.git.bisect("start", "--first-parent", bad, good)
    try:
        out = wt.git.bisect("run", sys.executable, str(script))
    finally:
        wt.git.bisect("reset")
    culprit = re.search(r"([0-9a-f]{40}) is the first bad commit", out)
    if culprit is None:
        raise RuntimeError(f"git bisect run found no culprit:\n{out[-2000:]}")
    return culprit[1], len(counter.read_text().split()), round(time.monotonic() - started, 1)


def git_bisect_replayed(clone: Path, good: str, bad: str, culprit: str) -> int:
    """The runs `git bisect run` takes over the first-parent commits of (good, bad] when its command
    answers as the test does there (bad from `culprit` on: what the pair's runs showed), replayed
    without running the test: real git's choice of commits, in a scratch worktree, `--no-checkout`."""
    repo = git.Repo(clone)
    with tempfile.TemporaryDirectory(prefix="bisect-npu-replay-") as scratch:
        worktree = Path(scratch) / "wt"
        repo.git.worktree("add", "--detach", "--no-checkout", str(worktree), bad)
        try:
            counter = Path(scratch) / "runs"
            script = Path(scratch) / "oracle.sh"
            script.write_text("#!/bin/sh\necho x >> " + str(counter) + "\n"
                              "head=$(git rev-parse BISECT_HEAD)\n"
                              f"git merge-base --is-ancestor {culprit} $head && exit 1\nexit 0\n")
            script.chmod(0o755)
            wt = git.Repo(worktree)
            wt.git.bisect("start", "--first-parent", "--no-checkout", bad, good)
            out = wt.git.bisect("run", str(script))
            wt.git.bisect("reset")
            if f"{culprit} is the first bad commit" not in out:
                raise RuntimeError(f"the replay ended elsewhere:\n{out[-1500:]}")
            return len(counter.read_text().split())
        finally:
            repo.git.worktree("remove", "--force", str(worktree))


def mine(clone: Path, out: Path, segment_of: list[str], limit: int, worktree: Path,
         with_git_bisect: bool = False) -> list[Pair]:
    tester = Tester(clone, worktree)
    repo = tester.repo
    line = first_parent(repo)
    index = {sha: i for i, sha in enumerate(line)}
    keys = {sha: tester.key(sha).name for sha in line}
    wanted = {keys[history.resolve_ref(repo, ref)] for ref in segment_of} or {k for s, k in keys.items()
                                                                                 if tester.has_venv(s)}
    pairs: list[Pair] = [Pair(**p) for p in json.loads(out.read_text())] if out.exists() else []
    tried_file = out.with_suffix(".tried.json")
    tried = {(str(r), str(f)) for r, f in json.loads(tried_file.read_text())} if tried_file.exists() else set()
    for repair, path in candidate_repairs(repo, line, keys, wanted):
        if len(pairs) >= limit:
            break
        if (repair, path) in tried or any(p.repair == repair for p in pairs):
            continue
        tried.add((repair, path))
        tried_file.write_text(json.dumps(sorted(tried)))
        parent = line[index[repair] - 1]
        if keys[parent] != keys[repair]:
            continue
        _, _, before = tester.run(parent, [path])
        broken = failing(before)
        print(f"{repair[:10]} {path}: {len(broken)} failing at its parent", flush=True)
        if not broken:
            continue
        _, _, after = tester.run(repair, [path])
        repaired = [n for n in broken if n in passing(after)]
        print(f"  {len(repaired)} of them pass at the repair", flush=True)
        if not repaired:
            continue
        node = repaired[0]
        start = max(index[parent] - RANGE_BEFORE, 0)
        while start < index[parent] and keys[line[start]] != keys[parent]:
            start += 1
        pair = Pair(culprit="", node_id=node, repair=repair, good=line[start], bad=parent, pin=keys[parent],
                    repair_title=repo.git.log("-1", "--format=%s", repair))
        if with_git_bisect:
            code, reason, _ = tester.run(pair.good, [node])
            if code != 0:
                print(f"  fails at {pair.good[:10]} too ({reason}): the culprit is further back; dropped", flush=True)
                continue
            pair.culprit, pair.git_bisect_steps, pair.git_bisect_seconds = git_bisect(tester, pair.good, parent, node)
            pair.title = repo.git.log("-1", "--format=%s", pair.culprit)
        pairs.append(pair)
        print(f"  WINDOW {node} broken at {parent[:10]}, repaired by {repair[:10]}; range from {pair.good[:10]}",
              flush=True)
        out.write_text(json.dumps([asdict(p) for p in pairs], indent=1) + "\n")
    return pairs


def status(sample: dict[str, object], node_id: str) -> str:
    """"pass", "fail", "absent" (its module lacks it, or there is no such module) or "unknown"
    (its module could not be collected, or the test was skipped) of one test in a sweep sample."""
    outcome = dict(sample["tests"]).get(node_id)  # type: ignore[call-overload]
    if outcome == "passed":
        return "pass"
    if outcome in ("failed", "error"):
        return "fail"
    module = node_id.split("::", 1)[0]
    if outcome is None and module not in dict(sample["errors"]) and (  # type: ignore[call-overload]
            module not in list(sample["files"]) or module in list(sample["collected"])):  # type: ignore[call-overload]
        return "absent"
    return "unknown"


def sweep_windows(samples: list[dict[str, object]]) -> list[tuple[str, int, int, int]]:
    """(test, i, j, k) over the samples: the test passes or is absent at i, fails at j (the next
    sample that knows it), and passes at k (the first later sample where it does not fail)."""
    names = sorted({str(n) for sample in samples for n in dict(sample["tests"])})  # type: ignore[call-overload]
    windows = []
    for name in names:
        known = [(index, status(sample, name)) for index, sample in enumerate(samples)]
        known = [(index, state) for index, state in known if state != "unknown"]
        for (i, before), (j, now) in itertools.pairwise(known):
            if before in ("pass", "absent") and now == "fail":
                later = next(((k, state) for k, state in known if k > j and state != "fail"), None)
                if later is not None and later[1] == "pass":
                    windows.append((name, i, j, later[0]))
    return windows


def sweep(clone: Path, out: Path, segment_of: str, every: int, worktree: Path, limit: int,
          offset: int = 0) -> list[Pair]:
    """Mine pairs from a sweep of one pin segment (see the module's docstring); the samples are
    kept beside OUT (OUT.sweep.json) so a second call goes on from there, and a call with another
    `offset` adds samples between the first call's: windows are read from all of them in order."""
    tester = Tester(clone, worktree)
    repo = tester.repo
    line = first_parent(repo)
    index = {sha: i for i, sha in enumerate(line)}
    wanted = tester.key(history.resolve_ref(repo, segment_of)).name
    segment = [sha for sha in line if tester.key(sha).name == wanted]
    to_run = list(dict.fromkeys([*segment[offset::every], segment[-1]]))
    kept = out.with_suffix(".sweep.json")
    samples: dict[str, dict[str, object]] = json.loads(kept.read_text()) if kept.exists() else {}
    for sha in to_run:
        if sha in samples:
            continue
        started = time.monotonic()
        report = tester.run_all(sha)
        tests = {str(k): str(v) for k, v in dict(report.get("tests") or {}).items()}  # type: ignore[call-overload]
        samples[sha] = {"tests": tests, "errors": dict(report.get("collect_errors") or {}),  # type: ignore[call-overload]
                        "files": cpu_test_files(repo, sha), "collected": sorted({t.split("::", 1)[0] for t in tests}),
                        "seconds": round(time.monotonic() - started, 1)}
        failed = sum(1 for v in tests.values() if v in ("failed", "error"))
        print(f"{sha[:10]} (#{index[sha]}): {len(tests)} tests, {failed} failing, "
              f"{len(samples[sha]['errors'])} modules not collected, {samples[sha]['seconds']} s", flush=True)  # type: ignore[arg-type]
        kept.write_text(json.dumps(samples))
    shas = [sha for sha in segment if sha in samples]  # this call's samples and any earlier call's
    ordered = [samples[sha] for sha in shas]
    pairs: list[Pair] = [Pair(**p) for p in json.loads(out.read_text())] if out.exists() else []
    known = [Pair(**p) for p in json.loads(PAIRS.read_text())] if PAIRS.exists() else []
    windows = sweep_windows(ordered)
    print(f"{len(windows)} windows in {len(shas)} samples", flush=True)
    # One window of each (i, j) first: those are the likeliest to have distinct culprits.
    firsts = {(i, j): (name, i, j, k) for name, i, j, k in reversed(windows)}
    for name, i, j, k in [*firsts.values(), *(w for w in windows if w not in firsts.values())]:
        if len(pairs) >= limit:
            break
        inside = [p.culprit for p in [*known, *pairs] if index[shas[i]] < index.get(p.culprit, -1) <= index[shas[j]]]
        if any(p.node_id == name for p in [*known, *pairs]) or any(
                tester.run(c, [name])[0] == 1 and tester.run(line[index[c] - 1], [name])[0] == 0 for c in inside):
            continue  # a culprit of a pair already found breaks this test too
        print(f"window {name}: ok at {shas[i][:10]}, fails at {shas[j][:10]}, passes at {shas[k][:10]}", flush=True)
        pair = narrow(tester, clone, line, index, name, shas[i], shas[j], shas[k])
        if pair is None or any(p.culprit == pair.culprit for p in [*known, *pairs]):
            continue
        pairs.append(pair)
        out.write_text(json.dumps([asdict(p) for p in pairs], indent=1) + "\n")
    return pairs


def narrow(tester: Tester, clone: Path, line: list[str], index: dict[str, int], name: str, ok: str, broken: str,
           passes: str) -> Pair | None:
    """The window's culprit (git bisect over (ok, broken]) and repair (over (broken, passes]), each
    flip run directly at the commit and its first parent; None when the test alone does not
    behave as it did in the whole set."""
    for sha, want in ((broken, 1), (ok, 0), (passes, 0)):
        code, reason, _ = tester.run(sha, [name])
        if code != want:
            print(f"  run alone at {sha[:10]}: {reason}; dropped", flush=True)
            return None
    culprit, _, _ = git_bisect(tester, ok, broken, name)
    repair, _, _ = git_bisect(tester, broken, passes, name, repair=True)
    verdicts = {}
    for what, sha, want in (("parent", line[index[culprit] - 1], 0), ("culprit", culprit, 1),
                            ("repair_parent", line[index[repair] - 1], 1), ("repair", repair, 0)):
        code, reason, _ = tester.run(sha, [name])
        verdicts[what] = f"command exited {code}: {reason}"
        if code != want:
            print(f"  {what} {sha[:10]}: {reason}; dropped", flush=True)
            return None
    bad = line[index[repair] - 1]
    repo = tester.repo
    pair = Pair(culprit=culprit, node_id=name, repair=repair, good=ok, bad=bad, pin=tester.key(bad).name,
                split="eval", title=repo.git.log("-1", "--format=%s", culprit),
                repair_title=repo.git.log("-1", "--format=%s", repair),
                git_bisect_steps=git_bisect_replayed(clone, ok, bad, culprit),
                parent_verdict=verdicts["parent"], culprit_verdict=verdicts["culprit"],
                evidence=diff_evidence(clone, culprit, verdicts["culprit"]),
                ground_truth="the flip git bisect run found in a sweep window, each side run directly: the test fails "
                             "at the culprit and passes (or is absent) at its parent; no independent bisection",
                repair_verified=True,
                notes=[f"swept: ok at {ok[:10]}, failing at {broken[:10]}, passing at {passes[:10]}; the repair "
                       "by git bisect run over those, its flip run directly"])
    print(f"  PAIR {name}: culprit {culprit[:10]}, repair {repair[:10]}", flush=True)
    return pair


def diff_evidence(clone: Path, culprit: str, failure: str) -> list[str]:
    """The names the failure quotes ('get_cache_scale', `fn`) that the culprit's own diff touches:
    evidence for the culprit that does not come from any bisection."""
    names = {n for n in re.findall(r"['`\"]([A-Za-z_][\w.]{3,})['`\"]", failure)}
    diff = git.Repo(clone).git.show("--format=", "-U0", culprit)
    changed = "\n".join(line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))
    return sorted(n for n in names if n.rsplit(".", 1)[-1] in changed)


def table(pairs_path: Path, results_path: Path) -> str:
    """The tier's results as a Markdown table (the last result of each pair)."""
    pairs = {p["culprit"]: p for p in json.loads(pairs_path.read_text())}
    results = {}
    for line in results_path.read_text().splitlines():
        result = json.loads(line)
        results[result["culprit"]] = result
    rows = ["| split | culprit | test | right? | steps (run) | steps (git bisect) | s/step | repair rank |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    for culprit, pair in pairs.items():
        r = results.get(culprit, {})
        rows.append(f"| {pair['split']} | {culprit[:10]} | `{pair['node_id'].split('/', 2)[-1]}` | "
                    f"{'yes' if r.get('found') == culprit else ('no' if r else 'not run')} | {r.get('steps', '')} | "
                    f"{pair['git_bisect_steps']} | {r.get('seconds_per_step', '')} | {r.get('repair_rank') or '-'} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    mine_cmd = sub.add_parser("mine")
    mine_cmd.add_argument("clone", type=Path)
    mine_cmd.add_argument("out", type=Path)
    mine_cmd.add_argument("--segment-of", action="append", default=[])
    mine_cmd.add_argument("--limit", type=int, default=12)
    mine_cmd.add_argument("--worktree", type=Path, default=Path("/tmp/bisect-npu-mine-wt"))
    mine_cmd.add_argument("--git-bisect", action="store_true", help="narrow each window with git bisect run too")
    sweep_cmd = sub.add_parser("sweep")
    sweep_cmd.add_argument("clone", type=Path)
    sweep_cmd.add_argument("out", type=Path)
    sweep_cmd.add_argument("--segment-of", required=True, help="a commit of the pin segment to sweep")
    sweep_cmd.add_argument("--every", type=int, default=20, help="run the whole set at every K-th commit")
    sweep_cmd.add_argument("--offset", type=int, default=0, help="start at the segment's K-th commit")
    sweep_cmd.add_argument("--limit", type=int, default=12)
    sweep_cmd.add_argument("--worktree", type=Path, default=Path("/tmp/bisect-npu-mine-wt"))
    table_cmd = sub.add_parser("table")
    table_cmd.add_argument("pairs", type=Path)
    table_cmd.add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "table":
        print(table(args.pairs, args.results))
        return
    if args.command == "sweep":
        sweep(args.clone, args.out, args.segment_of, args.every, args.worktree, args.limit, args.offset)
        return
    mine(args.clone, args.out, args.segment_of, args.limit, args.worktree, args.git_bisect)


if __name__ == "__main__":
    main()
