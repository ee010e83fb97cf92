"""The client training API: what user code implements, and how the runtime finds it.

A user writes a :class:`Client` (``fit`` and optionally ``evaluate``) and names it, or a
factory for it, as ``"module:attr"``. The runtime resolves that spec once with
:func:`load_client_app` and calls the resulting factory with a :class:`ClientContext` for
each process, so per-node data (the partition id, the region) reaches user code without
global state. The API mirrors Flower's ``NumPyClient`` so Flower users recognise it; no
framework is imported here, so a client-only install without torch can use it.
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from geofl.client.flower.detect import is_flower_client, is_flower_object
from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = [
    "Client",
    "ClientAppError",
    "ClientContext",
    "ClientFactory",
    "load_client_app",
]


@dataclass
class ClientContext:
    """What the runtime tells user code about the node it runs on.

    Attributes
    ----------
    node_id
        The server-assigned identifier of this node.
    node_name
        A human-readable name (e.g. ``"client-3"``).
    region
        The node's region, if it declared one; used by WAN-aware scheduling.
    node_config
        Per-node settings, e.g. ``{"partition-id": 0, "num-partitions": 4}`` in simulation.
    run_config
        Settings shared by every node of the run.
    state
        A dictionary that persists across rounds within the client process (e.g. an
        optimizer's momentum, or a cached data set).
    """

    node_id: int
    node_name: str
    region: str | None = None
    node_config: dict[str, Scalar] = field(default_factory=dict)
    run_config: dict[str, Scalar] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


class Client(ABC):
    """User training code: local training and (optionally) local evaluation.

    Implementations receive the global weights as NumPy arrays and return arrays with the
    same names, shapes and dtypes, so the runtime can encode, compress and check them
    without knowing the framework.
    """

    @abstractmethod
    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Train locally, starting from the global weights.

        Parameters
        ----------
        parameters
            The global model, name -> array.
        config
            The round's configuration (e.g. ``lr``, ``local_epochs``).

        Returns
        -------
        tuple
            The new weights (same names, shapes and dtypes as ``parameters``), the number of
            examples trained on (the aggregation weight), and metrics.
        """

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Evaluate the global weights on local data.

        Returns
        -------
        tuple
            The loss, the number of examples evaluated, and metrics.

        Raises
        ------
        NotImplementedError
            Unless a subclass overrides it; the server then treats this client as unable to
            evaluate.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement evaluate(); override "
            "Client.evaluate to enable client-side evaluation"
        )


#: Builds a :class:`Client` for one node; what :func:`load_client_app` returns.
ClientFactory = Callable[[ClientContext], Client]


class ClientAppError(GeoflError):
    """A ``module:attr`` client app spec could not be resolved to a :class:`Client`."""


def _parse_spec(spec: str) -> tuple[str, str]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip() or ":" in attr:
        raise ClientAppError(
            f"client app {spec!r} is malformed: expected 'module:attr', "
            "e.g. 'examples.quickstart.task:client_app'"
        )
    return module_name.strip(), attr.strip()


def _resolve_attr(module: object, module_name: str, attr: str) -> object:
    target: object = module
    for part in attr.split("."):
        if not part or not hasattr(target, part):
            raise ClientAppError(f"client app: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


def _check_instantiable(cls: type[Client], spec: str) -> None:
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise ClientAppError(f"client app {spec!r} is abstract (does not implement: {missing})")
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:
        raise ClientAppError(
            f"client app {spec!r}: the class {cls.__name__} cannot be instantiated without "
            f"arguments ({exc}); name a factory (ClientContext) -> Client instead"
        ) from exc
    except ValueError:  # no signature available (e.g. a C extension type): try at call time
        return


def _flower_factory(target: object, spec: str) -> ClientFactory:
    # Imports flwr: only ever reached for an app that is a Flower one.
    from geofl.client.flower.adapter import flower_factory

    return flower_factory(target, spec)


def _checked_factory(factory: Callable[[ClientContext], object], spec: str) -> ClientFactory:
    def build(context: ClientContext) -> Client:
        client = factory(context)
        if is_flower_client(client):  # a Flower client_fn without annotations
            return _flower_factory(factory, spec)(context)
        if not isinstance(client, Client):
            raise ClientAppError(
                f"client app {spec!r} returned {type(client).__name__}, expected a "
                "geofl.client.Client"
            )
        return client

    return build


def load_client_app(spec: str) -> ClientFactory:
    """Resolve ``"module:attr"`` to a factory building a :class:`Client` per node.

    ``attr`` (dots allowed for nested attributes) may be a :class:`Client` instance (shared
    as is), a :class:`Client` subclass (instantiated with no arguments), or a callable
    taking a :class:`ClientContext` and returning a :class:`Client`. Flower 1.42 apps run
    unchanged (see :mod:`geofl.client.flower`): a ``flwr.clientapp.ClientApp`` (message API
    or legacy ``client_fn``), or a bare ``client_fn(context)`` returning a Flower client.

    Raises
    ------
    ClientAppError
        If the spec is malformed, the module cannot be imported (the import error is
        chained and shown), the attribute is missing or of the wrong type. A factory that
        returns something other than a :class:`Client` raises it when called.
    """
    module_name, attr = _parse_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ClientAppError(
            f"client app {spec!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    target = _resolve_attr(module, module_name, attr)
    if is_flower_object(target):
        return _flower_factory(target, spec)
    if isinstance(target, Client):
        instance = target
        return lambda _context: instance
    if isinstance(target, type):
        if not issubclass(target, Client):
            raise ClientAppError(
                f"client app {spec!r} is the class {target.__name__}, which is not a "
                "subclass of geofl.client.Client"
            )
        _check_instantiable(target, spec)
        cls = target
        return lambda _context: cls()
    if callable(target):
        return _checked_factory(target, spec)
    raise ClientAppError(
        f"client app {spec!r} is a {type(target).__name__}; expected a Client instance, a "
        "Client subclass, or a callable (ClientContext) -> Client"
    )
