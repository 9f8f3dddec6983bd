"""The accuracy harnesses against the demo engine over HTTP: the server itself, the probe running
real lm-eval, real AISBench and a command harness, and every bad input (never a verdict).

Real parts throughout: git worktrees of the generated demo upstream, their build step, the
`serve_mini` server, `python -m bisect_npu.probe`. The lm-eval and AISBench tests are marked
`harness`: they need the venvs `make harnesses` installs (`make test` does), skip without them,
and FAIL under CI=true.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.demo.accuracy import DATASET, generate_dataset, read_dataset
from bisect_npu.observations import Observation
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.probe.harness import HARNESS_FAILED_EXIT, INSTALLS, harness_home
from bisect_npu.recipe.loader import load_recipe, parse_recipe
from tests.helpers.paths import HELPERS, REPO_ROOT

COMMAND_HARNESS = HELPERS / "accuracy_command_harness.py"
LONG = {row["id"] for row in read_dataset() if row["kind"] == "long"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def checkout(repo: Path, sha: str, dest: Path) -> Path:
    if not dest.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(dest), sha], check=True)
        subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def trees(demo_upstream, tmp_path_factory):
    """Built trees of the rope culprit's parent (good) and the culprit (bad)."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    base = tmp_path_factory.mktemp("accuracy-trees")
    return {"good": checkout(repo, case.culprit_parent, base / "good"),
            "bad": checkout(repo, case.culprit.sha, base / "bad")}


def harness_executable(name: str) -> str:
    """The harness's venv as `make harnesses` makes it; skip (FAIL under CI=true) without it."""
    install = INSTALLS[name]
    path = os.environ.get(install.env_var) or os.path.join(harness_home(), install.venv_name, "bin", install.command)
    if not os.access(path, os.X_OK):
        message = f"{install.package}=={install.version} is not installed at {path}: run `make {install.make_target}`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def write_recipe(tmp_path: Path, body: dict[str, Any], dataset: str | Path = DATASET) -> Path:
    recipe = {
        "name": "test-accuracy", "model": {"path": "seed:0", "dtype": "float32"},
        "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"],
                   "port": free_port(), "startup_timeout_s": 120},
        "accuracy": {"dataset": str(dataset), "sampling": {"temperature": 0.0, "max_tokens": 4, "seed": 0}, **body},
        "oracle": {"kinds": ["accuracy"]},
    }
    path = tmp_path / f"recipe-{recipe['engine']['port']}.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def probe(tree: Path, recipe_path: Path, out: Path, sample_ids: list[str] | None = None,
          env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    recipe = parse_recipe(recipe_path.read_text(), source=str(recipe_path))
    request = probe_request(recipe, recipe.cases[0], commit=tree.name, trial=0, sample_ids=sample_ids)
    out.mkdir(parents=True, exist_ok=True)
    request["output"] = str(out / "obs.json")
    (out / "request.json").write_text(json.dumps(request))
    environ = {**{k: v for k, v in os.environ.items() if k not in unset},
               "PYTHONPATH": os.pathsep.join([str(tree), str(REPO_ROOT)]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(out / "request.json")], env=environ,
                          capture_output=True, text=True, timeout=900, check=False)


def samples_of(out: Path) -> dict[str, float]:
    observation = Observation.load(out / "obs.json")
    assert observation.samples is not None
    return {s.id: s.correct for s in observation.samples}


# --- the dataset -------------------------------------------------------------------------------

@pytest.mark.e2e
def test_dataset_is_the_good_ends_answers_and_the_drift_breaks_the_long_ones(trees):
    rows = read_dataset()
    assert generate_dataset(trees["good"]) == rows  # the bundled file is what the generator records
    assert 10 <= len(LONG) < len(rows) <= 40
    bad = {row["id"]: row["answer"] for row in generate_dataset(trees["bad"])}
    wrong = {row["id"] for row in rows if bad[row["id"]] != row["answer"]}
    assert wrong == LONG  # short questions stay right at the culprit, every long one goes wrong


# --- the server --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(trees, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve-mini") / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trees["good"]), str(REPO_ROOT)])}
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "bisect_npu.probe.serve_mini", "seed:0", "--port", str(port),
                                 "--served-model-name", "tiny"], env=env, stdout=fh, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(log.read_text()) from None
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def stream(base: str, path: str, body: dict[str, Any]) -> list[Any]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    events = [line[len(b"data: "):].strip() for line in response.read().splitlines() if line.startswith(b"data: ")]
    conn.close()
    assert events[-1] == b"[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.e2e
def test_server_answers_as_vllm_serves(server):
    row = read_dataset()[0]
    with urllib.request.urlopen(server + "/v1/models", timeout=30) as response:
        assert json.loads(response.read())["data"][0]["id"] == "tiny"
    status, done = post(server, "/v1/completions", {"model": "tiny", "prompt": row["question"], "max_tokens": 4,
                                                    "temperature": 0})
    assert status == 200
    choice = done["choices"][0]
    assert choice["text"].strip() == row["answer"] and choice["finish_reason"] in ("length", "stop")
    assert done["usage"]["prompt_tokens"] == len(row["question"].split())
    assert done["usage"]["total_tokens"] == done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
    chunks = stream(server, "/v1/completions", {"model": "tiny", "prompt": row["question"], "max_tokens": 4,
                                                "temperature": 0})
    assert "".join(c["choices"][0]["text"] for c in chunks).strip() == row["answer"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    # A stop string cuts the text before it, as vLLM does, and the stream sends the same text.
    second = row["answer"].split()[1]
    status, stopped = post(server, "/v1/completions", {"prompt": row["question"], "max_tokens": 4,
                                                       "temperature": 0, "stop": [second]})
    assert stopped["choices"][0]["text"].strip() == row["answer"].split()[0]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    chunks = stream(server, "/v1/completions", {"prompt": row["question"], "max_tokens": 4, "temperature": 0,
                                                "stop": [second]})
    assert "".join(c["choices"][0]["text"] for c in chunks) == stopped["choices"][0]["text"]


@pytest.mark.e2e
def test_chat_and_its_stream_agree(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "please repeat the story"}],
            "max_tokens": 6, "temperature": 0, "seed": 3}
    status, done = post(server, "/v1/chat/completions", body)
    assert status == 200 and done["object"] == "chat.completion"
    message = done["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    chunks = stream(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == message["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == done["usage"]["completion_tokens"]


@pytest.mark.e2e
def test_server_refuses_bad_requests_with_400(server):
    for body in ({"prompt": "hello", "max_tokens": 100000}, {"prompt": "hello", "n": 2},
                 {"prompt": "hello", "temperature": "hot"}, {"prompt": "hello", "model": "other"}, {}):
        status, error = post(server, "/v1/completions", body)
        assert status == 400 and error["object"] == "error" and error["message"], body
    status, error = post(server, "/v1/chat/completions", {"messages": []})
    assert status == 400


@pytest.mark.e2e
def test_openai_backend_drives_the_demo_engine(trees, tmp_path):
    """The existing openai probe backend streams a case from serve_mini: the greedy tokens are the
    mini backend's (the same engine in-process)."""
    case = {"prompt": "please repeat the story of the old man and the sea",
            "sampling": {"temperature": 0.0, "max_tokens": 24, "seed": 0, "logprobs": 3}}
    observations = {}
    for backend, engine in (("openai", {"launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"],
                                        "port": free_port(), "startup_timeout_s": 120}), ("mini", {})):
        request = {"schema_version": 1, "commit": "c", "recipe": "r", "case_id": "c", "trial": 0, "seed": 0,
                   "backend": backend, "model": {"path": "seed:0", "dtype": "float32"}, "engine": engine,
                   "case": case, "loop_guard": None, "logits": {"top_k": 3, "dump_dir": None},
                   "output": str(tmp_path / f"{backend}.json")}
        (tmp_path / f"{backend}-request.json").write_text(json.dumps(request))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trees["good"]), str(REPO_ROOT)])}
        done = subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(tmp_path / f"{backend}-request.json")],
                              env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        observations[backend] = Observation.load(tmp_path / f"{backend}.json")
    served, inprocess = observations["openai"], observations["mini"]
    assert served.output_token_ids == inprocess.output_token_ids and len(served.output_token_ids) == 24
    assert served.prompt_token_ids == inprocess.prompt_token_ids
    assert [row[0][0] for row in served.top_logprobs or []] == served.output_token_ids
    assert served.finish_reason == "length"


# --- the command harness, and what breaks a harness ----------------------------------------------

def command_section(behave: str = "ok") -> dict[str, Any]:
    return {"harness": "command", "command": {"argv": [sys.executable, str(COMMAND_HARNESS), "{base_url}", "{model}",
                                                      "{dataset}", "{output}", "--behave", behave]}}


@pytest.mark.e2e
def test_command_harness_scores_the_ends_and_a_focus_list(trees, tmp_path):
    recipe = write_recipe(tmp_path, command_section())
    done = probe(trees["good"], recipe, tmp_path / "good")
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(samples_of(tmp_path / "good").values()) == {1.0}
    focus = [*sorted(LONG)[:3], "qa-01"]
    done = probe(trees["bad"], recipe, tmp_path / "bad", sample_ids=focus)
    assert done.returncode == 0, done.stderr[-2000:]
    got = samples_of(tmp_path / "bad")
    assert list(got) == focus  # exactly the focus list, in its order
    assert got == {sid: (0.0 if sid in LONG else 1.0) for sid in focus}
    observation = Observation.load(tmp_path / "bad" / "obs.json")
    flipped = next(s for s in observation.samples or [] if s.id == focus[0])
    assert flipped.output and flipped.target and flipped.output != flipped.target


@pytest.mark.parametrize(("behave", "says"), [
    ("exit", "exited 3"),
    ("nothing", "wrote no per-sample file"),
    ("garbage", "not a JSON line"),
    ("empty", "wrote no sample line"),
])
@pytest.mark.e2e
def test_a_broken_harness_is_infrastructure(trees, tmp_path, behave, says):
    done = probe(trees["good"], write_recipe(tmp_path, command_section(behave)), tmp_path / behave)
    assert done.returncode == HARNESS_FAILED_EXIT, done.stderr[-2000:]
    assert says in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / behave / "obs.json").exists()


@pytest.mark.e2e
def test_missing_or_empty_dataset_is_infrastructure(trees, tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    done = probe(trees["good"], write_recipe(tmp_path, command_section(), dataset=missing), tmp_path / "missing")
    assert done.returncode == HARNESS_FAILED_EXIT
    assert f"the dataset {missing} does not exist" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "missing" / "obs.server.log").exists()  # said before the server starts
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    done = probe(trees["good"], write_recipe(tmp_path, command_section(), dataset=empty), tmp_path / "empty")
    assert done.returncode == HARNESS_FAILED_EXIT
    assert "has no samples" in done.stderr.strip().splitlines()[-1]


@pytest.mark.e2e
def test_missing_harness_names_its_make_target(trees, tmp_path):
    recipe = write_recipe(tmp_path, {"harness": "lm_eval", "lm_eval": {"task": str(DATASET.parent / "demo_qa.yaml"),
                                                                       "model": "local-completions"}})
    env = {"BISECT_NPU_HARNESS_HOME": str(tmp_path / "no-harnesses"), "PATH": "/usr/bin:/bin"}
    done = probe(trees["good"], recipe, tmp_path / "out", env=env, unset=(INSTALLS["lm_eval"].env_var,))
    assert done.returncode == HARNESS_FAILED_EXIT
    last = done.stderr.strip().splitlines()[-1]
    assert "harness lm_eval is not installed: run `make harness-lmeval`" in last and "lm-eval==0.4.13" in last
    assert not (tmp_path / "out" / "obs.server.log").exists()


@pytest.mark.e2e
def test_a_harness_failure_stops_the_run_with_exit_5(demo_upstream, tmp_path):
    """Through `bisect-npu run`: the good end's harness run fails, and the run ends as an
    infrastructure error (exit 5), not as a verdict about either end."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    recipe = write_recipe(tmp_path, command_section("exit"))
    recipe_data = json.loads(recipe.read_text())
    recipe_data["build"] = {"local_command": ["python", "tools/build_kernels.py"]}
    recipe.write_text(json.dumps(recipe_data))
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", case.good_ref,
                           "--bad", case.bad_ref, "--recipe", str(recipe), "--session", str(tmp_path / "session"),
                           "--no-fix", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["exit_code"] == 5 and summary["culprit"] is None
    assert "exited 3" in done.stderr


# --- real lm-eval and real AISBench --------------------------------------------------------------

def bundled_recipe(name: str, tmp_path: Path) -> tuple[Path, str]:
    """The bundled recipe on a free port and the bundled dataset, with its harness (skip, or FAIL
    under CI=true, without the harness's venv)."""
    recipe = load_recipe(name)
    assert recipe.accuracy is not None
    harness_executable(recipe.accuracy.harness)
    path = tmp_path / f"{name}.yaml"
    text = Path(recipe.source or "").read_text().replace(f"port: {recipe.engine.port}", f"port: {free_port()}")
    path.write_text(text.replace("data/demo-accuracy/", f"{DATASET.parent}/"))
    return path, recipe.accuracy.harness


def scores_the_whole_dataset_right_at_the_good_side(trees, tmp_path: Path, path: Path) -> None:
    done = probe(trees["good"], path, tmp_path / "good")
    assert done.returncode == 0, done.stderr[-3000:]
    assert samples_of(tmp_path / "good") == {row["id"]: 1.0 for row in read_dataset()}


def scores_the_focus_at_the_culprit_long_ones_wrong(trees, tmp_path: Path, path: Path, harness: str) -> None:
    focus = [*sorted(LONG)[:4], "qa-01", "qa-03"]
    done = probe(trees["bad"], path, tmp_path / "bad", sample_ids=focus)
    assert done.returncode == 0, done.stderr[-3000:]
    bad = samples_of(tmp_path / "bad")
    assert bad == {sid: (0.0 if sid in LONG else 1.0) for sid in focus} and list(bad) == focus
    observation = Observation.load(tmp_path / "bad" / "obs.json")
    assert observation.extra["harness"] == harness
    flipped = next(s for s in observation.samples or [] if s.id == focus[0])
    assert flipped.prompt and flipped.output and flipped.target and flipped.output.strip() != flipped.target


HARNESS_RECIPES = {"lm_eval": "demo-accuracy", "aisbench": "demo-accuracy-aisbench"}


@pytest.mark.e2e
@pytest.mark.harness
@pytest.mark.parametrize("harness", HARNESS_RECIPES)
def test_real_harness_scores_the_focused_samples_per_sample(trees, tmp_path, harness):
    """Each harness at the culprit on a focus of long and short questions: the long ones wrong, the
    short ones right, in the focus's order, read from the harness's own per-sample files (lm-eval's
    samples, AISBench's result and prediction files). That the good side answers every question
    right is test_dataset_is_the_good_ends_answers_and_the_drift_breaks_the_long_ones's."""
    path, used = bundled_recipe(HARNESS_RECIPES[harness], tmp_path)
    scores_the_focus_at_the_culprit_long_ones_wrong(trees, tmp_path, path, used)


@pytest.mark.e2e
@pytest.mark.harness
@pytest.mark.heavy  # a harness run more than the focused test above: the good side's whole dataset
@pytest.mark.parametrize("harness", HARNESS_RECIPES)
def test_real_harness_scores_per_sample_at_both_sides(trees, tmp_path, harness):
    """Each harness at both sides of the culprit: the whole dataset right at the good side, then
    the culprit's focus."""
    path, used = bundled_recipe(HARNESS_RECIPES[harness], tmp_path)
    scores_the_whole_dataset_right_at_the_good_side(trees, tmp_path, path)
    scores_the_focus_at_the_culprit_long_ones_wrong(trees, tmp_path, path, used)


@pytest.mark.harness
@pytest.mark.timeout(1800)  # a real harness run per step on the CPU
# AISBench's bisection (about 45 s a step) runs in the heavy tier; its focused per-sample scoring above runs in
# make test.
@pytest.mark.e2e
@pytest.mark.heavy  # its lighter siblings stay: the real harnesses per sample here, the command harness's
# bisection in test_accuracy_session.py
@pytest.mark.parametrize("harness", ["lm_eval", "aisbench"])
def test_demo_accuracy_case_finds_the_manifests_culprit(harness, tmp_path):
    """`bisect-npu demo --case accuracy` end to end, scored by the real harness: the culprit is the
    manifest's, the ends ran the whole dataset and the candidates only the focused samples."""
    harness_executable(harness)
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "demo", "--case", "accuracy", "--harness", harness,
                           "--no-verify-fix", "--quiet", "--session-root", str(tmp_path / "sessions"), "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["match"] is True and summary["culprit"] == summary["expected"]
    runs = [Observation.load(path) for path in (tmp_path / "sessions").glob("*/steps/*/obs-accuracy-*.json")]
    sizes = sorted(len(o.samples or []) for o in runs)
    total = len(read_dataset())
    assert sizes.count(total) >= 2 and sizes[0] < total  # both ends whole, candidates focused
    assert all(o.extra["harness"] == harness for o in runs)


def test_make_targets_install_the_pinned_harnesses():
    """The Makefile's harness venvs are the ones the probe looks for, with the same pins."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    for install in INSTALLS.values():
        assert f"$(HARNESS_HOME)/{install.venv_name}\n" in makefile, install
        assert f"{install.package}=={install.version}" in makefile or (
            f"{install.package}[api]=={install.version}" in makefile), install
        assert f"{install.make_target}:" in makefile
    assert "torch==2.13.0" in makefile.split("AISBENCH_VENV)/.installed:")[1].split("cp $(AISBENCH_LOCK)")[0]


def test_harness_outputs_that_do_not_parse_are_errors(tmp_path):
    """lm-eval's and AISBench's own per-sample files: read when sound, an error naming the file
    when broken, and an aggregate without per-sample details is never taken for a score."""
    from bisect_npu.probe.harness import HarnessError, aisbench, lm_eval

    samples = tmp_path / "lm" / "output" / "model" / "samples_task_2026.jsonl"
    samples.parent.mkdir(parents=True)
    line = {"doc_id": 0, "doc": {"id": "qa-01"}, "target": "a b", "filtered_resps": ["a b"], "metrics": ["exact_match"],
            "exact_match": 1.0, "arguments": {"gen_args_0": {"arg_0": "q"}}}
    second = {**line, "doc_id": 1, "doc": {}, "exact_match": 0.0}
    samples.write_text(json.dumps(line) + "\n" + json.dumps(second) + "\n")
    assert [(s["id"], s["correct"]) for s in lm_eval.read_samples(str(tmp_path / "lm"), ["qa-01", "qa-02"])] == [
        ("qa-01", 1.0), ("qa-02", 0.0)]
    samples.write_text(json.dumps(line) + "\n{not json\n")
    with pytest.raises(HarnessError, match=r"samples_task_2026.jsonl:2: not a JSON line"):
        lm_eval.read_samples(str(tmp_path / "lm"), None)
    samples.write_text(json.dumps({**line, "exact_match": "yes"}) + "\n")
    with pytest.raises(HarnessError, match=r"no per-sample 0\.\.1 score"):
        lm_eval.read_samples(str(tmp_path / "lm"), None)
    with pytest.raises(HarnessError, match="wrote no samples file"):
        lm_eval.read_samples(str(tmp_path / "nothing"), None)

    run = tmp_path / "ais" / "20261202_000000"
    (run / "results" / "candidate").mkdir(parents=True)
    (run / "predictions" / "candidate").mkdir(parents=True)
    result = run / "results" / "candidate" / "demo_qa.json"
    result.write_text(json.dumps({"accuracy": 50.0, "details": [
        {"example_abbr": "demo_qa_test_0", "is_correct": [True]},
        {"example_abbr": "demo_qa_test_1", "is_correct": [False]}]}))
    (run / "predictions" / "candidate" / "demo_qa.jsonl").write_text(
        json.dumps({"id": 1, "prediction": " x y", "gold": "a b", "origin_prompt": "q"}) + "\n")
    outcomes = aisbench.read_samples(str(tmp_path / "ais"), ["qa-05", "qa-09"])
    assert [(s["id"], s["correct"]) for s in outcomes] == [("qa-05", 1.0), ("qa-09", 0.0)]
    assert outcomes[1]["output"] == " x y" and outcomes[1]["target"] == "a b"
    result.write_text(json.dumps({"accuracy": 50.0}))
    with pytest.raises(HarnessError, match="no per-sample details"):
        aisbench.read_samples(str(tmp_path / "ais"), None)
    result.write_text("{")
    with pytest.raises(HarnessError, match="cannot read AISBench's"):
        aisbench.read_samples(str(tmp_path / "ais"), None)
    (run / "predictions" / "candidate" / "demo_qa_failed.jsonl").write_text(
        json.dumps({"id": 0, "error_info": "Connection refused"}) + "\n")
    with pytest.raises(HarnessError, match="requests to the server failed for 1 samples"):
        aisbench.read_samples(str(tmp_path / "ais"), None)


def test_a_harness_missing_in_a_candidate_s_container_says_to_install_it_in_the_image(tmp_path):
    """The probe as `--executor docker` mounts it (the package under another name): the host's
    `make harness-*` venvs are not the next step there."""
    from bisect_npu.execute.docker import PROBE_PACKAGE, probe_source_dir

    shutil.copytree(probe_source_dir(), tmp_path / PROBE_PACKAGE)
    script = f"from {PROBE_PACKAGE}.harness import find_executable\nfind_executable('aisbench')\n"
    env = {"PATH": "/usr/bin:/bin", "BISECT_NPU_HARNESS_HOME": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    last = done.stderr.strip().splitlines()[-1]
    assert "harness aisbench is not installed in the candidate's container" in last
    assert "ais-bench-benchmark==3.1.20260630 in the image" in last and "$BISECT_NPU_AIS_BENCH" in last
    assert "pip install -c containers/harness-locks/ais-bench-benchmark-3.1.20260630.txt" in last
    assert "make harness" not in last
