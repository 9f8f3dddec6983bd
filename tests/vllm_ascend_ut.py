"""Breakage pairs mined from a real vllm-ascend clone for `make test-vllm-ascend-ut`.

A pair is (culprit, node id, repair): the test passes at the culprit's parent (or does not exist
there), fails at the culprit, and passes again at the repair, all on the first-parent line of
main. Mining is cheap where it can be: candidate repairs come from history (a first-parent commit
whose title says it fixes something and that edits a CPU-routed test file); each is checked by
running that file at the repair's parent and at the repair (one venv per pin, cached); only a
test that fails before the repair and passes at it is narrowed, by `git bisect run` over the
first-parent commits of a bounded range before it, and the culprit is confirmed by running its
parent. `git bisect run`'s steps on that range are what `run`'s are compared with.

    python tests/vllm_ascend_ut.py mine CLONE OUT.json [--segment-of SHA]... [--limit N]
"""

from __future__ import annotations

import argparse
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
    write_package_record,
)
from bisect_npu.upstream import history

ROOT = Path(__file__).resolve().parent.parent
ROUTING = "bb4d0776ee"  # [CI] Refactor test folder (#9807), 2026-06-02: the CPU routing
FIXING = re.compile(r"\bfix|\bbug|repair|broken|\bfail", re.I)
TEST_TITLE = re.compile(r"\bUT\b|\btests?\b|\bCI\b", re.I)
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
                                  log_dir or Path(tempfile.gettempdir()))
        site = self.checkout(sha)
        self.runs += 1
        with tempfile.TemporaryDirectory() as scratch:
            report, reason = Path(scratch) / "report.json", Path(scratch) / "reason"
            env = {**os.environ, "PYTHONPATH": f"{site}:{self.worktree}", "BISECT_NPU_REASON_FILE": str(reason)}
            argv = [str(venv.python), "-m", "bisect_npu.probe.unit_tests", "--report", str(report),
                    *(a for p in present_at_good or [] for a in ("--present-at-good", p)), *node_ids]
            proc = subprocess.run(argv, cwd=self.worktree, env=env, capture_output=True, text=True, check=False,
                                  timeout=1800)
            said = reason.read_text().strip() if reason.exists() else proc.stdout[-300:]
            data = json.loads(report.read_text()) if report.exists() else {}
        return proc.returncode, said, data


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


def git_bisect(tester: Tester, good: str, bad: str, node_id: str) -> tuple[str, int, float]:
    """`git bisect run` over the first-parent commits of (good, bad] with the runner as its
    command, in the tester's worktree: (first bad commit, runs, seconds)."""
    wt = git.Repo(tester.worktree)
    counter = tester.worktree.parent / f"{tester.worktree.name}.bisect-runs"
    counter.write_text("")
    script = tester.worktree.parent / f"{tester.worktree.name}.bisect.py"
    script.write_text(
        "import sys, subprocess\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.vllm_ascend_ut import Tester\n"
        f"t = Tester(__import__('pathlib').Path({str(tester.repo.working_dir)!r}), "
        f"__import__('pathlib').Path({str(tester.worktree)!r}))\n"
        "sha = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True).stdout.strip()\n"
        f"open({str(counter)!r}, 'a').write(sha + '\\n')\n"
        f"code, reason, _ = t.run(sha, [{node_id!r}])\n"
        "print(sha[:12], code, reason)\n"
        "sys.exit(code)\n")
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
    table_cmd = sub.add_parser("table")
    table_cmd.add_argument("pairs", type=Path)
    table_cmd.add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "table":
        print(table(args.pairs, args.results))
        return
    mine(args.clone, args.out, args.segment_of, args.limit, args.worktree, args.git_bisect)


if __name__ == "__main__":
    main()
