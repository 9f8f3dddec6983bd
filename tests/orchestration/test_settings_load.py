"""The load shape as settings: `engine.load.concurrency` and `engine.load.requests` are recipe
paths the settings search varies, sent by the openai backend to a real server (the demo engine
behind `serve_mini`) while the observed request runs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_npu.demo.manifest import Manifest
from bisect_npu.errors import UsageError
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.settings import apply, differences_from_settings

SERVED = {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"],
          "startup_timeout_s": 120}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def served_recipe(tmp_path: Path, load: dict[str, int]) -> Path:
    """demo-async-penalty served over HTTP, under `load`."""
    raw = yaml.safe_load(Path(load_recipe("demo-async-penalty").source or "").read_text())
    raw["engine"].update(SERVED, port=free_port(), load=load)
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_load_keys_are_settings_of_a_served_recipe(tmp_path: Path) -> None:
    recipe = load_recipe(str(served_recipe(tmp_path, {"concurrency": 4, "requests": 8})))
    differences = differences_from_settings(recipe, {"engine.load.concurrency": 1, "engine.load.requests": 1})
    assert [(d.key, d.bad, d.good) for d in differences] == [("engine.load.concurrency", 4, 1),
                                                             ("engine.load.requests", 8, 1)]
    with pytest.raises(UsageError, match="the mini backend runs one request at a time"):
        apply(load_recipe("demo-async-penalty"), {"engine.load.requests": 4})
    with pytest.raises(UsageError, match=r"nearest: engine\.load\.concurrency"):
        differences_from_settings(recipe, {"engine.load.concurency": 1})


@pytest.mark.e2e
def test_the_search_varies_the_load_on_a_real_server(tmp_path: Path) -> None:
    """The async-scheduling loop is the trigger; the load (4 in flight, 8 requests) is not needed,
    and the bad case's trials ran under it."""
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path / "upstream"
    manifest: Manifest = generate_upstream(repo, seed=0)
    truth = manifest.case("async-penalty")
    recipe = served_recipe(tmp_path, {"concurrency": 4, "requests": 8})
    session = tmp_path / "session"
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "settings", "--repo", str(repo), "--at", truth.bad_ref,
                           "--recipe", str(recipe), "--good-set", "engine.load.concurrency=1",
                           "--good-set", "engine.args.async_scheduling=false", "--good-set", "engine.load.requests=1",
                           "--session", str(session), "--no-verdict-store", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["trigger"] == ["engine.args.async_scheduling"]
    report = json.loads((session / "report.json").read_text())
    answers = {row["key"]: row["answer"] for row in report["keys"]}
    assert answers == {"engine.load.concurrency": "not needed", "engine.args.async_scheduling": "needed",
                       "engine.load.requests": "not needed"}
    loads = [observation["extra"].get("load") for path in (session / "configurations").rglob("*.json")
             if "extra" in (observation := json.loads(path.read_text()))]
    assert {"concurrency": 4, "requests": 8, "completed": 8, "max_in_flight": 4, "errors": []} in loads
    assert None in loads  # a configuration with requests=1 sends the case alone
