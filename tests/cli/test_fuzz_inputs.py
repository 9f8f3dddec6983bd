"""Hostile input, generated: recipes, observations and journal lines end in a one-line error or
a verdict, never a traceback, each within 2 s and 200 MB."""

from __future__ import annotations

import io
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_npu.cli import NOT_A_VERDICT_EXIT, main
from bisect_npu.errors import BisectError, UsageError
from bisect_npu.journal import Journal
from bisect_npu.recipe.loader import bundled_recipes, parse_recipe

SECONDS = 2.0
PEAK_BYTES = 200 * 2**20
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

JSON_SCALARS = st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40) | st.floats() | st.text(
    max_size=20)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=30)


def bounded(attempt: Callable[[], object]) -> None:
    """`attempt` finishes within SECONDS and allocates at most PEAK_BYTES at its peak; it runs twice,
    timed and then traced, as tracemalloc slows the code it watches several times over."""
    started = time.monotonic()
    attempt()
    seconds = time.monotonic() - started
    assert seconds < SECONDS, f"took {seconds:.1f}s"
    tracemalloc.start()
    try:
        attempt()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"peaked at {peak / 2**20:.0f} MB"


def nested(depth: int, opening: str, closing: str, inner: str = "") -> str:
    return opening * depth + inner + closing * depth


def alias_bomb(levels: int, width: int) -> str:
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


VALID_RECIPE = yaml.safe_load(bundled_recipes()["demo-presence-penalty"].read_text(encoding="utf-8"))


def mutated(base: dict, draw: Callable) -> dict:
    """The valid recipe with one field somewhere replaced by an arbitrary JSON value."""
    value = json.loads(json.dumps(base))
    node = value
    keys = [k for k in node if isinstance(node[k], dict)]
    if keys and draw(st.booleans()):
        node = node[draw(st.sampled_from(keys))]
    node[draw(st.sampled_from([*node, "extra"]))] = draw(JSON_VALUES)
    return value


@st.composite
def recipe_texts(draw: Callable) -> str:
    kind = draw(st.sampled_from(["noise", "mutated", "bomb", "deep", "duplicate", "counts"]))
    head = "name: fuzz\nmodel: {path: /m}\ncases: [{prompt: p}]\n"
    if kind == "noise":
        return draw(st.text(alphabet=st.sampled_from(list("{}[]:-&*!|>'\"#%@`, \n\tabc01?<=")), max_size=300))
    if kind == "mutated":
        return yaml.safe_dump(mutated(VALID_RECIPE, draw), allow_unicode=True)
    if kind == "bomb":
        return head + alias_bomb(draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    if kind == "deep":
        depth = draw(st.integers(1, 3000) | st.just(100_000))
        return head + "environment: " + draw(st.sampled_from([nested(depth, "[", "]"), nested(depth, "{a: ", "}", "1"),
                                                              "\n".join("  " * i + "a:" for i in range(min(depth,
                                                                                                           3000)))]))
    if kind == "duplicate":
        return head + draw(st.sampled_from(["name", "model", "cases"])) + ": again\n"
    return head + f"trials: {{count: {draw(st.sampled_from(['true', 'false', '1.5', '10e400', '-1', 'null']))}}}\n"


@given(text=recipe_texts())
@FUZZ
def test_recipes_are_refused_in_one_line(text: str) -> None:
    def attempt() -> None:
        try:
            parse_recipe(text, source="fuzz.yaml")
        except BisectError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("fuzz.yaml")

    bounded(attempt)


RECIPE = "name: fuzz\nmodel: {path: /m}\ncases: [{id: default, prompt: p}]\noracle: {kinds: [repetition, tokens]}\n"


@st.composite
def observation_texts(draw: Callable) -> str:
    kind = draw(st.sampled_from(["noise", "value", "fields", "deep"]))
    if kind == "noise":
        return draw(st.text(max_size=200))
    if kind == "value":
        return json.dumps(draw(JSON_VALUES))
    if kind == "deep":
        return '{"extra": ' + nested(draw(st.integers(1, 3000) | st.just(200_000)), "[", "]") + "}"
    fields = {"output_token_ids": st.lists(st.integers(-(10**30), 10**30), max_size=50),
              "prompt_token_ids": st.lists(st.integers(-(10**30), 10**30), max_size=5),
              "top_logprobs": st.lists(st.lists(st.tuples(st.integers(-5, 10**30), st.floats()), max_size=3),
                                       max_size=5) | JSON_VALUES,
              "schema_version": st.integers(-5, 10**6) | JSON_VALUES, "trial": st.integers(-(10**30), 10**30),
              "finish_reason": st.sampled_from(["stop", "length", None]) | JSON_VALUES,
              "timings": st.fixed_dictionaries({"load_s": st.floats(), "generate_s": st.floats()}) | JSON_VALUES,
              "case_id": st.sampled_from(["default", "other"]) | JSON_VALUES}
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    return json.dumps({name: draw(fields[name]) for name in chosen})


@given(observed=observation_texts(), reference=observation_texts())
@FUZZ
def test_judge_answers_a_verdict_or_one_line(observed: str, reference: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Through the command's own boundary: a verdict (0, 1, 125), or 128 with one line that is not
    an internal error."""
    recipe, observed_path, reference_path = tmp_path / "r.yaml", tmp_path / "o.json", tmp_path / "ref.json"
    recipe.write_text(RECIPE, encoding="utf-8")
    observed_path.write_text(observed, encoding="utf-8")
    reference_path.write_text(reference, encoding="utf-8")
    def attempt() -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["judge", "--recipe", str(recipe), "--reference", str(reference_path), str(observed_path)])
        err = capsys.readouterr().err
        assert exit_.value.code in (0, 1, 125, NOT_A_VERDICT_EXIT), err
        if exit_.value.code == NOT_A_VERDICT_EXIT:
            assert "internal error" not in err and len(err.strip().splitlines()) == 1, err

    bounded(attempt)


HEADER = {"type": "header", "options": {"good": "a", "bad": "b"},
          "range": {"kind": "commits", "good": "a", "bad": "b", "base": "a", "good_ref": "a", "bad_ref": "b",
                    "candidates": ["b"]}}
RECORD_FIELDS = {"index": st.integers(-(10**30), 10**30) | JSON_VALUES, "commit": st.just("b") | JSON_VALUES,
                 "verdict": st.fixed_dictionaries({"kind": st.sampled_from(["good", "bad", "skip"]) | JSON_VALUES,
                                                   "reason": st.text(max_size=5) | JSON_VALUES}) | JSON_VALUES,
                 "trials": st.lists(st.fixed_dictionaries({"case_id": st.just("c"), "trial": JSON_VALUES}),
                                    max_size=2) | JSON_VALUES,
                 "case_id": st.just("c") | JSON_VALUES, "trial": st.integers() | JSON_VALUES,
                 "culprit": JSON_VALUES, "status": st.sampled_from(["found", "narrowed"]) | JSON_VALUES}
JOURNAL_LINES = (st.text(max_size=80) | JSON_VALUES.map(json.dumps)
                 | (st.integers(1, 3000) | st.just(100_000)).map(lambda depth: '{"a": ' + nested(depth, "[", "]") + "}")
                 | st.fixed_dictionaries({"type": st.sampled_from(["step", "trial", "end", "fix", "next_level"])
                                          | JSON_VALUES}, optional=RECORD_FIELDS).map(json.dumps))
HEADERS = (st.just(HEADER) | st.fixed_dictionaries({"type": st.just("header")}, optional={
    "options": st.just(HEADER["options"]) | JSON_VALUES, "range": st.just(HEADER["range"]) | JSON_VALUES,
    "schema_version": st.integers(-5, 10**30) | JSON_VALUES})).map(json.dumps)


@given(header=HEADERS, lines=st.lists(JOURNAL_LINES, max_size=8), torn=st.booleans())
@FUZZ
def test_journals_read_or_are_refused_in_one_line(header: str, lines: list[str], torn: bool, tmp_path: Path) -> None:
    """The typed reader (records.py) under every line: read, or one line naming the file."""
    text = "\n".join(line.replace("\n", " ") for line in [header, *lines]) + ("" if torn else "\n")
    (tmp_path / "journal.jsonl").write_text(text, encoding="utf-8")

    def attempt() -> None:
        try:
            Journal.open(tmp_path, read_only=True).close()
        except BisectError as exc:
            assert "\n" not in str(exc) and "journal.jsonl" in str(exc)

    bounded(attempt)


def _leaves(value: object, path: tuple = ()) -> list[tuple]:
    """The paths to every number in a recipe, and to its environment mapping."""
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _leaves(item, (*path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in _leaves(item, (*path, index))]
    return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []


NUMBERS = (st.integers(min_value=-(10**40), max_value=10**40) | st.floats() | st.integers(-3, 3)
           | st.sampled_from([2**31, 2**31 - 1, 2**63, 2**63 - 1, 10**21, 10**32, 1e21, 1e32]))
ENV_TEXT = st.text(alphabet=st.sampled_from(list("AB_=\0 x1")), max_size=6)
BOUNDED_RECIPE = yaml.safe_load(bundled_recipes()["qwen3-repetition-penalty-async"].read_text(encoding="utf-8"))
PREFLIGHT_FIELDS = {("trials", "count"), ("trials", "load_cost"), ("engine", "port"), ("engine", "startup_timeout_s"),
                    ("capture", "top_k")}


@st.composite
def bounded_recipes(draw: Callable) -> dict:
    """A bundled recipe with some of its numbers (or fields that take one), or its environment,
    replaced by hostile values."""
    value = json.loads(json.dumps(BOUNDED_RECIPE))
    paths = _leaves(value) + [(*path, name) for path in [("cases", 0, "sampling")]
                              for name in ("max_tokens", "seed", "top_k", "presence_penalty", "logprobs")]
    paths += [tuple(field) for field in sorted(PREFLIGHT_FIELDS)]
    for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
        node = value
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
        node[path[-1]] = draw(NUMBERS)
    if draw(st.booleans()):
        value["environment"] = draw(st.dictionaries(ENV_TEXT, ENV_TEXT, max_size=3))
    return value


@pytest.fixture(scope="module")
def preflight_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    from tests.helpers.gitrepo import make_linear_repo

    path = tmp_path_factory.mktemp("preflight") / "repo"
    return path, make_linear_repo(path, 4, culprit=2)


@given(raw=bounded_recipes())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
def test_a_recipe_validate_accepts_gets_past_run_s_preflight_or_a_usage_error(raw: dict, tmp_path: Path,
                                                                            preflight_repo) -> None:
    """`recipes validate` accepting a recipe means `run` does not crash on it: its preflight (the
    checks, the journal, the evaluator and the search's first decision) passes or ends in a
    one-line usage error (exit 2), never an OverflowError or a ValueError."""
    import tempfile

    from bisect_npu import search
    from bisect_npu.orchestration.session import Session
    from bisect_npu.progress import PlainProgress
    from tests.helpers.asked import spec_of

    repo, shas = preflight_repo
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    done = main_exit(["recipes", "validate", str(path)])
    if done != 0:
        assert done == 2
        return
    options = spec_of(good=shas[0], bad=shas[3], repo=str(repo), recipe=str(path), executor="local",
                      verdict_store=None, propose_fix=False)
    try:
        session = Session.start(options, session_dir=Path(tempfile.mkdtemp(dir=tmp_path)),
                                progress=PlainProgress(io.StringIO()))
    except BisectError as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc)
        return
    try:
        search.decide(session.problem(), session.evidence())
    finally:
        session.close()


def main_exit(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.mark.parametrize("options", [None, {}, {"good": "a"}, {"good": "a", "bad": "b", "confidence": 7}])
def test_an_old_header_whose_options_are_no_request_names_the_journal(options: object, tmp_path: Path) -> None:
    """A 0.1.x header whose options cannot make a run request: one line naming the file, not the
    request's own message about a command-line flag."""
    (tmp_path / "journal.jsonl").write_text(json.dumps({"type": "header", "options": options}) + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as refused:
        Journal.open(tmp_path, read_only=True).close()
    assert "journal.jsonl:1" in str(refused.value) and "\n" not in str(refused.value)
