"""A session is its whole request: `run --session` on a session that ran another request is
refused in one line naming the difference; the same request again is the same run."""

from __future__ import annotations

import json
import string
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bisect_npu.errors import UsageError
from bisect_npu.journal import Journal
from bisect_npu.level import SettingsLevel
from bisect_npu.orchestration.opening.open_session import open_new, request_difference
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.records import HeaderRecord
from bisect_npu.request import RunRequest, choices_of, flags
from bisect_npu.settings_journal import DifferenceRecord, SettingsHeader, SettingsJournal
from tests.helpers.cli_exit import run_cli
from tests.helpers.gitrepo import git, make_linear_repo

CHECK = {"check.sh": "grep -qx good state\n"}
TAGS = {1: "t1", 40: "t40"}


def two_repos_with_the_same_tags(tmp_path: Path) -> tuple[Path, list[str], Path, list[str]]:
    """Two histories with the same tag names whose culprits differ (17 and 29)."""
    one, other = tmp_path / "one", tmp_path / "other"
    shas_one = make_linear_repo(one, 45, culprit=17, tags=TAGS, files=lambda i: CHECK if i == 0 else {})
    shas_other = make_linear_repo(other, 45, culprit=29, tags=TAGS, titles=lambda i: f"Other change {i}",
                                  files=lambda i: CHECK if i == 0 else {})
    return one, shas_one, other, shas_other




def test_a_session_reused_from_another_repository_with_the_same_tags_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    one, shas_one, other, _shas_other = two_repos_with_the_same_tags(tmp_path)
    session = tmp_path / "session"
    monkeypatch.chdir(one)
    ask = ["--good", "t1", "--bad", "t40", "--cmd", "sh check.sh", "--session", str(session), "--no-fix", "--json"]
    code, out, err = run_cli(["run", "--repo", str(one), *ask], capsys)
    assert code == 0 and json.loads(out.splitlines()[-1])["culprit"] == shas_one[17], err

    monkeypatch.chdir(other)
    code, out, err = run_cli(["run", "--repo", str(other), *ask], capsys)
    assert code == 2, (out, err)
    assert shas_one[17][:12] not in out + err
    line = err.strip().splitlines()[-1]
    assert f"its repository is {one}, this request's {other}" in line
    assert f"bisect-npu resume --session {session.resolve()}" in line and "new session" in line

    # The same request again is the same run: its answer, read back.
    monkeypatch.chdir(one)
    code, out, err = run_cli(["run", "--repo", str(one), *ask], capsys)
    assert code == 0 and json.loads(out.splitlines()[-1])["culprit"] == shas_one[17], err
    assert "already finished" in err


def test_a_new_command_on_an_existing_session_is_refused_not_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    one, _shas, _other, _ = two_repos_with_the_same_tags(tmp_path)
    session = tmp_path / "session"
    monkeypatch.chdir(one)
    # A session stopped before its first step (Ctrl-C as it opens): a journal, no verdict yet.
    header = open_new(SessionSpec.of(RunRequest.of(repo=str(one), good="t1", bad="t40", command=["sh", "check.sh"])),
                      session_dir=session)
    header.journal.close()
    code, _out, err = run_cli(["run", "--repo", str(one), "--good", "t1", "--bad", "t40", "--cmd", "grep -qx bad state",
                              "--session", str(session)], capsys)
    assert code == 2 and "its oracle is command sh check.sh, this request's command grep -qx bad state" in err
    assert len(Journal.open(session, read_only=True).entries) == 0  # nothing ran


# -- the property: for each field, a changed value is refused unless it is the same run ------------

FIELDS = {name: (part, info) for part, name, info, _flag in flags()}
Kept = tuple[HeaderRecord, RunRequest, Path, list[str]]
# Where and how fast candidates run, and which store is shared: not what a commit's run shows.
SAME_RUN = {"ray_address", "devices", "slots", "workdir", "prefetch", "cache_size_gb", "verdict_store"}


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Kept:
    """One session's header (a command session of 45 commits), the request that made it, its repository."""
    root = tmp_path_factory.mktemp("identity")
    one, _shas, other, _ = two_repos_with_the_same_tags(root)
    git(one, "branch", "also-t1", "t1")  # another name for the good end: the same run
    (one / "sub").mkdir()
    request = RunRequest.of(repo=str(one), good="t1", bad="t40", command=["grep", "-qx", "good", "state"],
                            verdict_store=None)
    opened = open_new(SessionSpec.of(request.model_copy(deep=True)), session_dir=root / "session")
    opened.journal.close()
    return opened.journal.header, request, one, [str(other), str(one / "sub")]


def rev_parse(repo: Path, ref: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", f"{ref}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


WORDS = st.text(string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=12)


def other_value(name: str, current: object, repos: list[str]) -> st.SearchStrategy[object]:
    """A value of field `name` other than `current`."""
    info = FIELDS[name][1]
    if name in ("good", "bad"):
        values: st.SearchStrategy[object] = st.sampled_from(["t1", "t40", "also-t1", "main", "main~3", "t2", "nope"])
    elif name == "repo":
        values = st.sampled_from(repos)
    elif name == "command":
        values = st.lists(WORDS, min_size=1, max_size=4)
    elif choices := choices_of(info):
        values = st.sampled_from(choices)
    elif isinstance(current, bool):
        values = st.just(not current)
    elif name in ("devices",):
        values = st.lists(st.integers(0, 7), min_size=1, max_size=4)
    elif name == "earlier_runs":
        values = st.lists(st.sampled_from(["8/10", "0/10", "3/4"]), min_size=2, max_size=2)
    elif isinstance(current, list):
        values = st.lists(WORDS, min_size=1, max_size=3)
    elif name in ("confidence",):
        values = st.floats(0.51, 0.99)
    elif isinstance(current, float) or name in ("slots", "fix_top"):
        values = st.integers(1, 5000)
    else:
        values = WORDS
    return values.filter(lambda value: value != current)


def changes_the_answer(name: str, before: object, after: object, repo: Path, header: HeaderRecord) -> bool:
    """Independently of the code under test: whether the changed field asks another run."""
    if name in SAME_RUN:
        return False
    if name in ("good", "bad"):
        assert isinstance(after, str)
        return rev_parse(repo, after) != (header.range.good if name == "good" else header.range.bad)
    if name == "repo":
        assert isinstance(after, str)
        return Path(git(Path(after), "rev-parse", "--show-toplevel")).resolve() != repo.resolve()
    if name == "mode":
        return after != header.request.search.mode
    return True


@pytest.mark.parametrize("name", sorted(FIELDS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reusing_a_session_with_one_field_changed_is_refused_or_the_same_run(
        name: str, data: st.DataObject, kept: Kept) -> None:
    header, request, repo, repos = kept
    part = FIELDS[name][0]
    before = getattr(getattr(request, part), name)
    after = data.draw(other_value(name, before, repos))
    raw = request.model_dump()
    raw[part][name] = after
    try:
        asked = RunRequest.model_validate(raw)
    except ValidationError:
        return  # a value the request itself refuses never reaches a session
    try:
        difference = request_difference(header, asked)
    except UsageError:
        difference = "refused"  # an end or a file that cannot be read: refused too
    if changes_the_answer(name, before, after, repo, header):
        assert difference is not None, (name, after)
    else:
        assert difference is None, (name, after, difference)


def test_the_request_that_made_a_session_is_the_same_run(kept: Kept) -> None:
    header, request, _repo, _ = kept
    assert request_difference(header, request) is None


# -- `settings --session`: the same, for a settings search ------------------------------------------

GOOD_SET = ["--recipe", "demo-async-penalty", "--good-set", "engine.args.async_scheduling=false"]


def settings_session(repo: Path, at: str, session: Path) -> None:
    """A settings search's journal as a search killed before its first configuration left it."""
    recipe = load_recipe("demo-async-penalty")
    commit = git(repo, "rev-parse", at)
    SettingsJournal.create(session, SettingsHeader(
        request=RunRequest.of(repo=str(repo), good=commit, bad=commit, recipe=str(recipe.source)),
        level=SettingsLevel(commit=commit, good_set=GOOD_SET[3:]), ref=at,
        recipe_digest=recipe.digest(), good_given=GOOD_SET[3:],
        differences=[DifferenceRecord(key="engine.args.async_scheduling", bad=True, good=False)])).close()


@pytest.mark.parametrize(("asked", "difference"), [
    (lambda one, other: ["--repo", str(other), "--at", "t40"], "its repository is {one}, this request's {other}"),
    (lambda one, other: ["--repo", str(one), "--at", "t1"], "its commit is {t40}, this request's {t1}"),
])
def test_settings_on_an_existing_search_with_another_repo_or_commit_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], asked: Any, difference: str) -> None:
    one, shas, other, _ = two_repos_with_the_same_tags(tmp_path)
    session = tmp_path / "search"
    settings_session(one, "t40", session)
    code, out, err = run_cli(["settings", *asked(one, other), *GOOD_SET, "--session", str(session),
                              "--no-verdict-store"], capsys)
    assert code == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert difference.format(one=one, other=other, t40=shas[40][:12], t1=shas[1][:12]) in line
    assert f"with --session {session.resolve()}" in line
    assert not (session / "configurations").exists()


def test_settings_on_a_commit_search_s_session_names_after_instead_of_crashing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    one, _shas, _other, _ = two_repos_with_the_same_tags(tmp_path)
    session = tmp_path / "session"
    monkeypatch.chdir(one)
    code, _out, err = run_cli(["run", "--repo", str(one), "--good", "t1", "--bad", "t40", "--cmd", "sh check.sh",
                               "--session", str(session), "--no-fix"], capsys)
    assert code == 0, err
    code, _out, err = run_cli(["settings", "--repo", str(one), "--at", "t40", *GOOD_SET, "--session", str(session),
                               "--no-verdict-store"], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"is a commit search's session, not a settings search's; search at its culprit with " \
           f"`bisect-npu settings --after {session.resolve()}`" in err.strip().splitlines()[-1]
    assert not (session / "settings.jsonl").exists()


def test_resume_after_the_bad_end_was_force_pushed_away_and_collected(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The bad end's branch reset to an older commit and `git gc` run: the session's end commit is no
    longer in the clone. Resume says which end is gone and how to get it back (exit 2), never a
    git traceback; the report still reads the session."""
    from tests.helpers.gitrepo import GOOD_CMD

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 8, culprit=5)
    git(repo, "checkout", "-q", "-b", "feature", shas[-1])
    git(repo, "checkout", "-q", "--detach", shas[0])
    git(repo, "branch", "-q", "-D", "main")
    code, _, err = run_cli(["run", "--repo", str(repo), "--good", shas[0], "--bad", "feature", "--cmd",
                            " ".join(GOOD_CMD), "--no-fix", "--no-verdict-store", "--session", str(tmp_path / "s")],
                           capsys)
    assert code == 0, err
    git(repo, "branch", "-q", "-f", "feature", shas[3])  # force-pushed to an older commit
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    code, _, err = run_cli(["resume", "--session", str(tmp_path / "s")], capsys)
    assert code == 2 and "Traceback" not in err, err
    assert (f"the session's bad end {shas[-1][:12]} (feature) is no longer in {repo} (a force-push and `git gc` drop "
            "commits no branch holds): fetch it back") in err
    assert run_cli(["report", "--session", str(tmp_path / "s")], capsys)[0] == 0
