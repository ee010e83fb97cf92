"""What the ServerApp and the ClientApp must agree on: client constants, who drops when.

Both sides compute the dropped clients from the same seeded function, so the server can
check the final model without being told who dropped, and a test can check it without Ray.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DROP_STAGES",
    "PLAIN_STAGE",
    "SECURE_STAGES",
    "ClientDropoutError",
    "client_shift",
    "dropped_partitions",
    "initial_model",
    "validate_drop_stage",
]

#: The stages of Flower's SecAgg+ protocol, named as in its ``Stage`` constants.
SECURE_STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
#: The one server -> client exchange of a plain FedAvg round.
PLAIN_STAGE = "train"
#: Every stage in which a client may be told to drop out.
DROP_STAGES = (*SECURE_STAGES, PLAIN_STAGE)


class ClientDropoutError(RuntimeError):
    """Raised by a ClientApp that plays a dropped client: Flower turns it into an error reply."""


def client_shift(partition_id: int) -> float:
    """What client ``partition_id`` adds to every parameter: distinct per client, and small.

    Small because SecAgg+ clips each weighted value to its ``clipping_range`` before
    quantizing it; distinct so that a lost or doubled update moves the mean.
    """
    if partition_id < 0:
        raise ValueError(f"partition_id must be >= 0, got {partition_id}")
    return 0.001 * (1 + partition_id)


def dropped_partitions(
    clients: int, fraction: float, server_round: int, seed: int
) -> frozenset[int]:
    """The partition ids that drop out in ``server_round``: ``round(fraction * clients)`` of them.

    A fresh seeded draw per round (the same clients do not drop every round), identical on
    every process that asks.
    """
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"dropout fraction must be in [0, 1), got {fraction}")
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1, got {server_round}")
    count = round(fraction * clients)
    if count == 0:
        return frozenset()
    rng = np.random.default_rng([seed, server_round])
    return frozenset(int(p) for p in rng.choice(clients, size=count, replace=False))


def initial_model(params: int) -> np.ndarray:
    """Seeded standard-normal float32 values (not constant: Flower deduplicates equal chunks)."""
    if params < 1:
        raise ValueError(f"params must be >= 1, got {params}")
    return np.random.default_rng(0).standard_normal(params, dtype=np.float32)


def validate_drop_stage(stage: str, secure: bool) -> str:
    """``stage`` if clients can drop in it under this mode, else a clear error."""
    allowed = SECURE_STAGES if secure else (PLAIN_STAGE,)
    if stage not in allowed:
        mode = "secure" if secure else "plain"
        raise ValueError(
            f"drop-stage {stage!r} does not exist in {mode} mode; use one of {allowed}"
        )
    return stage
