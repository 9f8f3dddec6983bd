"""`bisect-npu recipes list/show/validate/check`: the bundled and user recipes, and what they will run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click

from bisect_npu.errors import UsageError


@click.group()
def recipes() -> None:
    """The bundled and user recipes: list them, show what one runs, validate files."""


@recipes.command("list")
@click.option("--dir", "dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Also list the recipes in this directory (repeatable).")
def list_recipes(dirs: tuple[Path, ...]) -> None:
    """Name, backend, oracle kinds and description of each recipe."""
    from bisect_npu import api

    rows = [(entry.name, "-", "-", f"INVALID: {entry.error}", entry.origin) if entry.error is not None else
            (entry.name, entry.backend, ",".join(entry.oracle), entry.description, entry.origin)
            for entry in api.list_recipes(dirs)]
    widths = [max(len(row[i]) for row in rows) for i in range(3)] if rows else [0, 0, 0]
    header = ("NAME", "BACKEND", "ORACLE")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + "  DESCRIPTION")
    for name, backend, kinds, description, origin in rows:
        suffix = "" if origin == "bundled" else f" [{origin}]"
        click.echo(f"{name.ljust(widths[0])}  {backend.ljust(widths[1])}  {kinds.ljust(widths[2])}  "
                   f"{description}{suffix}")


@recipes.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check recipe files; exit 2 with the first error (field and line) of each bad one."""
    from bisect_npu import api

    errors = []
    for validated in api.validate_recipes(files):
        if validated.recipe is None:
            errors.append(str(validated.error))
            continue
        recipe = validated.recipe
        click.echo(f"ok  {validated.path}  ({recipe.name}: {len(recipe.cases)} case(s), oracle "
                   f"{','.join(recipe.oracle.kinds)})")
    _fail_on(errors)


def _fail_on(errors: list[str]) -> None:
    """Every error but the last printed, the last raised: the CLI prints it and exits 2."""
    from bisect_npu.api import UsageError

    for error in errors[:-1]:
        click.echo(f"bisect-npu: error: {error}", err=True)
    if errors:
        raise UsageError(errors[-1])


@recipes.command("check")
@click.argument("recipe")
@click.option("--repo", required=True, help="Path or URL of the candidate repository (a vllm-ascend clone).")
@click.option("--at", "refs", multiple=True, required=True,
              help="A ref to check the recipe at (repeatable): a tag, branch or sha, e.g. both ends of a range.")
def check(recipe: str, repo: str, refs: tuple[str, ...]) -> None:
    """Check RECIPE's engine args against the candidate's own source at each --at ref; exit 2
    naming the field, the constraint, the upstream file and the fix when the candidate would
    refuse to start."""
    from bisect_npu import api

    failed = []
    for checked in api.check_recipe_at(recipe, repo, refs):
        where = f"{checked.recipe} at {checked.ref} ({checked.sha[:12]})"
        if not checked.findings and checked.concerning:
            click.echo(f"ok    {where}: {len(checked.concerning)} of {checked.rules} rules concern this recipe "
                       f"({', '.join(checked.concerning)}); none finds a problem")
        elif not checked.findings:
            click.echo(f"ok    {where}: no rule concerns this recipe (of the {checked.rules}), so nothing was "
                       "checked against the candidate's source")
        failed += [f"{where}: [{finding.rule}] {finding.describe()}" for finding in checked.findings]
    _fail_on(failed)


@recipes.command("show")
@click.argument("recipe")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(recipe: str, fmt: str) -> None:
    """What RECIPE (a bundled name or a file) will run: model, engine, env, cases as sent, oracle."""
    from bisect_npu import api

    plan = api.recipe_plan(recipe)
    if fmt == "json":
        click.echo(json.dumps(plan, indent=2))
        return
    click.echo(render_plan(plan))


@recipes.command("lws")
@click.argument("recipe")
@click.option("--image", required=True, help="The candidate's image every node runs, e.g. one `bisect-npu run "
                                             "--executor docker` built, pushed where the cluster pulls from.")
@click.option("--npu-resource", default="huawei.com/Ascend910", show_default=True,
              help="The extended resource the cluster's Ascend device plugin names NPUs by "
                   "(huawei.com/ascend-1980 on some A3 clusters).")
@click.option("--rpc-port", type=click.IntRange(1, 65535), default=13389, show_default=True,
              help="The port {rpc_port} takes (each pod has its own network, so a fixed one is free).")
@click.option("--host-type", type=click.Choice(["A2", "A3", "310P"]),
              help="The NPU hosts' type: its switches join the determinism ones (A3: HCCL_OP_EXPANSION_MODE=AIV), "
                   "as on a docker run there.")
@click.option("--name", help="The LeaderWorkerSet's name [default: the recipe's name as a Kubernetes name].")
def lws(recipe: str, image: str, npu_resource: str, rpc_port: int, host_type: str | None, name: str | None) -> None:
    """RECIPE's engine across nodes (engine.nodes) as a Kubernetes LeaderWorkerSet, in YAML for
    `kubectl apply -f -`: the serving node the leader, the headless nodes its workers."""
    import yaml

    from bisect_npu import api

    manifest = api.recipe_lws(recipe, image, npu_resource=npu_resource, rpc_port=rpc_port, name=name,
                               host=host_type)
    click.echo(yaml.safe_dump(manifest, sort_keys=False, width=120), nl=False)


def node_lines(nodes: list[dict[str, Any]]) -> list[str]:
    """An engine across hosts: each node's command, environment and container, one block each."""
    lines = []
    for node in nodes:
        lines.append(f"node {node['index']}   {node['role']}, {node['cards']} NPU: {shlex.join(node['command'])}")
        lines.extend(f"  env    {key}={value}" for key, value in node["environment"].items())
        lines.append(f"  container {node['container']}")
    return lines


def render_plan(plan: dict[str, Any]) -> str:
    lines = [f"recipe   {plan['name']}  ({plan['source']})", f"         {plan['description']}"]
    model = plan["model"]
    mount = f"  (host {model['host_path']}, read-only)" if model.get("host_path") else ""
    lines.append(f"model    {model['path']}  dtype={model['dtype']}{mount}")
    engine = plan["engine"]
    lines.append(f"backend  {engine['backend']}")
    if "server_command" in engine:
        lines.append(f"server   {shlex.join(engine['server_command'])}")
        for part in engine.get("server_sources", []):
            lines.append(f"  {shlex.join(part['flags'])}  <- {part['from']}")
    lines.extend(node_lines(engine.get("nodes", [])))
    if "llm_kwargs" in engine:
        lines.append(f"engine   LLM(**{json.dumps(engine['llm_kwargs'])})")
    lines.append(f"loop     {json.dumps(engine['loop_guard']) if engine['loop_guard'] else 'no early stop'}")
    for key, value in plan["environment"].items():
        lines.append(f"env      {key}={value}")
    for case in plan["cases"]:
        lines.append(f"case     {case['id']}")
        if "prompt" in case and plan["oracle"]["kinds"] != ["accuracy"]:  # accuracy: the harness sends the dataset
            lines.append(f"  prompt   {case['prompt']!r}")
        for message in case.get("messages", []):
            lines.append(f"  {message['role']:<9}{message['content']!r}")
        lines.append(f"  sampling {json.dumps(case['sampling'])}  (unset fields: server/model defaults apply)")
    capture = plan["capture"]
    lines.append(f"capture  top-{capture['top_k']} logprobs" + (", full logits" if capture["full_logits"] else "")
                 + (f", layers {capture['layers']} at steps {capture['steps']}" if capture["layers"] else ""))
    lines.append(f"oracle   {', '.join(plan['oracle']['kinds'])}")
    for kind in plan["oracle"]["kinds"]:
        if kind in plan["oracle"]:
            lines.append(f"  {kind:<10} {json.dumps(plan['oracle'][kind])}")
    trials = plan["trials"]
    lines.append(f"trials   {trials['count']} ({trials['mode']}, confidence {trials['confidence']})")
    lines.append(f"reference {plan['effective_reference']}")
    if plan.get("harness_command"):
        lines.append(f"harness  {shlex.join(plan['harness_command'])}")
    return "\n".join(lines)


@recipes.command("import-nightly")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--case", "case_name", help="The case (`test_cases[].name`) [default: the file's only case].")
@click.option("--benchmark", help="The benchmark of the case [default: its first accuracy one, else performance].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the recipe here [default: stdout].")
@click.option("--list", "list_only", is_flag=True, help="List the file's cases: imported, or refused and why.")
@click.option("--datasets", type=click.Path(file_okay=False, path_type=Path),
              help="Where the benchmarks' relative dataset paths lie [default: as written].")
@click.option("--model-root", type=click.Path(file_okay=False, path_type=Path),
              help="Where the hub's models lie on this host, ORG/NAME under it [default: the case's hub id].")
def import_nightly(file: Path, case_name: str | None, benchmark: str | None, out: Path | None,
                   list_only: bool, datasets: Path | None, model_root: Path | None) -> None:
    """A vllm-ascend nightly case file (tests/e2e/nightly/**/*.yaml) as a recipe."""
    from bisect_npu import api

    if list_only:
        found = api.survey_nightly(file)
        for name in found.imported:
            click.echo(f"imported  {name}")
        for reason in found.refused:
            click.echo(f"refused   {reason}")
        return
    imported = api.import_nightly(file, case=case_name, benchmark=benchmark, datasets=datasets,
                                  model_root=model_root)
    recipe, body = imported.recipe, imported.text
    if out is None:
        click.echo(body, nl=False)
    else:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot write it ({exc.strerror})") from None
        click.echo(f"wrote {out} (recipe {recipe.name})", err=True)
    for note in imported.notes:
        click.echo(f"note: {note}", err=True)
