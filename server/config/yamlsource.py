"""Reading YAML with line numbers: one parse gives both the data and the node tree.

The node tree (``yaml.compose``) keeps each key's position, so a validation error on
``strategy.min_clients`` can point at the line that sets it. The loader is PyYAML's safe
loader plus one fix: YAML 1.1 reads ``1e-3`` (no dot) as a string, which surprises
everyone who writes a learning rate that way, so exponent floats resolve as floats here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import yaml

from geofl.server.config.errors import ConfigError, ConfigProblem

__all__ = ["dump_scalar", "duplicate_keys", "line_of", "parse_value", "parse_yaml"]

_FLOAT_TAG = "tag:yaml.org,2002:float"
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_FLOAT_FIRST_CHARS = list("-+0123456789.")


class _Loader(yaml.SafeLoader):
    """Safe loader that also reads ``1e-3`` and ``2E5`` as floats."""


class _Dumper(yaml.SafeDumper):
    """Safe dumper that quotes strings :class:`_Loader` would read as floats."""


_Loader.add_implicit_resolver(_FLOAT_TAG, _EXPONENT_FLOAT, _FLOAT_FIRST_CHARS)
_Dumper.add_implicit_resolver(_FLOAT_TAG, _EXPONENT_FLOAT, _FLOAT_FIRST_CHARS)


def _one_line_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """Strings with line breaks double-quoted (``\\n`` escapes), so a value stays one line.

    PyYAML would otherwise fold them into a single-quoted scalar over several lines.
    """
    style = '"' if any(c in value for c in "\n\r") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _one_line_str)


def _yaml_problem(
    source: str, exc: yaml.YAMLError, what: str, *, with_line: bool = True
) -> ConfigProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        detail = " ".join(part for part in (exc.context, exc.problem) if part)
        line = None if mark is None or not with_line else mark.line + 1
        return ConfigProblem(source, "", f"invalid {what}: {detail}", line=line)
    return ConfigProblem(source, "", f"invalid {what}: {exc}")


def parse_yaml(text: str, source: str) -> tuple[yaml.Node | None, object]:
    """Parse one YAML document into its node tree and its plain data.

    Raises
    ------
    ConfigError
        On a syntax error or an unsafe tag, naming the line.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(source, exc, "YAML")]) from exc
    finally:
        loader.dispose()
    return node, data


def parse_value(text: str, source: str) -> object:
    """Parse a YAML scalar or flow value (``3``, ``0.1``, ``[1, 2]``, ``{a: 1}``)."""
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader subclass
    except yaml.YAMLError as exc:
        problem = _yaml_problem(source, exc, "value", with_line=False)
        raise ConfigError([problem]) from exc


def dump_scalar(value: object) -> str:
    """One-line YAML text that :func:`parse_value` reads back as ``value``."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=1 << 30)
    return text.removesuffix("\n...\n").removesuffix("\n")


def _children(node: yaml.Node) -> Iterator[tuple[str, yaml.Node, yaml.Node]]:
    """(key text, key node, value node) of a mapping or sequence node."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                yield str(key.value), key, value
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield str(index), item, item


def line_of(node: yaml.Node | None, path: Sequence[str | int]) -> int | None:
    """1-based line of the deepest key on ``path`` present in the document, if any."""
    line = None
    for segment in path:
        if node is None:
            break
        # The last duplicate wins, as in the constructed data.
        found = [entry for entry in _children(node) if entry[0] == str(segment)]
        if not found:
            break
        _, key, node = found[-1]
        line = key.start_mark.line + 1
    return line


def duplicate_keys(
    node: yaml.Node | None, source: str, prefix: str = "", _seen_nodes: set[int] | None = None
) -> list[ConfigProblem]:
    """A problem for every key that appears twice in one mapping (YAML keeps the last)."""
    visited = set() if _seen_nodes is None else _seen_nodes
    if node is None or id(node) in visited:  # aliases share nodes: visit each once
        return []
    visited.add(id(node))
    problems: list[ConfigProblem] = []
    seen: dict[str, int] = {}
    for name, key, value in _children(node):
        path = f"{prefix}.{name}" if prefix else name
        line = key.start_mark.line + 1
        if isinstance(node, yaml.MappingNode) and name != "<<":
            if name in seen:
                message = f"duplicate key (first set on line {seen[name]})"
                problems.append(ConfigProblem(source, path, message, line=line))
            seen.setdefault(name, line)
        problems.extend(duplicate_keys(value, source, path, visited))
    return problems
