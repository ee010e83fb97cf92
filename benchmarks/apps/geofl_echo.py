"""geofl client app for the framework-overhead benchmark: echo the model plus a constant.

Mirrors the Flower ClientApp in ``benchmarks/flower_app``: no training, every update
distinct (``parameters + (1 + partition-id)``), weight 1, so both frameworks move the same
bytes and aggregate to the same model; only the framework's own cost is measured.

Server side: ``make_model`` returns one float32 tensor ``w`` of ``GEOFL_BENCH_PARAMS``
seeded random values (the harness sets that variable for the server process).
"""

from __future__ import annotations

import os

import numpy as np

from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Weights, WeightsView

__all__ = ["PARAMS_ENV", "EchoPlusConstant", "client_app", "make_model"]

#: Environment variable holding the model size in float32 parameters.
PARAMS_ENV = "GEOFL_BENCH_PARAMS"


class EchoPlusConstant(Client):
    """Return the received weights shifted by ``shift``; evaluate reports zero loss."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Echo ``parameters + shift`` (same names, shapes, dtypes), weight 1."""
        out = {
            name: np.add(arr, np.asarray(self.shift, dtype=arr.dtype))
            for name, arr in parameters.items()
        }
        return out, 1, {}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Nothing to evaluate: loss 0 on one example (the benchmark disables evaluation)."""
        return 0.0, 1, {}


def client_app(context: ClientContext) -> Client:
    """Build the client for this node; its constant is ``1 + partition-id``."""
    raw = context.node_config.get("partition-id")
    if raw is None or isinstance(raw, bytes | bool):
        raise ValueError(
            f"geofl_echo needs an integer node config 'partition-id', got {raw!r}; "
            "start the client with --node-config partition-id=<i>"
        )
    return EchoPlusConstant(1.0 + float(int(raw)))


def make_model() -> Weights:
    """The initial global model: ``{"w": GEOFL_BENCH_PARAMS seeded normal float32 values}``.

    The same values as the Flower ServerApp's model (seed 0). Not zeros: a constant model
    splits into identical chunks, which content-addressed transports deduplicate.
    """
    raw = os.environ.get(PARAMS_ENV)
    if raw is None or not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"set {PARAMS_ENV} to a positive integer parameter count, got {raw!r}")
    return {"w": np.random.default_rng(0).standard_normal(int(raw), dtype=np.float32)}
