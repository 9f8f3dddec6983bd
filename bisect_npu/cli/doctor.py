"""`bisect-npu doctor`: is this host ready to bisect? One line per check, with the fix when not.

Exit 0 when everything the chosen executor needs is there, 5 (infrastructure) otherwise. Only
what it needs is checked: `--executor local` (run's default) needs git, and the NPUs only with
`--npu` (`run --executor local --devices` on a host without containers); `docker` needs the
engine, its disk and, unless `--no-npu`, the NPUs.
"""

from __future__ import annotations

from typing import Literal

import click


@click.command()
@click.option("--executor", type=click.Choice(["local", "docker", "ray"]), default="local", show_default=True,
              help="Check what this executor needs, as `run` would use it (local: git; docker: the container "
                   "engine, disk and NPUs; ray: the cluster and each of its nodes).")
@click.option("--npu/--no-npu", default=None,
              help="Check the NPUs, driver and npu-smi [default: with --executor docker; --no-npu for containers on "
                   "the CPU (the demo), --npu for `run --executor local --devices`].")
@click.option("--ray-address", help="The Ray cluster for --executor ray [default: RAY_ADDRESS, else a local one].")
@click.option("--prune-venvs", "prune_days", type=click.FloatRange(min=0), metavar="DAYS",
              help="Remove the `run --unit-test` venvs (one per vLLM pin) not used for DAYS days.")
def doctor(executor: Literal["local", "docker", "ray"], npu: bool | None, ray_address: str | None,
           prune_days: float | None) -> None:
    """Check the container engine, NPUs, driver, disk and git; print a fix for each problem."""
    from bisect_npu import api

    answer = api.doctor(executor, npu=npu, ray_address=ray_address, prune_days=prune_days)
    for check in answer.checks:
        status = "OK" if check.ok else ("MISSING" if check.needed else "missing (not needed)")
        line = f"{status:<21} {check.name}: {check.detail}"
        if not check.ok:
            line += f"\n{'':<21} fix: {check.fix}"
        click.echo(line)
    if answer.failed:
        click.echo(f"not ready for --executor {executor}: {', '.join(answer.failed)}")
        raise SystemExit(5)
    click.echo(f"ready for --executor {executor}")
