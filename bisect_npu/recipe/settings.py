"""Settings of a recipe by path (`engine.args.async_scheduling`, `cases[*].sampling.temperature`,
`environment.HCCL_DETERMINISTIC`): read one, set some, and list where two recipes differ.

The settings search (`bisect-npu settings`) varies these keys between a bad recipe and a good
variant. A key is checked against the recipe schema before anything runs, so a misspelling ends
in one line naming the nearest key, and a value of the wrong type in one line naming the field.
Free-form mappings (`engine.args`, `environment`, and the mappings inside engine args) take any
key below them; a value of `null` there unsets the key, and on a sampling field leaves it to the
engine's default.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from bisect_npu.errors import UsageError, validation_problem
from bisect_npu.recipe.loader import model_in
from bisect_npu.recipe.schema import CaseSpec, Recipe

# The parts of a recipe that make the case; the rest (oracle, trials, reference, build, ...) is how
# it is judged or built, which a settings search holds fixed.
SETTING_ROOTS = ("model", "engine", "environment", "cases")
_CASES = re.compile(r"^cases\[(?P<selector>[^\]]+)\]$")
ALL_CASES = "*"


@dataclass(frozen=True)
class Difference:
    """One key the bad recipe and the good variant differ in (None: unset on that side)."""

    key: str
    bad: Any
    good: Any

    def describe(self, side: str = "bad") -> str:
        return f"{self.key}: {show(self.bad if side == 'bad' else self.good)}"


def show(value: Any) -> str:
    """A value as the report and the messages write it (YAML-like; None as `unset`)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def parse_assignment(text: str, option: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE read as YAML (`true`, `1.3`, `null`, `{a: 1}`); a bare word stays text."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{option} {text!r}: write KEY=VALUE, e.g. {option} engine.args.async_scheduling=false")
    if not raw.strip():
        raise UsageError(f"{option} {text!r}: give a value after `=` ({key.strip()}=null unsets the key)")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _split(key: str) -> tuple[str | None, list[str]]:
    """(case selector or None, the path's parts after it)."""
    parts = key.split(".")
    match = _CASES.match(parts[0])
    if match:
        return match.group("selector"), parts[1:]
    return None, parts


def _schema_keys(model: type[BaseModel], prefix: str, free: Mapping[str, Any] | None = None) -> list[str]:
    """Every key path a model's fields allow, the free mappings' present keys included."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = f"{prefix}{name}"
        keys.append(path)
        inner = model_in(field.annotation)
        if inner is not None and get_origin(field.annotation) is not list:
            keys += _schema_keys(inner, path + ".")
        elif get_origin(field.annotation) is dict and free is not None:
            keys += [f"{path}.{sub}" for sub in (free.get(name) or {})]
    return keys


def known_keys(recipe: Recipe) -> list[str]:
    """The keys a settings search of `recipe` can vary (the free mappings' keys as the recipe has them)."""
    dumped = recipe.model_dump(mode="json")
    keys = [f"model.{k}" for k in type(recipe.model).model_fields]
    keys += _schema_keys(type(recipe.engine), "engine.", dumped["engine"])
    keys += ["environment", *(f"environment.{k}" for k in recipe.environment)]
    for selector in (ALL_CASES, *(case.id for case in recipe.cases)):
        keys += _schema_keys(CaseSpec, f"cases[{selector}].")
    return keys


def check_key(recipe: Recipe, key: str, option: str) -> None:
    """Refuse a key outside the recipe schema or outside the settings, naming the nearest key."""
    selector, parts = _split(key)
    if selector is not None:
        ids = [case.id for case in recipe.cases]
        if selector != ALL_CASES and selector not in ids:
            raise UsageError(f"{option} {key}: the recipe has no case {selector!r} (cases: {', '.join(ids)}); "
                             f"write cases[*] for every case or cases[ID]")
        model: type[BaseModel] | None = CaseSpec
    else:
        if parts[0] not in SETTING_ROOTS:
            if parts[0] in Recipe.model_fields:
                raise UsageError(f"{option} {key}: {parts[0]}.* is how the case is judged or built, which a settings "
                                 "search holds fixed; vary model.*, engine.*, environment.* or cases[*].*")
            _unknown(recipe, key, option)
        model = Recipe
    free = False
    for part in parts:
        if free:
            continue
        if model is None:
            _unknown(recipe, key, option)
        assert model is not None
        field = model.model_fields.get(part)
        if field is None or field.exclude:
            _unknown(recipe, key, option)
        assert field is not None
        inner = model_in(field.annotation)
        if inner is not None and get_origin(field.annotation) is not list:
            model = inner
        elif get_origin(field.annotation) is dict:
            free, model = True, None
        else:
            model = None


def _unknown(recipe: Recipe, key: str, option: str) -> None:
    nearest = difflib.get_close_matches(key, known_keys(recipe), n=1, cutoff=0.5)
    hint = f"; nearest: {nearest[0]}" if nearest else "; settings are model.*, engine.*, environment.*, cases[*].*"
    raise UsageError(f"{option} {key}: no such key in the recipe schema{hint}")


def _targets(data: dict[str, Any], selector: str | None) -> list[dict[str, Any]]:
    if selector is None:
        return [data]
    return [case for case in data["cases"] if selector == ALL_CASES or case["id"] == selector]


def value_of(recipe: Recipe, key: str) -> Any:
    """The key's value in the recipe (None when unset); for cases[*], the value every case has (a
    key on which the cases differ is read per case: an error here)."""
    selector, parts = _split(key)
    values = []
    for target in _targets(recipe.model_dump(mode="json"), selector):
        node: Any = target
        for part in parts:
            node = node.get(part) if isinstance(node, dict) else None
        values.append(node)
    if any(v != values[0] for v in values):
        raise UsageError(f"{key}: the recipe's cases differ in it; name each case, cases[ID]."
                         f"{'.'.join(parts)}")
    return values[0]


def apply(recipe: Recipe, settings: Mapping[str, Any], option: str = "--good-set") -> Recipe:
    """`recipe` with `settings` (key -> value) set, validated; a value of the wrong type is one line."""
    data = copy.deepcopy(recipe.model_dump(mode="json"))
    for key, value in settings.items():
        selector, parts = _split(key)
        for target in _targets(data, selector):
            nodes = [target]
            for part in parts[:-1]:
                child = nodes[-1].get(part)
                if not isinstance(child, dict):
                    child = nodes[-1][part] = {}
                nodes.append(child)
            if value is None and _is_free(key):
                nodes[-1].pop(parts[-1], None)
                _prune(nodes, parts)
            else:
                nodes[-1][parts[-1]] = value
    try:
        changed = Recipe.model_validate(data)
    except ValidationError as exc:
        where, problem = validation_problem(exc, root="")
        given = ", ".join(f"{k}={show(v)}" for k, v in settings.items())
        raise UsageError(f"{option} {given}: {where}: {problem}") from None
    changed.source = recipe.source
    return changed


def _prune(nodes: list[dict[str, Any]], parts: list[str]) -> None:
    """Drop the mappings an unset key left empty inside engine args (`override_generation_config: {}`
    is not the same engine as no override at all); `engine.args` and `environment` themselves stay."""
    for depth in range(len(nodes) - 1, 2 if parts[0] == "engine" else 1, -1):
        if nodes[depth]:
            break
        nodes[depth - 1].pop(parts[depth - 1], None)


def _is_free(key: str) -> bool:
    """Whether the key lies inside a free-form mapping (where null unsets it)."""
    _, parts = _split(key)
    return parts[0] == "environment" or parts[:2] == ["engine", "args"]


def differences_from_settings(recipe: Recipe, good: Mapping[str, Any], option: str = "--good-set") -> list[Difference]:
    """The differences a good variant given as key -> value makes, each key checked."""
    found = []
    for key, value in good.items():
        check_key(recipe, key, option)
        bad = value_of(recipe, key)
        if bad == value:
            raise UsageError(f"{option} {key}={show(value)}: the recipe has that value already; a good variant "
                             "must differ from the bad case")
        found.append(Difference(key, bad, value))
    apply(recipe, {d.key: d.good for d in found}, option)  # every value of the right type, together
    return found


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    """Key path -> value for every leaf; an empty mapping has none (as if unset)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_leaves(inner, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def _setting_leaves(recipe: Recipe) -> dict[str, Any]:
    data = recipe.model_dump(mode="json")
    leaves: dict[str, Any] = {}
    for root in ("model", "engine", "environment"):
        leaves.update(_leaves(data[root], root))
    for case in data["cases"]:
        leaves.update(_leaves({k: v for k, v in case.items() if k != "id"}, f"cases[{case['id']}]"))
    return leaves


def differences_between(bad: Recipe, good: Recipe) -> list[Difference]:
    """Where two recipes of one case differ, key by key (a difference every case shares is one
    `cases[*]` key); they must differ only in settings, over the same case ids."""
    if [c.id for c in bad.cases] != [c.id for c in good.cases]:
        raise UsageError(f"--good-recipe {good.source}: its cases ({', '.join(c.id for c in good.cases)}) are not "
                         f"the recipe's ({', '.join(c.id for c in bad.cases)}); give both the same case ids")
    judged = [name for name, field in Recipe.model_fields.items()
              if not field.exclude and name not in (*SETTING_ROOTS, "name", "description", "symptom")
              and getattr(bad, name) != getattr(good, name)]
    if judged:
        raise UsageError(f"--good-recipe {good.source}: it differs in {', '.join(judged)}, which is how the case is "
                         "judged or built; a settings search holds that fixed: make them equal")
    bad_leaves, good_leaves = _setting_leaves(bad), _setting_leaves(good)
    keys = sorted(set(bad_leaves) | set(good_leaves), key=lambda k: (k.startswith("cases"), k))
    per_key = {k: Difference(k, bad_leaves.get(k), good_leaves.get(k)) for k in keys
               if bad_leaves.get(k) != good_leaves.get(k)}
    ids = [c.id for c in bad.cases]
    merged: dict[str, Difference] = {}
    for key, difference in per_key.items():
        selector, parts = _split(key)
        if selector is None:
            merged[key] = difference
            continue
        shared = [per_key.get(f"cases[{case_id}].{'.'.join(parts)}") for case_id in ids]
        if len(ids) > 1 and all(d is not None and (d.bad, d.good) == (difference.bad, difference.good)
                                for d in shared):
            merged.setdefault(f"cases[*].{'.'.join(parts)}",
                              Difference(f"cases[*].{'.'.join(parts)}", difference.bad, difference.good))
        else:
            merged[key] = difference
    return list(merged.values())
