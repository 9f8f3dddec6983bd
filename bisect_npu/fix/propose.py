"""Rank the later commits that fix a culprit: every commit after it on every branch that holds it (or a
twin) gets evidence a reviewer can check (its reasons, tallied in points by WEIGHTS) and a confidence
from the fitted model (fix/model.py) over that evidence, which orders the proposals."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import git

from bisect_npu.fix.dependency import dependency_note
from bisect_npu.fix.evidence import (
    BM25,
    COSMETIC_TITLE,
    changed_names,
    citation_hider,
    keeps_behaviour,
    touched_names,
    word_counts,
    words,
)
from bisect_npu.fix.gitlog import (
    DIFF_FORMAT,
    IGNORABLE_FILE,
    FileDiff,
    branch_refs,
    default_branch,
    logged_commits,
    parse_diffs,
    patch_ids,
    reachable,
    read_git,
    refs_containing,
    short_ref,
    show_commit,
)
from bisect_npu.fix.lines import PROXIMITY_LINES, LineHit, line_hits
from bisect_npu.fix.model import CONFIDENT, RankModel, load_model
from bisect_npu.fix_proposals import CulpritTwin, DependencyNote, FixProposal, FixReport, Reason, some_branches
from bisect_npu.upstream.history import PR_SUFFIX, LoggedCommit, github_url, pr_number, resolve_ref

# Score weights. Strong signals (each alone qualifies a commit) weigh more than all weak signals

# Points per reason: the tally a reviewer reads (FixProposal.score). Strong signals (each alone
# qualifies a commit) weigh more than all weak signals together (4 + 3 + 1.5 + 2 + 1.5 + 1.5 + 3 + 1 =
# 17.5 < 18). The order of the proposals is the fitted model's (fix/model.py), not these points.
WEIGHTS: dict[str, float] = {
    "revert": 30.0,  # Revert "<culprit title>" / This reverts commit <culprit sha>
    "provenance": 20.0,  # changes or deletes lines the culprit added or changed
    "reference": 18.0,  # names the culprit's PR (#N), sha or title
    "proximity": 4.0,  # edits within PROXIMITY_LINES of the culprit's lines, no overlap
    "same_function": 3.0,  # hunk in a function the culprit changed
    "same_file": 1.5,  # touches a file the culprit changed
    "names": 2.0,  # changes or names functions, attributes, config keys the culprit introduced or changed
    "tests": 1.5,  # adds/changes a test that names the touched module or functions
    "tag": 1.5,  # [BugFix], fix: ... in the title
    "symptom": 1.0,  # per distinct symptom keyword, at most SYMPTOM_CAP keywords
    "twins": 1.0,  # present on more than one branch: maintainers thought it worth back-porting
}
STRONG_SIGNALS = ("revert", "provenance", "reference")
WEAK_SIGNALS = ("proximity", "same_function", "same_file", "names", "tests", "tag", "symptom", "twins")
SYMPTOM_CAP = 3
MIN_TITLE_REFERENCE = 16  # shorter culprit titles are too generic to count as a reference
RARE_NAME_SHARE = 0.05  # a culprit name on more of the candidates' diffs than this is too common to tie them
MAX_TEXT_LINES = 2000  # changed lines of a candidate read for the symptom: a 10,000-line commit is not 5x as relevant
MAX_GROUPED = 80  # candidates (best first) whose twins are looked for; the rest stay single
_GENERIC_FUNCTIONS = frozenset({"__init__", "main", "forward", "setup", "run", "test", "call", "init"})

_FUNC_NAME = re.compile(r"\b(?:def|class|fn|func|function|void|int|auto)\s+([A-Za-z_]\w*)")
_DEF_LINE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")
_TAG = re.compile(r"\[\s*(?:bug\s*-?\s*fix|hot\s*-?\s*fix|fix(?:es|ed)?|bug)\s*\]|^\s*(?:bug|hot)?fix(?:\([^)]*\))?!?:",
                  re.IGNORECASE)
_LEADING_TAGS = re.compile(r"^(?:\s*\[[^\]]*\])+\s*")
_VERSION_TAG = re.compile(r"\[\s*(?:v?\d+(?:\.\d+)+\S*|main|[\w.-]*-dev|releases?(?:/[\w.-]+|[\w.-]*))\s*\]",
                          re.IGNORECASE)
# Trailing parentheses that cite PRs, `(#N)`, `(from #N)`, `(reverts #N)`: a back-port's title adds them.
_CITING_SUFFIX = re.compile(r"(?:\s*\([^()]*#\d+\))+\s*$")
_REVERT_TITLE = re.compile(r'^Revert\s+"(.+)"(?:\s*\(#\d+\))?\s*$')
_REVERTS_COMMIT = re.compile(r"This reverts commit ([0-9a-f]{7,40})", re.IGNORECASE)
_CHERRY_PICKED = re.compile(r"cherry picked from commit ([0-9a-f]{7,40})", re.IGNORECASE)
_HEX_WORD = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{7,40}(?![0-9a-zA-Z])")
# How a message cites a commit decides what it says of it: a cause ("introduced by #N", "reverts #N") or
# a copy ("cherry-pick from #N": the commit IS that change on another branch, not a fix of it).
_CAUSE_WORDS = re.compile(r"introduc|caus|regress|brok|break|revert|restor|roll\s*-?\s*back|\bfix|\bbug|mistake|wrong|"
                          r"error|fail|crash", re.IGNORECASE)
_COPY_PHRASE = re.compile(r"(?:cherry[\s-]*pick(?:ed)?|back[\s-]*port(?:ed)?|port(?:ed)?|picked)\s+(?:from|of)\s*:?\s*$"
                          r"|\(\s*from\s*$", re.IGNORECASE)
# A change that builds on the culprit rather than repairing it.
FOLLOW_UP = re.compile(r"follow[\s-]*ups?|based\s+on|continu\w*|part\s+\d|\[\d+/\w+\]|\b\d+/n\b|optimi[sz]\w*|"
                       r"perf(?:ormance)?\b|\bsupports?\b|\bfeat(?:ure)?\b|refactor\w*|\benable\w*", re.IGNORECASE)
_TEST_PATH = re.compile(r"(?:^|/)tests?/|(?:^|/)test_[^/]*$|_test\.\w+$")
_WORD = re.compile(r"\w+")
# Test files whose added lines can name a module or function (not the data files tests keep).
_TEST_SOURCE = re.compile(r"\.(?:py|pyi|c|cc|cpp|h|hpp|sh|ya?ml|json|toml)$")


@dataclass
class _Anchor:
    """The culprit, or one of its cherry-picks, with what the signals compare against."""

    commit: LoggedCommit
    diffs: list[FileDiff]
    refs: list[str]  # refs (full names) that contain it
    hidden: bool = False  # its citations are hidden from the signals (hide_citation_of)

    @cached_property
    def plain_title(self) -> str:
        return normalize_title(self.commit.title)

    @cached_property
    def pr(self) -> int | None:
        return pr_number(self.commit.title)

    @property
    def paths(self) -> set[str]:
        return {p for d in self.diffs for p in (d.old_path, d.new_path) if p}

    @cached_property
    def functions(self) -> set[str]:
        """Functions it changed: hunk-header context (`@@ ... @@ def foo`) and definitions it edited."""
        found: set[str] = set()
        for hunk in (h for d in self.diffs for h in d.hunks):
            found.update(_FUNC_NAME.findall(hunk.header))
            found.update(m[1] for text in hunk.added + hunk.removed if (m := _DEF_LINE.match(text)))
        return found

    @cached_property
    def names(self) -> set[str]:
        """Functions, attributes, config keys it introduced or changed."""
        return changed_names(self.diffs)

    @cached_property
    def tracked_lines(self) -> int:
        return sum(h.new_len for d in self.diffs for h in d.hunks if d.new_path) or 1

    def visible(self, message: str) -> str:
        """`message` as the signals may read it: without this anchor's citation when it is hidden."""
        if not self.hidden:
            return message
        return self.hider(message)

    @cached_property
    def hider(self) -> Callable[[str], str]:
        return citation_hider(self.commit.sha, self.commit.title, self.pr, self.plain_title)


@dataclass
class _Candidate:
    commit: LoggedCommit
    reasons: dict[str, Reason] = field(default_factory=dict)
    features: dict[str, float] = field(default_factory=dict)
    text: str = ""  # message (citations hidden as asked) and changed lines: what BM25 reads
    names: set[str] = field(default_factory=set)  # names on its changed lines (the culprit's files)
    cosmetic: bool = False  # changes no behaviour: a typo, format or rename commit
    reverts: set[str] = field(default_factory=set)  # the anchors (culprit, twins) it reverts

    def add(self, signal: str, detail: str, weight: float | None = None) -> None:
        weight = WEIGHTS[signal] if weight is None else weight
        old = self.reasons.get(signal)
        if old is None or weight > old.weight:
            self.reasons[signal] = Reason(signal, detail, weight)

    def feature(self, name: str, value: float) -> None:
        self.features[name] = max(self.features.get(name, 0.0), value)

    @property
    def qualifies(self) -> bool:
        """Strong evidence, or locality backed by the symptom or a bug-fix tag; never a change that keeps
        behaviour (a typo fix or a rename editing the culprit's lines repairs nothing)."""
        signals = self.reasons.keys()
        if self.cosmetic and not ({"revert", "reference"} & signals):
            return False
        if any(s in signals for s in STRONG_SIGNALS):
            return True
        backed = "symptom" in signals or "tag" in signals
        if "proximity" in signals or "names" in signals:
            return backed
        return "same_function" in signals and "symptom" in signals


def propose_fixes(
    repo: git.Repo,
    culprit: str,
    *,
    bad: str | None = None,
    symptom: Sequence[str] = (),
    evidence_keywords: Sequence[str] = (),
    top: int = 5,
    hide_citation_of: str | None = None,
    model: RankModel | None = None,
) -> FixReport:
    """Rank the later commits that fix `culprit`, most likely first (the fitted model over the evidence).

    `hide_citation_of` (the culprit, or a twin of it) makes the signals blind to what cites that commit:
    its PR number, sha and title in a message, and the revert relation. It measures what the ranking
    knows when a fix does not cite its culprit (bench/fix_eval.py); the repository is never changed.
    """
    model = model or load_model()
    culprit_sha = resolve_ref(repo, culprit)
    bad_sha = resolve_ref(repo, bad) if bad else None
    hidden_sha = resolve_ref(repo, hide_citation_of) if hide_citation_of else None
    refs = branch_refs(repo)
    culprit_commit, culprit_diffs = show_commit(repo, culprit_sha)
    dependency = dependency_note(culprit_diffs)

    containing = refs_containing(repo, culprit_sha, refs)
    anchors = [_Anchor(culprit_commit, culprit_diffs, containing)]
    twin_shas = _find_twins(repo, culprit_commit, culprit_diffs, [r for r in refs if r not in containing])
    for sha in twin_shas:
        commit, diffs = show_commit(repo, sha)
        anchors.append(_Anchor(commit, diffs, refs_containing(repo, sha, refs)))
    if hidden_sha in {a.commit.sha for a in anchors}:
        for anchor in anchors:
            anchor.hidden = True  # a twin cites the same change: hiding one citation hides them all
    excluded = {culprit_sha, *twin_shas}

    candidates: dict[str, _Candidate] = {}
    for anchor in anchors:
        tips = anchor.refs + ([bad_sha] if bad_sha and anchor is anchors[0] and not anchor.refs else [])
        if not tips:
            continue
        for cand in _score_anchor(repo, anchor, anchors, tips, excluded):
            known = candidates.setdefault(cand.commit.sha, _Candidate(cand.commit, text=cand.text))
            for reason in cand.reasons.values():
                known.add(reason.signal, reason.detail, reason.weight)
            for name, value in cand.features.items():
                known.feature(name, value)
            known.names |= cand.names
            known.reverts |= cand.reverts
            known.cosmetic = known.cosmetic or cand.cosmetic
            known.text = max(known.text, cand.text, key=len)

    pool = list(candidates.values())
    _symptom_relevance(pool, [*symptom, *evidence_keywords])
    qualified = [c for c in pool if c.qualifies]
    in_bad = reachable(repo, bad_sha, culprit_sha) if bad_sha else set()
    membership = _branch_members(repo, refs, culprit_sha)
    # The user's own branches: those holding the bad end (else the culprit). A change on several
    # branches is named by its commit there, the one a fix on the user's branch would be.
    own = {short_ref(r) for r in (refs_containing(repo, bad_sha, refs) if bad_sha else []) or anchors[0].refs}
    proposals, held = _group_twins(repo, qualified, refs, membership, in_bad, model, culprit_commit.time, own)
    all_anchor_refs = sorted({r for a in anchors for r in a.refs})
    base = github_url(repo)
    for proposal in proposals:
        proposal.missing_on = [short_ref(r) for r in all_anchor_refs if short_ref(r) not in proposal.branches]
        proposal.pr_url = f"{base}/pull/{proposal.pr}" if base and proposal.pr else None
    confidences = model.confidences([p.model_score for p in proposals])
    for proposal, confidence in zip(proposals, confidences, strict=True):
        proposal.confidence = round(confidence, 4)
    # Ties: a fix on the user's branch before one only on a twin's branch, then the older fix.
    proposals.sort(key=lambda p: (-p.model_score, -p.score, not own & set(p.branches), p.date, p.shas[0]))
    proposals = proposals[:top] if top > 0 else proposals

    twins = [
        CulpritTwin(a.commit.sha, [short_ref(r) for r in a.refs],
                    fixed=any(set(map(short_ref, a.refs)) & set(p.branches) for p in proposals))
        for a in anchors[1:]
    ]
    branch_tips = {short_ref(r): refs[r] for r in all_anchor_refs}
    confident = bool(proposals) and proposals[0].confidence >= CONFIDENT
    note = _note(proposals, dependency, twins, branch_tips, confident)
    if held:
        note += (f"; {held} later commit{'s' if held != 1 else ''} that touch the culprit "
                 f"{'are' if held != 1 else 'is'} in the bad end {bad_sha[:10] if bad_sha else ''}, which is still "
                 f"bad with {'them' if held != 1 else 'it'}: not proposed")
    return FixReport(culprit_sha, proposals, dependency, note, twins, branch_tips, confident)


def _note(proposals: list[FixProposal], dependency: DependencyNote | None,
          twins: list[CulpritTwin], tips: dict[str, str], confident: bool) -> str:
    parts = [dependency.message] if dependency else []
    if proposals and confident:
        best = proposals[0]
        parts.append(f"{len(proposals)} proposal(s); best: {best.shas[0][:10]} {best.title} "
                     f"(confidence {best.confidence:.0%}, on {some_branches(best.branches) or 'no branch'})")
    elif proposals:
        best = proposals[0]
        parts.append(f"no confident fix upstream: {len(proposals)} lead(s), the best {best.shas[0][:10]} "
                     f"{best.title} (confidence {best.confidence:.0%}); check them before applying one")
    else:
        as_of = some_branches([f"{name}@{sha[:10]}" for name, sha in sorted(tips.items())]) or "no branch holds it"
        parts.append(f"no later commit touches the culprit's lines or names it; "
                     f"no fix found upstream as of {as_of}")
    for twin in twins:
        if not twin.fixed:
            parts.append(f"the culprit was cherry-picked to {some_branches(twin.branches)} as {twin.sha[:10]}: "
                         f"the fix is needed there too")
    return "; ".join(parts)


def normalize_title(title: str) -> str:
    """Title without branch tags, a leading tag block and trailing PR citations (`(#N)`, `(from #N)`):
    equal across cherry-picks."""
    title = _CITING_SUFFIX.sub("", PR_SUFFIX.sub("", _VERSION_TAG.sub("", title)))
    title = _LEADING_TAGS.sub("", title)
    return re.sub(r"\s+", " ", title).strip().lower()


def _find_twins(repo: git.Repo, culprit: LoggedCommit, diffs: list[FileDiff], other_refs: list[str]) -> list[str]:
    """Cherry-picks of the culprit on branches that do not contain it: same title, patch-id or -x line."""
    if not other_refs:
        return []
    # No date filter: a back-port is often a new PR, so the original on main can be the older commit.
    meta = logged_commits(repo, "-M", *other_refs, "--not", culprit.sha)
    wanted_title = normalize_title(culprit.title)
    culprit_paths = {d.new_path or d.old_path for d in diffs}
    twins = []
    same_paths = []
    for commit in meta:
        picked = [m for m in _CHERRY_PICKED.findall(commit.message) if culprit.sha.startswith(m)]
        if picked or (wanted_title and normalize_title(commit.title) == wanted_title):
            twins.append(commit.sha)
        elif {new or old for _, old, new in commit.changes} == culprit_paths:
            same_paths.append(commit.sha)
    if same_paths:
        ids = patch_ids(repo, [culprit.sha, *same_paths])
        twins += [sha for sha in same_paths if ids.get(culprit.sha) and ids.get(sha) == ids[culprit.sha]]
    return twins


def _score_anchor(repo: git.Repo, anchor: _Anchor, anchors: list[_Anchor], tips: list[str],
                  excluded: set[str]) -> list[_Candidate]:
    """Score every commit after `anchor` on `tips` against it (and name references to any anchor)."""
    meta = logged_commits(repo, "--reverse", "--topo-order", "-M", *tips, "--not", anchor.commit.sha)
    meta = [c for c in meta if c.sha not in excluded]
    paths = _follow_renames(anchor.paths, meta)
    diffs = parse_diffs(read_git(repo, "log", "--reverse", "--topo-order", "-M", "--full-history",
                                 "--diff-merges=first-parent", "-U0", f"--format={DIFF_FORMAT}",
                                 *tips, "--not", anchor.commit.sha, "--", *sorted(paths))) if paths else {}
    hits = line_hits(anchor.commit, anchor.diffs, meta, diffs)
    all_functions = anchor.functions
    modules = {_module_name(p) for p in anchor.paths if p.endswith(".py")}

    located = []
    for commit in meta:
        cand = _Candidate(commit)
        _reference_signals(cand, anchors)
        own = diffs.get(commit.sha, [])
        _locality_signals(cand, anchor, hits.get(commit.sha), own, paths)
        # Touching one of the culprit's files and nothing more can never qualify: such commits (every
        # later edit of a big module) are not read further, which keeps a query on 5,000 commits fast.
        if set(cand.reasons) - {"same_file"} or cand.names & anchor.names:
            located.append(cand)
    test_diffs = _test_diffs(repo, [c.commit for c in located], paths)
    for cand in located:
        commit = cand.commit
        own = diffs.get(commit.sha, [])
        mentioned = _test_mentions(test_diffs.get(commit.sha, []), modules, all_functions)
        if mentioned:
            cand.add("tests", f"adds tests naming {', '.join(mentioned[:3])}")
            cand.feature("tests", 1.0)
        if _TAG.search(commit.title):
            cand.add("tag", f"bug-fix tag in the title: {commit.title[:60]!r}")
            cand.feature("tag", 1.0)
        if COSMETIC_TITLE.search(normalize_title(anchor.visible(commit.title))):
            cand.feature("cosmetic_title", 1.0)
        if FOLLOW_UP.search(re.sub(r'"[^"]*"?', "", anchor.visible(commit.title))):
            cand.feature("follow_up", 1.0)
        message = anchor.visible(commit.message)
        changed = [line for f in own + test_diffs.get(commit.sha, []) for h in f.hunks
                   for line in (h.header, *h.added, *h.removed)]
        cand.text = message + "\n" + "\n".join(changed[:MAX_TEXT_LINES])
        named = sorted(n for n in anchor.names & set(_WORD.findall(message)) if len(n) >= 6)
        if named:
            cand.feature("names_in_message", 1.0)
            cand.add("names", f"its message names {', '.join(named[:3])}, which the culprit changed")
        cand.feature("days", _days_feature(commit.time - anchor.commit.time))
    _name_signals(located, anchor)
    return located


def _days_feature(seconds: int) -> float:
    """Whole days after the culprit, log-scaled: a fix a week later and one a year later differ, two
    fixes an hour apart do not."""
    return math.log1p(max(seconds, 0) // 86400) / 6


def _locality_signals(cand: _Candidate, anchor: _Anchor, hit: LineHit | None, own: list[FileDiff],
                      paths: set[str]) -> None:
    """Where the commit edits relative to the culprit: its lines, next to them, its functions, its files."""
    commit = cand.commit
    if hit and (hit.changed or hit.restored or hit.rewritten):
        what = []
        if hit.changed:
            what.append(f"changes {hit.changed} line(s) the culprit wrote")
        if hit.rewritten:
            what.append(f"changes {hit.rewritten} line(s) written since in place of the culprit's")
        if hit.restored:
            what.append(f"re-adds lines where the culprit deleted {hit.restored} block(s)")
        removed = sum(h.old_len for f in own for h in f.hunks) + sum(1 for f in own for h in f.hunks if not h.old_len)
        explained = min(1.0, (hit.changed + hit.restored + hit.rewritten) / max(removed, 1))
        cand.add("provenance", "; ".join(what) + f" (blamed forward from {anchor.commit.sha[:10]}; "
                               f"{explained:.0%} of its edits there)")
        cand.feature("provenance", 1.0)
        cand.feature("explained", explained)
        cand.feature("coverage", min(1.0, hit.changed / anchor.tracked_lines))
    elif hit and hit.near:
        cand.add("proximity", f"edits within {PROXIMITY_LINES} lines of the culprit's lines ({hit.near} hunk(s))")
        cand.feature("proximity", 1.0)
    code_files = {p for _, old, new in commit.changes for p in (new or old,) if p and not IGNORABLE_FILE.search(p)}
    touched = sorted(p for p in code_files if p in paths)
    if touched:
        cand.add("same_file", f"touches {', '.join(touched[:3])}")
        cand.feature("file_share", len(touched) / len(code_files))
    same_funcs = sorted({name for fd in own for h in fd.hunks for name in _FUNC_NAME.findall(h.header)
                         if name in anchor.functions})
    if same_funcs:
        cand.add("same_function", f"changes {', '.join(same_funcs[:3])}, which the culprit changed")
        cand.feature("same_function", 1.0)
    if own:
        cand.names = touched_names(own)
        only_culprit_files = all(p in paths for p in code_files)
        cand.cosmetic = only_culprit_files and keeps_behaviour(own)


def _name_signals(candidates: list[_Candidate], anchor: _Anchor) -> None:
    """The culprit's names a candidate's changed lines touch, counting only names rare among the
    candidates (a name on every later diff of the file ties nothing to the culprit)."""
    if not candidates or not anchor.names:
        return
    frequency: Counter[str] = Counter()
    for cand in candidates:
        frequency.update(cand.names & anchor.names)
    limit = max(2, RARE_NAME_SHARE * len(candidates))
    for cand in candidates:
        shared = sorted(n for n in cand.names & anchor.names if frequency[n] <= limit)
        if not shared:
            continue
        cand.feature("names", math.log1p(len(shared)))
        cand.add("names", f"changes {', '.join(shared[:4])}, which the culprit introduced or changed")


def _symptom_relevance(candidates: list[_Candidate], keywords: Sequence[str]) -> None:
    """BM25 of each candidate's message and changed lines against the symptom words, as a share of the
    best candidate's (the scale of raw BM25 depends on the corpus); a keyword is mentioned when all
    its words are."""
    phrases = {k.strip(): words(k) for k in keywords if len(k.strip()) >= 3}
    query = [w for parts in phrases.values() for w in parts]
    if not candidates or not query:
        return
    index = BM25([word_counts(c.text) for c in candidates])
    scores = index.scores(query)
    best = max(scores)
    for at, (cand, score) in enumerate(zip(candidates, scores, strict=True)):
        if score <= 0:
            continue
        cand.feature("symptom", score / best)
        cand.feature("symptom_any", 1.0)
        present = set(index.matched(at, query))
        found = [k for k, parts in phrases.items() if parts and all(p in present for p in parts)]
        if found:
            cand.add("symptom", f"mentions {', '.join(found)}", WEIGHTS["symptom"] * min(len(found), SYMPTOM_CAP))


def _follow_renames(paths: set[str], meta: list[LoggedCommit]) -> set[str]:
    followed = set(paths)
    for commit in meta:
        for status, old, new in commit.changes:
            if status in "RC" and old in followed and new:
                followed.add(new)
    return followed


def _test_diffs(repo: git.Repo, meta: list[LoggedCommit], paths: set[str]) -> dict[str, list[FileDiff]]:
    """Diffs of the test files later commits add or change (only those commits, in a few calls)."""
    wanted: dict[str, set[str]] = {}
    for commit in meta:
        tests = {new for status, _, new in commit.changes
                 if new and status != "D" and _TEST_PATH.search(new) and _TEST_SOURCE.search(new)}
        tests -= paths
        if tests:
            wanted[commit.sha] = tests
    result: dict[str, list[FileDiff]] = {}
    shas = list(wanted)
    for start in range(0, len(shas), 500):
        batch = shas[start:start + 500]
        test_paths = sorted({p for sha in batch for p in wanted[sha]})
        out = read_git(repo, "show", "-U0", "--diff-merges=first-parent", f"--format={DIFF_FORMAT}",
                       *batch, "--", *test_paths)
        for sha, files in parse_diffs(out).items():
            result[sha] = [f for f in files if (f.new_path or "") in wanted.get(sha, ())]
    return result


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _test_mentions(files: list[FileDiff], modules: set[str], functions: set[str]) -> list[str]:
    text = "\n".join(line for f in files for h in f.hunks for line in h.added)
    if not text:
        return []
    names = [m for m in sorted(modules) if m and m in text]
    words_found = set(_WORD.findall(text))  # one pass over the text, not one regex per name (big culprits)
    names += [f for f in sorted(functions) if f not in _GENERIC_FUNCTIONS and len(f) >= 4
              and (f in words_found if _WORD.fullmatch(f) else re.search(rf"\b{re.escape(f)}\b", text))]
    return names


def _reference_signals(cand: _Candidate, anchors: list[_Anchor]) -> None:
    """Revert and reference signals; cheap substring checks first, since this runs for every commit.
    An anchor whose citation is hidden is neither reverted nor referenced, whatever the message says."""
    message = cand.commit.message
    lowered = message.lower()
    revert = _REVERT_TITLE.match(cand.commit.title)
    reverted = normalize_title(revert[1]) if revert else None
    reverts_shas = _REVERTS_COMMIT.findall(message) if "reverts commit" in lowered else []
    hex_words = _HEX_WORD.findall(lowered)
    own_title = normalize_title(cand.commit.title)
    by_title: set[str] = set()
    by_sha: set[str] = set()  # the precise one: copies of the culprit often share its title
    for anchor in anchors:
        if anchor.hidden:
            continue
        target, short, plain = anchor.commit, anchor.commit.sha[:10], anchor.plain_title
        if reverted is not None and reverted == plain:
            cand.add("revert", f'reverts "{target.title}" ({short})')
            by_title.add(target.sha)
        for sha in reverts_shas:
            if target.sha.startswith(sha.lower()):
                cand.add("revert", f"says 'This reverts commit {sha}' ({short})")
                by_sha.add(target.sha)
        pr = anchor.pr
        if pr is not None and str(pr) in message:
            fixes = re.search(rf"(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)\s*:?\s*#{pr}\b", message, re.IGNORECASE)
            if fixes:
                cand.add("reference", f"says {fixes[0]!r} (the culprit's PR)")
                cand.feature("cites_cause", 1.0)
            else:
                # `owner/repo#N` too: what hide_citation removes is what a reference reads.
                _cite(cand, message, re.compile(rf"(?<![\w/])(?:[\w.-]+/[\w.-]+)?#{pr}\b|/pull/{pr}\b"),
                      f"the culprit's PR #{pr}")
        if any(target.sha.startswith(word) for word in hex_words):
            _cite(cand, message, re.compile(rf"(?<![0-9a-zA-Z]){target.sha[:7]}[0-9a-f]*", re.IGNORECASE),
                  f"the culprit's sha {short}")
        if (len(plain) >= MIN_TITLE_REFERENCE and revert is None and own_title != plain
                and plain[:MIN_TITLE_REFERENCE] in lowered and plain in re.sub(r"\s+", " ", lowered)):
            cand.add("reference", f'quotes the culprit\'s title "{target.title}"')
    cand.reverts = by_sha or by_title
    for signal in ("revert", "reference"):
        if signal in cand.reasons:
            cand.feature(signal, 1.0)


def _cite(cand: _Candidate, message: str, pattern: re.Pattern[str], what: str) -> None:
    """A reference where the message names `what`, unless it names it as the change it copies ("cherry-pick
    from #N"); cites_cause when the line around it speaks of a bug or a revert, not of building on it."""
    for match in pattern.finditer(message):
        before = message[message.rfind("\n", 0, match.start()) + 1:match.start()]
        if _COPY_PHRASE.search(before):
            continue
        end = message.find("\n", match.end())
        line = before + message[match.start():end if end >= 0 else len(message)]
        cand.add("reference", f"names {what}")
        if _CAUSE_WORDS.search(line):
            cand.feature("cites_cause", 1.0)


def _branch_members(repo: git.Repo, refs: dict[str, str], culprit: str) -> dict[str, set[str]]:
    """Each branch's commits newer than the culprit's ancestry: one rev-list per branch, instead of a
    `--contains` walk per candidate (minutes on a big history without a commit-graph)."""
    return {ref: set(read_git(repo, "rev-list", sha, "--not", culprit).split()) for ref, sha in refs.items()}


def _group_twins(repo: git.Repo, qualified: list[_Candidate], refs: dict[str, str], membership: dict[str, set[str]],
                 in_bad: set[str], model: RankModel, culprit_time: int,
                 own: set[str]) -> tuple[list[FixProposal], int]:
    """One proposal per change: candidates with the same normalized title or patch-id merge (patch-ids
    of the MAX_GROUPED most likely only: a twin carries the same evidence, so it ranks near its pair), and
    so do the reverts of the culprit and of its twins (each branch reverting its own copy). A proposal is
    named by its member on the user's `own` branches, the others listed as also on their branches. A
    change whose every member the still-bad end holds (`in_bad`) is left out and counted: the second
    value returned."""
    parent = {c.commit.sha: c.commit.sha for c in qualified}

    def root(sha: str) -> str:
        while parent[sha] != sha:
            sha = parent[sha]
        return sha

    by_key: dict[tuple[str, str], str] = {}
    likely = sorted(qualified, key=lambda c: -model.score(c.features))[:MAX_GROUPED]
    ids = patch_ids(repo, [c.commit.sha for c in likely]) if len(likely) > 1 else {}
    for cand in qualified:
        keys = [("title", normalize_title(cand.commit.title))]
        pid = ids.get(cand.commit.sha)
        if pid:
            keys.append(("patch", pid))
        for key in keys:
            if not key[1]:
                continue
            if key in by_key:
                parent[root(cand.commit.sha)] = root(by_key[key])
            else:
                by_key[key] = cand.commit.sha
    # The first revert of each copy of the culprit (each branch reverting its own copy) is one change.
    first_reverts: dict[str, _Candidate] = {}
    for cand in sorted(qualified, key=lambda c: (c.commit.time, c.commit.sha)):
        for anchor in sorted(cand.reverts):
            first_reverts.setdefault(anchor, cand)
    chain = list(dict.fromkeys(c.commit.sha for c in first_reverts.values()))
    for sha in chain[1:]:
        if root(sha) != root(chain[0]):
            parent[root(sha)] = root(chain[0])
    groups: dict[str, list[_Candidate]] = {}
    for cand in qualified:
        groups.setdefault(root(cand.commit.sha), []).append(cand)

    default = default_branch(repo, refs)
    proposals = []
    held = 0
    for members in groups.values():
        if in_bad and all(m.commit.sha in in_bad for m in members):
            held += 1  # the bad end holds it and is still bad: whatever it repairs, not this regression
            continue
        members.sort(key=lambda c: (c.commit.time, c.commit.sha))
        best: dict[str, Reason] = {}
        features: dict[str, float] = {}
        for member in members:
            for signal, reason in member.reasons.items():
                if signal not in best or reason.weight > best[signal].weight:
                    best[signal] = reason
            for name, value in member.features.items():
                features[name] = max(features.get(name, 0.0), value)
        features["days"] = _days_feature(members[0].commit.time - culprit_time)
        where = {m.commit.sha: sorted(short_ref(r) for r, shas in membership.items() if m.commit.sha in shas)
                 for m in members}
        branches = sorted({b for names in where.values() for b in names})
        if len(branches) > 1 and len(members) > 1:
            best["twins"] = Reason("twins", f"the same change is on {len(branches)} branches: "
                                            f"{some_branches(branches)}", WEIGHTS["twins"])
            features["twins"] = 1.0
        reasons = sorted(best.values(), key=lambda r: (-r.weight, r.signal))
        # Name the change by its member on the user's branch (the commit to apply there; one already in
        # the bad end applies nothing), else by its upstream PR (the member on the default branch), else
        # by the oldest.
        named = min(members, key=lambda m: (m.commit.sha in in_bad, not own & set(where[m.commit.sha]),
                                            default not in where[m.commit.sha], m.commit.time, m.commit.sha)).commit
        proposals.append(FixProposal(
            shas=[named.sha] + [m.commit.sha for m in members if m.commit is not named],
            branches=branches, title=named.title,
            pr=pr_number(named.title), score=round(sum(r.weight for r in reasons), 3),
            reasons=reasons, date=members[0].commit.time, sha_branches=where,
            model_score=round(model.score(features), 6), features=features))
    return proposals, held
