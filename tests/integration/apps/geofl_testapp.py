"""A numpy-only app for integration tests; behaviour chosen per node by node config.

Node config ``behaviour``: ``ok`` (default), ``wrong-shape``, ``raise``, ``slow``
(sleeps ``delay_s`` seconds in fit), ``scaled`` (its float delta multiplied by ``scale``:
an attacker whose update is finite, so it passes every check). With ``count-dir`` set,
every fit appends its ``server_round`` to ``<count-dir>/<partition-id>.log`` (how often a
client trained). Every client adds ``1 + partition-id`` to the float tensors and reports
``10 * (partition-id + 1)`` examples, so the aggregate of a round is known exactly.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Weights, WeightsView


def make_model() -> Weights:
    return {
        "w": np.zeros((4, 3), np.float32),
        "b": np.zeros(3, np.float32),
        "steps": np.zeros((), np.int64),
    }


def make_float_model() -> Weights:
    """The model without its integer counter: differential privacy noises every tensor."""
    return {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, float]]:
    return float(np.abs(weights["w"]).mean()), {"w_mean": float(weights["w"].mean())}


class ScriptedClient(Client):
    def __init__(
        self,
        partition: int,
        behaviour: str,
        delay_s: float,
        count_dir: str = "",
        scale: float = 1.0,
    ) -> None:
        self.partition = partition
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.count_dir = count_dir
        self.scale = scale if behaviour == "scaled" else 1.0

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        if self.count_dir:
            with (Path(self.count_dir) / f"{self.partition}.log").open("a") as log:
                log.write(f"{config.get('server_round')}\n")
        if self.behaviour == "raise":
            raise ValueError("deliberate failure in fit")
        if self.behaviour == "slow":
            time.sleep(self.delay_s)
        shift = (1 + self.partition) * self.scale
        out = {k: v + shift if v.dtype.kind == "f" else v + 1 for k, v in parameters.items()}
        if self.behaviour == "wrong-shape":
            out["w"] = np.zeros((5, 3), np.float32)
        return out, 10 * (self.partition + 1), {"train_loss": float(self.partition)}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return float(parameters["w"].mean()), 5, {"accuracy": 0.5 + 0.1 * self.partition}


def client_app(context: ClientContext) -> Client:
    node = context.node_config
    return ScriptedClient(
        int(node.get("partition-id", 0)),
        str(node.get("behaviour", "ok")),
        float(node.get("delay_s", 1.0)),
        str(node.get("count-dir", "")),
        float(node.get("scale", 1.0)),
    )


def make_large_model() -> Weights:
    """6 M float32 values (24 MB): far above gRPC's 4 MiB default message limit."""
    return {"big": np.zeros(6_000_000, np.float32), "b": np.zeros(3, np.float32)}


class ShiftClient(Client):
    def __init__(self, shift: float) -> None:
        self.shift = shift

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        return {k: v + self.shift for k, v in parameters.items()}, 1, {}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return float(np.abs(parameters["b"]).mean()), 1, {}


def shift_app(context: ClientContext) -> Client:
    return ShiftClient(1.0 + float(context.node_config.get("partition-id", 0)))


def _ids(context: ClientContext, key: str) -> set[int]:
    text = str(context.node_config.get(key, ""))
    return {int(part) for part in text.split(",") if part.strip()}


class VirtualClient(ShiftClient):
    """``ShiftClient`` whose failure modes are chosen by partition id (node config lists)."""

    def __init__(self, shift: float, behaviour: str, scale: float = 1.0) -> None:
        super().__init__(shift * scale if behaviour == "scaled" else shift)
        self.behaviour = behaviour

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        if self.behaviour == "raise":
            raise ValueError("deliberate failure in fit")
        out = {k: v + self.shift if v.dtype.kind == "f" else v + 1 for k, v in parameters.items()}
        if self.behaviour == "nan":
            out = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in out.items()}
        return out, 100, {"train_loss": self.shift}


def virtual_app(context: ClientContext) -> Client:
    """``raise-ids`` / ``nan-ids`` / ``scaled-ids`` (comma-separated partition ids) fail,
    send NaN, or multiply their shift by ``scale``; each client trains on 100 examples and
    adds ``1 + partition-id`` to every weight."""
    index = int(context.node_config.get("partition-id", 0))
    behaviour = "raise" if index in _ids(context, "raise-ids") else "ok"
    behaviour = "nan" if index in _ids(context, "nan-ids") else behaviour
    behaviour = "scaled" if index in _ids(context, "scaled-ids") else behaviour
    return VirtualClient(1.0 + index, behaviour, float(context.node_config.get("scale", 1.0)))


def make_medium_model() -> Weights:
    """10,000 float32 values (40 kB): large enough for a codec to pay off."""
    return {"w": np.zeros((200, 50), np.float32), "b": np.zeros(3, np.float32)}


def labels() -> np.ndarray:
    """80 samples with labels 0..3 in turn: what ``simulation.labels`` names in tests."""
    return np.arange(80, dtype=np.int64) % 4


class PartitionClient(ShiftClient):
    """Reports the simulator's share as its examples and the share's first index as loss."""

    def __init__(self, indices: np.ndarray) -> None:
        super().__init__(1.0)
        self.indices = indices

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        out = {k: v + 1 if v.dtype.kind == "f" else v for k, v in parameters.items()}
        return out, int(self.indices.size), {"train_loss": float(self.indices[0])}


def partition_app(context: ClientContext) -> Client:
    """A client that needs the simulator's partition file (``assigned_indices``)."""
    from geofl.client.partition import assigned_indices

    indices = assigned_indices(context)
    if indices is None:
        raise ValueError("no partition-file in the node config")
    return PartitionClient(indices)


class StepClient(Client):
    """Adds ``(1 + partition-id) x local_steps`` to every float tensor (ints: + steps).

    Reports ``10 x local_steps`` examples, so a partially synchronized round's groups
    and their aggregate are known exactly. Node config ``behaviour: raise-late`` fails
    in the second segment of a partial-sync round (after a group was already sent).
    """

    def __init__(self, rate: float, behaviour: str) -> None:
        self.rate = rate
        self.behaviour = behaviour

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        steps = int(config.get("local_steps", 1))
        if self.behaviour == "raise-late" and config.get("sync_segment") == 1:
            raise ValueError("deliberate failure in the second segment")
        out = {
            k: v + self.rate * steps if v.dtype.kind == "f" else v + steps
            for k, v in parameters.items()
        }
        return out, 10 * steps, {"train_loss": self.rate}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return float(parameters["w"].mean()), 5, {}


def step_app(context: ClientContext) -> Client:
    node = context.node_config
    return StepClient(1.0 + float(node.get("partition-id", 0)), str(node.get("behaviour", "ok")))


class TowardClient(Client):
    """Moves every float tensor half-way to ``1 + partition-id``: the update depends on
    the model trained from, so training from the wrong model version is visible."""

    def __init__(self, target: float) -> None:
        self.target = target

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        out = {
            k: v + (self.target - v) / 2 if v.dtype.kind == "f" else v
            for k, v in parameters.items()
        }
        return out, 100, {"train_loss": self.target}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return float(parameters["b"].mean()), 1, {}


def toward_app(context: ClientContext) -> Client:
    return TowardClient(1.0 + float(context.node_config.get("partition-id", 0)))


class RampClient(ShiftClient):
    """Adds ``(1 + partition-id) x`` a ramp over each float tensor's elements, so a
    stochastic codec's rounding differs from element to element (a constant shift
    quantizes exactly)."""

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        out = {
            k: v + self.shift * np.linspace(0.0, 1.0, v.size, dtype=v.dtype).reshape(v.shape)
            for k, v in parameters.items()
        }
        return out, 100, {"train_loss": self.shift}


def ramp_app(context: ClientContext) -> Client:
    return RampClient(1.0 + float(context.node_config.get("partition-id", 0)))
