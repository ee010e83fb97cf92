"""Recognise Flower objects without importing Flower.

``load_client_app`` asks these questions about every app it loads, so they must stay
cheap: they look at module names only. A Flower app's own module has imported ``flwr``
already, so the adapter's import of it afterwards costs nothing extra.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["is_flower_client", "is_flower_object"]

_FLOWER_PACKAGE = "flwr"


def _defined_by_flower(cls: type) -> bool:
    """True if ``cls`` or one of its bases comes from the ``flwr`` package."""
    return any(_in_flower(getattr(base, "__module__", None)) for base in cls.__mro__)


def _in_flower(module: object) -> bool:
    return isinstance(module, str) and module.split(".")[0] == _FLOWER_PACKAGE


def _annotations(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's annotations, evaluated where possible (``from __future__`` strings)."""
    try:
        return inspect.get_annotations(function, eval_str=True)
    # Annotation strings are arbitrary expressions: a name imported only under
    # TYPE_CHECKING (NameError) or anything else may fail; the raw strings still help.
    except Exception:
        return inspect.get_annotations(function)


def _mentions_flower(annotation: object) -> bool:
    if isinstance(annotation, str):
        return _FLOWER_PACKAGE + "." in annotation
    if isinstance(annotation, type):
        return _defined_by_flower(annotation)
    return _in_flower(getattr(annotation, "__module__", None))


def is_flower_object(target: object) -> bool:
    """Whether ``target`` is a Flower app object rather than a geofl one.

    True for an instance or subclass of a Flower class (a ``flwr.clientapp.ClientApp``,
    a ``NumPyClient`` ...) and for a function whose parameters or return value are
    annotated with Flower types, e.g. ``def client_fn(context: Context) -> Client``.
    """
    if isinstance(target, type):
        return _defined_by_flower(target)
    if _defined_by_flower(type(target)):
        return True
    if inspect.isfunction(target) or inspect.ismethod(target):
        return any(_mentions_flower(a) for a in _annotations(target).values())
    return False


def is_flower_client(value: object) -> bool:
    """Whether a factory returned a Flower client (``Client`` or ``NumPyClient``).

    Catches a ``client_fn`` without annotations, which looks like a geofl factory until
    it is called.
    """
    return _defined_by_flower(type(value))
