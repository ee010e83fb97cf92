"""Take Flower's SecAgg/SecAgg+ mods out of a ClientApp: geofl's secure aggregation replaces them.

``secaggplus_mod`` (and ``secagg_mod``) run Flower's four-stage SecAgg+ protocol and fail on
any train message that is not one of its stages; geofl's server runs its own secure
aggregation (``secure_aggregation.enabled``), so the mods must not run. A ClientApp wraps
its mods around each handler when the handler is registered (with ``make_ffn``) and keeps
no list of them per handler; the chains are therefore taken apart by reading the closures
``make_ffn`` builds, and rebuilt with ``make_ffn`` itself, on a copy of the app.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import CodeType

from flwr.app import Context, Message
from flwr.client.mod import make_ffn
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable, Mod

__all__ = [
    "SECURE_AGGREGATION_MODS",
    "is_secure_aggregation_mod",
    "strip_secure_aggregation",
    "unwrap_chain",
    "uses_client_fn",
]

log = logging.getLogger(__name__)

#: Flower's mods that run SecAgg/SecAgg+ on the client (``flwr.client.mod``).
SECURE_AGGREGATION_MODS = frozenset({"secaggplus_mod", "secagg_mod"})


def is_secure_aggregation_mod(mod: object) -> bool:
    """Whether ``mod`` is one of Flower's SecAgg mods (matched by name, wherever it lives)."""
    module = getattr(mod, "__module__", None) or ""
    return getattr(mod, "__name__", None) in SECURE_AGGREGATION_MODS and module.startswith("flwr.")


def uses_client_fn(app: ClientApp) -> bool:
    """Whether the app was built from a legacy ``client_fn`` (else: registered handlers)."""
    return _private(app, "_call") is not None


@dataclass(frozen=True)
class _ChainLayout:
    """Where ``make_ffn``'s wrapper keeps its mod and the callable it wraps."""

    code: CodeType
    mod_cell: int
    next_cell: int


@lru_cache(maxsize=1)
def _layout() -> _ChainLayout:
    """Learn the wrapper's layout by wrapping a probe: robust to renamed variables."""

    def probe(message: Message, context: Context) -> Message:
        return message

    def probe_mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
        return call_next(message, context)

    wrapped = make_ffn(probe, [probe_mod])
    cells = [cell.cell_contents for cell in wrapped.__closure__ or ()]
    if probe_mod not in cells or probe not in cells:
        raise RuntimeError("this Flower version's make_ffn does not keep mods in closures")
    return _ChainLayout(wrapped.__code__, cells.index(probe_mod), cells.index(probe))


def unwrap_chain(chain: ClientAppCallable) -> tuple[ClientAppCallable, list[Mod]]:
    """The innermost handler of a ``make_ffn`` chain and its mods, outermost first."""
    layout = _layout()
    mods: list[Mod] = []
    while getattr(chain, "__code__", None) is layout.code and chain.__closure__:
        cells = chain.__closure__
        mods.append(cells[layout.mod_cell].cell_contents)
        chain = cells[layout.next_cell].cell_contents
    return chain, mods


def _without_secure_aggregation(chain: ClientAppCallable) -> tuple[ClientAppCallable, int]:
    handler, mods = unwrap_chain(chain)
    kept = [mod for mod in mods if not is_secure_aggregation_mod(mod)]
    if len(kept) == len(mods):
        return chain, 0
    return make_ffn(handler, kept), len(mods) - len(kept)


def _private(app: ClientApp, name: str) -> object:
    if not hasattr(app, name):
        raise RuntimeError(
            f"this Flower version's ClientApp has no {name!r}: geofl supports Flower 1.42"
        )
    return getattr(app, name)


def strip_secure_aggregation(app: ClientApp) -> ClientApp:
    """``app`` itself if it has no SecAgg mods, else a copy whose handlers run without them.

    Raises
    ------
    RuntimeError
        If the app declares a SecAgg mod that cannot be taken out of its handlers.
    """
    removed = 0
    patched = copy.copy(app)
    if uses_client_fn(app):
        patched._call, removed = _without_secure_aggregation(app._call)  # type: ignore[arg-type]
    else:
        handlers = _registered(app)
        patched._registered_funcs = {}
        for name, chain in handlers.items():
            patched._registered_funcs[name], count = _without_secure_aggregation(chain)
            removed += count
    declared = [mod for mod in _app_mods(app) if is_secure_aggregation_mod(mod)]
    if declared and not removed:
        raise RuntimeError(
            "the ClientApp declares secaggplus_mod but geofl could not take it out of its "
            "handlers; remove it from the app's mods"
        )
    if not removed:
        return app
    patched._mods = [mod for mod in _app_mods(app) if not is_secure_aggregation_mod(mod)]
    log.warning(
        "Flower's secaggplus_mod removed from the ClientApp's mods: geofl's secure "
        "aggregation replaces it (server setting secure_aggregation.enabled; without it "
        "updates are sent unmasked)"
    )
    return patched


def _registered(app: ClientApp) -> dict[str, ClientAppCallable]:
    handlers = _private(app, "_registered_funcs")
    if not isinstance(handlers, dict):
        raise RuntimeError("this Flower version's ClientApp keeps its handlers differently")
    return dict(handlers)


def _app_mods(app: ClientApp) -> list[Callable[..., Message]]:
    mods = _private(app, "_mods")
    return list(mods) if isinstance(mods, list) else []
