"""Issue 15's privacy figures: accuracy at ε = 1, 3, 8 for central and distributed DP.

Workload: Fashion-MNIST, 1,000 virtual clients (Dirichlet(0.5) label skew, split by the
simulator), 100 a round, softmax regression (:mod:`benchmarks.apps.privacy_linear`,
7,850 parameters), on the virtual clock through the real coordinator. Variants:

``nonprivate``
    FedAvg with server momentum, no clipping or noise.
``central``
    ``privacy.mechanism: central`` at each target ε (δ = 1e-5): the server clips each
    update to ``--clip`` and adds Gaussian noise to the sum; ``z`` is calibrated by
    dp-accounting for the planned rounds. No amplification (``sampling: none``).
``distributed``
    ``secure_aggregation.enabled`` with ``privacy.mechanism: distributed``: SecAgg+ among
    each round's 100 clients (default degree and threshold, 32-bit ring); each client clips,
    rotates, rounds and adds its share of discrete Gaussian noise before masking; ε from
    the zCDP bound of the distributed discrete Gaussian. No amplification.
``central-amplified``
    ``central`` with ``sampling: uniform, population: 1000`` (the cohort is a uniform
    sample): what amplification would buy; distributed DP does not get it (docs/privacy.md).

Every run has the same seed, partition, model, optimizer and rounds; the final model is
scored on the 10,000 test images. Run as::

    python -m benchmarks.privacy [--rounds 20] [--epsilons 1,3,8] [--variants ...]
        [--lock] [--out benchmarks/results/privacy.json]

``--lock`` holds the shared heavy-work lock (:func:`benchmarks.core.heavy_lock`) around
each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.apps.privacy_linear import accuracy
from benchmarks.core import heavy_lock
from geofl.server.config import RunConfig, parse_config
from geofl.server.coordinator import distributed_plan
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

VARIANTS = ("nonprivate", "central", "distributed", "central-amplified")
DIMENSION = 7850


def run_config(
    args: argparse.Namespace, variant: str, target: float | None, workdir: Path
) -> RunConfig:
    """The run of one variant at one target ε (None: non-private)."""
    data: dict[str, Any] = {
        "run": {"name": f"privacy-{variant}-{target}", "rounds": args.rounds, "seed": args.seed},
        "model": "benchmarks.apps.privacy_linear:make_model",
        "strategy": {
            "name": "fedavgm",
            "clients_per_round": args.per_round,
            "min_clients": args.per_round,
            "server_lr": args.server_lr,
            "server_momentum": args.server_momentum,
        },
        "schedule": {"deadline_s": 3600, "wait_for_clients_s": 600},
        "round_config": {"local_steps": args.local_steps, "batch_size": 32, "lr": args.lr},
        "evaluation": {"every": 0},
        "storage": {
            "url": f"sqlite:///{workdir / 'privacy.db'}",
            "checkpoints": str(workdir / "checkpoints"),
            "keep_checkpoints": 1,
        },
        "simulation": {
            "clients": args.clients,
            "clock": "virtual",
            "workers": 0,
            "app": "benchmarks.apps.privacy_linear:client_app",
            "partition": {"dirichlet": {"alpha": 0.5}},
            "labels": "examples.fashion_mnist.task:train_labels",
        },
    }
    if target is not None:
        privacy: dict[str, Any] = {
            "clip_norm": args.clip,
            "target_epsilon": target,
            "delta": args.delta,
            "mechanism": "central" if variant.startswith("central") else "distributed",
        }
        if variant == "central-amplified":
            privacy.update(sampling="uniform", population=args.clients)
        data["privacy"] = privacy
    if variant == "distributed":
        data["secure_aggregation"] = {"enabled": True, "ring_bits": 32, "stage_deadline_s": 600}
    return parse_config(data, source="benchmarks.privacy")


def noise_multiplier(config: RunConfig) -> float | None:
    """The z the run noised with (calibrated from the target)."""
    privacy = config.privacy
    if privacy is None:
        return None
    if privacy.is_distributed(config.secure_aggregation.enabled):
        return distributed_plan(config, DIMENSION)[0].noise_multiplier
    cohort = config.strategy.clients_per_round
    return privacy.central_mechanism(cohort, config.planned_rounds).noise_multiplier


def measure(config: RunConfig) -> dict[str, Any]:
    """Run ``config``; the final model's test accuracy and the ε recorded per round."""
    started = time.perf_counter()
    outcome = run_virtual_simulation(config)
    wall_s = time.perf_counter() - started
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        run_id = outcome.result.run_id
        rounds = queries.rounds_of(session, run_id)
        row = queries.latest_checkpoint(session, run_id)
        assert row is not None, "the run left no checkpoint"
        record = CheckpointRecord.from_row(row)
    weights, _ = CheckpointStore(Path(config.storage.checkpoints)).load(record)
    loss, acc = accuracy(weights)
    return {
        "status": outcome.result.status,
        "committed_rounds": sum(r.status == "committed" for r in rounds),
        "epsilon_per_round": [r.epsilon for r in rounds],
        "test_accuracy": acc,
        "test_loss": loss,
        "wall_s": round(wall_s, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--server-momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each case (DP noise is fresh each time; the data and seed are not)",
    )
    parser.add_argument(
        "--lock", action="store_true", help="hold the heavy-work lock around each run"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/privacy.json"))
    args = parser.parse_args(argv)
    targets = [float(e) for e in args.epsilons.split(",")]
    results = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}; choose from {VARIANTS}")
        for target in [None] if variant == "nonprivate" else targets:
            for repeat in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="geofl-privacy-") as tmp:
                    config = run_config(args, variant, target, Path(tmp))
                    with heavy_lock() if args.lock else contextlib.nullcontext():
                        measured = measure(config)
                    row = {
                        "variant": variant,
                        "target_epsilon": target,
                        "repeat": repeat,
                        "noise_multiplier": noise_multiplier(config),
                        **measured,
                    }
                print(json.dumps(row), flush=True)
                results.append(row)
                args.out.write_text(json.dumps(_report(args, results), indent=2) + "\n")
    return 0


def _report(args: argparse.Namespace, results: list[dict[str, Any]]) -> dict[str, Any]:
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "lock")}
    return {
        "benchmark": "privacy (issue 15)",
        "settings": settings,
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "summary": summarize(results),
        "results": results,
    }


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread of the test accuracy of each (variant, target) over its repeats."""
    cases: dict[tuple[str, float | None], list[float]] = {}
    for row in results:
        cases.setdefault((row["variant"], row["target_epsilon"]), []).append(row["test_accuracy"])
    return [
        {
            "variant": variant,
            "target_epsilon": target,
            "runs": len(accuracies),
            "mean_accuracy": round(statistics.fmean(accuracies), 4),
            "min_accuracy": min(accuracies),
            "max_accuracy": max(accuracies),
            "stdev_accuracy": round(statistics.stdev(accuracies), 4)
            if len(accuracies) > 1
            else None,
        }
        for (variant, target), accuracies in cases.items()
    ]


if __name__ == "__main__":
    raise SystemExit(main())
