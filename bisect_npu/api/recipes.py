"""The recipes: list them, validate files, check one against a candidate's source, show what one
runs, import a vllm-ascend nightly case as one; what `bisect-npu recipes` prints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_npu.errors import UsageError

if TYPE_CHECKING:
    from bisect_npu.nightly.cases import FileSurvey
    from bisect_npu.recipe.check import Finding
    from bisect_npu.recipe.schema import Recipe


@dataclass(frozen=True)
class RecipeEntry:
    """One recipe file found: its name (the file's stem where it does not load), engine backend,
    oracle kinds and description, where it lies ("bundled" or the directory), why it is invalid."""

    name: str
    backend: str
    oracle: list[str]
    description: str
    origin: str
    error: str | None = None


def list_recipes(dirs: Iterable[str | Path] = ()) -> list[RecipeEntry]:
    """The bundled recipes, then those in each of `dirs` (`*.yaml`, by name)."""
    from bisect_npu.recipe.loader import bundled_recipes, load_recipe

    sources: list[tuple[str, Mapping[str, Traversable]]] = [("bundled", bundled_recipes())]
    for directory in map(Path, dirs):
        if not directory.is_dir():
            raise UsageError(f"--dir {directory}: not a directory")
        sources.append((str(directory), {path.stem: path for path in sorted(directory.glob("*.yaml"))}))
    entries = []
    for origin, files in sources:
        for stem, file in files.items():
            try:
                recipe = load_recipe(file)
            except UsageError as exc:
                entries.append(RecipeEntry(stem, "-", [], "", origin, str(exc)))
                continue
            entries.append(RecipeEntry(recipe.name, recipe.engine.backend, list(recipe.oracle.kinds),
                                       recipe.description, origin))
    return entries


@dataclass(frozen=True)
class Validation:
    """One file validated: the recipe it holds, or the first error (field and line)."""

    path: Path
    recipe: Recipe | None
    error: str | None = None


def validate_recipes(files: Iterable[str | Path]) -> list[Validation]:
    """Load each file as a recipe; a bad one's first error is kept, not raised."""
    from bisect_npu.recipe.loader import load_recipe

    validated = []
    for path in map(Path, files):
        try:
            validated.append(Validation(path, load_recipe(path)))
        except UsageError as exc:
            validated.append(Validation(path, None, str(exc)))
    return validated


@dataclass(frozen=True)
class RecipeAtRef:
    """A recipe's engine args checked against the candidate's source at one ref: what the rules
    found would make the candidate refuse to start (nothing: it starts)."""

    recipe: str
    ref: str
    sha: str
    rules: int  # rules checked
    findings: list[Finding]
    concerning: list[str] = field(default_factory=list)  # the rules about what the recipe uses, by name


def check_recipe_at(recipe: str | Path | Recipe, repo: str | Path, refs: Iterable[str]) -> list[RecipeAtRef]:
    """Check `recipe` at each of `refs` of the candidate repository (a clone or a URL)."""
    from bisect_npu.recipe.check import RULES, EngineFacts, check_recipe
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.recipe.schema import Recipe
    from bisect_npu.upstream import history

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    clone = history.open_repo(str(repo))
    engine = EngineFacts.of(loaded)
    concerning = [rule.name for rule in RULES if rule.concerns(engine)]
    checked = []
    for ref in refs:
        sha = history.resolve_ref(clone, ref)
        checked.append(RecipeAtRef(loaded.name, ref, sha, len(RULES), check_recipe(loaded, clone, sha), concerning))
    return checked


def recipe_plan(recipe: str | Path | Recipe) -> dict[str, Any]:
    """What a recipe runs, as the probe will see it: model, engine call or server command line,
    environment, cases as sent, oracle, trials and reference (`recipes show --format json`)."""
    from bisect_npu.orchestration.running.probe_requests import probe_request
    from bisect_npu.probe.backends.openai import server_argv
    from bisect_npu.probe.backends.vllm import engine_kwargs
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.recipe.schema import Recipe

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    first = probe_request(loaded, loaded.cases[0], commit="<candidate>", trial=0)
    engine: dict[str, Any] = {"backend": loaded.engine.backend, "loop_guard": first["loop_guard"]}
    if loaded.engine.backend == "openai" and loaded.engine.nodes is None:  # else each node's, below
        engine["server_command"] = server_argv(first, python="python3")
    elif loaded.engine.backend == "vllm":
        engine["llm_kwargs"] = engine_kwargs(first)
    else:
        engine["args"] = loaded.engine.args
    if "server_command" in engine:
        engine["server_sources"] = [{"flags": flags, "from": source} for flags, source in server_sources(first, loaded)]
    if loaded.engine.nodes is not None:
        engine["nodes"] = nodes_plan(loaded, first)
    kinds = loaded.oracle.kinds
    oracle = {kind: getattr(loaded.oracle, kind).model_dump() for kind in kinds if hasattr(loaded.oracle, kind)}
    if loaded.accuracy is not None:
        oracle["accuracy"] = loaded.accuracy.model_dump(mode="json", exclude={"sampling"})
    return {
        "name": loaded.name,
        "source": loaded.source,
        "description": loaded.description,
        "model": loaded.model.model_dump(),
        "engine": engine,
        "environment": loaded.environment,
        "capture": loaded.capture.model_dump(),
        "cases": [{"id": case.id, **probe_request(loaded, case, "<candidate>", 0)["case"]} for case in loaded.cases],
        "oracle": {"kinds": kinds, **oracle},
        "trials": loaded.trials.model_dump(),
        "reference": loaded.reference.model_dump(),
        "effective_reference": effective_reference(loaded),
        "harness_command": harness_command(loaded),
    }


def nodes_plan(recipe: Recipe, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node of an engine across hosts: its role, the command it starts ({local_ip},
    {master_ip} and {rpc_port} filled at each start; the serving node's is the openai backend's
    server command with the node's flags), its environment over the recipe's, and where it runs."""
    from bisect_npu.execute.ray_nodes import launcher_argv
    from bisect_npu.probe.backends.openai import server_argv

    assert recipe.engine.nodes is not None
    nodes = recipe.engine.nodes
    plan = []
    for index, node in enumerate(nodes.each):
        if index == nodes.serving:
            role = "serving"
            command = server_argv({**request, "engine": {**request["engine"], "server_flags": node.flags}},
                                  python="python3")
        else:
            role, command = "headless", [*launcher_argv(request, "python3"), *node.flags]
        plan.append({"index": index, "role": role, "cards": nodes.cards, "command": command,
                     "environment": node.environment,
                     "container": "on a Ray node of its own (--executor ray): the candidate's worktree "
                                  "(--node-executor local), or a container of the candidate's image on the "
                                  "node's network with its cards (--node-executor docker)"})
    return plan


def server_sources(request: dict[str, Any], recipe: Recipe) -> list[tuple[list[str], str]]:
    """The server command line in parts, each with where it comes from: the recipe's fields, or
    what bisect-npu adds (the address it binds, the trial's seed). Joined, the parts are the line
    `server_argv` makes (a test holds them together)."""
    from bisect_npu.probe.backends.openai import HOST, server_argv

    engine, model = request.get("engine", {}), request["model"]
    whole = server_argv(request, python="python3")
    port = str(engine.get("port", 8000))
    launched = whole[:whole.index("--host")]
    parts: list[tuple[list[str], str]] = [
        (launched, "engine.launcher" if "launcher" in recipe.engine.model_fields_set
         else "the default launcher: `vllm serve` of model.path"),
        (["--host", HOST, "--port", port], "bisect-npu: the probe talks to the server on this address "
                                           "(engine.port)")]
    if model.get("dtype") and model["dtype"] != "auto":
        parts.append((["--dtype", model["dtype"]], "model.dtype"))
    if model.get("tokenizer"):
        parts.append((["--tokenizer", model["tokenizer"]], "model.tokenizer"))
    if request.get("seed") is not None:
        parts.append((["--seed", str(request["seed"])], "bisect-npu: the first trial's seed, from sampling.seed "
                                                        "(each trial its own)"))
    used = sum(len(flags) for flags, _ in parts)
    extra = len(list(engine.get("server_flags", [])))
    if whole[used:len(whole) - extra]:
        parts.append((whole[used:len(whole) - extra], "engine.args"))
    if extra:
        parts.append((whole[len(whole) - extra:], "engine.server_flags"))
    return parts


def effective_reference(recipe: Recipe) -> str:
    """What the verdicts compare with, in the terms of the section that decides it."""
    acc, throughput = recipe.accuracy, recipe.oracle.throughput
    if acc is not None and "accuracy" in recipe.oracle.kinds:
        published = f"the published {acc.baseline} points less {acc.threshold}"
        return {"good_end": "accuracy.reference good_end: the good end's score, sample by sample",
                "baseline": f"accuracy.reference baseline: {published}",
                "both": f"accuracy.reference both: the good end's score and {published}"}[acc.reference]
    if throughput is not None and "throughput" in recipe.oracle.kinds:
        line = f"{throughput.baseline} tokens/s" if throughput.reference == "baseline" else "the good end's"
        return f"oracle.throughput.reference {throughput.reference}: {throughput.threshold:.0%} of {line}"
    reference = recipe.reference
    return f"reference {reference.kind}" + (f" {reference.path}" if reference.path else "")


def harness_command(recipe: Recipe) -> list[str] | None:
    """The accuracy harness's command line as each run starts it (per-run paths as placeholders)."""
    acc = recipe.accuracy
    if acc is None:
        return None
    sampling = acc.sampling.model_dump(exclude_none=True)
    if acc.harness == "aisbench" and acc.aisbench is not None:
        return ["ais_bench", f"<config: models {acc.aisbench.request_conf} at the server, datasets "
                f"{acc.aisbench.dataset_conf}, batch_size {acc.aisbench.batch_size}, max_out_len "
                f"{sampling.get('max_tokens')}>", "--work-dir", "<run>/outputs", "--dump-eval-details",
                "--num-warmups", "0", *acc.aisbench.extra_args]
    if acc.harness == "lm_eval" and acc.lm_eval is not None:
        from bisect_npu.probe.harness.lm_eval import argv, is_task_file

        if not is_task_file(acc.lm_eval.task):
            return argv("lm_eval", acc.lm_eval.model_dump(), "http://127.0.0.1:<port>", recipe.model.path,
                        acc.dataset, None, None, sampling, int(sampling.get("seed", 0)), "<run>")
        return ["lm_eval", "run", "--model", acc.lm_eval.model, "--tasks", f"<a task including {acc.lm_eval.task}>",
                *acc.lm_eval.extra_args]
    if acc.command is not None:
        return list(acc.command.argv)
    return None


@dataclass(frozen=True)
class ImportedRecipe:
    """A nightly case imported: the recipe and its YAML text (headed by where it came from)."""

    recipe: Recipe
    text: str
    notes: list[str] = field(default_factory=list)  # what the host still owes before it runs


def _read_case_file(file: str | Path) -> tuple[str, str]:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file}: cannot read it as a text file ({exc})") from None
    return text, Path(file).as_posix()


def import_nightly(file: str | Path, *, case: str | None = None, benchmark: str | None = None,
                   datasets: str | Path | None = None, model_root: str | Path | None = None) -> ImportedRecipe:
    """A vllm-ascend nightly case file (tests/e2e/nightly/**/*.yaml) as a recipe: `case` (its
    `test_cases[].name`; default: the file's only case), `benchmark` (default: its first accuracy
    one, else performance), `datasets`: where the benchmarks' relative dataset paths lie,
    `model_root`: where the hub's models lie (ORG/NAME under it). The SoC, and so the Dockerfile,
    is the one the nightly's schedule beside the file names; `notes` say what the host still owes."""
    from bisect_npu.nightly.at_commit import recipe_dump
    from bisect_npu.nightly.cases import import_case, import_notes, read_case_file
    from bisect_npu.nightly.soc import schedules_beside, soc_of

    text, path = _read_case_file(file)
    root = str(Path(datasets).resolve()) if datasets else None
    recipe = import_case(read_case_file(text, path), path, case, benchmark, root,
                         soc=soc_of(path, schedules_beside(Path(file))),
                         model_root=str(model_root) if model_root is not None else None)
    return ImportedRecipe(recipe, f"# imported by bisect-npu recipes import-nightly from {path}\n"
                          + recipe_dump(recipe), import_notes(recipe, root))


def survey_nightly(file: str | Path) -> FileSurvey:
    """A nightly case file's cases: those a recipe can be imported from, and the others with why."""
    from bisect_npu.nightly.cases import survey
    from bisect_npu.nightly.soc import schedules_beside, soc_of

    text, path = _read_case_file(file)
    return survey(text, path, soc_of(path, schedules_beside(Path(file))))


def recipe_lws(recipe: str | Path | Recipe, image: str, *, npu_resource: str | None = None,
               rpc_port: int | None = None, name: str | None = None, host: str | None = None) -> dict[str, Any]:
    """A recipe's engine across nodes as a Kubernetes LeaderWorkerSet running `image` (a built
    candidate) on NPU hosts of type `host` (A2, A3, 310P; None: unknown): each node's command as
    `nodes_plan` shows it, the values Ray fills taken from the pod instead
    (bisect_npu/execute/lws.py). A recipe without `engine.nodes`, or whose nodes start
    what a candidate's image does not hold (the demo engine's `{probe}` package), is refused."""
    from bisect_npu.execute.lws import DEFAULT_RPC_PORT, NPU_RESOURCE, LwsNode, leader_worker_set
    from bisect_npu.orchestration.running.probe_requests import probe_request
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.recipe.schema import Recipe

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    nodes = loaded.engine.nodes
    if nodes is None:
        raise UsageError(f"recipe {loaded.name} runs its engine on one host (no engine.nodes): a LeaderWorkerSet "
                         "is for an engine across nodes; give a recipe with engine.nodes")
    if any("{probe}" in part for part in loaded.engine.launcher):
        raise UsageError(f"recipe {loaded.name}'s launcher needs {{probe}}, bisect-npu's own package, which a "
                         "candidate's image does not hold: give a recipe whose launcher starts the image's server")
    if not image.strip():
        raise UsageError("--image is empty: give the candidate's image, e.g. quay.io/ascend/vllm-ascend:v0.11.0")
    first = probe_request(loaded, loaded.cases[0], commit="<candidate>", trial=0)
    planned = [LwsNode(node["command"], node["environment"]) for node in nodes_plan(loaded, first)]
    serving = planned[nodes.serving]
    headless = [planned[index] for index in nodes.headless()]
    return leader_worker_set(name or loaded.name, image, serving, headless, cards=nodes.cards,
                             environment=loaded.environment, serving_port=loaded.engine.port,
                             model_path=loaded.model.path, model_host_path=loaded.model.host_path,
                             npu_resource=npu_resource or NPU_RESOURCE, rpc_port=rpc_port or DEFAULT_RPC_PORT,
                             host=host)
