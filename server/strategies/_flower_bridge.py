"""Flower 1.42's side of :mod:`geofl.server.strategies.flower`: the one module importing flwr.

It is imported lazily, only when a run names a Flower strategy, so ``import geofl.server``
neither pays Flower's import (about a second) nor needs Flower installed. Here live the
construction of a Flower strategy from YAML arguments (every argument checked against the
class's signature), the stand-in ``Grid``, and the conversions between geofl's tensors,
configs and metrics and Flower's records and messages.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import threading
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, cast

import flwr.serverapp.strategy as flower_strategies
import numpy as np
import numpy.typing as npt
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlowerBase
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from pydantic import TypeAdapter, ValidationError

from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView
from geofl.server.strategies._flower_names import (
    FLOWER_STRATEGIES,
    FLOWER_WRAPPERS,
    SAMPLING_ARGS,
    FlowerConfigError,
)
from geofl.server.strategies._flower_state import WRAPPED
from geofl.server.strategies._numeric import blocks, flat, to_dtype
from geofl.server.strategies.errors import StrategyError

__all__ = [
    "CohortGrid",
    "FlowerBase",
    "array_record",
    "build",
    "configure",
    "metric_reply",
    "metrics_of",
    "train_reply",
    "weighted_by_key",
    "weights_of",
]

#: Types a YAML argument can carry; a parameter annotated otherwise takes a Python object.
_YAML_TYPES = frozenset({bool, int, float, str, type(None)})
_DEFAULT_WEIGHT_KEY = "num-examples"
_identity_lock = threading.Lock()
_FLOWER_LOGGER = logging.getLogger("flwr")
#: Flower's strategies log their sampling with this text (``FedAvg.configure_train`` ...).
_SAMPLING_LOG = ": Sampled %s nodes (out of %s)"

# Flower's logger prints with its own handler; passed on to geofl's root handler as well,
# each of its lines showed twice.
_FLOWER_LOGGER.propagate = False


# ------------------------------------------------------------------ construction


def build(
    name: str,
    args: Mapping[str, object],
    wraps: Mapping[str, Any] | None,
    path: tuple[str, ...] = (),
) -> FlowerBase:
    """Construct Flower's ``name`` from YAML ``args`` (and the strategy it ``wraps``).

    Raises
    ------
    FlowerConfigError
        Naming, as a key path below ``path``, what is wrong: an unsupported name, an
        argument that is unknown, of the wrong type, Flower's own cohort sampling, a
        Python object or missing; or relaying Flower's refusal of the values.
    """
    if name not in FLOWER_STRATEGIES:
        _refuse(
            (*path, "flower"),
            f"{name!r} is not a supported Flower strategy; "
            f"supported: {', '.join(FLOWER_STRATEGIES)}",
        )
    kwargs = dict(args)
    if name in FLOWER_WRAPPERS:
        if wraps is None:
            _refuse((*path, "wraps"), f"{name} wraps another strategy: set wraps")
        if wraps.get("flower") in FLOWER_WRAPPERS:
            _refuse(
                (*path, "wraps", "flower"),
                "a DifferentialPrivacy* wrapper wraps a plain strategy, not another wrapper",
            )
        kwargs["strategy"] = build(
            str(wraps.get("flower")), wraps.get("args") or {}, None, (*path, "wraps")
        )
    elif wraps is not None:
        _refuse(
            (*path, "wraps"),
            f"{name} wraps nothing; only the DifferentialPrivacy* wrappers take wraps",
        )
    _check_args(name, args, (*path, "args"))
    try:
        strategy: FlowerBase = getattr(flower_strategies, name)(**kwargs)
    except (TypeError, ValueError) as exc:
        _refuse((*path, "args"), f"Flower {name} rejected its arguments: {exc}")
    return strategy


def _check_args(name: str, args: Mapping[str, object], path: tuple[str, ...]) -> None:
    """Check every argument against ``name``'s signature before Flower sees it."""
    cls = getattr(flower_strategies, name)
    parameters = _parameters(cls)
    hints = typing.get_type_hints(cls.__init__)
    for key, value in args.items():
        where = (*path, key)
        if key in SAMPLING_ARGS:
            _refuse(
                where,
                "Flower's node sampling does not apply: geofl's scheduler picks "
                f"the clients; use {SAMPLING_ARGS[key]} instead",
            )
        if key == WRAPPED:
            _refuse(where, "name the wrapped strategy under wraps: {flower: ..., args: ...}")
        if key not in parameters:
            known = sorted(
                p for p in parameters if _takes_yaml(hints.get(p)) and p not in SAMPLING_ARGS
            )
            _refuse(where, f"Flower {name} takes no argument {key!r}; it takes {known}")
        _check_value(where, hints.get(key), value)
    missing = [
        key
        for key, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty and key not in args and key != WRAPPED
    ]
    if missing:
        _refuse(path, f"Flower {name} requires {', '.join(missing)}")


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Named parameters of ``cls``'s constructor (``*args``/``**kwargs`` left out)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        key: parameter
        for key, parameter in inspect.signature(cls).parameters.items()
        if parameter.kind in named
    }


def _check_value(where: tuple[str, ...], annotation: object, value: object) -> None:
    """Validate one argument against its annotation (strictly: no "3" for 3)."""
    if not _takes_yaml(annotation):
        _refuse(
            where,
            f"takes a Python object ({_show_type(annotation)}), which a YAML run cannot express",
        )
    try:
        TypeAdapter(cast(Any, annotation)).validate_python(value, strict=True)
    except ValidationError as exc:
        _refuse(where, f"{exc.errors()[0]['msg']} (got {value!r})")
    if isinstance(value, float) and not math.isfinite(value):
        _refuse(where, f"must be finite, got {value!r}")


def _takes_yaml(annotation: object) -> bool:
    """Whether ``annotation`` is built only from bool, int, float, str and None."""
    if annotation in _YAML_TYPES:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return all(arg in _YAML_TYPES for arg in typing.get_args(annotation))
    return False


def _show_type(annotation: object) -> str:
    """A short name for a parameter's type: ``PrivacyAccountant``, ``a callable``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(_show_type(arg) for arg in members)
    if origin is not None and getattr(origin, "__name__", "") == "Callable":
        return "a callable"
    return str(getattr(annotation, "__name__", annotation))


def _refuse(where: tuple[str, ...], message: str) -> NoReturn:
    raise FlowerConfigError(where, message)


# ------------------------------------------------------------------ the round's messages


class CohortGrid(Grid):
    """The ``Grid`` a Flower strategy samples from when geofl configures a round.

    geofl's scheduler has already chosen the cohort, and every client of a round gets the
    same config, so the grid only has to let Flower's sampling return at once: it lists
    ``size`` stand-in node ids (enough for the strategy's ``min_*_nodes``) and Flower
    samples all of them. Sending and receiving are the round engine's, never Flower's.
    """

    def __init__(self, size: int) -> None:
        self._node_ids = tuple(range(SUPERLINK_NODE_ID + 1, SUPERLINK_NODE_ID + 1 + size))

    def get_node_ids(self) -> Iterable[int]:
        """The stand-in node ids."""
        return self._node_ids

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """An instruction message, as a ServerApp's grid would build it."""
        ensure_identity()
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def set_run(self, run: Run) -> None:
        """Refused: the round engine owns the run."""
        _runtime_only("Grid.set_run")

    @property
    def run(self) -> Run:
        """Refused: the round engine owns the run."""
        _runtime_only("Grid.run")

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Refused: the round engine sends tasks."""
        _runtime_only("Grid.push_messages")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Refused: the round engine collects results."""
        _runtime_only("Grid.pull_messages")

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Refused: the round engine sends tasks and collects results."""
        _runtime_only("Grid.send_and_receive")


def _runtime_only(feature: str) -> NoReturn:
    raise StrategyError(
        f"{feature} is a feature of Flower's runtime; inside geofl's round engine a Flower "
        "strategy only configures and aggregates rounds"
    )


def grid_for(strategy: FlowerBase) -> CohortGrid:
    """A grid big enough for the (innermost) strategy's minimum node counts."""
    inner = _innermost(strategy)
    counts = [getattr(inner, key, 1) for key in SAMPLING_ARGS if key.startswith("min_")]
    return CohortGrid(max(1, *(int(count) for count in counts)))


def _innermost(strategy: FlowerBase) -> Any:
    """The strategy at the bottom of a chain of DP wrappers."""
    inner: Any = strategy
    while hasattr(inner, WRAPPED):
        inner = getattr(inner, WRAPPED)
    return inner


def ensure_identity() -> None:
    """Give this process the identity of a Flower server-side task, if it has none.

    Flower's public ``Message`` constructor reads the run, node and task of the Flower
    process it runs in; the geofl coordinator is no Flower process, and Flower's
    strategies build their instruction messages with that constructor.
    """
    with _identity_lock:
        for attribute, value in (("run_id", 0), ("node_id", SUPERLINK_NODE_ID), ("task_id", 0)):
            try:
                getattr(TaskIdentity, attribute)
            except RuntimeError:
                setattr(TaskIdentity, attribute, value)


def configure(
    strategy: FlowerBase,
    phase: str,
    server_round: int,
    arrays: ArrayRecord,
    base_config: Mapping[str, Scalar],
) -> Config:
    """Run ``configure_train``/``configure_evaluate`` and return the config it sends.

    Raises
    ------
    StrategyError
        If the strategy sends no message, or a config value that is not a scalar.
    """
    ensure_identity()
    hook = strategy.configure_train if phase == "train" else strategy.configure_evaluate
    with _without_sampling_log():
        messages = list(
            hook(server_round, arrays, ConfigRecord(dict(base_config)), grid_for(strategy))
        )
    if not messages:
        raise StrategyError(f"Flower configure_{phase} selected no clients in round {server_round}")
    records = list(messages[0].content.config_records.values())
    if len(records) != 1:
        raise StrategyError(f"Flower configure_{phase} sent {len(records)} config records, not 1")
    config: Config = {}
    for key, value in records[0].items():
        if isinstance(value, list):
            raise StrategyError(
                f"Flower configure_{phase} set {key!r} to a list; geofl configs hold scalars"
            )
        config[key] = value
    return config


class _SamplingLogFilter(logging.Filter):
    """Drops the Flower sampling lines logged by one thread.

    Flower samples the stand-in grid (:class:`CohortGrid`), so it would log "Sampled 2
    nodes (out of 2)" however many clients geofl's scheduler picked; geofl's own round
    line says who trained.
    """

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.thread == self._thread and str(record.msg).endswith(_SAMPLING_LOG))


@contextlib.contextmanager
def _without_sampling_log() -> typing.Iterator[None]:
    """Flower's sampling log lines left out while this thread configures a round."""
    dropped = _SamplingLogFilter()
    _FLOWER_LOGGER.addFilter(dropped)
    try:
        yield
    finally:
        _FLOWER_LOGGER.removeFilter(dropped)


def array_record(tensors: Iterable[tuple[str, npt.NDArray[Any]]]) -> ArrayRecord:
    """An ``ArrayRecord`` of ``tensors``, each serialized as soon as the iterator yields it."""
    record = ArrayRecord()
    for name, array in tensors:
        record[name] = Array(np.asarray(array))
    return record


def train_reply(index: int, arrays: ArrayRecord, metrics: Mapping[str, int | float]) -> Message:
    """The ``index``-th client's reply to a train instruction: its arrays and metrics."""
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(dict(metrics))})
    return Message(content, reply_to=_instruction(index, MessageType.TRAIN))


def metric_reply(index: int, metrics: Mapping[str, int | float]) -> Message:
    """The ``index``-th client's reply carrying metrics only."""
    content = RecordDict({"metrics": MetricRecord(dict(metrics))})
    return Message(content, reply_to=_instruction(index, MessageType.EVALUATE))


def _instruction(index: int, message_type: str) -> Message:
    """The instruction a reply answers, sent to a stand-in node id."""
    ensure_identity()
    return Message(RecordDict(), SUPERLINK_NODE_ID + 1 + index, message_type)


def weighted_by_key(strategy: FlowerBase) -> str:
    """The metric key the (innermost) strategy reads a reply's weight from."""
    inner = _innermost(strategy)
    return str(getattr(inner, "weighted_by_key", _DEFAULT_WEIGHT_KEY))


def metrics_of(record: MetricRecord | None) -> Metrics:
    """Flower's aggregated metrics as geofl metrics (lists, which geofl has none of, dropped)."""
    if record is None:
        return {}
    return {key: float(value) for key, value in record.items() if not isinstance(value, list)}


def weights_of(record: ArrayRecord, global_weights: WeightsView) -> Weights:
    """Flower's aggregate as the next global model: global names, order, shapes and dtypes.

    Flower may return float64 where the model is float32 (FedAdam's step) or a float median
    of an integer tensor; each tensor is cast back to its global dtype (integers rounded),
    so the model keeps its specification.

    Raises
    ------
    StrategyError
        If names or shapes differ from the model's, or a value is not finite.
    """
    if set(record.keys()) != set(global_weights):
        raise StrategyError(
            f"Flower returned tensors {sorted(record.keys())}, the model has "
            f"{sorted(global_weights)}"
        )
    result: Weights = {}
    for name, reference in global_weights.items():
        array = record[name].numpy()
        if array.shape != reference.shape:
            raise StrategyError(
                f"Flower returned tensor {name!r} with shape {array.shape}, "
                f"the model has {reference.shape}"
            )
        result[name] = _cast(name, array, reference.dtype)
    return result


def _cast(name: str, array: npt.NDArray[Any], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """``array`` in ``dtype``, block by block; refuses non-finite values."""
    if array.dtype == dtype and dtype.kind != "f":
        return array
    if array.dtype == dtype:
        if all(np.isfinite(flat(array)[part]).all() for part in blocks(array.size)):
            return array
        raise StrategyError(f"tensor {name!r}: result is not finite")
    out = np.empty(array.shape, dtype=dtype)
    source, target = flat(array), out.reshape(-1)
    for part in blocks(array.size):
        target[part] = to_dtype(source[part].astype(np.float64), dtype, name)
    return out
