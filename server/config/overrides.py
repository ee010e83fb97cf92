"""Command-line overrides: ``--set strategy.clients_per_round=10``.

The value is YAML, so ``run.rounds=3`` sets an integer, ``round_config.lr=0.1`` a float and
``x=[1,2]`` a list, exactly as the same text would in the file. Overrides apply to the raw
mapping before validation, so they are checked like any other value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from geofl.server.config.errors import ConfigError, ConfigProblem
from geofl.server.config.yamlsource import dump_scalar, parse_value

__all__ = ["Override", "apply_overrides", "format_override", "parse_override"]

_KEY = re.compile(r"[^.=\s]+")


@dataclass(frozen=True)
class Override:
    """One parsed ``KEY.PATH=VALUE``: the key path, the YAML-parsed value, and the text."""

    path: tuple[str, ...]
    value: object
    text: str

    @property
    def source(self) -> str:
        """How the override is named in error messages."""
        return f"--set {self.text}"


def parse_override(text: str) -> Override:
    """Parse ``KEY.PATH=VALUE``; the value is YAML (an empty value is null).

    Raises
    ------
    ConfigError
        If ``=`` is missing, a key in the path is empty or holds spaces, or the value is not
        valid YAML.
    """
    source = f"--set {text}"
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError.single(source, "expected KEY.PATH=VALUE, e.g. run.rounds=10")
    path = tuple(key.strip().split("."))
    if not all(_KEY.fullmatch(part) for part in path):
        raise ConfigError.single(
            source, f"invalid key path {key!r}: dot-separated keys without spaces"
        )
    return Override(path=path, value=parse_value(raw, source), text=text)


def format_override(path: Sequence[str], value: object) -> str:
    """The ``KEY.PATH=VALUE`` text that :func:`parse_override` reads back as given."""
    return f"{'.'.join(path)}={dump_scalar(value)}"


def apply_overrides(data: Mapping[str, object], overrides: Sequence[Override]) -> dict[str, object]:
    """A deep copy of ``data`` with each override set in order (later ones win).

    Missing or null mappings along a path are created; ``data`` is not modified.

    Raises
    ------
    ConfigError
        If a path runs through a value that is not a mapping (``run.rounds.x=1``).
    """
    result: dict[str, object] = copy.deepcopy(dict(data))
    problems: list[ConfigProblem] = []
    for override in overrides:
        parent = _parent_of(result, override)
        if isinstance(parent, ConfigProblem):
            problems.append(parent)
        else:
            parent[override.path[-1]] = copy.deepcopy(override.value)
    if problems:
        raise ConfigError(problems)
    return result


def _parent_of(data: dict[str, object], override: Override) -> dict[str, object] | ConfigProblem:
    """The mapping that will hold the override's last key, creating missing mappings."""
    target = data
    for depth, key in enumerate(override.path[:-1]):
        child = target.get(key)
        if child is None:
            child = target[key] = {}
        if not isinstance(child, dict):
            where = ".".join(override.path[: depth + 1])
            kind = type(child).__name__
            message = f"cannot set a key inside {where}: it is a {kind}, not a mapping"
            return ConfigProblem(override.source, "", message)
        target = child
    return target
