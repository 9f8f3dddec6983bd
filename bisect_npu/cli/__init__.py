"""The command line: thin. Each command lives in its own module and calls library code.

Commands are imported lazily so `bisect-npu --help` stays fast and one room's heavy imports
(torch, docker) never slow another command down.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import select
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from bisect_npu import __version__, interrupts
from bisect_npu.errors import BisectError, InfrastructureError

COMMANDS: dict[str, str] = {
    "run": "bisect_npu.cli.run:run",
    "resume": "bisect_npu.cli.run:resume",
    "plan": "bisect_npu.cli.plan:plan",
    "report": "bisect_npu.cli.report:report",
    "judge": "bisect_npu.cli.judge:judge",
    "simulate": "bisect_npu.cli.simulate:simulate",
    "fix": "bisect_npu.cli.fix:fix",
    "recipes": "bisect_npu.cli.recipes:recipes",
    "doctor": "bisect_npu.cli.doctor:doctor",
    "demo": "bisect_npu.cli.demo:demo",
    "ci": "bisect_npu.cli.ci:ci",
    "settings": "bisect_npu.cli.settings:settings",
    "record": "bisect_npu.cli.align:record",
    "align": "bisect_npu.cli.align:align",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, target in COMMANDS.items()
                      if importlib.util.find_spec(target.split(":")[0]) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """A command whose stdout's reader left (`| head -1`) ends quietly, with 0 (a verdict
        command: 128, no verdict), not click's 1 for a broken pipe."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not _stdout_reader_gone():
                raise
            _stdout_gone()
            return _no_verdict([ctx.invoked_subcommand or ""], 0)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisect-npu")
def cli() -> None:
    """Find the commit that broke a model's output on Ascend NPUs, and the commit that fixes it."""


SESSION_COMMANDS = ("run", "resume", "demo", "settings")
# Commands whose exit code another bisector reads as a verdict (`git bisect run`: 0 good, 125 skip,
# 1-127 bad, >= 128 abort): anything that is not a verdict must end >= 128, or git would blame a commit.
VERDICT_COMMANDS = ("judge",)
NOT_A_VERDICT_EXIT = 128
JSON_COMMANDS = ("run", "resume", "settings")  # their --json promises a summary as the last line of stdout
_session: list[Path] = []  # the session a command works on, once it has one (for the interrupt's hint)
_kept: list[str] = []  # what a command without a session keeps when stopped, and how to go on (`note_kept`)
_found: set[Path] = set()  # --session directories that were there before the command: never removed


def note_session(session_dir: Path) -> None:
    """Commands call this once their session exists: a failure or an interrupt names it."""
    _session[:] = [session_dir]


def note_kept(how_to_go_on: str) -> None:
    """A command without a session (`record`) says what it keeps and how to go on: an interrupt or
    a crash prints it."""
    _kept[:] = [how_to_go_on]


def started(session_dir: Path) -> None:
    """A session exists: a failure or an interrupt from here on names it, and so does stderr."""
    note_session(session_dir)
    click.echo(f"session: {session_dir}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: a BisectError becomes one line on stderr and its exit code.

    SIGTERM unwinds like Ctrl-C (and neither is lost: `interrupts`), so worktrees, containers and
    locks are released either way.
    For `run`/`resume --json` stdout still ends with a JSON summary when they fail."""
    args = sys.argv[1:] if argv is None else argv
    _session.clear()  # a session noted by an earlier call in this process is not this one's
    _kept.clear()
    _found.clear()
    _found.update(_existing_sessions(args))
    interrupts.install()
    _closed_streams_to_devnull()
    stdout = sys.stdout
    sys.stdout = _GuardedStdout(stdout)
    try:
        _main(args)
    finally:
        sys.stdout = stdout


def _main(args: list[str]) -> None:
    try:
        # Without standalone mode click returns the code of a `ctx.exit(code)` instead of exiting.
        returned = cli.main(args=args, prog_name="bisect-npu", standalone_mode=False)
        sys.stdout.flush()  # what is still buffered is written now, where a failure can be reported
    except BisectError as exc:
        if args and args[0] in SESSION_COMMANDS and _session:
            _report_stop(_session[0], str(exc), exc.exit_code)
        _fail(args, f"bisect-npu: error: {exc}", exc.exit_code, "error", str(exc))
    except (click.exceptions.Abort, KeyboardInterrupt):
        hint = ""
        if args and args[0] in SESSION_COMMANDS and _session:
            again = ("the same `bisect-npu settings` command with --session {}" if args[0] == "settings"
                     else "`bisect-npu resume --session {}`").format(_session[0])
            hint = f"; finished steps and trials are kept: {again} continues"
            _report_stop(_session[0], "interrupted", 130)
        elif _kept:
            hint = f"; {_kept[0]}"
        _fail(args, f"bisect-npu: interrupted{hint}", 130, "interrupted", "interrupted")
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "bisect-npu"
        message = exc.format_message()
        _fail(args, f"bisect-npu: error: {message} (`{where} --help` lists the options)", 2, "error", message)
    except click.ClickException as exc:
        exc.show()
        sys.exit(_no_verdict(args, exc.exit_code))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:  # the file system refused (read-only, full, gone): this host's, not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        message = (f"{where}{exc.strerror or exc}; check that place (writable, room left, still there), then run "
                   "the command again")
        if args and args[0] in SESSION_COMMANDS and _session:
            _report_stop(_session[0], message, 5)
        _fail(args, f"bisect-npu: error: {message}", 5, "error", message)
    except Exception as exc:  # a bug: its traceback is what a report needs, and --json still ends stdout
        traceback.print_exc()
        kept = ""
        if args and args[0] in SESSION_COMMANDS and _session:
            _report_crash(_session[0], f"{type(exc).__name__}: {exc}")
            kept = f"; finished steps stay in the journal of {_session[0]}"
        elif _kept:
            kept = f"; {_kept[0]}"
        _fail(args, f"bisect-npu: internal error: {type(exc).__name__}: {exc} (the traceback above is what to "
              f"report{kept})", 1, "error", f"{type(exc).__name__}: {exc}")
    sys.exit(returned if isinstance(returned, int) else 0)


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """Output whose reader may go away before it ends (`| head -1`): the rest goes nowhere, and the
    command ends with its own exit code (a verdict's), not a traceback's 1."""
    try:
        yield
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        _stdout_gone()


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (a broken pipe elsewhere, a probe's socket,
    is another failure)."""
    poller = select.poll()
    poller.register(sys.__stdout__.fileno() if sys.__stdout__ is not None else 1, select.POLLOUT)
    return any(events & select.POLLERR for _fd, events in poller.poll(0))


def _stdout_gone() -> None:
    """Stdout's pipe is closed: what is still buffered or written later goes to /dev/null, so
    neither a later write nor the flush at exit fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
    os.close(devnull)


def _closed_streams_to_devnull() -> None:
    """A command started with stdout or stderr closed (`>&-`) writes them to /dev/null: neither
    `print` nor a file the command opens next may take the closed descriptor's number (a child
    would write its output into the journal)."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 - the process's own stream


def _report_crash(session_dir: Path, error: str) -> None:
    """The session's report says it crashed (not "still running"); a report that cannot be written
    leaves the traceback as the only word."""
    from bisect_npu.report import note_crash, write_reports

    try:
        note_crash(session_dir, error)
        write_reports(session_dir)
    except Exception:  # the crash being reported is what the user needs to see, not this one
        click.echo("bisect-npu: the crashed session's report could not be written", err=True)


def _report_stop(session_dir: Path, reason: str, exit_code: int) -> None:
    """The session's report says it stopped and why (not "still running"), as `_report_crash` does."""
    from bisect_npu.report import note_stop, write_reports

    if not (session_dir / "journal.jsonl").is_file():
        _drop_if_empty(session_dir)  # stopped before anything was journaled: no session to keep
        return
    try:
        note_stop(session_dir, reason, exit_code)
        write_reports(session_dir)
    except (BisectError, OSError):
        return  # a journal that cannot be read, a directory that cannot be written: the error says so already
    except Exception:  # the error being reported is what the user needs to see, not this one
        click.echo("bisect-npu: the stopped session's report could not be written", err=True)


def _existing_sessions(args: list[str]) -> set[Path]:
    """The directories `--session` names on the command line that exist before it runs."""
    named = [value for flag, value in itertools.pairwise(args) if flag == "--session"]
    named += [arg.split("=", 1)[1] for arg in args if arg.startswith("--session=")]
    found = set()
    for value in named:
        with contextlib.suppress(OSError, ValueError):
            if Path(value).is_dir():
                found.add(Path(value).resolve())
    return found


def _drop_if_empty(session_dir: Path) -> None:
    """Remove a session directory the command made and the error left with nothing in it (at most
    its lock); one that was there before (`resume` of an empty directory, a folder the user made)
    stays."""
    try:
        if not session_dir.is_dir() or {p.name for p in session_dir.iterdir()} - {"lock", "settings.lock"}:
            return
        if session_dir.resolve() in _found:
            return
        for leftover in session_dir.iterdir():
            leftover.unlink()
        session_dir.rmdir()
    except OSError:
        return  # another process took it over: it is not empty any more
    click.echo(f"bisect-npu: nothing was run; the session directory {session_dir} is removed", err=True)


def _no_verdict(args: list[str], code: int) -> int:
    """The exit code of a failure: a verdict command's ends >= 128 (130 stays the interrupt's)."""
    return max(code, NOT_A_VERDICT_EXIT) if args and args[0] in VERDICT_COMMANDS else code


class StdoutFailed(InfrastructureError):
    """Standard output could not be written (a full disk, `> /dev/full`, an I/O error): the
    command's output is lost, so it ends as an infrastructure error, not with its own code. A
    closed stdout, or one whose reader left, is not this (`reader_may_leave`)."""


class _GuardedStdout:
    """sys.stdout whose failed writes (other than a broken pipe) raise StdoutFailed: one line on
    stderr, never a traceback, and nothing more is written to it."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.failed = ""  # why it failed, once it has

    def write(self, text: str) -> int:
        return int(self._guarded(self.stream.write, text))

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call: Any, *args: Any) -> Any:
        if self.failed:  # every later write fails too (click probes the stream, and ignores a failed probe)
            raise StdoutFailed(self.failed)
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failed = (f"standard output cannot be written ({exc.strerror or exc}): the output is lost; write "
                           "it where there is room (another file or device), then run the command again")
            if self.stream is sys.__stdout__:  # what is still buffered goes nowhere at exit
                with contextlib.suppress(OSError, ValueError):
                    _stdout_gone()
            raise StdoutFailed(self.failed) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _fail(args: list[str], line: str, code: int, status: str, message: str) -> NoReturn:
    click.echo(line, err=True)
    failed = isinstance(sys.stdout, _GuardedStdout) and bool(sys.stdout.failed)
    if args and args[0] in JSON_COMMANDS and "--json" in args and not failed:
        click.echo(json.dumps({"status": status, "exit_code": code, "message": message, "culprit": None,
                               "session": str(_session[0]) if _session else None}))
    sys.exit(_no_verdict(args, code))
