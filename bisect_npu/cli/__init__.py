"""The command line: thin. Each command lives in its own module and calls library code.

Commands are imported lazily so `bisect-npu --help` stays fast and one room's heavy imports
(torch, docker) never slow another command down.
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys

import click

from bisect_npu import __version__
from bisect_npu.models import BisectError

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
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bisect-npu")
def cli() -> None:
    """Find the commit that broke a model's output on Ascend NPUs, and the commit that fixes it."""


SESSION_COMMANDS = ("run", "resume", "demo")


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point: a BisectError becomes one line on stderr and its exit code.

    SIGTERM unwinds like Ctrl-C, so worktrees, containers and locks are released either way."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        # Without standalone mode click returns the code of a `ctx.exit(code)` instead of exiting.
        returned = cli.main(args=args, prog_name="bisect-npu", standalone_mode=False)
    except BisectError as exc:
        click.echo(f"bisect-npu: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        hint = ("; finished steps and trials are kept: `bisect-npu resume` continues the latest session "
                "(--session DIR for another)") if args and args[0] in SESSION_COMMANDS else ""
        click.echo(f"bisect-npu: interrupted{hint}", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "bisect-npu"
        click.echo(f"bisect-npu: error: {exc.format_message()} (`{where} --help` lists the options)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(returned if isinstance(returned, int) else 0)
