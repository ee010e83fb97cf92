"""ClientApp: return the received model plus a client constant, via SecAgg+ or in the clear.

SecAgg+ in Flower 1.42 exists only on the legacy path (``client_fn`` + ``NumPyClient`` +
``secaggplus_mod``), so that path is used for both modes; ``secure`` in the run config
decides whether ``secaggplus_mod`` wraps the call. A dropped client is played by raising
in the chosen stage before the protocol code runs: Flower turns the exception into an error
reply, which its workflows treat as a failed client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Context, Message
from flwr.client import Client, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

from flwrsecagg.common import (
    PLAIN_STAGE,
    ClientDropoutError,
    client_shift,
    dropped_partitions,
)

__all__ = ["ShiftClient", "app", "dropout_mod", "message_stage", "secure_switch_mod"]


class ShiftClient(NumPyClient):
    """Adds :func:`client_shift` to every parameter; reports its partition id, weight 1."""

    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """The received arrays plus this client's constant (no training)."""
        shift = client_shift(self.partition_id)
        updated = [p + p.dtype.type(shift) for p in parameters]
        return updated, 1, {"partition-id": self.partition_id}


def message_stage(msg: Message) -> str:
    """The protocol stage a train message asks for: a SecAgg+ stage, or ``"train"``."""
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    if configs is None or Key.STAGE not in configs:
        return PLAIN_STAGE
    return str(configs[Key.STAGE])


def dropout_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Raise in the configured stage if this client is among the round's dropped ones.

    The round number is the message's ``group_id`` (both legacy workflows set it).
    """
    cfg = context.run_config
    fraction = float(cfg["dropout"])
    if fraction > 0.0 and message_stage(msg) == str(cfg["drop-stage"]):
        partition_id = int(context.node_config["partition-id"])
        server_round = int(msg.metadata.group_id)
        dropped = dropped_partitions(
            int(cfg["num-clients"]), fraction, server_round, int(cfg["drop-seed"])
        )
        if partition_id in dropped:
            raise ClientDropoutError(
                f"partition {partition_id} drops out in round {server_round}, "
                f"stage {cfg['drop-stage']}"
            )
    return call_next(msg, context)


def secure_switch_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Run Flower's ``secaggplus_mod`` when the run is secure, else pass through."""
    if bool(context.run_config["secure"]):
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def client_fn(context: Context) -> Client:
    """One :class:`ShiftClient` per node, keyed by its ``partition-id``."""
    return ShiftClient(int(context.node_config["partition-id"])).to_client()


app = ClientApp(client_fn=client_fn, mods=[dropout_mod, secure_switch_mod])
