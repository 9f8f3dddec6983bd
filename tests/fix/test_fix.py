"""propose_fixes on histories made with real git: what is found, what is grouped, what is not."""

from __future__ import annotations

import itertools

import git
import pytest

from bisect_npu.errors import InfrastructureError
from bisect_npu.fix import STRONG_SIGNALS, SYMPTOM_CAP, WEAK_SIGNALS, WEIGHTS, normalize_title, propose_fixes
from tests.helpers.fix_history import CULPRIT_TITLE, SAMPLER, add_culprit, base_history

SYMPTOM = ("repetition_penalty", "async")


def signals(proposal) -> set[str]:
    return {r.signal for r in proposal.reasons}


def unrelated_bugfixes(hist) -> list[str]:
    """Bug fixes in other files (one even names the symptom) and one far away in the same file."""
    return [
        hist.commit("[BugFix] Fix crash in async scheduler shutdown (#40)",
                    {"vllm_ascend/core/scheduler.py": "def shutdown():\n    return None\n"}),
        hist.commit("[Bugfix] Fix typo in the attention docstring (#41)",
                    {"vllm_ascend/attention/attention.py": '"""Attention."""\n'}),
        hist.edit("[BugFix] Guard temperature against zero (#42)", SAMPLER,
                  "    return [x / value for x in logits]\n",
                  "    return [x / max(value, 1e-5) for x in logits]\n"),
    ]


def test_weights_strong_signals_dominate_all_weak_ones():
    weak_total = sum(WEIGHTS[s] for s in WEAK_SIGNALS if s != "symptom") + WEIGHTS["symptom"] * SYMPTOM_CAP
    assert weak_total < min(WEIGHTS[s] for s in STRONG_SIGNALS)


def test_fix_without_tag_is_found_by_line_provenance_after_lines_moved(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    # Lines inserted above the culprit's line move it: provenance must follow it.
    hist.edit("[Misc] Document apply_penalties (#13)", SAMPLER, "def apply_penalties(logits, token_ids, penalty):\n",
              "def apply_penalties(logits, token_ids, penalty):\n    # penalties need the full history\n"
              "    # (see the scheduler notes)\n")
    unrelated_bugfixes(hist)
    fix = hist.edit("Restore the history used by penalties (#50)", SAMPLER,
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    hist.filler(2, "CI")
    report = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)
    best = report.proposals[0]
    assert best.shas == [fix]
    assert "provenance" in signals(best) and "tag" not in signals(best)
    assert best.pr == 50 and best.branches == ["main"]
    # Unrelated bug fixes (other files, or a far-away function of the same file) are not proposed.
    assert [p.shas for p in report.proposals] == [[fix]]


def test_provenance_follows_a_rename(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    hist.git("mv", SAMPLER, "vllm_ascend/sample/penalties.py")
    hist.commit("[Refactor] Rename sampler module (#14)", {})
    fix = hist.edit("Restore the history used by penalties (#51)", "vllm_ascend/sample/penalties.py",
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    report = propose_fixes(git.Repo(hist.path), culprit)
    assert report.proposals[0].shas == [fix]
    assert "provenance" in signals(report.proposals[0])


def test_fix_that_only_adds_lines_near_the_culprit_is_found(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    unrelated_bugfixes(hist)
    fix = hist.edit("[BugFix] Back-fill async placeholders before repetition_penalty (#60)", SAMPLER,
                    "    return scale(logits, history, penalty)\n",
                    "    history = backfill(history)\n    return scale(logits, history, penalty)\n")
    report = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)
    best = report.proposals[0]
    assert best.shas == [fix]
    assert "provenance" not in signals(best)
    assert {"proximity", "same_function", "tag", "symptom"} <= signals(best)
    assert len(report.proposals) == 1


def test_revert_by_title_and_by_body(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    hist.filler(3)
    revert = hist.revert(culprit)
    repo = git.Repo(hist.path)
    message = repo.commit(revert).message
    assert message.startswith(f'Revert "{CULPRIT_TITLE}"') and f"This reverts commit {culprit}" in message
    best = propose_fixes(repo, culprit).proposals[0]
    assert best.shas == [revert]
    reasons = [r.detail for r in best.reasons if r.signal == "revert"]
    assert reasons and best.score >= WEIGHTS["revert"]

    # Title only (GitHub's revert button titles it, squash-merge drops the body) and body only.
    hist2 = base_history(tmp_path / "up2")
    culprit2 = add_culprit(hist2)
    by_title = hist2.edit(f'Revert "{CULPRIT_TITLE}" (#70)', SAMPLER,
                          "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    hist2.filler(1)
    by_body = hist2.commit("[Misc] Undo a perf change in docs (#71)", {"docs/perf.md": "undone\n"},
                           body=f"This reverts commit {culprit2[:12]}.")
    proposals = propose_fixes(git.Repo(hist2.path), culprit2).proposals
    by_sha = {p.shas[0]: p for p in proposals}
    assert "revert" in signals(by_sha[by_title]) and "revert" in signals(by_sha[by_body])
    assert proposals[0].shas == [by_title]  # revert + provenance beats revert alone


def test_explicit_reference_to_the_culprit_pr(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    fix = hist.commit("Handle placeholder ids in the runner (#80)",
                      {"vllm_ascend/worker/runner.py": "def backfill_ids():\n    return []\n"},
                      body="Fixes #12: penalties saw no history under async scheduling.")
    best = propose_fixes(git.Repo(hist.path), culprit).proposals[0]
    assert best.shas == [fix]
    assert any(r.signal == "reference" and "Fixes #12" in r.detail for r in best.reasons)


def test_fix_on_two_branches_is_one_proposal(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    hist.filler(1)
    hist.branch("v0.9.1-dev", hist.head())
    hist.filler(2)
    on_main = hist.edit("[BugFix] Restore async back-fill for penalties (#90)", SAMPLER,
                        "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    hist.checkout("v0.9.1-dev")
    hist.filler(1, "Release")
    on_release = hist.cherry_pick(on_main, "[v0.9.1][BugFix] Restore async back-fill for penalties (#95)")
    hist.checkout("main")
    report = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)
    assert len(report.proposals) == 1
    best = report.proposals[0]
    assert set(best.shas) == {on_main, on_release}
    assert best.branches == ["main", "v0.9.1-dev"]
    assert best.sha_branches == {on_main: ["main"], on_release: ["v0.9.1-dev"]}
    assert "twins" in signals(best) and best.missing_on == []


def culprit_and_release_branch(tmp_path):
    """main with the culprit; v0.9.1-dev forked just before it, one release commit on it, checked out."""
    hist = base_history(tmp_path / "up")
    fork = hist.head()
    culprit = add_culprit(hist)
    hist.branch("v0.9.1-dev", fork)
    hist.checkout("v0.9.1-dev")
    hist.filler(1, "Release")
    return hist, culprit


def test_culprit_cherry_picked_to_a_release_branch_without_the_fix(tmp_path):
    hist, culprit = culprit_and_release_branch(tmp_path)
    twin = hist.cherry_pick(culprit, "[0.9.1]" + CULPRIT_TITLE.replace("(#12)", "(#13)"))
    hist.checkout("main")
    fix = hist.edit("Restore the history used by penalties (#50)", SAMPLER,
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    report = propose_fixes(git.Repo(hist.path), culprit)
    assert report.proposals[0].shas == [fix]
    assert report.proposals[0].missing_on == ["v0.9.1-dev"]
    assert [(t.sha, t.branches, t.fixed) for t in report.twins] == [(twin, ["v0.9.1-dev"], False)]
    assert "v0.9.1-dev" in report.note and "needed there too" in report.note


def test_no_fix_says_so_plainly_despite_unrelated_bugfixes(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    unrelated_bugfixes(hist)
    hist.filler(2)
    repo = git.Repo(hist.path)
    report = propose_fixes(repo, culprit, symptom=SYMPTOM, evidence_keywords=["repetition_penalty"])
    assert report.proposals == []
    assert report.note.startswith("no later commit touches the culprit's lines or names it; "
                                  "no fix found upstream as of main@")
    assert repo.head.commit.hexsha[:10] in report.note


def test_dependency_culprit_gives_the_versions_to_bisect_next(tmp_path):
    hist = base_history(tmp_path / "up")
    docker = "FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10\nARG VLLM_TAG=v0.9.0\nRUN true\n"
    hist.commit("[CI] Add Dockerfile (#2)", {"Dockerfile": docker, "requirements.txt": "numpy<2\ntorch==2.5.1\n"})
    bump = hist.commit("Upgrade vLLM to v0.9.1 (#3)", {
        "Dockerfile": docker.replace("v0.9.0", "v0.9.1"),
        ".github/workflows/test.yaml": "vllm_version: [v0.9.1]\n",
    })
    report = propose_fixes(git.Repo(hist.path), bump)
    dep = report.dependency
    assert dep is not None
    assert (dep.package, dep.old, dep.new, dep.files) == ("vllm", "v0.9.0", "v0.9.1", ["Dockerfile"])
    assert report.note.startswith(
        "the regression comes from the dependency: bisect vllm between v0.9.0 and v0.9.1 next")
    pin = hist.commit("Pin torch (#4)", {"requirements.txt": "numpy<2\ntorch==2.6.0\n"})
    dep = propose_fixes(git.Repo(hist.path), pin).dependency
    assert dep is not None and (dep.package, dep.old, dep.new) == ("torch", "2.5.1", "2.6.0")
    moved = hist.commit("Move minivllm to v0.3.0 (#5)", {
        "Dockerfile": docker.replace("v0.9.0", "v0.9.1") + "ARG MINIVLLM_TAG=v0.2.0\n"})
    assert propose_fixes(git.Repo(hist.path), moved).dependency is None  # a new pin is a change, not a move
    moved = hist.commit("Move minivllm to v0.3.0 (#6)", {
        "Dockerfile": docker.replace("v0.9.0", "v0.9.1") + "ARG MINIVLLM_TAG=v0.3.0\n"})
    dep = propose_fixes(git.Repo(hist.path), moved).dependency
    assert dep is not None and (dep.package, dep.old, dep.new) == ("minivllm", "v0.2.0", "v0.3.0")
    code = propose_fixes(git.Repo(hist.path), add_culprit(hist))
    assert code.dependency is None


def test_ranking_is_deterministic_and_ties_go_to_the_older_commit(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    first = hist.commit("Follow up (#100)", {"a.txt": "1\n"}, body="See #12.")
    second = hist.commit("Another follow up (#101)", {"b.txt": "1\n"}, body="See #12.")
    repo = git.Repo(hist.path)
    runs = [propose_fixes(repo, culprit) for _ in range(2)]
    assert runs[0] == runs[1]
    assert [p.shas[0] for p in runs[0].proposals] == [first, second]
    assert runs[0].proposals[0].score == runs[0].proposals[1].score


@pytest.mark.parametrize(("title", "expected"), [
    ("[v0.9.1][BugFix] Fix rope scaling (#3)", "fix rope scaling"),
    ("[BugFix] Fix rope scaling (#2)", "fix rope scaling"),
    ("[0.9.1] Fix  rope scaling", "fix rope scaling"),
    ("[Cherry-pick][releases/v0.23.0][Misc] Fix rope scaling (from #11713) (#11867)", "fix rope scaling"),
    ("[Revert][releases/v0.23.0] Restore PA ops (reverts #11867) (#12172)", "restore pa ops"),
])
def test_normalize_title_ignores_branch_tags_and_pr(title, expected):
    assert normalize_title(title) == expected


def test_twins_found_by_patch_id_when_titles_differ(tmp_path):
    hist = base_history(tmp_path / "up")
    fork = hist.head()
    culprit = add_culprit(hist)
    hist.branch("v0.9.1-dev", fork)
    fix = hist.edit("Restore the history used by penalties (#50)", SAMPLER,
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    hist.checkout("v0.9.1-dev")
    twin = hist.cherry_pick(culprit, "[0.9.1] Back-port a perf change (#13)")
    hist.filler(1, "Release")
    backport = hist.cherry_pick(fix, "[0.9.1] Back-port the sampler correction (#55)")
    hist.checkout("main")
    report = propose_fixes(git.Repo(hist.path), culprit)
    assert [t.sha for t in report.twins] == [twin] and report.twins[0].fixed
    assert len(report.proposals) == 1
    assert report.proposals[0].sha_branches == {fix: ["main"], backport: ["v0.9.1-dev"]}


def test_remote_branches_in_a_clone_and_pr_links(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    hist.branch("v0.9.1-dev", hist.head())
    fix = hist.edit("[BugFix] Restore async back-fill for penalties (#90)", SAMPLER,
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    hist.checkout("v0.9.1-dev")
    backport = hist.cherry_pick(fix, "[v0.9.1][BugFix] Restore async back-fill for penalties (#95)")
    hist.checkout("main")  # the upstream's HEAD: the clone's origin/HEAD, its default branch
    clone = tmp_path / "clone"
    hist.git("clone", "-q", str(hist.path), str(clone))
    repo = git.Repo(clone)
    repo.git.remote("set-url", "origin", "https://github.com/vllm-project/vllm-ascend.git")
    best = propose_fixes(repo, culprit[:10], bad="origin/v0.9.1-dev").proposals[0]
    # origin/main repeats the local main (same commit) and is not listed twice.
    assert best.sha_branches == {fix: ["main"], backport: ["origin/v0.9.1-dev"]}
    assert best.shas[0] == fix and best.pr == 90
    assert best.pr_url == "https://github.com/vllm-project/vllm-ascend/pull/90"


def drop_object(repo_path, sha: str) -> None:
    """Delete one loose object, as a partial (--filter) clone never fetched it."""
    (repo_path / ".git" / "objects" / sha[:2] / sha[2:]).unlink()


def test_test_data_a_partial_clone_lacks_is_not_read_and_a_missing_source_is_named(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    text = hist.read(SAMPLER).replace("    history = [t for t in token_ids if t >= 0]\n",
                                      "    history = backfill(token_ids)\n")
    fix = hist.commit("Restore the history used by penalties (#50)", {
        SAMPLER: text,
        "tests/test_penalties.py": "from sampler import apply_penalties\n\ndef test_apply_penalties(): ...\n",
        "tests/data/golden_logits.bin": "\x00\x01binary reference logits\x00" * 40,
    })
    data_blob = hist.git("rev-parse", f"{fix}:tests/data/golden_logits.bin")
    drop_object(hist.path, data_blob)
    best = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM).proposals[0]
    assert best.shas == [fix] and "tests" in signals(best)

    drop_object(hist.path, hist.git("rev-parse", f"{fix}:tests/test_penalties.py"))
    with pytest.raises(InfrastructureError, match=r"git \w+ failed in .*\.git: .*; if the clone is partial "
                                                  r"\(--filter\) or shallow, fetch what it lacks"):
        propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)


def test_reverts_of_the_culprit_and_of_its_release_twin_are_one_proposal_named_on_the_users_branch(tmp_path):
    # As #5761 on vllm-ascend's main and its cherry-pick #5809 on releases/v0.13.0: each reverted on
    # its own branch (#5965, #5966). They are one change: one proposal, named by the revert of the commit
    # the user named (the one to apply on that branch), the other listed as also on its branch.
    hist, culprit = culprit_and_release_branch(tmp_path)
    backport = hist.read(SAMPLER).replace("    history = backfill(token_ids)\n",
                                          "    history = [t for t in token_ids if t >= 0]\n")
    twin = hist.commit("[0.9.1]" + CULPRIT_TITLE.replace("(#12)", "(#13)"),  # adapted on the way: own patch
                       {SAMPLER: backport, "vllm_ascend/release_compat.py": "ASYNC_BACKFILL = False\n"})
    release_revert = hist.revert(twin)
    hist.checkout("main")
    hist.filler(1)
    main_revert = hist.revert(culprit)
    repo = git.Repo(hist.path)
    for named, first, second, branch in ((culprit, main_revert, release_revert, "v0.9.1-dev"),
                                         (twin, release_revert, main_revert, "main")):
        proposals = propose_fixes(repo, named).proposals
        assert proposals[0].shas == [first, second]
        assert proposals[0].also_on == [f"also on {branch} as {second[:10]}"]
        assert "twins" in signals(proposals[0])


def test_a_fix_and_its_back_port_are_named_by_the_commit_on_the_bad_ends_branch(tmp_path):
    # The back-port's title adds branch tags and "(from #90)" (as #11867 "(from #11713)" did): the same
    # change. The user's bad end decides which commit names it: the one to apply on that branch.
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    hist.branch("v0.9.1-dev", hist.head())
    hist.filler(1)
    fix = hist.edit("[BugFix] Restore async back-fill for penalties (#90)", SAMPLER,
                    "    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")
    main_bad = hist.git("rev-parse", "HEAD~1")
    hist.checkout("v0.9.1-dev")
    release_bad = hist.filler(1, "Release")[0]
    backport = hist.commit("[Cherry-pick][releases/v0.9.1][BugFix] Restore async back-fill for penalties "
                           "(from #90) (#95)", {SAMPLER: hist.read(SAMPLER).replace(
                               "    history = [t for t in token_ids if t >= 0]\n",
                               "    history = backfill(token_ids)  # back-port\n")})
    hist.checkout("main")
    repo = git.Repo(hist.path)
    on_release = propose_fixes(repo, culprit, bad=release_bad).proposals
    assert len(on_release) == 1
    assert on_release[0].shas == [backport, fix] and on_release[0].also_on == [f"also on main as {fix[:10]}"]
    on_main = propose_fixes(repo, culprit, bad=main_bad).proposals
    assert on_main[0].shas == [fix, backport]
    # Without a bad end, the branch of the commit the user named (both hold the culprit): the default one.
    assert propose_fixes(repo, culprit).proposals[0].shas == [fix, backport]


def test_a_commit_that_says_it_is_a_cherry_pick_of_the_culprit_does_not_reference_it(tmp_path):
    # As #12137 on releases/v0.23.0, "cherry-pick from #11980" (#11980 is main's copy of the culprit):
    # it names the culprit as the change it copies, not as the one it repairs.
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    copy = hist.commit("[Performance] Merge outputs with All2All (#60)", {"vllm_ascend/ops/merge.py": "X = 1\n"},
                       body="cherry-pick from #12")
    cause = hist.commit("[Misc] Guard the placeholder ids (#61)", {"vllm_ascend/ops/guard.py": "Y = 1\n"},
                        body="The crash was introduced by #12.")
    qualified = hist.commit("[Misc] Drop the placeholder copy (#63)", {"vllm_ascend/ops/copy.py": "W = 1\n"},
                            body="It was re-introduced by vllm-project/vllm-ascend#12.")
    follow = hist.commit("[Perf] Follow-up: cache the placeholder ids (#62)", {"vllm_ascend/ops/cache.py": "Z = 1\n"},
                         body="Builds on #12 to cache them.")
    by_sha = {p.shas[0]: p for p in propose_fixes(git.Repo(hist.path), culprit).proposals}
    assert copy not in by_sha
    assert "reference" in signals(by_sha[cause]) and by_sha[cause].features["cites_cause"] == 1.0
    assert by_sha[qualified].features["cites_cause"] == 1.0  # owner/repo#N: as hide_citation reads it
    assert "cites_cause" not in by_sha[follow].features and by_sha[follow].features["follow_up"] == 1.0
    assert by_sha[cause].confidence > by_sha[follow].confidence  # the fitted weights read the difference


def test_a_commit_the_still_bad_end_holds_is_never_proposed(tmp_path):
    """A plain line: the culprit, later edits of its lines up to the bad end, the real fix after it.
    The bad end is still bad with those edits, so none of them can be its fix: only the fix after
    the bad end is proposed, and the note says how many were left out and why."""
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    line = "    history = [t for t in token_ids if {}]\n"
    kept = ["t >= 0", "t > -1", "0 <= t"]  # each later edit rewrites the culprit's line
    inside = [hist.edit(f"[BugFix] Tidy the penalty history, part {n} (#{80 + n})", SAMPLER, line.format(old),
                        line.format(new)) for n, (old, new) in enumerate(itertools.pairwise(kept))]
    bad = hist.head()
    fix = hist.edit("Restore the history used by penalties (#90)", SAMPLER,
                    "    history = [t for t in token_ids if 0 <= t]\n", "    history = backfill(token_ids)\n")
    repo = git.Repo(hist.path)
    assert {s for p in propose_fixes(repo, culprit).proposals for s in p.shas} >= {*inside, fix}  # no bad end given
    report = propose_fixes(repo, culprit, bad=bad)
    assert [p.shas for p in report.proposals] == [[fix]]
    assert "2 later commits that touch the culprit are in the bad end" in report.note
    # With the bad end at the tip nothing is left to propose, and the note says why.
    at_tip = propose_fixes(repo, culprit, bad=fix)
    assert at_tip.proposals == [] and "3 later commits that touch the culprit are in the bad end" in at_tip.note
