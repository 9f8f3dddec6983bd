"""Everything that can be wrong with a run's inputs, found before its journal is created: the
candidate range, the recipe or command, the Dockerfile at both ends, --slots and --workdir."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import git

from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.dependency import PinnedCommit, open_dependency_clone
from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.builders.local import check_workdir
from bisect_npu.builders.registry import BaseImageMap
from bisect_npu.builders.release_overlay import parse_release
from bisect_npu.builders.releases import check_template
from bisect_npu.builders.submodules import check_submodule_pins
from bisect_npu.builders.unit_tests import check_unit_tests, unit_test_command
from bisect_npu.defaults import LAST_GOOD
from bisect_npu.errors import UsageError
from bisect_npu.execute.ascend import device_files
from bisect_npu.execute.docker import check_command_mounts
from bisect_npu.execute.host import check_devices_on_host, check_slot_shares, detect_host, recipe_for_host
from bisect_npu.execute.host_devices import check_host_devices, missing_paths
from bisect_npu.execute.ray import settle_slots as settle_on_cluster
from bisect_npu.level import held_of, scope_of
from bisect_npu.nightly.at_commit import settle_run
from bisect_npu.nightly.cases import CaseRef, model_unplaced
from bisect_npu.orchestration.opening.session_spec import (
    SessionSpec,
    check_dependency_options,
    declared_dependencies,
    dep_repo_of,
    earlier_runs_spec,
)
from bisect_npu.orchestration.opening.verdict_reuse import resolve_last_good
from bisect_npu.orchestration.running.earlier_results import check_given, check_models, settled_given
from bisect_npu.probe.harness import HarnessError
from bisect_npu.probe.harness.dataset import indexed_rows, is_jsonl
from bisect_npu.recipe.check import check_recipe_at_ends, check_support, range_ends
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import EarlierRunsSpec, NodesSpec, Recipe
from bisect_npu.recipe.settings import differences_from_settings, parse_assignment
from bisect_npu.records import CandidateRange
from bisect_npu.upstream import history, versions
from bisect_npu.upstream.versions import tag_for_version

# Why the settings search (`settings`, `run --settings`) does not take --executor ray, and what to do instead.
RAY_REFUSED = ("--executor ray: a settings search runs every configuration on one build of its commit, kept by "
               "this host's builder, which Ray's nodes do not share; search with --executor local or docker on a "
               "host that runs the recipe (after a run: bisect-npu settings --after SESSION)")


@dataclass(frozen=True)
class RunInputs:
    """What a run's options resolved to: the journal header's `range` and what a session is made of."""

    recipe: Recipe | None
    repo: git.Repo | None
    earlier_runs: EarlierRunsSpec | None
    candidates_range: CandidateRange
    last_good_note: str | None = None  # `--good last-good`: which commit the verdict store gave
    # Said first: what --nightly-result read, what the host still owes the run (--nightly-case's dataset
    # place, --devices it lacks).
    owed: tuple[str, ...] = ()


def check_run(spec: SessionSpec, host_root: Path = Path("/")) -> RunInputs:
    """Resolve and check everything that can be wrong before the journal is created; settles
    `options` in place (the mode, and absolute paths: resume may start elsewhere). `host_root` is
    where the NPU device and driver files are looked up (a directory of fake ones in a test)."""
    check_good_table_options(spec)
    nightly_note, owed = settle_nightly(spec) if spec.judge.nightly_case or spec.range.good_table else (None, [])
    # --unit-test's runner is the command once settled: a later level's session starts with both.
    oracle_command = None if spec.judge.unit_tests else spec.judge.command
    if [spec.judge.recipe, oracle_command, spec.context.python_oracle, spec.judge.unit_tests or None].count(None) != 3:
        raise UsageError("give either --recipe FILE, --cmd COMMAND or --unit-test NODEID (the oracle for each "
                         "candidate)")
    if spec.judge.unit_test_from is not None and not spec.judge.unit_tests:
        raise UsageError("--unit-test-from REF names where the --unit-test files come from: add --unit-test")
    if spec.search.settings and spec.executor.executor == "ray":
        raise UsageError(f"--settings with {RAY_REFUSED}")
    recipe = load_recipe(spec.judge.recipe) if spec.judge.recipe else None
    if spec.judge.nightly_case and recipe is not None:
        owed = [*owed, *nightly_model_owed(spec.judge.nightly_case, recipe, spec.executor.executor == "docker")]
    if recipe is not None and recipe.accuracy is not None:
        check_accuracy_options(spec)
        check_dataset_ids(recipe)
    if spec.judge.earlier_results:
        spec.judge.earlier_results = settled_given(spec.judge.earlier_results)  # resume may start elsewhere
        check_given(spec.judge.earlier_results, recipe)
    if recipe is not None and recipe.accuracy is not None:
        check_models(recipe, spec.judge.earlier_results)  # a nightly of another model: before anything runs
    settle_executor(spec, recipe.cards_per_run() if recipe else 1, host_root,  # before any clone or index query
                    recipe.engine.nodes if recipe else None)
    owed = [*owed, *local_devices_missing(spec, host_root)]
    spec.search.mode = spec.search.mode or (recipe.trials.mode if recipe else "exact")
    earlier_runs = earlier_runs_spec(spec, recipe)
    if spec.search.earlier_runs and spec.level.takes_earlier_runs and spec.search.mode != "noisy":
        raise UsageError("--earlier-runs counts only in noisy mode; add --mode noisy (or trials.mode: noisy "
                         "in the recipe), or drop it: exact mode takes one verdict per commit")
    if recipe is not None and spec.judge.recipe and Path(spec.judge.recipe).exists():
        spec.judge.recipe = str(Path(spec.judge.recipe).resolve())
    for option, given in (("--package", spec.range.package), ("--repo", spec.range.repo)):
        if given is not None and not given.strip():
            raise UsageError(f"{option} is empty; name one, or leave the option out")
    repo = history.open_repo(spec.range.repo) if spec.range.repo else None
    if repo is not None and spec.range.repo and not history.is_url(spec.range.repo):
        spec.range.repo = str(repo.working_tree_dir or repo.git_dir)
    if spec.range.package is None and repo is None:
        raise UsageError("give --repo (a clone of the upstream) or --package (bisect published releases)")
    if spec.range.overlay_on_release:
        check_overlay_on_release(spec, repo)
    last_good_note = nightly_note
    if spec.range.good == LAST_GOOD:
        if repo is None or spec.range.package:
            raise UsageError("--good last-good picks a commit of --repo; with --package name the good release")
        spec.range.good, last_good_note = resolve_last_good(spec, recipe, repo)
    check_dependency_options(spec, recipe)
    check_settings(spec, recipe)
    try:
        candidates_range = resolve_candidates(spec, repo)
    except UsageError:
        if spec.range.good_table is None or not last_good_note:
            raise
        raise UsageError(f"--good-table's newest successful row gives {spec.range.good[:12]}, which is not older than "
                         f"--bad {spec.range.bad}: the table says the bad end passed the nightly; give an older --bad, "
                         "or a --good ref instead of the table's row") from None
    if last_good_note:
        candidates_range = candidates_range.model_copy(update={"good_ref": LAST_GOOD})
    if held_of(spec.level) is not None:  # a dependency level: its clone is not the upstream the checks below are for
        return RunInputs(recipe, repo, earlier_runs, candidates_range, last_good_note, tuple(owed))
    if spec.judge.command:
        ends = [candidates_range.base, candidates_range.bad] if candidates_range.kind == "commits" else []
        spec.judge.command = check_command(spec.judge.command, repo, ends, spec.executor.executor == "docker")
    if spec.judge.unit_tests:
        settle_unit_tests(spec, repo, candidates_range)
    builds_images = spec.executor.executor == "docker" or (spec.executor.executor == "ray"
                                                           and spec.executor.node_executor == "docker")
    if repo is not None and spec.range.package is None and builds_images and recipe is not None:
        check_dockerfile(repo, recipe_for_host(recipe, spec.context.host).build.dockerfile, candidates_range)
    if repo is not None and recipe is not None and candidates_range.kind == "commits":
        named_ends = range_ends(spec.range.good, spec.range.bad, candidates_range.good, candidates_range.base,
                              candidates_range.bad)
        check_support(recipe, repo, named_ends)
        check_recipe_at_ends(recipe, repo, named_ends)  # a recipe the candidate refuses: an error, not a range of skips
    if repo is not None and candidates_range.kind == "commits":
        check_laid_in_pins(spec, recipe, repo, (candidates_range.base, candidates_range.bad))

        for end in (candidates_range.base, candidates_range.bad) if not spec.judge.unit_tests else ():
            check_submodule_pins(repo, end)  # a clone without its submodules stops here, not at step one
    return RunInputs(recipe, repo, earlier_runs, candidates_range, last_good_note, tuple(owed))


def settle_executor(spec: SessionSpec, cards_per_run: int, host_root: Path = Path("/"),
                    nodes: NodesSpec | None = None) -> None:
    """The executor options as every search (of commits or of settings) checks them before its
    journal exists: the image options as written, the devices and slots (the cluster's under ray),
    and the workdir made absolute (a resume may start elsewhere) and checked."""
    check_image_options(spec)
    check_nodes_executor(spec, nodes)
    if spec.executor.executor == "ray":
        settle_ray_slots(spec, cards_per_run, nodes)
    else:
        settle_devices(spec, cards_per_run, host_root)
    if spec.executor.workdir:
        spec.executor.workdir = str(Path(spec.executor.workdir).resolve())
        check_workdir(Path(spec.executor.workdir))


def check_nodes_executor(spec: SessionSpec, nodes: NodesSpec | None) -> None:
    """An engine across hosts (`engine.nodes`) starts its nodes on a Ray cluster, each in a worktree
    or a container (--node-executor) on its own host."""
    if nodes is None:
        return
    if spec.executor.executor != "ray":
        raise UsageError(f"the recipe's engine spans {nodes.count} hosts (engine.nodes): run it with --executor ray "
                         "on a Ray cluster of those hosts (docs/guide/several-hosts.md)")


# --good-table's row options: each picks a row of the table, so each needs it.
_ROW_OPTIONS = {"case_name": "--name", "config_yaml": "--config-yaml", "soc": "--soc", "frequency": "--frequency"}


def check_good_table_options(spec: SessionSpec) -> None:
    """--name, --config-yaml, --soc, --frequency and --scene pick --good-table's row: without the
    table they would do nothing."""
    if spec.range.good_table is not None:
        return
    given = [option for name, option in _ROW_OPTIONS.items() if getattr(spec.range, name) is not None]
    given += ["--scene"] if spec.range.scene != "single_node" else []
    if given:
        raise UsageError(f"{', '.join(given)} pick{'s' if len(given) == 1 else ''} a row of --good-table: add "
                         "--good-table FILE (with --good last-good), or drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def check_accuracy_options(spec: SessionSpec) -> None:
    """An accuracy recipe's own sequential test decides each step: noisy mode's options cannot act."""
    if spec.search.mode == "noisy" or spec.search.earlier_runs or spec.search.confidence is not None:
        given = [option for option, value in (("--mode noisy", spec.search.mode == "noisy"),
                                              ("--earlier-runs", bool(spec.search.earlier_runs)),
                                              ("--confidence", spec.search.confidence is not None)) if value]
        raise UsageError(f"{', '.join(given)}: an accuracy recipe is not searched in noisy mode (its own sequential "
                         "test decides each step: accuracy.repeats, accuracy.max_rounds); drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def check_dataset_ids(recipe: Recipe) -> None:
    """An accuracy recipe's JSONL dataset, where this host can read it: each sample an id of its own."""
    assert recipe.accuracy is not None
    path = str(recipe.accuracy.dataset_path(recipe.source))
    if is_jsonl(path):
        try:
            indexed_rows(path)
        except HarnessError as exc:
            raise UsageError(str(exc)) from None


def check_settings(spec: SessionSpec, recipe: Recipe | None) -> None:
    """--settings: each KEY=VALUE checked now as `settings --good-set` checks it (under its own name),
    not after the whole commit search."""
    if not spec.search.settings:
        return
    if recipe is None:
        raise UsageError("--settings searches which of a recipe's settings the culprit needs: give --recipe or "
                         "--nightly-case, or drop --settings")
    good: dict[str, object] = {}
    for text in spec.search.settings:
        key, value = parse_assignment(text, "--settings")
        if key in good:
            raise UsageError(f"--settings {key} is given twice; give each key once")
        good[key] = value
    differences_from_settings(recipe, good, "--settings")


def check_image_options(spec: SessionSpec) -> None:
    """--base-image-map, --release-images and --overlay-on-release as written: a malformed one is an
    error now, not at the first build."""
    BaseImageMap.parse(spec.executor.base_image_map)
    if spec.executor.release_images is not None:
        check_template(spec.executor.release_images)
    if spec.range.overlay_on_release is not None:
        parse_release(spec.range.overlay_on_release)


def settle_nightly(spec: SessionSpec) -> tuple[str | None, list[str]]:
    """--nightly-case: the bad end's recipe, written out, becomes the recipe; --good-table: the
    table's commit becomes the good end. Returns the note saying what was read (None without
    --good-table) and what the host still owes the case, one line each."""
    if spec.judge.nightly_case and (spec.judge.recipe or spec.judge.command):
        raise UsageError("--nightly-case is the recipe: drop --recipe/--cmd")
    if spec.judge.nightly_results and not spec.judge.nightly_case:
        raise UsageError("--nightly-result goes with --nightly-case; with --recipe, set the recipe's "
                         "oracle.throughput.earlier_runs")
    settled = settle_run(spec.range.repo or ".", spec.range.bad, spec.range.good, spec.judge.nightly_case,
                         Path(spec.range.good_table) if spec.range.good_table else None, spec.range.case_name,
                         spec.range.config_yaml, spec.range.soc, spec.range.scene, spec.range.frequency,
                         spec.judge.nightly_datasets, tuple(spec.judge.nightly_results), spec.search.find_fix)
    spec.judge.recipe = settled.recipe or spec.judge.recipe
    spec.range.good = settled.good
    return ("; ".join(settled.notes) if spec.range.good_table else None), settled.owed


def nightly_model_owed(case: str, recipe: Recipe, in_container: bool) -> list[str]:
    """--nightly-case: a case served by `vllm serve MODEL` whose model is a hub id with no
    model.host_path. In a container nothing would hold it, so that stops here, before any build;
    on this host the engine may find it in its own cache, so it is a line said before building."""
    if not model_unplaced(recipe):
        return []
    ref = CaseRef.parse(case)
    words = ["bisect-npu", "recipes", "import-nightly", ref.file, *(["--case", ref.case] if ref.case else []),
             *(["--benchmark", ref.benchmark] if ref.benchmark else []), "--model-root", "DIR", "--out", "case.yaml"]
    how = (f"import it in the clone with `{shlex.join(words)}` (DIR holding {recipe.model.path}), or set "
           "model.host_path in the imported recipe, and run case.yaml with --recipe")
    if in_container:
        raise UsageError(f"--nightly-case {case}: model {recipe.model.path} is not a directory on this host and the "
                         f"case sets no model.host_path, so no container can load it; {how}")
    return [f"model {recipe.model.path} is not a directory on this host: the engine must find it in its own cache "
            f"(offline hosts: HF_HOME / MODELSCOPE_CACHE); to load it from a directory, {how}"]


def check_overlay_on_release(spec: SessionSpec, repo: git.Repo | None) -> None:
    """`--overlay-on-release`: a commit-level run of this host's processes, on a clone holding the
    release's tag (the compiled inputs each commit changed are counted from it)."""
    assert spec.range.overlay_on_release is not None
    _package, version = parse_release(spec.range.overlay_on_release)
    if spec.range.package is not None or repo is None:
        raise UsageError("--overlay-on-release runs a clone's commits on a release: give --repo and drop --package "
                         "(`--package --repo` overlays the commits below the release level by itself)")
    if spec.executor.executor != "local":
        raise UsageError("--overlay-on-release runs each commit as a process on this host: use --executor local")
    tag_for_version(repo, version)


def check_laid_in_pins(spec: SessionSpec, recipe: Recipe | None, repo: git.Repo, ends: tuple[str, str]) -> None:
    """A dependency the upstream's build does not install is laid into every candidate at its
    pin: both ends' pins must be in its clone (made now, once) before anything runs."""
    for dependency in declared_dependencies(spec, recipe):
        if dependency.installed_by_image:
            continue
        if spec.executor.executor == "ray":
            raise UsageError(f"dependency {dependency.name} is laid into every candidate (installed_by_image: false), "
                             "which --executor ray's nodes do not do; use --executor local or docker")
        clone = open_dependency_clone(dependency, dep_repo_of(spec, dependency.name))
        pinned = PinnedCommit(repo, clone, dependency, recipe.build.dockerfile if recipe else "Dockerfile",
                              recipe.build.docker_args if recipe else {})
        for end in ends:
            try:
                pinned(end)
            except BuildFailed as exc:
                raise UsageError(f"{exc}; the range's ends must pin {dependency.name}, which every candidate is given "
                                 "at its pin (installed_by_image: false)") from None


def settle_devices(spec: SessionSpec, cards_per_run: int, host_root: Path = Path("/")) -> None:
    """With --devices, the host type (`spec.context.host`, from npu-smi) and the host's refusals (an
    engine larger than the host, devices it lacks, an A3 NPU's dies split), then the slots, and for
    containers the device and driver files they mount (under `host_root`): what `run` and
    `fix --verify` check alike before anything is built."""
    host = detect_host() if spec.executor.devices else None
    spec.context.host = host.kind if host else None
    if host is not None:
        cards_per_run = check_devices_on_host(host, spec.executor.devices, cards_per_run)  # whole A3 NPUs per slot
    settle_slots(spec, cards_per_run)
    if host is not None and spec.executor.slots:
        check_slot_shares(host, spec.executor.devices, spec.executor.slots)
    if spec.executor.devices and spec.executor.executor == "docker":
        check_host_devices(spec.executor.devices, host_root)  # the NPU containers' devices and driver files


def local_devices_missing(spec: SessionSpec, host_root: Path = Path("/")) -> list[str]:
    """--devices with the local executor on a host without those cards' device files (under
    `host_root`): its runs get ASCEND_RT_VISIBLE_DEVICES for cards they cannot reach. Said, not
    refused as the containers' path is (they cannot start): a --cmd may use the numbers its own way."""
    if spec.executor.executor != "local" or not spec.executor.devices:
        return []
    missing = missing_paths(device_files(spec.executor.devices), host_root)
    if not missing:
        return []
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    return [f"--devices {','.join(map(str, spec.executor.devices))}: this host lacks {shown}, so an NPU engine "
            "started by a run cannot reach those cards (each run still gets them in ASCEND_RT_VISIBLE_DEVICES); "
            "`bisect-npu doctor` checks the host, or drop --devices to run on the CPU"]


def settle_slots(spec: SessionSpec, cards_per_run: int) -> None:
    """Decide `spec.executor.slots`: each slot's share of --devices must hold one engine (the recipe's
    tensor x pipeline x prefill-context x data parallel size); by default as many slots as the cards allow."""
    cards = len(spec.executor.devices)
    if not cards:
        spec.executor.slots = spec.executor.slots or 1
        return
    if cards < cards_per_run:
        raise UsageError(f"the recipe's engine runs on {cards_per_run} cards (its parallel sizes multiplied) "
                         f"but --devices gives {cards}; give at least {cards_per_run}")
    spec.executor.slots = spec.executor.slots or cards // cards_per_run
    if cards // spec.executor.slots < cards_per_run:
        needs = f"the recipe's engine needs {cards_per_run}" if cards_per_run > 1 else "each slot needs a card"
        slots = spec.executor.slots
        raise UsageError(f"--slots {slots} over {cards} card(s) leaves {cards // slots} per slot, and "
                         f"{needs}; use --slots {cards // cards_per_run} or fewer, or give more --devices")


def settle_ray_slots(spec: SessionSpec, cards_per_run: int, nodes: NodesSpec | None = None) -> None:
    """`--executor ray`: a recipe's probe on the cluster's nodes; slots default to the engines
    the cluster holds, and an engine larger than every node (or across more nodes than the cluster
    has with its cards) is refused here, before any run or build."""
    if spec.context.python_oracle is not None or spec.range.package is not None or spec.executor.devices:
        raise UsageError("--executor ray runs a recipe or a command on a clone's commits, on the nodes Ray hands "
                         "out: drop --package and --devices (or use --executor local or docker)")
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--executor ray needs Ray on this host and every node: pip install 'bisect-npu[ray]'")
    if spec.judge.command is not None or spec.judge.unit_tests:
        spec.executor.slots = spec.executor.slots or 1  # a command takes one CPU of a node, no card
        return

    spec.executor.slots = settle_on_cluster(spec.executor.ray_address, cards_per_run, spec.executor.slots, nodes)


def settle_unit_tests(spec: SessionSpec, repo: git.Repo | None, candidates: CandidateRange) -> None:
    """`--unit-test`: the named tests checked at the ends (builders/unit_tests.py) and their runner
    made the session's command, so resume, the verdict store and the report treat it as one."""
    if repo is None or spec.range.package or candidates.kind != "commits":
        raise UsageError("--unit-test runs vllm-ascend's unit tests at a clone's commits: give --repo, drop --package")
    if spec.executor.executor == "docker" or (spec.executor.executor == "ray"
                                              and spec.executor.node_executor == "docker"):
        raise UsageError("--unit-test runs in a venv per vLLM pin on the host (or each Ray node): drop "
                         "--executor docker / --node-executor docker")
    tests_from = history.resolve_ref(repo, spec.judge.unit_test_from) if spec.judge.unit_test_from else None
    spec.judge.unit_test_from = tests_from
    present = check_unit_tests(repo, spec.judge.unit_tests, candidates.base, candidates.bad, tests_from,
                               candidates.candidates, Path(spec.judge.vllm_repo) if spec.judge.vllm_repo else None)
    spec.judge.command = unit_test_command(spec.judge.unit_tests, present, tests_from)


def resolve_candidates(spec: SessionSpec, repo: git.Repo | None) -> CandidateRange:
    """The journal header's `range`: commits of a repository, or published versions of a package."""
    if spec.range.package:
        vrange = versions.resolve_version_range(spec.range.package, spec.range.good, spec.range.bad,
                                                include_prereleases=spec.range.prereleases,
                                                index_url=spec.range.index_url)
        candidates = [*vrange.candidates, vrange.bad]
        titles = {**vrange.titles, vrange.good: f"{spec.range.package} {vrange.good}",
                  vrange.bad: f"{spec.range.package} {vrange.bad}"}
        return CandidateRange(kind="versions", package=spec.range.package, good=vrange.good, bad=vrange.bad,
                              base=vrange.good, good_ref=spec.range.good, bad_ref=spec.range.bad, candidates=candidates,
                              titles=titles, groups=vrange.groups)
    assert repo is not None
    if scope_of(spec.level) is not None:
        return _merged_candidates(spec, repo)
    brange = history.resolve_range(repo, spec.range.good, spec.range.bad)
    if not brange.candidates:
        raise UsageError(f"nothing to bisect between {spec.range.good} and {spec.range.bad}")
    facts = history.commits_facts(repo, [brange.base, *brange.candidates])
    weights = {} if spec.search.first_parent_only else history.brought_in(repo, brange.candidates, [brange.good])
    return CandidateRange(kind="commits", good=brange.good, bad=brange.bad, base=brange.base, good_ref=spec.range.good,
                          bad_ref=spec.range.bad, merge_base_note=brange.merge_base_note,
                          candidates=list(brange.candidates), titles={f.sha: f.title for f in facts},
                          prs={f.sha: f.pr for f in facts if f.pr}, brought_in=weights)


def _merged_candidates(spec: SessionSpec, repo: git.Repo) -> CandidateRange:
    """A merge level's range: the merge's first parent as the good end, what it brought in as the
    candidates (`history.merged_line`), the merge itself last; merges among them weighed."""
    scope = scope_of(spec.level)
    assert scope is not None
    merge, first = scope.merges[-1], spec.range.good
    goods = [first, *scope.goods]
    line = history.merged_line(repo, merge, scope.goods)
    facts = history.commits_facts(repo, [first, *line, *scope.merges[:-1]])
    return CandidateRange(kind="commits", good=first, bad=merge, base=first, good_ref=spec.range.good,
                          bad_ref=spec.range.bad, candidates=list(line), titles={f.sha: f.title for f in facts},
                          prs={f.sha: f.pr for f in facts if f.pr},
                          brought_in=history.brought_in(repo, line[:-1], goods))


def check_dockerfile(repo: git.Repo, dockerfile: str, candidates_range: CandidateRange) -> None:
    """Both ends must hold the Dockerfile the images are built from (a recipe's build.dockerfile),
    or every step would be a skip; say where in the range it first appears."""
    keys = BuildKeyReader(repo, dockerfile=dockerfile)
    ends = (("good", candidates_range.base, candidates_range.good_ref),
            ("bad", candidates_range.bad, candidates_range.bad_ref))
    for which, sha, ref in ends:
        if keys.key(sha).has_dockerfile:
            continue
        first = next((c for c in candidates_range.candidates if keys.key(c).has_dockerfile), None)
        where = f"it first appears at {first[:12]} in this range" if first else "no commit of this range has it"
        raise UsageError(f"the {which} end {ref} ({sha[:12]}) has no {dockerfile}, "
                         f"so it cannot be built for that target ({where}); pick ends that have it, or set "
                         "build.dockerfile to one they have")


# An argument that is only a path (a shell snippet such as `./x.sh && test -f y` is not).
_PLAIN_PATH = re.compile(r"[\w./+@%:=,-]+")


_OPERATOR = re.compile(r"[;&|<>()]+")  # what a shell would read as control or redirection
_EXPANSION = re.compile(r"`|\$[({A-Za-z_]")  # command substitution, ${...}, $NAME
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # `VAR=x cmd`: a shell's environment prefix


def command_words(text: str) -> list[str]:
    """The words of a `--cmd` string, which runs as one program with no shell (nothing of a commit
    title or ref ever reaches one). What only a shell would act on is refused, since the program
    would get it as arguments and its failure would read as a verdict: `||`, `&&`, `;`, `|`, `>`,
    `<` outside quotes, `$(...)`, backticks and `$NAME` outside single quotes, a leading `~`, a `#`
    comment, a line break. Quoted (`sh -c '...'`, `grep -q '|'`) or escaped (`find ... \\;`), they
    are the program's own words."""
    if not text.strip():
        raise UsageError("--cmd is empty; give the command that judges a checkout")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--cmd {text!r}: {exc} (check its quotes)") from None
    lexer = shlex.shlex(text, posix=False, punctuation_chars=True)  # keeps the quotes: tells '|' from |
    lexer.whitespace_split = True
    lexer.commenters = ""
    tokens = list(lexer)
    for index, token in enumerate(tokens):
        escaped = index > 0 and tokens[index - 1] == "\\"
        if token.startswith("'"):
            continue
        if (_OPERATOR.fullmatch(token) and not (escaped and len(token) == 1)) or _EXPANSION.search(token) \
                or (not token.startswith('"') and token.startswith(("~", "#"))):
            raise UsageError(f"--cmd has shell syntax ({token!r}) but runs without a shell; wrap it: "
                             f"--cmd \"sh -c '...'\" (the whole script as one quoted argument)")
    if "\n" in text and not any("\n" in token for token in tokens):
        raise UsageError("--cmd has a line break outside quotes, which only a shell would read as a second "
                         "command; wrap it: --cmd \"sh -c '...'\"")
    if _ASSIGNMENT.match(words[0]):
        raise UsageError(f"--cmd starts with {words[0]!r}, a variable setting only a shell reads, and runs without "
                         f"a shell; put `env` first: --cmd {shlex.join(['env', *words])!r}")
    return words


def check_command(command: list[str], repo: git.Repo | None, ends: list[str], in_container: bool = False) -> list[str]:
    """A command on PATH must exist now. The command runs in each candidate's checkout, which holds
    only committed files: a relative program, or an argument that names a relative path (`./x`,
    `../x`, or, run from the repository's root, a file there), must be committed at both ends, a
    program executable and not a directory. Returns the command to run.

    In a container (`in_container`) the image has its own PATH and files, so neither is looked up
    here; a relative path committed at neither end but a file here is this host's: it is made
    absolute, and the executor mounts it read-only (`check_command_mounts` says what cannot be)."""
    program = command[0]
    if not in_container and "/" not in program and shutil.which(program) is None:
        raise UsageError(f"command not found: {program}; give a program on PATH or a path relative to "
                         "the repository root (e.g. ./tests/check.sh)")
    if not in_container and Path(program).is_absolute() and not Path(program).is_file():
        raise UsageError(f"command not found: {program} is not a file")
    command = [_host_file(arg, repo, ends) if in_container else arg for arg in command]
    if in_container:
        check_command_mounts(command)
    if repo is None:
        return command
    at_root = repo.working_tree_dir is not None and Path.cwd().resolve() == Path(repo.working_tree_dir).resolve()
    relative = [arg for i, arg in enumerate(command)
                if _PLAIN_PATH.fullmatch(arg) and not Path(arg).is_absolute()
                and (arg.startswith(("./", "../")) or (i == 0 and "/" in arg)
                     or (i > 0 and at_root and Path(arg).is_file()))]
    for arg in relative:
        for sha in ends:
            entry = _tree_entry(repo.commit(sha).tree, os.path.normpath(arg))
            if entry is None:
                raise UsageError(f"{arg} is not committed at {sha[:12]}: --cmd runs in each candidate's checkout, "
                                 f"which holds only committed files; give an absolute path (e.g. "
                                 f"{Path(arg).resolve()}) or commit it")
            if arg != program or entry == "symlink":
                continue
            if entry.type == "tree":
                raise UsageError(f"{arg} is a directory; give the program to run (e.g. {arg.rstrip('/')}/check.sh)")
            if stat.S_ISREG(entry.mode) and not entry.mode & 0o111:
                raise UsageError(f"{arg} is not executable at {sha[:12]}; run it through its interpreter "
                                 f"(e.g. --cmd \"python3 {arg}\") or commit it with the executable bit")
    return command


def _host_file(arg: str, repo: git.Repo | None, ends: list[str]) -> str:
    """`arg` made absolute when it is a relative path to a file of this host that no end commits
    (a check script kept beside the clone): in a container it is mounted from here. A committed
    one stays the candidate's own."""
    if Path(arg).is_absolute() or not _PLAIN_PATH.fullmatch(arg) or arg.startswith("-") or not Path(arg).is_file():
        return arg
    if repo is not None and repo.working_tree_dir is not None:
        inside = Path(arg).resolve().is_relative_to(Path(repo.working_tree_dir).resolve())
        where = os.path.relpath(Path(arg).resolve(), Path(repo.working_tree_dir).resolve()) if inside else None
        if where is not None and any(_tree_entry(repo.commit(sha).tree, where) is not None for sha in ends):
            return arg
    return str(Path(arg).resolve())


def _tree_entry(tree: git.Tree, path: str) -> git.Blob | git.Tree | Literal["symlink"] | None:
    """The entry at `path`, "symlink" where a symlink on the way decides it (git does not follow
    them; a checkout does), None when the commit has nothing there."""
    if path in (".", ""):
        return tree
    try:
        return tree / path
    except KeyError:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            try:
                on_the_way = tree / "/".join(parts[:depth])
            except KeyError:
                return None
            if on_the_way.type == "blob" and stat.S_ISLNK(on_the_way.mode):
                return "symlink"
        return None
