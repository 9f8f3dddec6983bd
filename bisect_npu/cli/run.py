"""`bisect-npu run` and `bisect-npu resume`: map the flags to a request, call `bisect_npu.api`,
print the answer.

`run`'s options are made from the request's fields (`bisect_npu.request`: each field with a
`Flag`), so a new option is a new field there: its option here, its value in the request, its place
in the reproduce line (`RunRequest.run_argv`) and on the docs' command-line page follow.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bisect_npu.cli import note_session, reader_may_leave, started
from bisect_npu.cli.params import FiniteRange
from bisect_npu.request import FlagKind, RunRequest, choices_of, flags

if TYPE_CHECKING:
    from bisect_npu.api import Result


class _Parsed(click.ParamType[Any, Any]):
    """Option text to a request field's value, by a parser of `bisect_npu.api` (imported when an
    option is parsed: `--help` stays fast) that raises the library's UsageError, a click usage
    error here, so the message names the option."""

    def __init__(self, name: str, parse: Callable[[Any, str], Any]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already the field's value
        from bisect_npu import api

        try:
            return self.parse(api, value)
        except api.UsageError as exc:
            self.fail(str(exc), param, ctx)


PARAM_TYPES: dict[FlagKind, click.ParamType[Any, Any] | None] = {
    "text": None,
    "int>=0": click.IntRange(min=0),
    "int>=1": click.IntRange(min=1),
    "positive": FiniteRange(0, min_open=True),
    "confidence": FiniteRange(0.5, 1.0, min_open=True, max_open=True),
    "path": click.Path(),
    "file": _Parsed("file", lambda _api, text: str(Path(text).resolve())),
    "devices": _Parsed("devices", lambda api, text: api.parse_devices(text)),  # `--devices ""`: an error, not "none"
    "command": _Parsed("command", lambda api, text: api.command_words(text)),
    "size": _Parsed("size", lambda api, text: api.parse_size(text) / 2**30),
}


def param_name(part: str, field: str) -> str:
    return f"{part}__{field}"


Taken = Callable[[str, str], bool]  # (part, field) -> whether a command takes the field's option


def request_options(request_type: type[RunRequest] = RunRequest, taken: Taken | None = None) -> list[click.Option]:
    """One click option per flagged field of the request (and an `off` flag where the field has
    one), in the request's order; each option's parameter is named after its part and field.
    `taken`: the fields a command takes (`settings`: those a search at one commit reads), else all."""
    options: list[click.Option] = []
    for part, name, info, spec in flags(request_type):
        if taken is not None and not taken(part, name):
            continue
        # A field whose command default differs from its own (`Flag.default`) gets it in request_from.
        default = None if spec.default is not None else info.get_default(call_default_factory=True)
        details: dict[str, Any] = {"help": spec.help, "show_default": spec.show_default, "metavar": spec.metavar}
        choices = choices_of(info)
        if info.annotation is bool and "/" not in spec.names[0]:
            details["is_flag"] = True
        elif spec.nargs > 1:
            details["nargs"] = spec.nargs
            default = None
        elif isinstance(default, list) and spec.kind not in ("command", "devices"):
            details["multiple"] = True
        if choices is not None:
            details["type"] = click.Choice(choices)
        elif PARAM_TYPES[spec.kind] is not None:
            details["type"] = PARAM_TYPES[spec.kind]
        if spec.kind in ("command", "devices"):
            default = None  # absent: the field's own default
        options.append(click.Option([*spec.names, param_name(part, name)], default=default,
                                    required=info.is_required(), **details))
        if spec.off is not None:
            options.append(click.Option([spec.off, f"{param_name(part, name)}__off"], is_flag=True,
                                        help=spec.off_help))
    return options


def request_from(values: dict[str, Any], request_type: type[RunRequest] = RunRequest) -> RunRequest:
    """The request the flags ask for (`values`: click's parameters by name)."""
    return request_type.from_flags(request_parts(values, request_type))


def request_parts(values: dict[str, Any], request_type: type[RunRequest] = RunRequest,
                  taken: Taken | None = None) -> dict[str, dict[str, Any]]:
    """The request's fields the flags give, by part (`values`: click's parameters by name)."""
    parts: dict[str, dict[str, Any]] = {part: {} for part in request_type.model_fields}
    for part, name, _info, spec in flags(request_type):
        if taken is not None and not taken(part, name):
            continue
        value = values.pop(param_name(part, name))
        if spec.off is not None and values.pop(f"{param_name(part, name)}__off"):
            if value is not None:
                raise click.UsageError(f"{spec.name} and {spec.off} contradict each other; give one")
            parts[part][name] = None
            continue
        if value is None and spec.default is not None:
            param_type = PARAM_TYPES[spec.kind]
            value = spec.default() if param_type is None else param_type.convert(spec.default(), None, None)
        if isinstance(value, tuple):
            value = list(value)
        if value is not None:
            parts[part][name] = value
    return parts


def finish(result: Result, as_json: bool) -> None:
    """Print the answer (and a JSON summary as the last line), exit with its code."""
    with reader_may_leave():  # the answer's code still, when stdout's reader left
        click.echo(result.message)
        reused = json.loads(Path(result.report_json).read_text()).get("reused_verdicts", 0) if result.report_json else 0
        if reused:
            click.echo(f"{reused} verdict{'s' if reused != 1 else ''} reused from the store (run fresh with "
                       "--no-verdict-store)")
        if result.output_tail:
            tail = "\n".join(f"    {line}" for line in result.output_tail.splitlines())
            click.echo(f"its last lines of output:\n{tail}")
        click.echo(f"report: {result.report}")
        if as_json:
            summary = {"status": result.status, "exit_code": result.exit_code, "culprit": result.culprit,
                       "range": list(result.range) if result.range else None, "best_guess": result.best_guess,
                       "steps": result.steps,
                       "session": str(result.session_dir), "report": str(result.report),
                       "report_json": str(result.report_json)}
            click.echo(json.dumps(summary))
    raise SystemExit(result.exit_code)


def run_command(request_type: type[RunRequest] = RunRequest) -> click.Command:
    """`bisect-npu run` for a request type: its flags, then where the session goes and how the
    answer is printed."""

    def run(session_dir: Path | None, as_json: bool, quiet: bool, **values: Any) -> None:
        from bisect_npu import api

        request = request_from(values, request_type)
        finish(api.bisect(request, session_dir=session_dir, quiet=quiet or as_json, live=True,
                          on_session=started), as_json)

    return click.Command("run", callback=run, help="Bisect GOOD..BAD: find the first bad commit, propose its fix, "
                         "write the report.", params=[
        *request_options(request_type),
        click.Option(["--session", "session_dir"], type=click.Path(path_type=Path),
                     help="Session directory to create."),
        click.Option(["--json", "as_json"], is_flag=True, help="Print a machine-readable summary as the last line."),
        click.Option(["--quiet"], is_flag=True, help="Plain log lines even on a terminal."),
    ])


run = run_command()


@click.command()
@click.option("--session", "session_dir", type=click.Path(path_type=Path),
              help="Session directory (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary as the last line.")
@click.option("--quiet", is_flag=True, help="Plain log lines even on a terminal.")
@click.option("--accept-changed-command", is_flag=True,
              help="Continue though the --cmd script (or what else the command reads) changed since the session "
                   "started: a fix of the command that aborted the run, which judges every commit as before.")
def resume(session_dir: Path | None, as_json: bool, quiet: bool, accept_changed_command: bool) -> None:
    """Continue an interrupted session without redoing a finished step."""
    from bisect_npu import api

    if session_dir is not None:
        note_session(api.session_named(session_dir).resolve())  # named in a failure's summary, started or not
    finish(api.resume(session_dir, quiet=quiet or as_json, live=True, on_session=started,
                      accept_changed_command=accept_changed_command), as_json)

