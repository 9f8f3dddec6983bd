"""A tiny history builder for the fix tests: real git commits, branches and cherry-picks.

Each commit gets a fixed date one minute after the previous one, so shas and tie-breaks are
deterministic. Named test_fix_support so it belongs to the fix room's test files; it holds no tests.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SAMPLER = "vllm_ascend/sample/sampler.py"

SAMPLER_BASE = '''import math


def apply_penalties(logits, token_ids, penalty):
    history = backfill(token_ids)
    return scale(logits, history, penalty)


def backfill(token_ids):
    out = []
    for token in token_ids:
        out.append(token)
    return out


def scale(logits, history, penalty):
    for token in history:
        logits[token] = logits[token] / penalty
    return logits


def top_k(logits, k):
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    return order[:k]


def temperature(logits, value):
    return [x / value for x in logits]
'''


class History:
    """A git repository in `path` that tests grow commit by commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.clock = 1_750_000_000
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        env = dict(os.environ)
        when = f"{self.clock} +0000"
        env.update(GIT_AUTHOR_NAME="Dev", GIT_AUTHOR_EMAIL="dev@example.com", GIT_COMMITTER_NAME="Dev",
                   GIT_COMMITTER_EMAIL="dev@example.com", GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when,
                   GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
        done = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr}")
        return done.stdout.strip()

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def commit(self, title: str, files: dict[str, str | None], body: str = "") -> str:
        """Write (or delete, for None) `files` and commit them; return the new sha."""
        for name, text in files.items():
            target = self.path / name
            if text is None:
                self.git("rm", "-q", name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            self.git("add", name)
        self.clock += 60
        message = title + (f"\n\n{body}" if body else "")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def edit(self, title: str, name: str, old: str, new: str, body: str = "") -> str:
        """Replace `old` (which must occur exactly once) by `new` in `name` and commit."""
        text = self.read(name)
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {name}"
        return self.commit(title, {name: text.replace(old, new)}, body)

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def branch(self, name: str, at: str) -> None:
        self.git("branch", name, at)

    def checkout(self, name: str) -> None:
        self.git("checkout", "-q", name)

    def cherry_pick(self, sha: str, title: str) -> str:
        """Cherry-pick `sha` onto the current branch under a release-branch title (as upstream does)."""
        self.clock += 60
        self.git("cherry-pick", sha)
        self.git("commit", "-q", "--amend", "-m", title)
        return self.head()

    def revert(self, sha: str) -> str:
        self.clock += 60
        self.git("revert", "--no-edit", sha)
        return self.head()

    def filler(self, count: int, prefix: str = "Docs") -> list[str]:
        """Unrelated commits (another file), so the interesting ones are not simply the newest."""
        return [self.commit(f"[{prefix}] update notes {i} (#{900 + self.clock % 97 + i})",
                            {f"docs/notes{i}.md": f"note {i} at {self.clock}\n"}) for i in range(count)]


def base_history(path: Path) -> History:
    """main: a sampler module and a few unrelated commits."""
    hist = History(path)
    hist.commit("Initial sampler (#1)", {SAMPLER: SAMPLER_BASE, "README.md": "demo\n"})
    hist.filler(2)
    return hist


CULPRIT_TITLE = "[Perf] Skip back-fill of async placeholders in apply_penalties (#12)"


def add_culprit(hist: History) -> str:
    """The regression: the async back-fill is skipped, repetition_penalty sees no history."""
    return hist.edit(CULPRIT_TITLE, SAMPLER, "    history = backfill(token_ids)\n",
                     "    history = [t for t in token_ids if t >= 0]\n")
