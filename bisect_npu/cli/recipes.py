"""`bisect-npu recipes list/show/validate/check`: the bundled and user recipes, and what they will run."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import click


@click.group()
def recipes() -> None:
    """The bundled and user recipes: list them, show what one runs, validate files."""


@recipes.command("list")
@click.option("--dir", "dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="Also list the recipes in this directory (repeatable).")
def list_recipes(dirs: tuple[Path, ...]) -> None:
    """Name, backend, oracle kinds and description of each recipe."""
    from bisect_npu.errors import UsageError
    from bisect_npu.recipe.loader import bundled_recipes, load_recipe

    sources: list[tuple[str, Mapping[str, Traversable]]] = [("bundled", bundled_recipes())]
    for directory in dirs:
        if not directory.is_dir():
            raise UsageError(f"--dir {directory}: not a directory")
        sources.append((str(directory), {path.stem: path for path in sorted(directory.glob("*.yaml"))}))
    rows = []
    for origin, files in sources:
        for stem, file in files.items():
            try:
                recipe = load_recipe(file)
            except UsageError as exc:
                rows.append((stem, "-", "-", f"INVALID: {exc}", origin))
                continue
            rows.append((recipe.name, recipe.engine.backend, ",".join(recipe.oracle.kinds),
                         recipe.description, origin))
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
    from bisect_npu.errors import UsageError
    from bisect_npu.recipe.loader import load_recipe

    errors = []
    for path in files:
        try:
            recipe = load_recipe(path)
        except UsageError as exc:
            errors.append(str(exc))
            continue
        click.echo(f"ok  {path}  ({recipe.name}: {len(recipe.cases)} case(s), oracle {','.join(recipe.oracle.kinds)})")
    _fail_on(errors)


def _fail_on(errors: list[str]) -> None:
    """Every error but the last printed, the last raised: the CLI prints it and exits 2."""
    from bisect_npu.errors import UsageError

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
    from bisect_npu.recipe.check import RULES, check_recipe
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.upstream import history

    loaded = load_recipe(recipe)
    clone = history.open_repo(repo)
    failed = []
    for ref in refs:
        sha = history.resolve_ref(clone, ref)
        findings = check_recipe(loaded, clone, sha)
        if not findings:
            click.echo(f"ok    {loaded.name} at {ref} ({sha[:12]}): {len(RULES)} rules")
        for finding in findings:
            failed.append(f"{loaded.name} at {ref} ({sha[:12]}): [{finding.rule}] {finding.describe()}")
    _fail_on(failed)


@recipes.command("show")
@click.argument("recipe")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def show(recipe: str, fmt: str) -> None:
    """What RECIPE (a bundled name or a file) will run: model, engine, env, cases as sent, oracle."""
    from bisect_npu.recipe.loader import load_recipe

    loaded = load_recipe(recipe)
    plan = run_plan(loaded)
    if fmt == "json":
        click.echo(json.dumps(plan, indent=2))
        return
    click.echo(render_plan(plan))


def run_plan(recipe: Any) -> dict[str, Any]:
    """The recipe as the probe will see it: engine call or server command line, cases as sent."""
    from bisect_npu.orchestration.evaluate import probe_request
    from bisect_npu.probe.backends.openai import server_argv
    from bisect_npu.probe.backends.vllm import engine_kwargs

    first = probe_request(recipe, recipe.cases[0], commit="<candidate>", trial=0)
    engine: dict[str, Any] = {"backend": recipe.engine.backend, "loop_guard": first["loop_guard"]}
    if recipe.engine.backend == "openai":
        engine["server_command"] = server_argv(first, python="python3")
    elif recipe.engine.backend == "vllm":
        engine["llm_kwargs"] = engine_kwargs(first)
    else:
        engine["args"] = recipe.engine.args
    kinds = recipe.oracle.kinds
    oracle = {kind: getattr(recipe.oracle, kind).model_dump() for kind in kinds if hasattr(recipe.oracle, kind)}
    if recipe.accuracy is not None:
        oracle["accuracy"] = recipe.accuracy.model_dump(mode="json", exclude={"sampling"})
    return {
        "name": recipe.name,
        "source": recipe.source,
        "description": recipe.description,
        "model": recipe.model.model_dump(),
        "engine": engine,
        "environment": recipe.environment,
        "capture": recipe.capture.model_dump(),
        "cases": [{"id": case.id, **{k: v for k, v in probe_request(recipe, case, "<candidate>", 0)["case"].items()}}
                  for case in recipe.cases],
        "oracle": {"kinds": kinds, **oracle},
        "trials": recipe.trials.model_dump(),
        "reference": recipe.reference.model_dump(),
    }


def render_plan(plan: dict[str, Any]) -> str:
    lines = [f"recipe   {plan['name']}  ({plan['source']})", f"         {plan['description']}"]
    model = plan["model"]
    mount = f"  (host {model['host_path']}, read-only)" if model.get("host_path") else ""
    lines.append(f"model    {model['path']}  dtype={model['dtype']}{mount}")
    engine = plan["engine"]
    lines.append(f"backend  {engine['backend']}")
    if "server_command" in engine:
        lines.append(f"server   {shlex.join(engine['server_command'])}")
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
    reference = plan["reference"]
    lines.append(f"reference {reference['kind']}" + (f" {reference['path']}" if reference.get("path") else ""))
    return "\n".join(lines)


@recipes.command("import-nightly")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--case", "case_name", help="The case (`test_cases[].name`) [default: the file's only case].")
@click.option("--benchmark", help="The benchmark of the case [default: its first accuracy one, else performance].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the recipe here [default: stdout].")
@click.option("--list", "list_only", is_flag=True, help="List the file's cases: imported, or refused and why.")
@click.option("--datasets", type=click.Path(file_okay=False, path_type=Path),
              help="Where the benchmarks' relative dataset paths lie [default: as written].")
def import_nightly(file: Path, case_name: str | None, benchmark: str | None, out: Path | None,
                   list_only: bool, datasets: Path | None) -> None:
    """A vllm-ascend nightly case file (tests/e2e/nightly/**/*.yaml) as a recipe."""
    from bisect_npu.errors import UsageError
    from bisect_npu.nightly.at_commit import recipe_dump
    from bisect_npu.nightly.cases import import_case, read_case_file, survey

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file}: cannot read it as a text file ({exc})") from None
    path = file.as_posix()
    if list_only:
        found = survey(text, path)
        for name in found.imported:
            click.echo(f"imported  {name}")
        for reason in found.refused:
            click.echo(f"refused   {reason}")
        return
    recipe = import_case(read_case_file(text, path), path, case_name, benchmark,
                         str(datasets.resolve()) if datasets else None)
    body = f"# imported by bisect-npu recipes import-nightly from {path}\n" + recipe_dump(recipe)
    if out is None:
        click.echo(body, nl=False)
    else:
        out.write_text(body, encoding="utf-8")
        click.echo(f"wrote {out} (recipe {recipe.name})", err=True)
