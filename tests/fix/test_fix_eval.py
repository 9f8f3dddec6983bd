"""bench/fix_eval.py on a history made in the test: both rankings, the baseline and the splits printed."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.fix_history import SAMPLER, add_culprit, base_history
from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
COLUMNS = "split\tbranch\tculprit\tfix\tbad\tfix_date\tcitation\tkeywords\tculprit_title\tfix_title\n"


def test_fix_eval_prints_recall_for_shown_and_hidden_citations_and_the_baseline(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    bad = hist.filler(1)[0]
    hist.edit("[BugFix] Guard temperature against zero (#42)", SAMPLER, "    return [x / value for x in logits]\n",
              "    return [x / max(value, 1e-5) for x in logits]\n")
    revert = hist.revert(culprit)
    hist.edit("[BugFix] Clamp top_k (#43)", SAMPLER, "    return order[:k]\n", "    return order[:max(k, 1)]\n")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(COLUMNS + f"test\tmain\t{culprit}\t{revert}\t{bad}\t2026-02-01\tsha\t"
                               f"repetition penalty;async\tculprit\trevert\n")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "fix_eval.py"), "--repo", str(hist.path),
                           "--pairs", str(pairs), "--verbose"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split()[:4] == ["test", "shown", "rank", "1"] for line in lines), done.stdout
    assert any(line.split()[:4] == ["test", "hidden", "rank", "1"] for line in lines), done.stdout
    table = {tuple(line.split()[:2]): line.split()[2:] for line in lines if line.startswith("test ")}
    assert table[("test", "shown")][:2] == ["1", "1/1"] and table[("test", "hidden")][:2] == ["1", "1/1"]
    # The baseline's most recent bug-fix-tagged commit on the culprit's file is the later [BugFix]: the
    # revert has no tag at all, so the baseline misses it.
    assert table[("test", "baseline")][:2] == ["1", "0/1"]
    assert "seconds per query (hidden)" in done.stdout and "seconds per query (hidden CPU)" in done.stdout


def test_a_fix_counts_only_where_it_names_its_proposal():
    sys.path.insert(0, str(ROOT / "bench"))
    from fix_eval import rank_of

    from bisect_npu.fix_proposals import FixProposal, FixReport

    def proposal(*shas: str) -> FixProposal:
        return FixProposal(shas=list(shas), branches=[], title="t", pr=None, score=0.0, reasons=[])

    # The release branch's revert named first (the user's branch), main's listed as its twin: main's
    # revert is not what this proposal tells the user to apply.
    report = FixReport("c", [proposal("other"), proposal("release_revert", "main_revert")], None, "")
    assert rank_of(report, "release_revert") == 2 and rank_of(report, "main_revert") is None
