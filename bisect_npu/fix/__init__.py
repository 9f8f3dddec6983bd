"""Propose the upstream commit that fixes a culprit, with reasons a reviewer can check, and verify it.

Why this shape: in vllm-ascend a fix lands weeks after the culprit, on main or a release branch or
both, often with a title that does not name the culprit. So candidates are every commit after the
culprit on every branch that holds it (or a cherry-pick of it), and each is scored on evidence:
line provenance (it edits the culprit's lines as they have moved since), explicit references,
locality (file, function, tests), the names the culprit changed, a bug-fix tag and the symptom's
words (BM25); a model fitted on real culprit -> fix pairs weighs them into a confidence. Twins (the same fix
cherry-picked to several branches) become one proposal. Everything is read with a handful of
`git log` calls over the whole range, never one call per commit, so 5,000 commits take seconds.

`verify_fixes` walks the ranking: it cherry-picks each proposal in turn onto the bad end in a throw-away
worktree and hands the new commit to the caller's evaluator (build, probe, oracle), so the proof uses
the normal pipeline, until one turns the bad end good.

Modules: `propose` ranks (its signals: `lines` blames forward, `evidence` reads names, symptom words
and changes that keep behaviour, `dependency` spots a bare version bump; `model` weighs them with
weights fitted on real history, `weights.json`), `gitlog` reads and parses git, `verify` applies and
evaluates, `results` holds what applying returns; the proposals, the report and the verifications are
data (`bisect_npu.fix_proposals`).
"""

from __future__ import annotations

from bisect_npu.defaults import VERIFY_TOP
from bisect_npu.fix.propose import (
    MIN_TITLE_REFERENCE,
    STRONG_SIGNALS,
    SYMPTOM_CAP,
    WEAK_SIGNALS,
    WEIGHTS,
    normalize_title,
    propose_fixes,
)
from bisect_npu.fix.results import AlreadyApplied, AppliedFix, ApplyConflict, ApplyResult
from bisect_npu.fix.verify import APPLY_NAME, apply_fix, verify_fixes
from bisect_npu.fix_proposals import (
    CulpritTwin,
    DependencyNote,
    FixProposal,
    FixReport,
    FixStatus,
    FixVerification,
    Reason,
)

__all__ = [
    "APPLY_NAME",
    "MIN_TITLE_REFERENCE",
    "STRONG_SIGNALS",
    "SYMPTOM_CAP",
    "VERIFY_TOP",
    "WEAK_SIGNALS",
    "WEIGHTS",
    "AlreadyApplied",
    "AppliedFix",
    "ApplyConflict",
    "ApplyResult",
    "CulpritTwin",
    "DependencyNote",
    "FixProposal",
    "FixReport",
    "FixStatus",
    "FixVerification",
    "Reason",
    "apply_fix",
    "normalize_title",
    "propose_fixes",
    "verify_fixes",
]
