"""Host detection from recorded `npu-smi info` outputs (tests/data/npu-smi/README.md says where
each layout comes from): the host type, its image variant and dtype, and the slot rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.api.host_checks import check_host
from bisect_npu.errors import UsageError
from bisect_npu.execute import host as host_module
from bisect_npu.execute.host import (
    check_devices_on_host,
    check_slot_shares,
    detect_host,
    host_changes,
    parse_npu_smi_info,
    recipe_for_host,
)
from bisect_npu.orchestration.opening.environments import session_evaluator
from bisect_npu.orchestration.opening.preflight import check_run
from bisect_npu.recipe.loader import load_recipe, parse_recipe
from tests.helpers.asked import spec_of
from tests.helpers.paths import DATA

SAMPLES = DATA / "npu-smi"
A2, A3, P310 = (SAMPLES / name for name in ("a2-atlas-800i-a2.txt", "a3-atlas-800-a3.txt",
                                            "310p-atlas-300i-duo.txt"))


def parsed(path: Path) -> host_module.NpuHost:
    return parse_npu_smi_info(path.read_text())


def test_an_a2_has_eight_single_die_npus_and_the_plain_dockerfile() -> None:
    host = parsed(A2)
    assert host.kind == "A2" and host.devices == list(range(8))
    assert host.pairs() == [(n,) for n in range(8)]
    assert (host.dockerfile, host.dtype, host.die_unit) == ("Dockerfile", None, 1)
    assert {die.name for die in host.dies} == {"910B3"}


def test_an_a3_has_sixteen_dies_in_pairs_by_phy_id() -> None:
    host = parsed(A3)
    assert host.kind == "A3" and host.devices == list(range(16))
    assert host.pairs() == [(2 * n, 2 * n + 1) for n in range(8)]
    assert (host.dockerfile, host.die_unit) == ("Dockerfile.a3", 2)
    assert "16 dies on 8 NPUs" in host.describe()


def test_a_310p_duo_reads_the_device_column_and_runs_float16() -> None:
    host = parsed(P310)
    assert host.kind == "310P" and host.devices == [0, 1, 2, 3]
    assert [(die.npu, die.chip, die.device) for die in host.dies] == [(1, 0, 0), (1, 1, 1), (2, 0, 2), (2, 1, 3)]
    assert (host.dockerfile, host.dtype) == ("Dockerfile.310p", "float16")


def test_an_unknown_chip_and_an_empty_table() -> None:
    host = parse_npu_smi_info(A2.read_text().replace("910B3", "910A "))
    assert host.kind is None and host.dockerfile == "Dockerfile"
    with pytest.raises(UsageError, match="lists no NPU"):
        parse_npu_smi_info("npu-smi: command failed\n")


def fake_npu_smi(tmp_path: Path, sample: Path, code: int = 0) -> str:
    script = tmp_path / "npu-smi"
    script.write_text(f"#!/bin/sh\ncat '{sample}'\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_detect_host_runs_npu_smi_and_gives_none_without_it(tmp_path: Path) -> None:
    found = detect_host(fake_npu_smi(tmp_path, A3))
    assert found is not None and found.kind == "A3"
    assert detect_host(str(tmp_path / "absent")) is None
    assert detect_host(fake_npu_smi(tmp_path, A3, code=1)) is None


def test_doctor_prints_the_host_type(tmp_path: Path) -> None:
    check = check_host(fake_npu_smi(tmp_path, A2))
    assert check.ok and check.detail.startswith("Atlas A2 (800I A2, 910B): 8 dies on 8 NPUs (910B3)")


def test_an_engine_larger_than_the_host_is_refused() -> None:
    with pytest.raises(UsageError, match=r"needs 16 dies .* this host has 8: Atlas A2"):
        check_devices_on_host(parsed(A2), list(range(8)), 16)
    assert check_devices_on_host(parsed(A3), list(range(16)), 16) == 16
    with pytest.raises(UsageError, match=r"--devices 8,9: this host has devices 0,1,2,3,4,5,6,7"):
        check_devices_on_host(parsed(A2), [6, 7, 8, 9], 1)


def test_a3_slots_keep_die_pairs_together() -> None:
    a3 = parsed(A3)
    assert check_devices_on_host(a3, list(range(16)), 1) == 2  # a one-die engine still takes its NPU's pair
    assert check_devices_on_host(a3, list(range(16)), 3) == 4
    with pytest.raises(UsageError, match=r"one die of the A3 NPU\(s\) 2\+3"):
        check_devices_on_host(a3, [0, 1, 2], 1)
    check_slot_shares(a3, list(range(16)), 8)
    check_slot_shares(a3, list(range(16)), 4)
    with pytest.raises(UsageError, match=r"--slots 3 over 16 A3 dies gives 5 per slot"):
        check_slot_shares(a3, list(range(16)), 3)
    check_slot_shares(parsed(A2), list(range(8)), 3)  # an A2 NPU is one die: any split keeps them whole


def test_the_recipe_runs_with_the_hosts_image_and_dtype_unless_it_names_one() -> None:
    qwen = load_recipe("qwen3-repetition-penalty-async")
    assert recipe_for_host(qwen, "A3").build.dockerfile == "Dockerfile.a3"
    on_310p = recipe_for_host(qwen, "310P")
    assert (on_310p.build.dockerfile, on_310p.model.dtype) == ("Dockerfile.310p", "float16")
    assert recipe_for_host(qwen, "A2").build.dockerfile == "Dockerfile" and recipe_for_host(qwen, None) is qwen
    assert qwen.model.dtype == "bfloat16" and qwen.build.dockerfile == "Dockerfile"  # the loaded recipe is kept
    named = load_recipe("deepseek-r1-mtp-temperature")
    assert recipe_for_host(named, "310P").build.dockerfile == "Dockerfile.a3"


def test_preflight_records_the_host_and_refuses_a_recipe_too_big_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_module, "NPU_SMI", fake_npu_smi(tmp_path, A2))
    options = spec_of(good="a", bad="b", repo=str(tmp_path), recipe="deepseek-r1-mtp-temperature",
                         executor="docker", devices=list(range(8)))
    with pytest.raises(UsageError, match=r"needs 16 dies .* this host has 8"):
        check_run(options)
    assert options.context.host == "A2"


def test_a_session_on_a_310p_evaluates_the_float16_recipe(tmp_path: Path) -> None:
    recipe = parse_recipe("name: t\nmodel:\n  path: /m\n  dtype: bfloat16\ncases:\n  - prompt: hi\n")
    options = spec_of(good="a", bad="b", recipe="t", host="310P")
    evaluator = session_evaluator(options, None, recipe, tmp_path, builder=object(),  # type: ignore[arg-type]
                                  executor=object())  # type: ignore[arg-type]
    assert evaluator.recipe is not None and evaluator.recipe.model.dtype == "float16"
    assert recipe.model.dtype == "bfloat16"


def test_host_changes_name_the_recipe_fields_the_host_changed() -> None:
    qwen = load_recipe("qwen3-repetition-penalty-async")
    assert host_changes(qwen, "310P") == {"build.dockerfile": "Dockerfile.310p", "model.dtype": "float16"}
    assert host_changes(qwen, "A3") == {"build.dockerfile": "Dockerfile.a3"}
    assert host_changes(qwen, "A2") == {} and host_changes(qwen, None) == {}  # the recipe as written
    assert host_changes(load_recipe("deepseek-r1-mtp-temperature"), "A3") == {}  # names its Dockerfile


def test_the_report_shows_the_host_type_and_the_dtype_it_forced(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.orchestration.session import Session
    from bisect_npu.report import load_view, render_json, render_markdown
    from tests.helpers.gitrepo import make_linear_repo

    monkeypatch.setattr(host_module, "NPU_SMI", fake_npu_smi(tmp_path, P310))
    shas = make_linear_repo(tmp_path / "repo", 3)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: t\nmodel:\n  path: /m\n  dtype: bfloat16\ncases:\n  - id: a\n    prompt: hi\n")
    options = spec_of(good=shas[0], bad=shas[-1], repo=str(tmp_path / "repo"), recipe=str(recipe),
                         devices=[0, 1], propose_fix=False)
    session = Session.start(options, session_dir=tmp_path / "s")
    session.evaluator.close()
    session.journal.close()
    view = load_view(tmp_path / "s")
    assert view.header.host_changes == {"build.dockerfile": "Dockerfile.310p", "model.dtype": "float16"}
    assert ("- NPU host type: 310P; the recipe as this host ran it: `build.dockerfile: Dockerfile.310p`, "
            "`model.dtype: float16`\n") in render_markdown(view)
    assert render_json(view)["host"] == "310P"
    assert render_json(view)["host_changes"]["model.dtype"] == "float16"


def test_fix_verify_detects_the_host_as_run_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fix --verify --devices`: an A3's runs get its switches, and what `run` refuses on a host
    (an engine larger than it, one die of an A3 NPU) is refused here too."""
    from bisect_npu.orchestration.opening.environments import make_evaluator
    from tests.helpers.gitrepo import make_linear_repo

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 2)
    seen = tmp_path / "seen"
    command = ["sh", "-c", f"echo $HCCL_OP_EXPANSION_MODE > {seen}"]
    monkeypatch.setattr(host_module, "NPU_SMI", fake_npu_smi(tmp_path, A3))
    with make_evaluator(str(repo), None, command=command, session_dir=tmp_path / "v", devices=[0, 1]) as evaluate:
        assert evaluate(shas[1]).kind.value == "good"
    assert seen.read_text().split() == ["AIV"]
    with pytest.raises(UsageError, match="takes one die of the A3 NPU"), \
            make_evaluator(str(repo), None, command=command, session_dir=tmp_path / "w", devices=[0]):
        pass
    monkeypatch.setattr(host_module, "NPU_SMI", fake_npu_smi(tmp_path, A2))
    with pytest.raises(UsageError, match=r"needs 16 dies .* this host has 8"), \
            make_evaluator(str(repo), "deepseek-r1-mtp-temperature", session_dir=tmp_path / "x",
                           devices=list(range(8))):
        pass
