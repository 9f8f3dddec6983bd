"""Loading a recipe: the bundled ones, a safe YAML loader that tracks lines and bounds size, errors
that name the field and its line."""

from __future__ import annotations

from collections.abc import Hashable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from bisect_npu.errors import UsageError, problem_of
from bisect_npu.recipe.schema import Recipe


def bundled_recipes() -> dict[str, Traversable]:
    """The recipes shipped inside the package, by name; read through importlib.resources so an
    installed wheel finds them as the checkout does (`recipes/` at the top is a link to them)."""
    folder = resources.files("bisect_npu") / "recipes"
    found = (item for item in folder.iterdir() if item.is_file() and item.name.endswith(".yaml"))
    return {item.name.removesuffix(".yaml"): item for item in sorted(found, key=lambda item: item.name)}


# Bounds on what a recipe may be, so a hostile file ends in one line instead of gigabytes: real
# recipes are a few KB, a few levels deep, with an anchor or two.
MAX_RECIPE_BYTES = 256 * 1024
MAX_DEPTH = 40
MAX_EXPANDED_NODES = 20_000  # nodes once every alias is expanded (what validation walks)


class _LineLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """Safe loader that remembers the line of every mapping key, refuses duplicate keys, and
    bounds nesting and alias expansion (a 1 KB alias bomb expands to billions of nodes)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._expanded: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._expanded:
                raise yaml.composer.ComposerError(None, None, "an alias refers to the node that contains it", mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                              self.peek_event().start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        size = 1 + sum(self._expanded.get(id(child), 1) for child in children)
        if size > MAX_EXPANDED_NODES:
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_EXPANDED_NODES} values once its "
                                              "aliases are expanded (a recipe is a few hundred)", node.start_mark)
        self._expanded[id(node)] = size
        return node


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Hashable, Any]:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            key = loader.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first_line[key]}); one of them would be "
                    "silently lost", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
    mapping = yaml.SafeLoader.construct_mapping(loader, node, deep=True)
    lines = {key_node.value: key_node.start_mark.line + 1 for key_node, _ in node.value
             if isinstance(key_node, yaml.ScalarNode)}
    mapping["__lines__"] = lines
    mapping["__line__"] = node.start_mark.line + 1
    return dict(mapping)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k not in ("__lines__", "__line__")}
    if isinstance(value, list):
        return [_strip_lines(v) for v in value]
    return value


def _line_of(raw: Any, loc: tuple[Any, ...]) -> int | None:
    """The YAML line of the deepest part of `loc` that exists in the document."""
    line: int | None = raw.get("__line__") if isinstance(raw, dict) else None
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            line = node.get("__lines__", {}).get(part, line)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            if isinstance(node, dict):
                line = node.get("__line__", line)
        else:
            break
    return line


def _yaml_error(source: str, exc: yaml.YAMLError) -> str:
    """One line, `file:line:column: what`, like the field errors (PyYAML's own text spans lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(filter(None, (exc.context, exc.problem)))
        return f"{source}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}"
    return f"{source}: not valid YAML: {' '.join(str(exc).split())}"


def parse_recipe(text: str, source: str = "<recipe>") -> Recipe:
    if len(text) > MAX_RECIPE_BYTES:
        raise UsageError(f"{source}: {len(text)} characters; a recipe is at most {MAX_RECIPE_BYTES // 1024} KB")
    try:
        raw = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        raise UsageError(_yaml_error(source, exc)) from exc
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: a recipe is a mapping with at least `name`, `model` and `cases`")
    try:
        recipe = Recipe.model_validate(_strip_lines(raw))
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelled key fails twice (unknown here, the right one missing): name the misspelling.
        first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = tuple(first["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        line = _line_of(raw, loc)
        where = f"{source}:{line}" if line else source
        msg = problem_of(first)
        if first["type"] == "extra_forbidden":
            known = _fields_at(Recipe, loc[:-1])
            msg = "unknown field (check the spelling" + (f"; known here: {', '.join(known)})" if known else ")")
        raise UsageError(f"{where}: field {field!r}: {msg}") from exc
    recipe.source = source
    return recipe


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The fields a recipe may have at `path` (list indices skipped), for an unknown-field error."""
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        inner = model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return [name for name, field in model.model_fields.items() if not field.exclude]


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation such as `Sub`, `Sub | None` or `list[Sub]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := model_in(arg)) is not None:
            return found
    return None


def load_recipe(path_or_name: str | Path | Traversable) -> Recipe:
    """Load a recipe file, or a bundled recipe by name (`qwen3-repetition-penalty-async`) or resource."""
    path = Path(path_or_name) if isinstance(path_or_name, str) else path_or_name
    if isinstance(path, Path) and not path.exists():
        bundled = bundled_recipes()
        if str(path_or_name) not in bundled:
            raise UsageError(f"recipe not found: {path_or_name}; bundled recipes: {', '.join(bundled) or 'none'}")
        path = bundled[str(path_or_name)]
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_RECIPE_BYTES + 1)
        if len(data) > MAX_RECIPE_BYTES:
            raise UsageError(f"{path}: larger than {MAX_RECIPE_BYTES // 1024} KB; a recipe is a few KB of YAML")
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}); a recipe is a YAML file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the recipe ({exc.strerror})") from None
    return parse_recipe(text, source=str(path))
