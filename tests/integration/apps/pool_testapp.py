"""A numpy client that writes down where and how it ran, for the pooled-simulation tests.

Every fit appends one JSON line to the node config's ``record-file``: the client's
partition, the process it ran in, torch's thread count there (torch is imported on first
fit, after the simulator's thread cap applies), and how many fits its ``context.state``
has counted so far (state that must survive across rounds in every process layout). The
update itself is :mod:`geofl_testapp`'s: ``1 + partition-id`` added to the float tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from geofl_testapp import make_model

from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Weights, WeightsView

__all__ = ["RecordingClient", "client_app", "make_model"]


class RecordingClient(Client):
    def __init__(self, context: ClientContext) -> None:
        self.context = context
        self.partition = int(context.node_config["partition-id"])
        self.record_file = Path(str(context.node_config["record-file"]))

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        import torch

        fits = int(self.context.state.get("fits", 0)) + 1
        self.context.state["fits"] = fits
        line = {
            "partition": self.partition,
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "fits": fits,
        }
        with self.record_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        out_weights = {
            k: v + (1 + self.partition) if v.dtype.kind == "f" else v + 1
            for k, v in parameters.items()
        }
        return out_weights, 10 * (self.partition + 1), {"train_loss": float(self.partition)}


def client_app(context: ClientContext) -> Client:
    return RecordingClient(context)
