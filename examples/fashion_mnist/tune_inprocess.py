"""Pick hyper-parameters by simulating FedAvg in one process, without servers or sockets.

Each round every client's ``fit`` runs in turn from the same global weights, the results are
averaged weighted by examples, and the server evaluation scores the average. This is the
arithmetic of a synchronous FedAvg round and nothing else (no network, no dropouts), so it
is a fast way to check that a configuration can reach a target accuracy at all.

    python -m examples.fashion_mnist.tune_inprocess --rounds 15 --lr 0.05 --alpha 0.5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import torch

from examples.fashion_mnist.task import client_app, make_model, server_evaluate
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Weights, WeightsView


def fedavg(results: Sequence[tuple[WeightsView, int]]) -> Weights:
    """Average weights, each client counted by its number of examples."""
    total = sum(n for _, n in results)
    averaged: Weights = {}
    for name, first in results[0][0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for weights, n in results:
            acc += weights[name].astype(np.float64) * (n / total)
        averaged[name] = acc.astype(first.dtype)
    return averaged


def run(clients: Sequence[Client], rounds: int, config: Config, target: float) -> None:
    """Run FedAvg rounds, print server accuracy per round and when ``target`` is reached."""
    weights = make_model()
    reached = None
    for rnd in range(1, rounds + 1):
        start = time.perf_counter()
        round_config: Config = {**config, "seed": rnd}
        fits = [client.fit(weights, round_config) for client in clients]
        weights = fedavg([(new, n) for new, n, _ in fits])
        loss, metrics = server_evaluate(weights)
        accuracy = float(metrics["accuracy"])
        if reached is None and accuracy >= target:
            reached = rnd
        print(
            f"round {rnd:2d}  loss {loss:.4f}  accuracy {accuracy:.4f}  "
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )
    print(f"target {target:.2f}: " + (f"reached at round {reached}" if reached else "not reached"))


def main() -> None:
    """Parse the command line and run the simulation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--proximal-mu", type=float, default=0.0)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    node = {"num-partitions": args.clients, "dirichlet-alpha": args.alpha}
    clients = [
        client_app(ClientContext(i, f"client-{i}", node_config={**node, "partition-id": i}))
        for i in range(args.clients)
    ]
    config: Config = {
        "lr": args.lr,
        "local_epochs": args.local_epochs,
        "batch_size": args.batch_size,
        "proximal_mu": args.proximal_mu,
    }
    run(clients, args.rounds, config, args.target)


if __name__ == "__main__":
    main()
