"""geofl's weights, config and results <-> the records a Flower ClientApp reads and writes.

Two formats, matching the two ways a Flower 1.42 ClientApp handles a message:

* :class:`MessageFormat` for ``@app.train()`` / ``@app.evaluate()`` handlers: content
  ``{"arrays": ArrayRecord, "config": ConfigRecord}``; replies carry one ArrayRecord (train)
  and one MetricRecord with ``"num-examples"``, as Flower's message strategies require.
* :class:`LegacyFormat` for a ``client_fn`` returning a ``Client``/``NumPyClient``: the
  ``fitins``/``fitres``, ``evaluateins``/``evaluateres`` records of Flower's compatibility
  layer, which the ClientApp turns into ``fit``/``evaluate`` calls.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import lru_cache
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from flwr.app import (
    DEFAULT_TTL,
    Array,
    ArrayRecord,
    ConfigRecord,
    ConfigRecordValues,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
    UserConfig,
    UserConfigValue,
)
from flwr.common import (
    Code,
    EvaluateIns,
    FitIns,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.compat.common import recorddict_compat as compat

from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Config, Metrics, Scalar, Weights

__all__ = [
    "EVAL_LOSS_KEYS",
    "NUM_EXAMPLES_KEY",
    "UNKNOWN_RUN_ID",
    "FlowerReplyError",
    "LegacyFormat",
    "MessageFormat",
    "RecordFormat",
    "error_text",
    "instruction",
    "user_config",
]

log = logging.getLogger(__name__)
_R = TypeVar("_R")

#: The MetricRecord key Flower's strategies weigh replies by.
NUM_EXAMPLES_KEY = "num-examples"
#: Where an evaluate reply's loss is looked for, in order ("eval_loss": Flower's quickstarts).
EVAL_LOSS_KEYS = ("eval_loss", "loss", "val_loss", "test_loss")
#: Flower's message strategies put the round here; geofl's engine sends ``server_round``.
_FLOWER_ROUND_KEY = "server-round"
_GEOFL_ROUND_KEY = "server_round"
#: geofl's client context has no run id; Flower's Context needs one.
UNKNOWN_RUN_ID = 0


class FlowerReplyError(GeoflError):
    """A Flower ClientApp replied with an error, or with content geofl cannot use."""


def instruction(content: RecordDict, message_type: str, node_id: int, config: Config) -> Message:
    """The message Flower's SuperLink would deliver to node ``node_id``.

    Built from metadata directly: Flower's public constructor reads the identity of a
    Flower runtime process, which a geofl client is not.
    """
    round_number = config.get(_GEOFL_ROUND_KEY)
    metadata = Metadata(
        run_id=UNKNOWN_RUN_ID,
        message_id=uuid.uuid4().hex,
        src_node_id=SUPERLINK_NODE_ID,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id="" if round_number is None else str(round_number),
        created_at=time.time(),
        ttl=DEFAULT_TTL,
        message_type=message_type,
    )
    # The metadata argument is Flower's own way in (it inflates received messages with it),
    # left out of the typed overloads.
    message: Message = Message(content=content, metadata=metadata)  # type: ignore[call-overload]
    return message


def user_config(values: Mapping[str, Scalar]) -> UserConfig:
    """geofl node or run settings as a Flower ``UserConfig``.

    Flower declares no ``bytes`` values there but never checks; they pass through rather
    than silently disappearing.
    """
    config: dict[str, UserConfigValue] = {}
    for key, value in values.items():
        config[key] = value  # type: ignore[assignment]  # bytes, see above
    return config


def error_text(message: Message) -> str:
    """Flower's error of a reply as one line: code name, number and reason."""
    error = message.error
    names = {v: k for k, v in vars(ErrorCode).items() if not k.startswith("_")}
    name = names.get(error.code, "UNKNOWN")
    return f"Flower ClientApp replied with error {name} ({error.code}): {error.reason or ''}"


class RecordFormat(ABC):
    """How geofl's fit/evaluate arguments become message content, and replies results."""

    @abstractmethod
    def train_content(self, parameters: Weights, config: Config) -> RecordDict:
        """Content of a ``train`` message."""

    @abstractmethod
    def evaluate_content(self, parameters: Weights, config: Config) -> RecordDict:
        """Content of an ``evaluate`` message."""

    @abstractmethod
    def read_train(self, content: RecordDict, sent: Weights) -> tuple[Weights, int, Metrics]:
        """New weights (named as ``sent``), number of examples and metrics of a reply."""

    @abstractmethod
    def read_evaluate(self, content: RecordDict) -> tuple[float, int, Metrics]:
        """Loss, number of examples and metrics of an evaluate reply."""


class MessageFormat(RecordFormat):
    """Records of Flower's message API (``@app.train()``, ``@app.evaluate()``)."""

    def train_content(self, parameters: Weights, config: Config) -> RecordDict:
        return RecordDict({"arrays": _array_record(parameters), "config": _config_record(config)})

    def evaluate_content(self, parameters: Weights, config: Config) -> RecordDict:
        return self.train_content(parameters, config)

    def read_train(self, content: RecordDict, sent: Weights) -> tuple[Weights, int, Metrics]:
        arrays = _only_record(content.array_records, "arrays", "ArrayRecord")
        metrics = _only_record(content.metric_records, "metrics", "MetricRecord")
        return _named_weights(arrays, sent), _num_examples(metrics), _scalar_metrics(metrics)

    def read_evaluate(self, content: RecordDict) -> tuple[float, int, Metrics]:
        metrics = _only_record(content.metric_records, "metrics", "MetricRecord")
        return _eval_loss(metrics), _num_examples(metrics), _scalar_metrics(metrics)


class LegacyFormat(RecordFormat):
    """Flower's legacy ``FitIns``/``FitRes`` records, for ``client_fn`` apps.

    Tensors travel as a list: the order of geofl's weights dict is the list order, both
    ways.
    """

    def train_content(self, parameters: Weights, config: Config) -> RecordDict:
        ins = FitIns(ndarrays_to_parameters(list(parameters.values())), dict(config))
        return compat.fitins_to_recorddict(ins, keep_input=True)

    def evaluate_content(self, parameters: Weights, config: Config) -> RecordDict:
        ins = EvaluateIns(ndarrays_to_parameters(list(parameters.values())), dict(config))
        return compat.evaluateins_to_recorddict(ins, keep_input=True)

    def read_train(self, content: RecordDict, sent: Weights) -> tuple[Weights, int, Metrics]:
        try:
            res = compat.recorddict_to_fitres(content, keep_input=False)
        except KeyError as exc:
            raise FlowerReplyError(f"the reply is not a legacy FitRes: no record {exc}") from exc
        _check_status(res.status)
        arrays = parameters_to_ndarrays(res.parameters)
        if len(arrays) != len(sent):
            raise FlowerReplyError(
                f"the client returned {len(arrays)} arrays for a model of {len(sent)} "
                f"tensors ({', '.join(sent)})"
            )
        pairs = zip(sent, arrays, strict=True)
        weights = {name: _conform(name, array, sent[name]) for name, array in pairs}
        return weights, int(res.num_examples), dict(res.metrics)

    def read_evaluate(self, content: RecordDict) -> tuple[float, int, Metrics]:
        try:
            res = compat.recorddict_to_evaluateres(content)
        except KeyError as exc:
            raise FlowerReplyError(
                f"the reply is not a legacy EvaluateRes: no record {exc}"
            ) from exc
        if res.status.code == Code.EVALUATE_NOT_IMPLEMENTED:
            raise NotImplementedError(f"the Flower client: {res.status.message}")
        _check_status(res.status)
        return float(res.loss), int(res.num_examples), dict(res.metrics)


def _check_status(status: Status) -> None:
    if status.code != Code.OK:
        raise FlowerReplyError(f"the Flower client returned {status.code.name}: {status.message}")


def _array_record(parameters: Weights) -> ArrayRecord:
    return ArrayRecord({name: Array(np.asarray(value)) for name, value in parameters.items()})


def _config_record(config: Config) -> ConfigRecord:
    values: dict[str, ConfigRecordValues] = dict(config)
    if _GEOFL_ROUND_KEY in config and _FLOWER_ROUND_KEY not in config:
        values[_FLOWER_ROUND_KEY] = config[_GEOFL_ROUND_KEY]
    return ConfigRecord(values)


def _only_record(records: Mapping[str, _R], preferred: str, kind: str) -> _R:
    """The record named ``preferred``, else the only record of its kind."""
    if preferred in records:
        return records[preferred]
    if len(records) == 1:
        return next(iter(records.values()))
    found = ", ".join(repr(k) for k in records) or "none"
    raise FlowerReplyError(
        f"the reply must hold one {kind} (Flower's strategies expect exactly one, "
        f"usually {preferred!r}); found {found}"
    )


def _named_weights(arrays: ArrayRecord, sent: Weights) -> Weights:
    missing = [name for name in sent if name not in arrays]
    extra = [key for key in arrays if key not in sent]
    if missing or extra:
        raise FlowerReplyError(
            "the reply's ArrayRecord keys must be the model's tensor names: "
            f"missing {missing}, unexpected {extra}"
        )
    return {name: _conform(name, arrays[name].numpy(), sent[name]) for name in sent}


def _conform(
    name: str, value: npt.NDArray[np.generic], sent: npt.NDArray[np.generic]
) -> npt.NDArray[np.generic]:
    """``value`` in the dtype geofl sent, when that is a same-kind cast (float64 -> float32).

    Flower aggregates whatever dtype comes back; geofl's wire keeps the model's dtypes.
    Other mismatches are left for the runtime's shape and dtype check to report.
    """
    if value.dtype != sent.dtype and np.can_cast(value.dtype, sent.dtype, "same_kind"):
        log.debug("casting %s from %s to %s", name, value.dtype, sent.dtype)
        return value.astype(sent.dtype)
    return value


def _num_examples(metrics: MetricRecord) -> int:
    value = metrics.get(NUM_EXAMPLES_KEY)
    if not isinstance(value, (int, float)):
        raise FlowerReplyError(
            f"the reply's MetricRecord needs {NUM_EXAMPLES_KEY!r} (a number): Flower's "
            "strategies, and geofl's, weigh results by it"
        )
    return int(value)


def _eval_loss(metrics: MetricRecord) -> float:
    for key in EVAL_LOSS_KEYS:
        value = metrics.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    _warn_once(f"evaluate replies carry none of {EVAL_LOSS_KEYS}: the loss is recorded as NaN")
    return math.nan


def _scalar_metrics(metrics: MetricRecord) -> Metrics:
    """Scalar metrics of a MetricRecord; list values have no geofl equivalent."""
    out: dict[str, Scalar] = {}
    dropped = []
    for key, value in metrics.items():
        if key == NUM_EXAMPLES_KEY:
            continue
        if isinstance(value, (int, float)):
            out[key] = value
        else:
            dropped.append(key)
    if dropped:
        _warn_once(f"list-valued metrics {sorted(dropped)} dropped: geofl metrics are scalars")
    return out


@lru_cache(maxsize=64)
def _warn_once(text: str) -> None:
    log.warning(text)
