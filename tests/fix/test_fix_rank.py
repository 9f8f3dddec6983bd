"""The fix ranking's evidence that survives time, on histories made with real git: names, BM25, changes
that keep behaviour, hidden citations and the confidence that turns proposals into leads."""

from __future__ import annotations

import sys

import git
import numpy as np

from bisect_npu.fix import propose_fixes
from bisect_npu.fix.evidence import BM25, hide_citation, keeps_behaviour, words
from bisect_npu.fix.gitlog import FileDiff, Hunk
from bisect_npu.fix.model import CONFIDENT, FEATURES, RankModel, load_model
from tests.helpers.fix_history import CULPRIT_TITLE, SAMPLER, add_culprit, base_history
from tests.helpers.paths import REPO_ROOT

SYMPTOM = ("repetition_penalty", "async")
RESTORE = ("    history = [t for t in token_ids if t >= 0]\n", "    history = backfill(token_ids)\n")


def signals(proposal) -> set[str]:
    return {r.signal for r in proposal.reasons}


def hunk(removed: list[str], added: list[str]) -> FileDiff:
    return FileDiff("m.py", "m.py", [Hunk(1, len(removed), 1, len(added), "", removed, added)])


def test_words_split_snake_and_camel_case():
    assert words("AscendMetadata with_prefill_across_dp 910") == [
        "ascendmetadata", "ascend", "metadata", "with_prefill_across_dp", "with", "prefill", "across", "dp", "910"]


def test_bm25_prefers_the_rare_word_and_saturates_repeats():
    docs = [words("fix async crash"), words("async async async async update"), words("repetition penalty async")]
    scores = BM25(docs).scores(words("repetition_penalty async"))
    assert scores.index(max(scores)) == 2
    assert scores[1] < 2 * scores[0]


def test_keeps_behaviour_sees_typos_comments_and_consistent_renames_but_not_a_change():
    assert keeps_behaviour([hunk(["x = f(y)  # recieve"], ["x = f(y)  # receive"])])
    assert keeps_behaviour([hunk(["history = g(ids)", "return h(history)"], ["past = g(ids)", "return h(past)"])])
    assert keeps_behaviour([hunk(['raise ValueError("bad vlaue")'], ['raise ValueError("bad value")'])])
    assert not keeps_behaviour([hunk(["history = g(ids)"], ["history = backfill(ids)"])])
    assert not keeps_behaviour([hunk(["return h(a, b)"], ["return h(b, a)"])])


def test_hide_citation_strips_pr_sha_title_and_revert_lines():
    sha = "4453c60213aa0c57cb3e6c15a3ae1b9cc0c9e1d2"
    title = "[bugfix]limit graph replay sync (#5761)"
    message = (f'Revert "{title}" (#5965)\n\nThis reverts commit {sha}.\nreverts #5761 and '
               f"vllm-project/vllm-ascend#5761 ({sha[:9]}) to fix accuracy in piecewise graph mode; see #5800.")
    hidden = hide_citation(message, sha, title, 5761, "limit graph replay sync")
    assert "5761" not in hidden and sha[:9] not in hidden and "limit graph replay" not in hidden
    assert "reverts commit" not in hidden.lower()
    assert "accuracy in piecewise graph mode" in hidden and "#5800" in hidden


def test_a_typo_fix_and_a_rename_that_edit_the_culprits_lines_are_not_called_fixes(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = hist.edit(CULPRIT_TITLE, SAMPLER, "    history = backfill(token_ids)\n",
                        "    history = [t for t in token_ids if t >= 0]  # skip placehodlers\n")
    typo = hist.edit("[BugFix] Fix typo (#20)", SAMPLER, "# skip placehodlers", "# skip placeholders")
    rename = hist.commit("[Refactor] Rename history to past (#21)", {SAMPLER: hist.read(SAMPLER).replace(
        "    history = [t for t in token_ids if t >= 0]  # skip placeholders\n    return scale(logits, history,",
        "    past = [t for t in token_ids if t >= 0]  # skip placeholders\n    return scale(logits, past,")})
    fix = hist.edit("Restore the history used by penalties (#50)", SAMPLER,
                    "    past = [t for t in token_ids if t >= 0]  # skip placeholders\n",
                    "    past = backfill(token_ids)\n")
    report = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)
    shas = [p.shas[0] for p in report.proposals]
    assert shas == [fix]
    assert typo not in shas and rename not in shas


def test_hidden_citation_keeps_the_revert_by_its_evidence_and_drops_a_mere_reference(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    mention = hist.commit("Handle placeholder ids in the runner (#80)",
                          {"vllm_ascend/worker/runner.py": "def backfill_ids():\n    return []\n"},
                          body="Fixes #12: penalties saw no history under async scheduling.")
    hist.filler(2)
    revert = hist.revert(culprit)
    repo = git.Repo(hist.path)
    shown = propose_fixes(repo, culprit, symptom=SYMPTOM)
    assert {"revert", "reference"} <= signals(shown.proposals[0]) and shown.proposals[0].shas == [revert]
    assert mention in [p.shas[0] for p in shown.proposals]
    hidden = propose_fixes(repo, culprit, symptom=SYMPTOM, hide_citation_of=culprit)
    best = hidden.proposals[0]
    assert best.shas == [revert]
    assert not {"revert", "reference"} & signals(best)
    assert "provenance" in signals(best) and not best.features.get("revert")
    assert mention not in [p.shas[0] for p in hidden.proposals]  # only its citation tied it to the culprit
    assert repo.commit(revert).message.startswith(f'Revert "{CULPRIT_TITLE}"')  # the repository is unchanged


RUNNER = "vllm_ascend/worker/runner.py"
RUNNER_BASE = "".join(f"def step_{i}(batch):\n    return batch\n\n\n" for i in range(12))


def test_names_the_culprit_introduced_tie_a_fix_far_from_its_lines(tmp_path):
    hist = base_history(tmp_path / "up")
    hist.commit("[Feat] Runner steps (#2)", {RUNNER: RUNNER_BASE})
    culprit = hist.commit("[Feat] Async placeholders (#12)", {
        RUNNER: RUNNER_BASE.replace("def step_0(batch):\n    return batch\n",
                                    "def step_0(batch):\n    batch.async_placeholder_ids = []\n    return batch\n")})
    hist.filler(2)
    unrelated = hist.edit("[BugFix] Guard empty batches in step 9 (#30)", RUNNER,
                          "def step_9(batch):\n    return batch\n", "def step_9(batch):\n    return batch or []\n")
    fix = hist.edit("[BugFix] Fill placeholders before penalties (#31)", RUNNER,
                    "def step_10(batch):\n    return batch\n",
                    "def step_10(batch):\n    batch.async_placeholder_ids = fill(batch)\n    return batch\n")
    report = propose_fixes(git.Repo(hist.path), culprit, symptom=SYMPTOM)
    assert report.proposals and report.proposals[0].shas == [fix]
    assert "names" in signals(report.proposals[0]) and "provenance" not in signals(report.proposals[0])
    assert all(unrelated not in p.shas for p in report.proposals)


def test_a_lone_weak_lead_is_not_a_confident_fix(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    lead = hist.edit("[BugFix] Tidy the penalty scale (#40)", SAMPLER, "    return scale(logits, history, penalty)\n",
                     "    return scale(logits, list(history), penalty)\n")
    report = propose_fixes(git.Repo(hist.path), culprit)
    assert [p.shas for p in report.proposals] == [[lead]]
    assert report.proposals[0].confidence < CONFIDENT and not report.confident
    assert report.note.startswith("no confident fix upstream: 1 lead(s)")

    other = base_history(tmp_path / "other")
    reverted = add_culprit(other)
    other.revert(reverted)
    sure = propose_fixes(git.Repo(other.path), reverted)
    assert sure.confident and sure.proposals[0].confidence >= CONFIDENT
    assert sum(p.confidence for p in sure.proposals) <= 1.0


def test_the_shipped_weights_are_fitted_and_cover_every_feature():
    model = load_model()
    assert set(model.weights) == set(FEATURES)
    assert "train pairs" in model.trained_on
    assert model.weights["revert"] > 0 and model.weights["provenance"] > 0


def test_fit_learns_which_feature_marks_the_fix_and_when_none_is():
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from fix_logit import fit, vector

    def vector_matrix(rows):
        return np.array([vector(r) for r in rows])

    rng_rows = [{"provenance": 1.0, "tag": 1.0}, {"tag": 1.0}, {"symptom": 0.2}]
    queries = [(vector_matrix(rng_rows), 0) for _ in range(6)] + [(vector_matrix([{"tag": 1.0}]), None)] * 3
    weights, null_score = fit(queries, steps=600)
    model = RankModel(dict(zip(FEATURES, weights, strict=True)), null_score)
    assert model.weights["provenance"] > model.weights["symptom"]
    confident, weak = model.confidences([model.score(rng_rows[0]), model.score(rng_rows[1])])
    assert confident > 0.5 > weak

