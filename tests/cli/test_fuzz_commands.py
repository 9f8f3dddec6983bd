"""Every command of the command line and every one of its options and arguments fed hostile values
(hypothesis draws them: empty, huge, non-numbers, shell text, undecodable bytes, places that are
missing, not directories, under /proc or /sys, /dev/full), with standard output on a full device,
and into read-only directories: one line, never a traceback, and an exit code
docs/reference/exit-codes.md gives that command (read from the page itself).

Each command starts from a base invocation that reaches its body and ends there quickly (a
directory that is no repository, a missing session, a probe interpreter that exits at once), so a
value that is not refused by the option's type meets the command's own checks. The commands run
in this process (`bisect_npu.cli.main`, stdout and stderr captured, each call bounded by an alarm);
the read-only directories are real read-only mounts made for a subprocess (`unshare`), or, for a
user other than root, directories without write permission.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bisect_npu import api
from bisect_npu.cli import cli, main
from bisect_npu.observations import Observation
from bisect_npu.recipe.loader import bundled_recipes
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo
from tests.helpers.paths import REPO_ROOT
from tests.helpers.records import make_record

pytestmark = pytest.mark.e2e  # bisect-npu end to end, in this process and in subprocesses

EXIT_CODES_PAGE = REPO_ROOT / "docs" / "reference" / "exit-codes.md"
CODES = {0, 1, 2, 3, 4, 5, 125, 128, 130}  # every exit code the page speaks of
CALL_SECONDS = 60  # one call's bound: a hostile value fails fast, it does not start real work
TRACEBACK = "Traceback (most recent call last)"
# No shrinking: each example is a run of commands, and the failing invocation is printed whole.
FUZZ = settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@functools.cache
def documented_codes() -> dict[str, set[int]]:
    """Each command's exit codes as the page gives them: the first table for `run`, `resume` and
    `demo`, a row of "Other commands" for the rest (`recipes list/show` names two)."""
    text = EXIT_CODES_PAGE.read_text(encoding="utf-8")
    sessions, other = text.split("## Other commands")
    run_codes = {int(code) for code in re.findall(r"^\| (\d+) \|", sessions, re.MULTILINE)}
    codes = dict.fromkeys(("run", "resume", "demo"), run_codes)
    for names, said in re.findall(r"^\| (`[^|]*) \| (.*) \|$", other.split("\n## ")[0], re.MULTILINE):
        numbers = {int(n) for n in re.findall(r"(?<![\w.-])(\d{1,3})(?![\w.-])", said)} & CODES
        if "bisection's own code" in said:
            numbers |= run_codes
        for name in re.findall(r"`([^`]+)`", names):
            head, _, tails = name.partition(" ")
            for tail in tails.split("/") if tails else [""]:
                codes[f"{head} {tail}".strip()] = numbers
    return codes


def leaf_commands() -> dict[str, click.Command]:
    """Every command that runs (a group's subcommands, not the group), by its path."""
    context = click.Context(cli)
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: list[str]) -> None:
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            assert command is not None
            if isinstance(command, click.Group):
                walk(command, [*prefix, name])
            else:
                found[" ".join([*prefix, name])] = command

    walk(cli, [])
    return found


COMMANDS = leaf_commands()


@dataclass
class World:
    """The real things the base invocations name, made once: a repository, a finished session, an
    observation, a record, and places that cannot be used."""

    root: Path
    repo: Path
    shas: list[str]
    session: Path
    observation: Path
    record: Path
    plain: Path  # a directory that is no repository
    file: Path  # a regular file (a directory is expected under it below)
    stats: Counter[str] = field(default_factory=Counter)
    options: set[tuple[str, str]] = field(default_factory=set)

    def fresh(self) -> str:
        """A path not made yet (a session, a record's --out)."""
        return str(Path(tempfile.mkdtemp(dir=self.root / "fresh")) / "new")

    def places(self) -> list[str]:
        return [str(self.root / "missing" / "deeper"), str(self.file / "under-a-file"), "/proc/nope/x",
                "/sys/kernel/x", "/proc", "/dev/full", "/dev/null", str(self.plain), str(self.file), "/"]

    def bases(self) -> dict[str, dict[str, list[str]]]:
        """Per command, the options and arguments of an invocation that reaches its body and ends
        there quickly; hostile values replace one or more of them (or are added)."""
        plain, fresh = str(self.plain), self.fresh
        bundled = str(bundled_recipes()["demo-presence-penalty"])
        return {
            "run": {"--repo": [plain], "--good": ["a"], "--bad": ["b"], "--cmd": ["true"], "--session": [fresh()]},
            "resume": {"--session": [fresh()]},
            "demo": {"--case": ["no-such-case"], "--session-root": [fresh()]},
            "settings": {"--at": ["HEAD"], "--recipe": ["demo-async-penalty"],
                         "--good-set": ["cases[*].sampling.seed=1"], "--repo": [plain], "--session": [fresh()]},
            "fix": {"--culprit": ["HEAD"], "--repo": [plain]},
            "plan": {"--good": [self.shas[0]], "--bad": [self.shas[-1]], "--repo": [str(self.repo)], "--cmd": ["true"]},
            "simulate": {"--good": ["a"], "--bad": ["b"], "--culprit": ["c"], "--repo": [plain]},
            "report": {"--session": [str(self.session)]},
            "judge": {"--recipe": ["demo-presence-penalty"], "observations": [str(self.observation)]},
            "recipes list": {},
            "recipes show": {"recipe": ["demo-presence-penalty"]},
            "recipes validate": {"files": [bundled]},
            "recipes check": {"recipe": ["demo-async-penalty"], "--repo": [plain], "--at": ["HEAD"]},
            "recipes import-nightly": {"file": [str(self.root / "missing.yaml")]},
            "recipes lws": {"recipe": ["demo-presence-penalty"], "--image": ["localhost/candidate:1"]},
            "record": {"--recipe": ["demo-presence-penalty"], "--out": [fresh()], "--python": [shutil.which("false")
                                                                                             or "/bin/false"]},
            "align": {"reference": [str(self.record)], "candidate": [str(self.record)]},
            "doctor": {},
            "ci bisect": {"--bad": ["b"], "--repo": [plain], "--cmd": ["true"], "--executor": ["local"],
                          "--session": [fresh()]},
            "ci issue": {"--report-json": [str(self.session / "report.json")], "--repository": ["o/r"]},
            "ci comment": {"--body": ["/bisect x"], "--repo": [plain]},
        }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "fresh").mkdir()
    (root / "plain").mkdir()
    (root / "file").write_text("a file\n")
    shas = make_linear_repo(root / "repo", 4, culprit=2)
    before = {name: os.environ.get(name) for name in ("BISECT_NPU_CACHE", "PATH")}
    os.environ["BISECT_NPU_CACHE"] = str(root / "cache")
    os.environ["PATH"] = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)  # no `gh`: never GitHub
                                         if not (Path(d) / "gh").exists())
    here = Path.cwd()
    os.chdir(root / "plain")  # what a command makes in its directory stays here
    try:
        api.bisect(root / "repo", shas[0], shas[-1], oracle=list(GOOD_CMD), session_dir=root / "session", quiet=True,
                   propose_fix=False)
        observation = root / "obs.json"
        observation.write_text(Observation(commit="a" * 40, recipe="demo-presence-penalty", case_id="default",
                                           output_token_ids=[1, 2, 3], finish_reason="stop").model_dump_json())
        made = World(root, root / "repo", shas, root / "session", observation, make_record(root / "record"),
                     root / "plain", root / "file")
        yield made
        every = sum(len(keys_of(command)) for command in COMMANDS.values())
        print(f"\ncommand-line fuzz: {len({c for c, _ in made.options})} of {len(COMMANDS)} commands, "
              f"{len(made.options)} of {every} options and arguments, {made.stats['inputs']} inputs "
              f"({made.stats['full']} with stdout on /dev/full, "
              f"{made.stats['read-only']} into read-only directories), {made.stats['tracebacks']} tracebacks")
    finally:
        os.chdir(here)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class TooLong(BaseException):
    """A call ran past CALL_SECONDS (main() catches Exception, not this)."""


def invoke(argv: list[str], stdout: Any = None) -> tuple[int, str, str]:
    """`bisect-npu ARGV` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()

    def too_long(_signum: int, _frame: Any) -> None:
        raise TooLong(argv)

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(CALL_SECONDS)
    try:
        with redirect_stdout(stdout or out), redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def checked(world: World, path: str, argv: list[str], code: int, err: str) -> None:
    """A documented code, no traceback, an error said in a line of its own, nothing a shell would
    have run."""
    world.stats["inputs"] += 1
    if TRACEBACK in err or "internal error" in err:
        world.stats["tracebacks"] += 1
    said = f"bisect-npu {' '.join(argv)!r} -> {code}:\n{err[-3000:]}"
    assert TRACEBACK not in err and "internal error" not in err, said
    assert code in documented_codes()[path], said
    # `ci bisect`'s run writes to a stderr of its own; `doctor`'s 5 is its report of the host, on stdout.
    if (code in (2, 5) or (path == "judge" and code == 128)) and path not in ("ci bisect", "doctor"):
        assert re.search(r"^(bisect-npu: )?error: ", err, re.MULTILINE), said
    assert not (world.plain / "pwned").exists(), said


HOSTILE_TEXT = ["", " ", "-", "--", "-1", "0", "1e400", "nan", "-inf", "99999999999999999999999", "x" * 5000,
                "\u00fc\u2202\u202e", "\x1b[31mred", "..", "~", "HEAD^^^^^^^^^^^^", "a..b", "0-3,,", "x=y=z", "a::b",
                "${HOME}", "$(touch pwned)", "'; touch pwned #", '"', "\n", "\udcff\udcfe", "--help"]


def hostile(world: World) -> st.SearchStrategy[str]:
    printable = st.characters(codec="utf-8", exclude_characters="\x00")  # what argv can hold, decoded
    return (st.sampled_from(HOSTILE_TEXT + world.places()) | st.text(printable, max_size=40)
            | st.integers(-(10**30), 10**30).map(str) | st.floats().map(repr))


def argv_of(path: str, command: click.Command, given: dict[str, list[str]]) -> list[str]:
    """The words of an invocation: options (a flag by its name alone), then the arguments."""
    words, positional = path.split(), []
    for param in command.params:
        key = param.name if isinstance(param, click.Argument) else param.opts[0]
        if key not in given:
            continue
        if isinstance(param, click.Argument):
            positional += given[key]
        elif isinstance(param, click.Option) and param.is_flag:
            words.append(param.opts[0])
        else:
            step = max(param.nargs, 1)
            values = given[key]
            for at in range(0, len(values), step):
                words += [param.opts[0], *values[at:at + step]]
    return words + positional


def keys_of(command: click.Command) -> list[tuple[str, click.Parameter]]:
    return [(param.name if isinstance(param, click.Argument) else param.opts[0], param) for param in command.params
            if param.name not in ("help",) and (isinstance(param, click.Argument) or param.opts[0] != "--help")]


SPAWNING = {"ci bisect"}  # runs `bisect-npu run` in a child process per call: one example, not two


@pytest.mark.parametrize("path", sorted(set(COMMANDS) - SPAWNING))
@given(data=st.data())
@FUZZ
def test_every_option_takes_hostile_values_in_one_line(world: World, path: str, data: st.DataObject) -> None:
    """Each option and argument of the command alone, then a few at once, with hostile values."""
    fuzz_command(world, path, data)


@pytest.mark.parametrize("path", sorted(SPAWNING))
@given(data=st.data())
@settings(FUZZ, max_examples=1)
def test_every_option_of_a_spawning_command_takes_hostile_values(world: World, path: str,
                                                                 data: st.DataObject) -> None:
    fuzz_command(world, path, data)


def fuzz_command(world: World, path: str, data: st.DataObject) -> None:
    command = COMMANDS[path]
    base = world.bases()[path]
    keys = keys_of(command)
    values = hostile(world)
    alone = [[key] for key, _ in keys]
    together = [data.draw(st.lists(st.sampled_from([key for key, _ in keys]), min_size=2, max_size=3, unique=True))
                if len(keys) > 1 else []]
    for chosen in [*alone, *together]:
        given = dict(base)
        for key in chosen:
            param = dict(keys)[key]
            if isinstance(param, click.Option) and param.is_flag:
                given[key] = []
            else:
                given[key] = [data.draw(values) for _ in range(max(param.nargs, 1))]
            world.options.add((path, key))
        argv = argv_of(path, command, given)
        code, _out, err = invoke(argv)
        checked(world, path, argv, code, err)


def test_the_page_names_every_command(world: World) -> None:
    assert set(COMMANDS) <= set(documented_codes()), set(COMMANDS) - set(documented_codes())


OUTPUT_BASES = ["recipes list", "recipes show", "report", "judge", "plan", "doctor", "align", "recipes validate"]


@contextmanager
def full_device() -> Iterator[io.TextIOWrapper]:
    """/dev/full as a text stream that writes through (`> /dev/full` in this process: nothing is left
    buffered to fail again when the test closes it)."""
    with open("/dev/full", "wb", buffering=0) as raw:
        yield io.TextIOWrapper(raw, encoding="utf-8", write_through=True)


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_help_into_a_full_device_is_one_line(world: World, path: str) -> None:
    with full_device() as full:
        code, _, err = invoke([*path.split(), "--help"], stdout=full)
    world.stats["full"] += 1
    checked(world, path, [*path.split(), "--help"], code, err)
    assert code == (128 if path == "judge" else 5) and "standard output cannot be written" in err, err


@pytest.mark.parametrize("path", OUTPUT_BASES)
def test_output_into_a_full_device_is_one_line(world: World, path: str) -> None:
    """What each command prints, on a full device: exit 5 (judge: 128, no verdict), the output said lost."""
    argv = argv_of(path, COMMANDS[path], world.bases()[path])
    with full_device() as full:
        code, _, err = invoke(argv, stdout=full)
    world.stats["full"] += 1
    checked(world, path, argv, code, err)
    assert code == (128 if path == "judge" else 5) and "standard output cannot be written" in err, err


def read_only(directory: Path) -> list[str]:
    """The words that run a command with `directory` read-only: a read-only bind mount in a mount
    namespace of its own (root), or the directory's write permission taken away (any other user)."""
    if os.geteuid() != 0:
        for place in [directory, *directory.rglob("*")]:
            if place.is_dir():
                place.chmod(0o555)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): no read-only mount can be made here")
    return ["unshare", "--mount", "sh", "-c", 'd=$1; shift; mount --bind "$d" "$d" && '
            'mount -o remount,ro,bind "$d" "$d" && exec "$@"', "sh", str(directory)]


def read_only_cases(world: World, ro: Path, session: Path) -> list[tuple[str, list[str], set[int]]]:
    run = ["run", "--repo", str(world.repo), "--good", world.shas[0], "--bad", world.shas[-1], "--cmd",
           " ".join(GOOD_CMD), "--no-fix"]
    return [
        ("resume", ["resume", "--session", str(session)], {2}),
        ("run", [*run, "--session", str(session)], {2}),
        ("run", [*run, "--session", str(ro / "new")], {2}),
        ("record", ["record", "--recipe", "demo-presence-penalty", "--out", str(ro / "rec")], {2}),
        ("align", ["align", str(world.record), str(world.record), "--markdown", str(ro / "a.md")], {2}),
        ("demo", ["demo", "--session-root", str(ro / "demo")], {2}),
        ("report", ["report", "--session", str(session)], {0}),
        ("report", ["report", "--session", str(session), "-o", str(ro / "r.md")], {2}),
        ("settings", ["settings", "--at", world.shas[-1], "--recipe", "demo-async-penalty", "--good-set",
                      "cases[*].sampling.seed=1", "--repo", str(world.repo), "--session", str(ro / "s")], {2}),
    ]


def test_read_only_directories_are_one_line(world: World) -> None:
    """A session, record, session root or output file in a read-only directory: refused in one line
    (a finished session is still reported), nothing written there."""
    ro = world.root / "read-only"
    ro.mkdir()
    session = ro / "session"
    shutil.copytree(world.session, session)
    before = sorted(p.relative_to(ro) for p in ro.rglob("*"))
    prefix = read_only(ro)
    for path, argv, codes in read_only_cases(world, ro, session):
        done = subprocess.run([*prefix, sys.executable, "-m", "bisect_npu", *argv], cwd=world.plain,
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "BISECT_NPU_CACHE": str(world.root / "cache")})
        world.stats["read-only"] += 1
        checked(world, path, argv, done.returncode, done.stderr)
        assert done.returncode in codes, (argv, done.returncode, done.stderr[-2000:])
        if done.returncode:
            assert done.stderr.strip().splitlines()[-1].startswith("bisect-npu: error: "), done.stderr
    assert sorted(p.relative_to(ro) for p in ro.rglob("*")) == before
