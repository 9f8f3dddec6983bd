"""Evidence that survives months of rewrites: the names a culprit introduced or changed, symptom
relevance as BM25, a diff that changes no behaviour, and a fix's message with its citation hidden.

Line numbers drift and big culprits own hundreds of lines; names (functions, attributes, config keys)
and words (the symptom as a user writes it) stay. Nothing here is specific to one repository.
"""

from __future__ import annotations

import keyword
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from bisect_npu.fix.gitlog import IGNORABLE_FILE, FileDiff

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_COMMENT = re.compile(r"(?:#|//).*$")
# Names every diff is full of: they say nothing about which change a fix repairs.
_COMMON_NAMES = frozenset({
    *keyword.kwlist, "self", "cls", "None", "True", "False", "return", "print", "len", "range", "list", "dict",
    "int", "str", "float", "bool", "tuple", "set", "super", "torch", "Tensor", "tensor", "device", "dtype", "shape",
    "size", "args", "kwargs", "config", "kwarg", "value", "values", "result", "output", "input", "data", "name",
    "type", "isinstance", "getattr", "setattr", "hasattr", "assert", "logger", "import", "from", "const", "void",
    "auto", "static", "include", "define", "endif", "ifdef", "ifndef", "struct", "template", "typename", "namespace",
    "std", "nullptr", "uint32_t", "int64_t", "int32_t", "uint64_t", "forward", "__init__", "main", "test", "self_",
})
MIN_NAME = 4  # shorter names (i, x, ids) are too common to tie a fix to a culprit
# Titles of changes meant to keep behaviour: they can still be the fix, so this is a feature, not a verdict.
COSMETIC_TITLE = re.compile(r"\b(?:typos?|refactor\w*|renam\w*|clean\s*-?\s*ups?|reformat\w*|format(?:ting)?|lint\w*|"
                            r"style|docstrings?|comments?|spelling)\b", re.IGNORECASE)
_CODE_FILE = re.compile(r"\.(?:py|pyi|c|cc|cpp|cxx|h|hpp|cu|go|rs|java|js|ts|sh|ya?ml|json|toml|cfg|ini)$")


def words(text: str) -> list[str]:
    """Lower-case words of `text` for retrieval: snake_case and camelCase also split into their parts,
    so `repetition_penalty` matches "repetition penalty" and `AscendMetadata` matches "metadata"."""
    found: list[str] = []
    for token in _TOKEN.findall(text):
        found.extend(_parts(token))
    return found


def word_counts(text: str) -> Counter[str]:
    """`words(text)` counted: each distinct token split once (a diff repeats its tokens many times)."""
    counts: Counter[str] = Counter()
    for token, count in Counter(_TOKEN.findall(text)).items():
        for part in _parts(token):
            counts[part] += count
    return counts


def _parts(token: str) -> tuple[str, ...]:
    parts = _PARTS.get(token)
    if parts is None:
        lowered = token.lower()
        split = [p for p in re.split(r"_+", _CAMEL.sub("_", token).lower()) if p] if (
            "_" in token or not token.islower()) else []
        parts = _PARTS[token] = (lowered, *split) if len(split) > 1 else (lowered,)
    return parts


_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")
_PARTS: dict[str, tuple[str, ...]] = {}  # token -> its words; tokens repeat across a history's diffs


class BM25:
    """Okapi BM25 over a small corpus (the candidates of one culprit): the query's words scored by how
    rare they are among the candidates, saturating with repeats and normalised by document length."""

    def __init__(self, documents: Sequence[Sequence[str] | Counter[str]], k1: float = 1.2, b: float = 0.75) -> None:
        """`documents`: each a list of words, or their counts (word_counts)."""
        self.k1, self.b = k1, b
        self.counts = [doc if isinstance(doc, Counter) else Counter(doc) for doc in documents]
        self.lengths = [sum(counts.values()) for counts in self.counts]
        self.average = sum(self.lengths) / len(documents) if documents else 0.0
        frequency: Counter[str] = Counter()
        for counts in self.counts:
            frequency.update(counts.keys())
        total = len(documents)
        self.idf = {w: math.log(1 + (total - n + 0.5) / (n + 0.5)) for w, n in frequency.items()}

    def scores(self, query: Iterable[str]) -> list[float]:
        terms = [t for t in dict.fromkeys(query) if t in self.idf]
        result = []
        for counts, length in zip(self.counts, self.lengths, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / (self.average or 1))
            result.append(sum(self.idf[t] * counts[t] * (self.k1 + 1) / (counts[t] + norm)
                              for t in terms if counts[t]))
        return result

    def matched(self, index: int, query: Iterable[str]) -> list[str]:
        return [t for t in dict.fromkeys(query) if self.counts[index][t]]


def _code_lines(diffs: Iterable[FileDiff]) -> tuple[list[str], list[str]]:
    added: list[str] = []
    removed: list[str] = []
    for diff in diffs:
        path = diff.new_path or diff.old_path or ""
        if IGNORABLE_FILE.search(path) or not _CODE_FILE.search(path):
            continue
        for hunk in diff.hunks:
            added.extend(hunk.added)
            removed.extend(hunk.removed)
    return added, removed


def names_in(lines: Iterable[str]) -> set[str]:
    """Identifiers on code lines (and config keys in string literals), common ones left out."""
    found = set(_IDENTIFIER.findall("\n".join(lines)))  # one scan: a name never spans two lines
    return {name for name in found if len(name) >= MIN_NAME and name not in _COMMON_NAMES}


def specific(name: str) -> bool:
    """A compound or long name (`async_placeholder_ids`, `AscendMetadata`): a plain word (`batch`) is
    on too many unrelated lines to tie two commits together."""
    core = name.strip("_")
    return "_" in core or bool(re.search(r"[a-z][A-Z]", core)) or len(core) >= 10


def changed_names(diffs: Iterable[FileDiff]) -> set[str]:
    """The specific names a commit introduced, removed or re-wired: on its changed lines, not on both
    sides unchanged in count (a name merely carried along an edited line says less)."""
    added, removed = _code_lines(diffs)
    plus = Counter(n for line in added for n in names_in([line]) if specific(n))
    minus = Counter(n for line in removed for n in names_in([line]) if specific(n))
    return {n for n in plus.keys() | minus.keys() if plus[n] != minus[n]} or set(plus) | set(minus)


def touched_names(diffs: Iterable[FileDiff]) -> set[str]:
    """Every name on a commit's changed code lines."""
    added, removed = _code_lines(diffs)
    return names_in(added) | names_in(removed)


def _tokens(lines: Iterable[str]) -> list[str]:
    """Code tokens with comments and string contents left out."""
    tokens: list[str] = []
    for line in lines:
        code = _COMMENT.sub("", _STRING.sub('""', line)).strip()
        tokens.extend(re.findall(r"[A-Za-z_]\w*|\d+(?:\.\d+)?|\S", code))
    return tokens


def _same_up_to_renames(before: list[str], after: list[str]) -> bool:
    """Equal token sequences, except names renamed consistently: each old name always becomes the same
    new one, and is used at least twice (one swapped name, `g(x)` -> `backfill(x)`, is a change)."""
    if len(before) != len(after):
        return False
    renames: dict[str, str] = {}
    uses: Counter[str] = Counter()
    for old, new in zip(before, after, strict=True):
        if old == new:
            continue
        if not (_IDENTIFIER.fullmatch(old) and _IDENTIFIER.fullmatch(new)) or keyword.iskeyword(old):
            return False
        if renames.setdefault(old, new) != new:
            return False
        uses[old] += 1
    return all(count >= 2 for count in uses.values()) and len(set(renames.values())) == len(renames)


def keeps_behaviour(diffs: Sequence[FileDiff]) -> bool:
    """True when every code hunk only edits comments, whitespace or string text, or renames names
    consistently: a typo fix, a reformat or a rename, which cannot repair a regression."""
    code_hunks = [h for d in diffs if not IGNORABLE_FILE.search(d.new_path or d.old_path or "")
                  and _CODE_FILE.search(d.new_path or d.old_path or "") for h in d.hunks]
    if not code_hunks:
        return False
    return all(_same_up_to_renames(_tokens(h.removed), _tokens(h.added)) for h in code_hunks)


def hide_citation(message: str, sha: str, title: str, pr: int | None, normalized_title: str) -> str:
    """`message` without what cites the culprit: its PR number, its sha (any prefix of 7+) and its title,
    and a revert's `Revert "..."`/`This reverts commit` lines. What remains is what a fix that does
    not cite its culprit would say."""
    return citation_hider(sha, title, pr, normalized_title)(message)


def citation_hider(sha: str, title: str, pr: int | None, normalized_title: str) -> Callable[[str], str]:
    """hide_citation for one culprit, its patterns compiled once: it reads every later commit's message."""
    title_pattern = re.compile(re.escape(normalized_title).replace(r"\ ", r"\s+"), re.IGNORECASE) if (
        normalized_title and len(normalized_title) >= 8) else None
    pr_pattern = re.compile(rf"(?:[\w.-]+/[\w.-]+)?#{pr}\b|/pull/{pr}\b|\bPR\s*{pr}\b", re.IGNORECASE) if (
        pr is not None) else None

    def hide(message: str) -> str:
        text = message
        if "Revert" in message or _REVERTS_COMMIT.search(message):
            lines = []
            for line in message.split("\n"):
                if _REVERT_LINE.match(line) or _REVERTS_COMMIT.search(line):
                    line = _REVERT_TITLE_TEXT.sub("", line)
                    line = _REVERTS_COMMIT_SHA.sub("", line)
                lines.append(line)
            text = "\n".join(lines)
        if title:
            text = text.replace(title, "")
        if title_pattern is not None:
            text = title_pattern.sub("", text)
        text = _HEX.sub(lambda m: "" if sha.startswith(m[0].lower()) else m[0], text)
        if pr_pattern is not None:
            text = pr_pattern.sub("", text)
        return text

    return hide


_REVERT_LINE = re.compile(r'\s*Revert\s+"')
_REVERTS_COMMIT = re.compile(r"This reverts commit", re.IGNORECASE)
_REVERT_TITLE_TEXT = re.compile(r'Revert\s+"[^"]*"?')
_REVERTS_COMMIT_SHA = re.compile(r"This reverts commit\s+[0-9a-f]{7,40}\.?", re.IGNORECASE)
_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
