"""Every executor option `run` takes reaches a settings search's builder and executor, asked with
`bisect-npu settings` and with `run --settings` alike: the options are parsed by the commands
themselves and the search is opened as they open it (its journal, its shared build's builder and
executor made), then closed before any build.

A real repository, the bundled demo recipe, a real container engine for the docker options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import git
import pytest
from click.testing import CliRunner

from bisect_npu.builders.base import Builder
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.builders.local import LocalBuilder
from bisect_npu.builders.prefetch import Prefetcher
from bisect_npu.errors import UsageError
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.level import SettingsLevel
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.orchestration.settings_search import SettingsQuestion, culprit_settings, settings_request
from bisect_npu.orchestration.settings_session import SettingsSearch
from bisect_npu.request import flags
from tests.helpers.gitrepo import make_one_commit_repo

RECIPE = "demo-async-penalty"
GOOD_SET = "engine.args.async_scheduling=false"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_one_commit_repo(tmp_path / "repo")


def under_settings(repo: Path, session: Path, options: list[str]) -> SettingsSearch:
    """`bisect-npu settings --at v1 ... OPTIONS` opened as `api.search_settings` opens it."""
    from bisect_npu.cli.run import request_parts
    from bisect_npu.cli.settings import settings, taken

    params: dict[str, Any] = dict(settings.make_context("settings", [
        "--repo", str(repo), "--at", "v1", "--recipe", RECIPE, "--good-set", GOOD_SET, "--no-verdict-store",
        *options]).params)
    asked = SettingsQuestion(ref=params.pop("ref"), good_set=params.pop("good_set"))
    for own in ("good_recipe", "vary", "session_dir", "after", "reference_at", "as_json"):
        params.pop(own)
    fields = {name: value for part in request_parts(params, taken=taken).values() for name, value in part.items()}
    question, request = settings_request(asked, fields)
    return SettingsSearch.start(question, request, session)


def under_run_settings(repo: Path, session: Path, options: list[str]) -> SettingsSearch:
    """`bisect-npu run --good v1 --bad v1 ... --settings KEY=VALUE OPTIONS`: the search it opens at its culprit."""
    from bisect_npu.cli.run import request_from, run

    params: dict[str, Any] = dict(run.make_context("run", [
        "--repo", str(repo), "--good", "v1", "--bad", "v1", "--recipe", RECIPE, "--settings", GOOD_SET,
        "--no-verdict-store", *options]).params)
    for own in ("session_dir", "as_json", "quiet"):
        params.pop(own)
    spec = SessionSpec.of(request_from(params))
    culprit = git.Repo(repo).commit("v1").hexsha
    question, request = culprit_settings(spec, SettingsLevel(commit=culprit, good_set=list(spec.search.settings)),
                                         session, None)
    return SettingsSearch.start(question, request, session / "settings")


OPENERS = {"settings": under_settings, "run --settings": under_run_settings}


@pytest.fixture(params=sorted(OPENERS))
def opened(request: pytest.FixtureRequest, repo: Path, tmp_path: Path) -> Iterator[Callable[[list[str]],
                                                                                             SettingsSearch]]:
    searches: list[SettingsSearch] = []

    def open_with(options: list[str]) -> SettingsSearch:
        searches.append(OPENERS[request.param](repo, tmp_path / f"session-{len(searches)}", options))
        return searches[-1]

    yield open_with
    for search in searches:
        search.close()


def innermost(builder: Builder) -> Builder:
    """The builder under the wrappers (prefetch, dependency layers): the one that builds."""
    while (inner := getattr(builder, "builder", None) or getattr(builder, "inner", None)) is not None:
        builder = inner
    return builder


def test_workdir_holds_the_shared_build(opened: Callable[[list[str]], SettingsSearch], tmp_path: Path) -> None:
    search = opened(["--workdir", str(tmp_path / "fast")])
    builder = innermost(search.base.builder)
    assert isinstance(builder, LocalBuilder)
    assert builder.workdir.is_relative_to((tmp_path / "fast").resolve())


def test_timeout_bounds_the_build_and_each_run(opened: Callable[[list[str]], SettingsSearch]) -> None:
    search = opened(["--timeout", "7", "--timeout-is", "bad"])
    builder = innermost(search.base.builder)
    assert isinstance(builder, LocalBuilder) and builder.timeout_s == 7.0
    assert (search.base.timeout_s, search.base.timeout_is) == (7.0, "bad")


def test_prefetch_wraps_the_builder(opened: Callable[[list[str]], SettingsSearch]) -> None:
    assert isinstance(opened(["--prefetch"]).base.builder, Prefetcher)
    assert not isinstance(opened(["--no-prefetch"]).base.builder, Prefetcher)


def test_slots_share_the_devices(opened: Callable[[list[str]], SettingsSearch]) -> None:
    executor = opened(["--devices", "0-3", "--slots", "2"]).base.executor
    assert isinstance(executor, LocalExecutor) and executor.devices == [0, 1, 2, 3]
    pool = executor.device_pool
    assert pool is not None
    with pool.lease() as first, pool.lease() as second:
        assert (first, second) == ([0, 1], [2, 3])


@pytest.mark.container
def test_docker_options_reach_the_image_builder(opened: Callable[[list[str]], SettingsSearch]) -> None:
    search = opened(["--executor", "docker", "--base-image-map", "quay.io=mirror.example/quay.io",
                     "--release-images", "quay.io/ascend/vllm-ascend:{tag}", "--cache-size", "5G"])
    builder = innermost(search.base.builder)
    assert isinstance(builder, DockerBuilder)
    assert builder.base_images.apply("quay.io/ascend/cann:8") == "mirror.example/quay.io/ascend/cann:8"
    assert builder.releases is not None and builder.releases.template == "quay.io/ascend/vllm-ascend:{tag}"
    assert builder.cache is not None and builder.cache.max_bytes == 5 * 2**30


@pytest.mark.parametrize("options", [["--executor", "ray", "--node-executor", "docker"],
                                     ["--executor", "ray", "--ray-address", "ray://head:10001"]])
def test_ray_options_are_taken_and_ray_refused_in_one_line(repo: Path, tmp_path: Path, options: list[str]) -> None:
    """Every configuration shares this host's one build, so a cluster has nothing to share out."""
    with pytest.raises(UsageError, match="--executor ray: a settings search runs every configuration on one build"):
        under_settings(repo, tmp_path / "session", options)
    assert not (tmp_path / "session").exists()


def test_settings_help_lists_every_executor_option_run_help_does() -> None:
    from bisect_npu.cli import cli

    runner = CliRunner()
    run_help = runner.invoke(cli, ["run", "--help"], terminal_width=200).output
    settings_help = runner.invoke(cli, ["settings", "--help"], terminal_width=200).output
    names = [name for part, _field, _info, spec in flags() if part == "executor"
             for declared in spec.names for name in declared.split("/")]
    assert len(names) >= 11
    for name in names:
        assert f"{name} " in run_help or f"{name}," in run_help
        assert f"{name} " in settings_help or f"{name}," in settings_help, name
