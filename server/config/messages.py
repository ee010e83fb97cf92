"""Turning pydantic's validation errors into one clear line per problem.

Pydantic reports locations in model terms (``('strategy', 'fedavg', 'x')``, where
``fedavg`` is the union member); users think in YAML keys. Walking the model tree along
each location drops union tags, finds the model that owns the key (for "allowed keys")
and the literal's allowed values, and the YAML node tree gives the line.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from geofl.server.config.errors import ConfigProblem
from geofl.server.config.models import RunConfig
from geofl.server.config.overrides import Override

__all__ = ["validation_problems"]

Segment = str | int
#: Finds the line of a key path in the source document, when there is one.
LineFinder = Callable[[Sequence[Segment]], int | None]
_MAX_SHOWN = 60


@dataclass(frozen=True)
class _Located:
    """Where an error sits in user terms."""

    path: tuple[Segment, ...]
    owner: type[BaseModel] | None  # the model whose key is the last segment
    annotation: object  # the annotation found at the location


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """Model classes named by an annotation, looking through Annotated and unions."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]
    return []


def _tag(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("name")
    return field.default if field is not None and isinstance(field.default, str) else None


def _locate(loc: Sequence[Segment], root: type[BaseModel]) -> _Located:
    """Follow ``loc`` from ``root``, dropping tagged-union segments."""
    shown: list[Segment] = []
    owner: type[BaseModel] | None = None
    annotation: object = root
    for segment in loc:
        models = _models_in(annotation)
        if len(models) > 1:
            tagged = {_tag(model): model for model in models}
            if segment in tagged:
                annotation = tagged[segment]
                continue
        owner = models[0] if len(models) == 1 else None
        field = owner.model_fields.get(str(segment)) if owner is not None else None
        annotation = field.annotation if field is not None else None
        shown.append(segment)
    return _Located(tuple(shown), owner, annotation)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _literal_values(annotation: object) -> list[str]:
    if typing.get_origin(annotation) is Literal:
        return [str(value) for value in typing.get_args(annotation)]
    return []


def _describe(error: ErrorDetails, where: _Located) -> tuple[tuple[Segment, ...], str]:
    """(path shown to the user, message) for one pydantic error."""
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(where.owner.model_fields)) if where.owner else "none"
        return where.path, f"unknown key; allowed keys: {allowed}"
    if kind == "missing":
        return where.path, "required key is missing"
    if kind == "union_tag_invalid":
        name = value.get("name") if isinstance(value, dict) else value
        tags = ", ".join(str(_tag(model)) for model in _models_in(where.annotation))
        return (*where.path, "name"), f"{_show(name)} is not one of {tags}"
    if kind == "union_tag_not_found":
        return where.path, f"expected a mapping with a 'name' key, got {_show(value)}"
    if kind == "literal_error" and _literal_values(where.annotation):
        allowed = ", ".join(_literal_values(where.annotation))
        return where.path, f"{_show(value)} is not one of {allowed}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        got = "null" if value is None else f"{type(value).__name__} {_show(value)}"
        return where.path, f"expected a mapping, got {got}"
    if kind == "value_error":
        return where.path, error["msg"].removeprefix("Value error, ")
    return where.path, f"{error['msg']} (got {_show(value)})"


def _origin(path: Sequence[Segment], overrides: Sequence[Override]) -> Override | None:
    """The last override whose key path overlaps ``path``: it set the bad value."""
    keys = tuple(str(segment) for segment in path)
    for override in reversed(overrides):
        common = min(len(keys), len(override.path))
        if common and keys[:common] == override.path[:common]:
            return override
    return None


def validation_problems(
    exc: ValidationError,
    source: str,
    find_line: LineFinder,
    overrides: Sequence[Override] = (),
    root: type[BaseModel] = RunConfig,
) -> list[ConfigProblem]:
    """One :class:`ConfigProblem` per pydantic error, in user terms.

    ``root`` is the model that was validated (a relay's settings reuse this).

    Errors on values set by an override name the override as their source; the others
    name ``source`` and, where ``find_line`` knows it, the line.
    """
    problems: list[ConfigProblem] = []
    for error in exc.errors(include_url=False):
        path, message = _describe(error, _locate(error["loc"], root))
        dotted = ".".join(str(segment) for segment in path)
        override = _origin(path, overrides)
        if override is not None:
            problems.append(ConfigProblem(override.source, dotted, message))
        else:
            problems.append(ConfigProblem(source, dotted, message, line=find_line(path)))
    return problems
