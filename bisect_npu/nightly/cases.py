"""A nightly case file as recipes: `tests/e2e/nightly/**/configs/*.yaml` of vllm-ascend.

The nightly's single-node entry (`tests/e2e/nightly/single_node/models/scripts/`) starts
`vllm serve MODEL` + `server_cmd` + `server_cmd_extra`, with `$VAR`/`${VAR}` filled from the
case's `envs` (the port keys set to a free port), and runs each benchmark through AISBench:
accuracy passes within `threshold` points of `baseline`, performance at `threshold` x `baseline`
output tokens/s (`tools/aisbench.py`). Here one benchmark of one case becomes one recipe: the
same server through the `openai` backend, accuracy judged by the accuracy oracle against the
baseline, performance by the throughput oracle over repeated trials.

A multi-node file (`num_nodes` > 1, one `deployment` entry per node) becomes an engine across
hosts (`engine.nodes`, run with `--executor ray`): node 0 serves (`--data-parallel-address
$LOCAL_IP`), the others run `--headless` with `--data-parallel-address $MASTER_IP`. Their
`$LOCAL_IP` and `$MASTER_IP` become `{local_ip}` and `{master_ip}`, `--data-parallel-rpc-port`
takes `{rpc_port}` (a port chosen free at each start), `--host`/`--port` are dropped (the probe
gives the serving node its own), `env_common` is the recipe's environment and each entry's other
`envs` its node's. What cannot be mapped (disaggregated prefill, a router's templates, a value
bisect-npu cannot fill) is refused in one line.

Two case keys are bisect-npu's own: `launcher` (a list: the server command before its flags,
as a recipe's `engine.launcher`) replaces `vllm serve MODEL`, for a server that is not vLLM's
(the demo engine's, a test's); `local_build` (a list) is the recipe's `build.local_command` for
`--executor local` (the nightly runs in a built image). The nightly's loader keeps unknown case
keys as attributes and ignores them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bisect_npu.errors import UsageError, validation_problem
from bisect_npu.nightly.soc import Soc
from bisect_npu.recipe.schema import EngineSpec, Recipe

SINGLE_NODE_CONFIGS = "tests/e2e/nightly/single_node/models/configs"  # the nightly's CONFIG_BASE_PATH default
PORT_KEYS = ("SERVER_PORT", "ENCODE_PORT", "PD_PORT", "PROXY_PORT")  # the nightly fills these with a free port
_PLACEHOLDER = re.compile(r"\$(\w+)|\$\{(\w+)\}")  # single_node_config.py's `_expand_values`
# vLLM as vllm-ascend's image carries it: installed from the Dockerfile's pin (VLLM_COMMIT over
# VLLM_TAG), a Python tree at /vllm-workspace/vllm; a culprit that moves it is followed into vLLM.
VLLM_DEPENDENCY = {"name": "vllm", "url": "https://github.com/vllm-project/vllm.git",
                   "pin": {"arg": ["VLLM_COMMIT", "VLLM_TAG"]}, "package_dir": "vllm",
                   "image_path": "/vllm-workspace/vllm"}
PERF_TRIALS = 5  # throughput samples per commit: enough for a t bound to see a 3% drop on a quiet card
PERF_MAX_TOKENS = 1024
DEFAULT_PROMPT = "San Francisco is a"  # the nightly's default `prompts`


class NightlyRefused(UsageError):
    """A case (or file) this importer cannot turn into a recipe; the message says what is missing."""


@dataclass(frozen=True)
class CaseRef:
    """`FILE[::CASE[::BENCHMARK]]` as --nightly-case takes it."""

    file: str
    case: str | None = None
    benchmark: str | None = None

    @classmethod
    def parse(cls, text: str) -> CaseRef:
        parts = text.split("::")
        if len(parts) > 3 or not parts[0] or any(not p for p in parts[1:]):
            raise UsageError(f"--nightly-case {text!r}: write FILE, FILE::CASE or FILE::CASE::BENCHMARK, e.g. "
                             "tests/e2e/nightly/single_node/models/configs/Qwen3-32B-Int8.yaml::"
                             "Qwen3-32B-W8A8-single-a3::acc")
        case = parts[1] if len(parts) > 1 else None
        file = parts[0] if "/" in parts[0] else f"{SINGLE_NODE_CONFIGS}/{parts[0]}"  # as --config-yaml names it
        return cls(file, case, parts[2] if len(parts) > 2 else None)

    def __str__(self) -> str:
        return "::".join(p for p in (self.file, self.case, self.benchmark) if p)


def read_case_file(text: str, source: str) -> dict[str, Any]:
    """The file's mapping (safe loader; YAML merge keys as the nightly's own loader reads them)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise UsageError(f"{where}: not valid YAML ({problem}); a nightly case file is the YAML under "
                         "tests/e2e/nightly/") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: not a nightly case file (a mapping with `test_cases`, or `deployment` for "
                         f"multi-node); got a {type(raw).__name__}")
    return raw


def several_nodes(raw: dict[str, Any], path: str) -> bool:
    """Whether the file's engine spans hosts (num_nodes > 1, or several `deployment` entries)."""
    nodes = raw.get("num_nodes")
    deployment = raw.get("deployment")
    return (isinstance(nodes, int) and nodes > 1) or (isinstance(deployment, list) and len(deployment) > 1)


def _multi_node_reason(raw: dict[str, Any], path: str) -> str | None:
    """Why a multi-node file cannot become an engine across nodes, or None when it can."""
    if not several_nodes(raw, path):
        return None
    nodes = raw.get("num_nodes")
    deployment = raw.get("deployment")
    shape = f"num_nodes {nodes}" + (f" x {raw['npu_per_node']} NPUs" if raw.get("npu_per_node") else "")
    disaggregated = raw.get("disaggregated_prefill") or {}
    if isinstance(disaggregated, dict) and disaggregated.get("enabled"):
        return (f"multi-node case ({shape}, disaggregated prefill: prefill nodes "
                f"{disaggregated.get('prefiller_host_index')}, decode nodes {disaggregated.get('decoder_host_index')}):"
                " two engines behind a proxy that moves the KV cache between them; missing: a launcher for a "
                "proxy and more than one engine per candidate")
    if not isinstance(deployment, list):
        made_of = ", ".join(key for key in ("templates", "routing", "config") if key in raw)
        how = f" (its nodes are made from {made_of}: external data parallel behind a router)" if made_of else ""
        return (f"multi-node case ({shape}) with no `deployment` entries{how}; missing: a launcher for the router "
                "and its engines")
    if isinstance(nodes, int) and nodes != len(deployment):
        return f"multi-node case: num_nodes {nodes} but {len(deployment)} `deployment` entries; one entry per node"
    if not isinstance(raw.get("npu_per_node"), int) or raw["npu_per_node"] < 1:
        return f"multi-node case ({shape}): no whole npu_per_node; the NPUs each node's engine uses"
    return None


def case_names(raw: dict[str, Any]) -> list[str]:
    cases = raw.get("test_cases")
    return [str(c.get("name")) for c in cases if isinstance(c, dict)] if isinstance(cases, list) else []


def _expand(values: list[str], envs: dict[str, Any]) -> list[str]:
    def fill(match: re.Match[str]) -> str:
        key = match.group(1) or match.group(2)
        return str(envs[key]) if key in envs else match.group(0)

    return [_PLACEHOLDER.sub(fill, str(value)) for value in values]


def _words(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)  # a `>` block of the multi-node files; never run through a shell
        except ValueError as exc:
            raise NightlyRefused(f"{where}: cannot split into arguments ({exc})") from None
    if isinstance(value, list):
        return [str(v) for v in value]
    raise NightlyRefused(f"{where}: a list of arguments or one command line, got {type(value).__name__}")


def server_flags(case: dict[str, Any], where: str) -> tuple[list[str], dict[str, str]]:
    """The server's flags after `vllm serve MODEL` (its own --host/--port dropped: the openai
    backend binds 127.0.0.1 and its own port) and the environment (less the port keys)."""
    envs = {str(k): v for k, v in (case.get("envs") or {}).items()}
    words = _words(case.get("server_cmd"), f"{where} server_cmd") + _words(case.get("server_cmd_extra"),
                                                                          f"{where} server_cmd_extra")
    words = _expand(words, {k: v for k, v in envs.items() if k not in PORT_KEYS})
    flags = _serve_flags(words, rpc_port=False)
    environment = {k: _env_text(v) for k, v in envs.items() if k not in PORT_KEYS}
    return flags, environment


def _serve_flags(words: list[str], *, rpc_port: bool) -> list[str]:
    """The flags after `vllm serve MODEL` (a command line without it is all flags), --host and
    --port dropped with their values (bisect-npu binds and picks the port); with `rpc_port`, the
    data-parallel rpc port as bisect-npu fills it (`{rpc_port}`)."""
    if words[:2] == ["vllm", "serve"]:
        words = words[3:] if len(words) > 2 and not words[2].startswith("-") else words[2:]
    chosen = ("--port", "--host", "--data-parallel-rpc-port") if rpc_port else ("--port", "--host")
    flags: list[str] = []
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in chosen:
            skip = "=" not in word and index + 1 < len(words)
            if name == "--data-parallel-rpc-port":
                flags += [name, "{rpc_port}"]
            continue
        flags.append(word)
    return flags


def _env_text(value: Any) -> str:
    return str(value)  # as the nightly hands `envs` to its server process


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "case"


def pick_benchmark(case: dict[str, Any], wanted: str | None, where: str) -> tuple[str, dict[str, Any]]:
    """The benchmark to bisect: the one named, else the first accuracy one, else the first
    performance one with a baseline (a warm-up run has baseline 0 and judges nothing)."""
    benchmarks = {str(k): v for k, v in (case.get("benchmarks") or {}).items() if isinstance(v, dict)}
    if wanted is not None:
        if wanted not in benchmarks:
            raise UsageError(f"{where}: no benchmark {wanted!r}; its benchmarks: {', '.join(benchmarks) or 'none'}")
        return wanted, benchmarks[wanted]
    judged = [(k, b) for k, b in benchmarks.items() if b.get("case_type") in ("accuracy", "performance")
              and b.get("baseline") not in (None, 0, "0")]
    for kind in ("accuracy", "performance"):
        for key, bench in judged:
            if bench.get("case_type") == kind:
                return key, bench
    raise NightlyRefused(f"{where}: no accuracy or performance benchmark with a baseline to judge (test_content "
                         f"{case.get('test_content', ['completion'])} only checks that an answer comes back)")


def _number(bench: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = bench.get(key, default)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise NightlyRefused(f"{where}: {key} {value!r} is not a number") from None


def _integer(bench: dict[str, Any], key: str, where: str, default: int) -> int:
    value = bench.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise NightlyRefused(f"{where}: {key} {value!r} is not a whole number")
    try:
        return int(value)
    except ValueError:
        raise NightlyRefused(f"{where}: {key} {value!r} is not a whole number") from None


def _under(root: str | None, path: str) -> str:
    """A benchmark's relative path under the datasets root (as the nightly's are under its
    dataset cache); as written without a root."""
    return str(Path(root).expanduser() / path) if root and path and not Path(path).is_absolute() else path


def _benchmark_section(key: str, bench: dict[str, Any], case: dict[str, Any], where: str,
                       datasets: str | None) -> dict[str, Any]:
    kind = bench.get("case_type")
    if kind == "accuracy":
        conf = str(bench.get("dataset_conf", ""))
        sampling = {name: bench[name] for name in ("temperature", "top_p", "top_k", "seed")
                    if bench.get(name) is not None}
        sampling.setdefault("temperature", 0.6)  # tools/aisbench.py's accuracy default
        sampling["max_tokens"] = _integer(bench, "max_out_len", where, 1024)
        return {"oracle": {"kinds": ["accuracy"]},
                "accuracy": {"harness": "aisbench", "dataset": _under(datasets, str(bench.get("dataset_path", ""))),
                             "aisbench": {"request_conf": str(bench.get("request_conf", "vllm_api_general_chat")),
                                          "dataset_conf": _under(datasets, conf) if conf.endswith(".py") else conf,
                                          "batch_size": _integer(bench, "batch_size", where, 1)},
                             "sampling": sampling, "reference": "baseline",
                             "baseline": _number(bench, "baseline", where),
                             "threshold": _number(bench, "threshold", where, 1.0)}}
    if kind == "performance":
        prompts = case.get("prompts") or [DEFAULT_PROMPT]
        baseline = _number(bench, "baseline", where, 0.0)
        throughput: dict[str, Any] = {"threshold": _number(bench, "threshold", where, 0.97), "reference": "good_end"}
        if baseline > 0:
            throughput["baseline"] = baseline
        return {"cases": [{"id": _slug(key), "messages": [{"role": "user", "content": str(prompts[0])}],
                           "sampling": {"temperature": 0.0,
                                        "max_tokens": min(_integer(bench, "max_out_len", where, PERF_MAX_TOKENS),
                                                          PERF_MAX_TOKENS)}}],
                "trials": {"count": PERF_TRIALS},
                "oracle": {"kinds": ["throughput"], "throughput": throughput},
                "reference": {"kind": "good_end"}}
    raise NightlyRefused(f"{where}: case_type {kind!r} is neither accuracy nor performance")


def _refusal_of_case(case: dict[str, Any], where: str) -> str | None:
    mode = case.get("service_mode", "openai")
    if mode != "openai":
        return (f"{where}: service_mode {mode} starts several servers behind a proxy (encode/prefill/decode); "
                "missing: a launcher for more than one server per candidate")
    if case.get("kv_pool"):
        return f"{where}: kv_pool needs the nightly's KV pool service beside the server; missing: its launcher"
    return None


def import_case(raw: dict[str, Any], path: str, case_name: str | None = None,
                benchmark: str | None = None, datasets: str | None = None, *, soc: Soc | None = None,
                model_root: str | None = None) -> Recipe:
    """One benchmark of one case of the file as a recipe (see the module's docstring); a file
    or case this cannot run is a NightlyRefused naming what is missing. `datasets` is the root the
    benchmarks' relative `dataset_path` (and a `.py` `dataset_conf`) lie under; `soc` picks the
    Dockerfile its image builds from; `model_root` is where the hub's models lie on this host
    (`model_root/ORG/NAME`, mounted at the same path)."""
    if (reason := _multi_node_reason(raw, path)) is not None:
        raise NightlyRefused(f"{path}: {reason}")
    if several_nodes(raw, path):
        return import_multi_node(raw, path, benchmark, datasets, soc=soc, model_root=model_root)
    case = picked_case(raw, path, case_name)
    where = f"{path}::{case.get('name')}"
    if (reason := _refusal_of_case(case, where)) is not None:
        raise NightlyRefused(reason)
    if not case.get("model"):
        raise NightlyRefused(f"{where}: no `model`")
    key, bench = pick_benchmark(case, benchmark, where)
    flags, environment = server_flags(case, where)
    body: dict[str, Any] = {
        "name": _slug(f"{case.get('name')}-{key}"),
        "description": f"vllm-ascend nightly {where}::{key} ({bench.get('case_type')}"
                       f"{f'; SoC {soc.name}: {soc.how}' if soc is not None else ''})",
        "symptom": [str(bench.get("case_type"))],
        "model": _model(str(case["model"]), model_root),
        "engine": {"backend": "openai", "server_flags": flags, "startup_timeout_s": 3600.0,
                   **_launcher_part(case)},
        "environment": environment,
        **_build_parts(case, soc),
        **_benchmark_section(key, bench, case, f"{where}::{key}", datasets),
    }
    return _as_recipe(body, f"{where}::{key}")


def picked_case(raw: dict[str, Any], path: str, case_name: str | None) -> dict[str, Any]:
    """The single-node file's case named `case_name` (the only one when None); a multi-node
    file's benchmarks as one case (its `test_name`, else the file's name)."""
    if several_nodes(raw, path):
        return {"name": str(raw.get("test_name") or path.rsplit("/", 1)[-1].removesuffix(".yaml")),
                "benchmarks": raw.get("benchmarks"), "prompts": raw.get("prompts")}
    cases = [c for c in raw.get("test_cases") or [] if isinstance(c, dict)]
    if not cases and isinstance(raw.get("deployment"), list):  # a one-node multi-node file
        cases = [{"name": raw.get("test_name") or path.rsplit("/", 1)[-1].removesuffix(".yaml"),
                  "model": raw.get("model"), **raw["deployment"][0], "benchmarks": raw.get("benchmarks")}]
    if not cases:
        raise UsageError(f"{path}: no `test_cases` (nor one `deployment`); not a nightly case file")
    names = [str(c.get("name")) for c in cases]
    if case_name is None:
        if len(cases) > 1:
            raise UsageError(f"{path} has {len(cases)} cases; name one: {path}::{names[0]} (its cases: "
                             f"{', '.join(names)})")
        case = cases[0]
    else:
        found = [c for c in cases if str(c.get("name")) == case_name]
        if not found:
            raise UsageError(f"{path}: no case named {case_name!r}; its cases: {', '.join(names)}")
        if len(found) > 1:
            raise UsageError(f"{path}: {len(found)} cases are named {case_name!r}; which one is meant cannot be told: "
                             "give each case a name of its own")
        case = found[0]
    return case


def _launcher_part(case: dict[str, Any]) -> dict[str, Any]:
    """The engine's `launcher` where the case gives one (a locally built engine's start command)."""
    return {"launcher": [str(w) for w in case["launcher"]]} if isinstance(case.get("launcher"), list) else {}


def _build_parts(case: dict[str, Any], soc: Soc | None) -> dict[str, Any]:
    """The recipe's `build` (a local build command, the SoC's Dockerfile) and, for a candidate built
    as vLLM's plugin (no launcher of its own), its vLLM dependency."""
    build = {**({"local_command": [str(w) for w in case["local_build"]]}
                if isinstance(case.get("local_build"), list) else {}),
             **({"dockerfile": soc.dockerfile} if soc is not None else {})}
    return {"build": build,
            **({} if isinstance(case.get("launcher"), list) else {"dependencies": [VLLM_DEPENDENCY]})}


def _as_recipe(body: dict[str, Any], where: str) -> Recipe:
    """The imported body as a recipe, or one line naming the field the schema refused."""
    try:
        return Recipe.model_validate(body)
    except ValidationError as exc:
        field, problem = validation_problem(exc, root="")
        raise NightlyRefused(f"{where}: as a recipe, {field}: {problem}") from None


NODE_PLACEHOLDERS = {"LOCAL_IP": "{local_ip}", "MASTER_IP": "{master_ip}"}  # the nightly's run.sh sets these


def node_flags(command: Any, envs: dict[str, Any], where: str, serving: bool) -> list[str]:
    """A deployment entry's `vllm serve MODEL ...` as the node's flags: --host/--port dropped, the
    addresses and the rpc port as bisect-npu fills them, the entry's own `envs` expanded; a value
    bisect-npu cannot supply is refused."""
    flags = _serve_flags(_words(command, f"{where} server_cmd"), rpc_port=True)
    filled = _expand(flags, {**{k: v for k, v in envs.items() if k not in PORT_KEYS}, **NODE_PLACEHOLDERS})
    unknown = sorted({m.group(1) or m.group(2) for flag in filled for m in _PLACEHOLDER.finditer(flag)})
    if unknown:
        raise NightlyRefused(f"{where}: its command needs {', '.join('$' + name for name in unknown)}, which "
                             "bisect-npu cannot supply (it fills $LOCAL_IP, $MASTER_IP and the ports); set "
                             f"{'it' if len(unknown) == 1 else 'them'} in the entry's envs")
    headless = "--headless" in filled
    if serving and headless:
        raise NightlyRefused(f"{where}: node 0 runs --headless; node 0 serves the API the benchmark runs against")
    if not serving and not headless:
        raise NightlyRefused(f"{where}: not --headless, so a second API server; missing: a launcher for more "
                             "than one server per candidate (only node 0 serves)")
    return filled


def import_multi_node(raw: dict[str, Any], path: str, benchmark: str | None, datasets: str | None, *,
                      soc: Soc | None, model_root: str | None) -> Recipe:
    """A multi-node file (num_nodes > 1, one `deployment` entry per node) as a recipe whose engine
    spans hosts: node 0 serves, the others run headless (the module's docstring)."""
    if not raw.get("model"):
        raise NightlyRefused(f"{path}: no `model`")
    common = {str(k): v for k, v in (raw.get("env_common") or {}).items()}
    case = picked_case(raw, path, None)
    name = case["name"]
    key, bench = pick_benchmark(case, benchmark, path)
    each = []
    for index, entry in enumerate(raw["deployment"]):
        where = f"{path} deployment[{index}]"
        if not isinstance(entry, dict):
            raise NightlyRefused(f"{where}: not a mapping with `server_cmd` and `envs`")
        envs = {str(k): v for k, v in (entry.get("envs") or {}).items()}
        flags = node_flags(entry.get("server_cmd"), envs, where, serving=index == 0)
        own = {k: _env_text(v) for k, v in envs.items()
               if k not in PORT_KEYS and (k not in common or _env_text(common[k]) != _env_text(v))}
        each.append({"flags": flags, "environment": own})
    body: dict[str, Any] = {
        "name": _slug(f"{name}-{key}"),
        "description": f"vllm-ascend nightly {path}::{key} ({bench.get('case_type')}; {len(each)} nodes x "
                       f"{raw['npu_per_node']} NPUs{f'; SoC {soc.name}: {soc.how}' if soc is not None else ''})",
        "symptom": [str(bench.get("case_type"))],
        "model": _model(str(raw["model"]), model_root),
        "engine": {"backend": "openai", "startup_timeout_s": 3600.0,
                   "nodes": {"cards": raw["npu_per_node"], "serving": 0, "each": each}, **_launcher_part(raw)},
        "environment": {k: _env_text(v) for k, v in common.items() if k not in PORT_KEYS},
        **_build_parts(raw, soc),
        **_benchmark_section(key, bench, case, f"{path}::{key}", datasets),
    }
    return _as_recipe(body, f"{path}::{key}")


def _model(model: str, root: str | None) -> dict[str, str]:
    """The model as the recipe mounts it: a hub id under `root` when given, else as the case names it."""
    if root is None or Path(model).is_absolute():
        return {"path": model}
    where = str(Path(root).expanduser().resolve() / model)
    return {"path": where, "host_path": where}


def model_unplaced(recipe: Recipe) -> bool:
    """Whether the case's server would load a model this host does not hold: `vllm serve MODEL`
    (the nightly's runners are offline) on a path that is not a directory here, with no
    model.host_path to mount. A case with a launcher of its own reads its model word as it likes."""
    default_launcher = EngineSpec.model_fields["launcher"].get_default(call_default_factory=True)
    path = Path(recipe.model.path)
    return (recipe.model.host_path is None and recipe.engine.launcher == default_launcher
            and not (path.is_absolute() and path.is_dir()))


def import_notes(recipe: Recipe, datasets: str | None) -> list[str]:
    """What an imported recipe still needs from this host before it can run, one line each."""
    notes = []
    if model_unplaced(recipe):
        what = "not a directory here" if Path(recipe.model.path).is_absolute() else "a hub id, not a directory here"
        notes.append(f"model {recipe.model.path}: {what}; set model.host_path to where it "
                     "lies (or import with --model-root DIR, the directory holding ORG/NAME)")
    acc = recipe.accuracy
    if acc is not None and datasets is None and not Path(acc.dataset).is_absolute():
        notes.append(f"dataset {acc.dataset}: relative, as the nightly's dataset cache holds it; it must lie under "
                     "the directory given as --datasets (import-nightly) or --nightly-datasets (run)")
    if "SoC" not in recipe.description:
        notes.append(f"SoC: neither the nightly's schedule nor the file's name says; the image builds from "
                     f"{recipe.build.dockerfile} (A2): set build.dockerfile for another (Dockerfile.a3, "
                     "Dockerfile.310p)")
    return notes


@dataclass(frozen=True)
class FileSurvey:
    """What became of every case of one file: imported recipes and one-line refusals."""

    path: str
    imported: list[str]
    refused: list[str]


def benchmark_names(raw: dict[str, Any], case_name: str | None) -> list[str | None]:
    """A case's benchmarks by key ([None]: the importer's default, when it names none)."""
    cases = [c for c in raw.get("test_cases") or [] if isinstance(c, dict)
             and (case_name is None or str(c.get("name")) == case_name)]
    benchmarks = cases[0].get("benchmarks") if len(cases) == 1 else None
    return [str(k) for k in benchmarks] if isinstance(benchmarks, dict) and benchmarks else [None]


def survey(text: str, path: str, soc: Soc | None = None) -> FileSurvey:
    """Import every benchmark of every case of a file; refusals as one line each."""
    try:
        raw = read_case_file(text, path)
    except UsageError as exc:
        return FileSurvey(path, [], [str(exc)])
    names: list[str | None] = list(dict.fromkeys(case_names(raw))) or [None]
    across = several_nodes(raw, path)
    if across:
        names = [None]
    benchmarks = raw.get("benchmarks")
    imported, refused = [], []
    for name in names:
        each: list[str | None] = [str(k) for k in benchmarks] if across and isinstance(benchmarks, dict) \
            and benchmarks and _multi_node_reason(raw, path) is None else benchmark_names(raw, name)
        for benchmark in each:
            try:
                imported.append(import_case(raw, path, name, benchmark, soc=soc).name)
            except UsageError as exc:
                refused.append(str(exc))
    return FileSurvey(path, imported, refused)
