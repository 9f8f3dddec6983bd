"""The closing sentences where the answer is less than one sure commit: a range the skips leave
names why each commit between could not be tested (where the parent of the culprit cannot be
built, the user reads that build failure, not only a range), and a search that stopped below the
confidence asked names the range that holds it and its best guess inside, saying how sure it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_npu.orchestration.ending import end_messages
from tests.helpers.cli_exit import run_cli
from tests.helpers.gitrepo import make_linear_repo


def test_the_skipped_parent_of_the_culprit_is_named_with_its_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 8, culprit=5, tags={0: "good", 7: "bad"})
    script = tmp_path / "check.sh"
    script.write_text('if [ "$(cat counter)" = 4 ]; then echo "cannot build: undeclared x" >&2; exit 125; fi\n'
                      "grep -qx good state\n")
    monkeypatch.chdir(repo)
    code, out, err = run_cli(["run", "--good", "good", "--bad", "bad", "--cmd", f"sh {script}", "--no-fix",
                              "--session", str(tmp_path / "session"), "--json"], capsys)
    assert code == 3, err
    assert json.loads(out.splitlines()[-1])["range"] == [shas[3], shas[5]]
    said = f"the culprit is one of 2 commits in ({shas[3][:12]}, {shas[5][:12]}]: the commits between could not be " \
           f"tested ({shas[4][:12]}: "
    assert said in err + out
    assert "125" in (err + out).split(said)[1].split(")")[0]


def test_a_narrowed_sentence_names_at_most_three_skips() -> None:
    skipped = [(str(i) * 40, f"build failed: error {i}\nmore lines") for i in range(1, 6)]
    said = end_messages.narrowed("a" * 40, "b" * 40, 6, find_fix=False, skipped=skipped)
    assert said == ("the culprit is one of 6 commits in (aaaaaaaaaaaa, bbbbbbbbbbbb]: the commits between could not be "
                    "tested (111111111111: build failed: error 1; 222222222222: build failed: error 2; "
                    "333333333333: build failed: error 3; 2 more in the report)")
    assert end_messages.narrowed("a" * 40, "b" * 40, 2, find_fix=True).endswith(
        "the steps in it disagree with each other, a commit's own steps against the answer the others lean to "
        "(the report has each one's evidence): re-run the commits in it")


def test_a_best_guess_below_the_confidence_asked_is_named_inside_its_range() -> None:
    def said(reached: float, asked: float) -> str:
        return end_messages.best_guess("a" * 40, "b" * 40, 3, "c" * 40, "a title", reached=reached, asked=asked,
                                       find_fix=False)

    assert said(0.53, 0.99) == ("the culprit is one of 3 commits in (aaaaaaaaaaaa, bbbbbbbbbbbb]: no commit reached "
                                "the 99% asked; the best guess is cccccccccccc a title (53% sure), the steps around it "
                                "disagree (the report has each one's evidence): re-run it and its parent")
    # A confidence asked with more digits is shown with them, never rounded to 100%; what was
    # reached is never rounded up to it.
    assert "reached the 99.9% asked; the best guess is cccccccccccc a title (99.8% sure)" in said(0.9989, 0.999)
    assert "(76.3% sure)" in said(0.7633, 0.999) and "(29% sure)" in said(0.29, 0.95)
    assert end_messages.best_guess("a" * 40, "b" * 40, 2, "c" * 40, "", reached=0.9, asked=0.99,
                                   find_fix=True).startswith("the fix is one of 2 commits in")


def test_a_good_end_off_the_bad_ends_history_names_the_merge_base_that_was_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--good on a side branch (not an ancestor of --bad) whose merge-base with it is bad: the
    search tests the merge-base, so the sentence says the merge-base was judged bad, not the good end
    (`side` itself is good)."""
    from tests.helpers.gitrepo import GOOD_CMD, git

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 8, culprit=2)
    git(repo, "checkout", "-q", "-b", "side", shas[3])
    (repo / "state").write_text("good\n")
    git(repo, "commit", "-q", "-am", "side is good again")
    git(repo, "checkout", "-q", "main")
    monkeypatch.chdir(repo)
    code, out, err = run_cli(["run", "--good", "side", "--bad", "main", "--cmd", " ".join(GOOD_CMD), "--no-fix",
                              "--no-verdict-store", "--session", str(tmp_path / "session"), "--json"], capsys)
    assert code == 4, err
    said = out.splitlines()[0]
    assert said.startswith(f"precondition failed: the merge-base {shas[3][:12]} of the good end side and main "
                           "(side is not an ancestor of main) was judged bad"), said
    assert "the good end side was judged bad" not in out + err


def test_an_end_judged_the_wrong_way_says_why_it_was_judged_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test missing at both ends passes at the bad end too: exit 4, and the sentence gives
    the verdict's reason (the test does not exist there), not only "was judged good"."""
    repo = tmp_path / "repo"
    make_linear_repo(repo, 4, culprit=2, tags={0: "good", 3: "bad"})
    script = tmp_path / "check.sh"
    script.write_text('echo "tests/t.py::test_x does not exist at this commit: counted good" > '
                      '"$BISECT_NPU_REASON_FILE"\nexit 0\n')
    monkeypatch.chdir(repo)
    code, out, err = run_cli(["run", "--good", "good", "--bad", "bad", "--cmd", f"sh {script}", "--no-fix",
                              "--no-verdict-store", "--session", str(tmp_path / "session"), "--json"], capsys)
    assert code == 4, err
    assert ("the bad end bad was judged good (command exited 0: tests/t.py::test_x does not exist at this commit: "
            "counted good); "
            "check the command reproduces the problem") in out + err
