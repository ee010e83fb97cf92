"""WAN-aware scheduling (issue 5): time to 85 % accuracy on a simulated 3-region WAN.

Workload: real Fashion-MNIST, the example's CNN (:mod:`examples.fashion_mnist.task`),
``--clients`` clients (100) holding a Dirichlet(0.5) label-skewed split of the 60,000
training images, ``--per-round`` (20) of them per round, one local epoch of SGD (lr 0.05,
batch 32). Three regions (20/80/220 ms RTT, 50/20/5 Mbit/s up, 100/50/20 down; a quarter,
a quarter and half of the clients), per-client multipliers of compute speed (log-normal,
sigma 0.5) and bandwidth (uniform 0.5-1.5), 200 samples/s for a client with multiplier 1.
The link model, the split and the seeds are the same for every configuration; only the
configuration's own sections differ. The server evaluates the global model on the 10,000
test images after every round (simulated time is not charged for it).

Configurations (:data:`SCENARIOS`): plain FedAvg (uniform selection, no compression);
Flower 1.42's FedAvg on the same clients, data and training code, its round durations
*computed* from the same link model (Flower simulates no links); geofl with deadline-aware
selection; + adaptive upload compression with error feedback; + relays; async (FedBuff);
DiLoCo (``diloco_steps`` batches per round); DiLoCo with deadline-aware selection; DiLoCo
with partial synchronization. Rows that geofl cannot run say why (from the configuration
models themselves). Runs are capped at ``--rounds`` rounds (FedBuff: as many client
updates) so that final accuracies compare equal work.

Every geofl run is ``geofl simulate`` on the virtual clock (the real coordinator, engine,
strategy and codecs with simulated clients), run through the Python API in a child process
(this module with ``--child``) under the shared heavy-work lock; curves are read back from
its database: a round's time is ``Round.finished_at - Run.created_at`` (simulated
seconds), its bytes the sum over its participations of bytes up and down. Optionally one
configuration is also run on the wall clock (real processes and the link shaper) and
compared round by round with the virtual clock (:mod:`benchmarks.wan_schedule_wall`).

    python -m benchmarks.wan_schedule --wall --out benchmarks/results/wan_schedule.json \\
        --png benchmarks/wan_schedule.png
    python -m benchmarks.wan_schedule --report-only --out ... --png ...   # redraw

``--resume`` keeps the scenarios an earlier ``--out`` of the same workload already holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.compare import scrub_paths
from benchmarks.core import REPO_ROOT, heavy_lock, stop_tree
from benchmarks.wan_schedule_report import plot, render_markdown, scenario_summary, summarize
from benchmarks.wan_schedule_runs import flower_curve, read_geofl_curve, run_flower

__all__ = [
    "FASHION",
    "HETEROGENEITY",
    "REGIONS",
    "SCENARIOS",
    "Deadlines",
    "Scenario",
    "Setup",
    "WanSpec",
    "build_report",
    "deadline_for",
    "deadlines_for",
    "deep_merge",
    "flower_run_config",
    "geofl_config",
    "main",
    "model_bytes",
    "plot",
    "predicted_round_s",
    "prepare",
    "render_markdown",
    "report_only",
    "run_child",
    "run_geofl",
    "run_logged",
    "run_scenario",
    "scenario",
    "simulation_section",
    "summarize",
    "write_partition",
]

FASHION = "examples.fashion_mnist.task"
REGIONS: dict[str, dict[str, float]] = {
    "near": {"share": 0.25, "rtt_ms": 20, "up_mbps": 50, "down_mbps": 100},
    "mid": {"share": 0.25, "rtt_ms": 80, "up_mbps": 20, "down_mbps": 50},
    "far": {"share": 0.5, "rtt_ms": 220, "up_mbps": 5, "down_mbps": 20},
}
HETEROGENEITY = {
    "compute": {"lognormal": {"sigma": 0.5}},
    "bandwidth": {"uniform": {"low": 0.5, "high": 1.5}},
}
#: A deadline nobody misses: plain FedAvg, like Flower's, waits for every sampled client.
NO_DEADLINE_S = 3600.0


@dataclass(frozen=True)
class WanSpec:
    """The workload, identical for every configuration (see the module docstring)."""

    clients: int = 100
    per_round: int = 20
    min_clients: int = 10
    rounds: int = 80
    seed: int = 7
    alpha: float = 0.5
    target: float = 0.85
    samples_per_s: float = 200.0
    local_epochs: int = 1
    lr: float = 0.05
    batch_size: int = 32
    #: Deadline-aware selection: the deadline is this quantile of the clients' predicted
    #: round times divided by the selection margin, unless ``deadline_s`` is given.
    deadline_quantile: float = 0.5
    deadline_s: float | None = None
    buffer_size: int = 10
    concurrency: int = 20
    diloco_steps: int = 20
    #: Layer groups per DiLoCo round in the partial-sync configurations.
    sync_points: int = 4
    #: Steps between the sync points at the end of a round (None: the automatic value).
    tail_steps: int | None = None
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    workers: int = 2
    #: Cap on each client's training images (0: its whole share); for quick runs.
    max_train_samples: int = 0
    timeout_s: float = 5400.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_clients <= self.per_round <= self.clients:
            raise ValueError(
                "need 1 <= min_clients <= per_round <= clients, got "
                f"{self.min_clients}, {self.per_round}, {self.clients}"
            )
        for name in ("rounds", "local_epochs", "batch_size", "buffer_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.deadline_quantile <= 1 or not 0 < self.target <= 1:
            raise ValueError("deadline_quantile and target must be in (0, 1]")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s}")

    @property
    def async_updates(self) -> int:
        """FedBuff versions that apply as many client updates as ``rounds`` sync rounds."""
        return max(1, round(self.rounds * self.per_round / self.buffer_size))


# ---------------------------------------------------------------- the link model


def simulation_section(spec: WanSpec) -> dict[str, Any]:
    """The WAN part of ``simulation``: regions, heterogeneity, compute (shared by all)."""
    return {
        "clients": spec.clients,
        "regions": REGIONS,
        "heterogeneity": HETEROGENEITY,
        "compute": {"samples_per_s": spec.samples_per_s},
    }


def model_bytes() -> int:
    """Raw bytes of the CNN (float32): what an uncompressed transfer carries."""
    from examples.fashion_mnist.task import make_model

    return int(sum(np.asarray(t).nbytes for t in make_model().values()))


def write_partition(spec: WanSpec, directory: Path) -> tuple[Path, list[int]]:
    """Split the training labels Dirichlet(alpha) among the clients into a partition file.

    Seeded by ``spec.seed``, as ``simulation.partition`` would; every configuration and
    Flower read their shares from this one file. Returns it and the share sizes.
    """
    from examples.fashion_mnist.task import train_labels
    from geofl.client.partition import write_partition_file
    from geofl.server.config.simulation import PartitionConfig
    from geofl.server.simulation.partition import partition_data

    scheme = PartitionConfig.model_validate({"dirichlet": {"alpha": spec.alpha}})
    parts = partition_data(scheme, train_labels(), spec.clients, spec.seed)
    path = directory / "partition.npz"
    write_partition_file(path, parts)
    return path, [len(part) for part in parts]


def _trained(spec: WanSpec, share: int) -> int:
    kept = min(share, spec.max_train_samples) if spec.max_train_samples else share
    return kept * spec.local_epochs


def predicted_round_s(
    spec: WanSpec, shares: Sequence[int], nbytes: int, steps: int | None = None
) -> list[float]:
    """Each client's download + compute + upload of one uncompressed round, by the model.

    Compute is the client's local epochs over its share or, with ``steps``, that many
    batches (every client the same work, as in DiLoCo's rounds).
    """
    from geofl.server.config.models import SimulationConfig
    from geofl.server.simulation.links import LinkModel

    section = SimulationConfig.model_validate(simulation_section(spec))
    links = LinkModel.from_config(section, spec.seed).links
    return [
        link.round_s(
            nbytes, nbytes, _trained(spec, share) if steps is None else steps * spec.batch_size
        )
        for link, share in zip(links, shares, strict=True)
    ]


@dataclass(frozen=True)
class Deadlines:
    """``schedule.deadline_s`` of the deadline-aware configurations (see :func:`deadline_for`).

    ``epochs_s`` for rounds of local epochs, ``steps_s`` for DiLoCo's rounds of
    ``diloco_steps`` batches: the same rule over each one's predicted round times.
    """

    epochs_s: float
    steps_s: float


def deadline_for(spec: WanSpec, predicted: Sequence[float]) -> float:
    """The deadline-aware configurations' ``schedule.deadline_s``.

    ``spec.deadline_s`` if set; otherwise the ``deadline_quantile`` quantile of the
    predicted round times divided by the selection margin, so that that share of the
    clients is predicted to fit (a client fits when predicted <= margin x deadline).
    """
    if spec.deadline_s is not None:
        return spec.deadline_s
    from geofl.server.config.schedule import SelectionConfig

    margin = SelectionConfig().margin
    return round(float(np.quantile(predicted, spec.deadline_quantile)) / margin, 3)


# ---------------------------------------------------------------- configurations


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, mappings recursively (neither is modified)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def geofl_config(
    spec: WanSpec, sections: Mapping[str, Any], workdir: Path, partition: Path
) -> dict[str, Any]:
    """The ``geofl simulate`` run file of one configuration (a mapping to dump as YAML)."""
    node_config: dict[str, Any] = {"partition-file": str(partition), "torch-threads": 1}
    if spec.max_train_samples:
        node_config["max-train-samples"] = spec.max_train_samples
    base = {
        "run": {"name": "wan-schedule", "rounds": spec.rounds, "seed": spec.seed},
        "model": f"{FASHION}:make_model",
        "strategy": {
            "name": "fedavg",
            "clients_per_round": spec.per_round,
            "min_clients": spec.min_clients,
        },
        "schedule": {"deadline_s": NO_DEADLINE_S, "wait_for_clients_s": 600},
        "round_config": {
            "local_epochs": spec.local_epochs,
            "lr": spec.lr,
            "batch_size": spec.batch_size,
        },
        # Server-side evaluation every round, no federated evaluation (it would cost
        # simulated time and only repeat the server's figure).
        "evaluation": {"every": 1, "clients": 0, "server": f"{FASHION}:server_evaluate"},
        "storage": {
            "url": f"sqlite:///{workdir / 'run.db'}",
            "checkpoints": str(workdir / "checkpoints"),
            "keep_checkpoints": 1,
        },
        "simulation": {
            **simulation_section(spec),
            "clock": "virtual",
            "workers": spec.workers,
            "app": f"{FASHION}:client_app",
            "node_config": node_config,
            "target_accuracy": spec.target,
        },
    }
    return deep_merge(base, sections)


Sections = Callable[[WanSpec, "Deadlines"], dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    """One row of the table.

    ``system`` is ``geofl`` (run on the virtual clock with ``sections`` merged into the
    base configuration), ``flower`` (Flower 1.42, round times computed) or
    ``unavailable`` (``unavailable`` returns why, from the configuration models).
    """

    name: str
    label: str
    system: str
    sections: Sections | None = None
    unavailable: Callable[[WanSpec], str] | None = None


def _plain(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    return {}


def _deadline(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    return {"schedule": {"deadline_s": deadlines.epochs_s, "selection": {"policy": "deadline"}}}


def _adaptive(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    return deep_merge(
        _deadline(spec, deadlines), {"compression": {"adaptive": True, "error_feedback": True}}
    )


def _relays(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    """One simulated relay per region; each picks its clients deadline-aware.

    The coordinator's nodes are the three relays; ``per_round`` clients per global round
    are split among the regions by their client counts. Uploads inside a region are not
    compressed (a relay's regional rounds have no compression plan), so adaptive
    compression is not part of this row.
    """
    regions = len(REGIONS)
    relays = {
        "strategy": {"clients_per_round": regions, "min_clients": max(1, regions - 1)},
        "simulation": {"relays": True, "relay": {"cohort": spec.per_round}},
    }
    return deep_merge(_deadline(spec, deadlines), relays)


def _fedbuff(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    fedbuff = {
        "buffer_size": spec.buffer_size,
        "concurrency": spec.concurrency,
        "updates": spec.async_updates,
    }
    return {"schedule": {"mode": "async", "fedbuff": fedbuff}}


def _diloco(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    diloco = {
        "local_steps": spec.diloco_steps,
        "outer_lr": spec.outer_lr,
        "outer_momentum": spec.outer_momentum,
    }
    return {"schedule": {"mode": "diloco", "diloco": diloco}}


def _diloco_deadline(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    selection = {"deadline_s": deadlines.steps_s, "selection": {"policy": "deadline"}}
    return deep_merge(_diloco(spec, deadlines), {"schedule": selection})


def _diloco_deadline_utility(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    """DiLoCo + deadline-aware selection that samples eligible clients Oort-style."""
    utility = {"schedule": {"selection": {"utility": True}}}
    return deep_merge(_diloco_deadline(spec, deadlines), utility)


def _partial(spec: WanSpec) -> dict[str, Any]:
    partial = {"sync_points": spec.sync_points, "tail_steps": spec.tail_steps}
    return {"schedule": {"partial_sync": partial}}


def _diloco_partial(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    return deep_merge(_diloco(spec, deadlines), _partial(spec))


def _diloco_partial_deadline(spec: WanSpec, deadlines: Deadlines) -> dict[str, Any]:
    return deep_merge(_diloco_deadline(spec, deadlines), _partial(spec))


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("fedavg", "plain FedAvg (uniform, uncompressed)", "geofl", _plain),
    Scenario("flower", "Flower 1.42 FedAvg (round times computed)", "flower"),
    Scenario("deadline", "geofl deadline-aware selection", "geofl", _deadline),
    Scenario("adaptive", "+ adaptive compression (EF)", "geofl", _adaptive),
    Scenario("relays", "geofl deadline-aware selection + relays", "geofl", _relays),
    Scenario("fedbuff", "geofl async (FedBuff)", "geofl", _fedbuff),
    Scenario("diloco", "geofl DiLoCo (full sync)", "geofl", _diloco),
    Scenario(
        "diloco-deadline", "geofl DiLoCo + deadline-aware selection", "geofl", _diloco_deadline
    ),
    Scenario(
        "diloco-deadline-utility",
        "geofl DiLoCo + deadline-aware selection, utility-aware (Oort)",
        "geofl",
        _diloco_deadline_utility,
    ),
    Scenario("diloco-partial", "geofl DiLoCo, partial sync", "geofl", _diloco_partial),
    Scenario(
        "diloco-partial-deadline",
        "geofl DiLoCo, partial sync + deadline-aware selection",
        "geofl",
        _diloco_partial_deadline,
    ),
)
_BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


def scenario(name: str) -> Scenario:
    """The scenario called ``name``.

    Raises
    ------
    KeyError
        If there is none, listing the names.
    """
    if name not in _BY_NAME:
        raise KeyError(f"unknown scenario {name!r}; expected one of {list(_BY_NAME)}")
    return _BY_NAME[name]


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class Setup:
    """What every scenario of one benchmark shares: the split, its file, the deadline."""

    root: Path
    partition: Path
    shares: list[int]
    nbytes: int
    deadlines: Deadlines
    initial_accuracy: float


def deadlines_for(spec: WanSpec, shares: Sequence[int], nbytes: int) -> Deadlines:
    """The deadline rule (:func:`deadline_for`) for epoch rounds and for DiLoCo's rounds."""
    return Deadlines(
        deadline_for(spec, predicted_round_s(spec, shares, nbytes)),
        deadline_for(spec, predicted_round_s(spec, shares, nbytes, spec.diloco_steps)),
    )


def prepare(spec: WanSpec, root: Path) -> Setup:
    """Write the partition, fix the deadlines, evaluate the initial model once."""
    from examples.fashion_mnist.task import make_model, server_evaluate

    partition, shares = write_partition(spec, root)
    nbytes = model_bytes()
    _loss, metrics = server_evaluate(make_model())
    deadlines = deadlines_for(spec, shares, nbytes)
    return Setup(root, partition, shares, nbytes, deadlines, float(metrics["accuracy"]))


def _child_env() -> dict[str, str]:
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def run_logged(argv: list[str], workdir: Path, timeout_s: float) -> tuple[int, float]:
    """Run ``argv`` from the repository root, its output in ``workdir/child.log``.

    Returns the exit code (-1 if it ran past ``timeout_s`` and was stopped, with its
    children) and the wall seconds it took.
    """
    started = time.monotonic()
    with (workdir / "child.log").open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=_child_env(), cwd=REPO_ROOT
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_tree(proc.pid)
            proc.wait()
            code = -1
    return code, time.monotonic() - started


def _log_tail(workdir: Path, lines: int = 20) -> str:
    log = workdir / "child.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def run_geofl(spec: WanSpec, scenario: Scenario, setup: Setup) -> dict[str, Any]:
    """One geofl configuration on the virtual clock, in a child process; its record."""
    if scenario.sections is None:
        raise ValueError(f"{scenario.name} is not a geofl configuration")
    workdir = setup.root / scenario.name
    workdir.mkdir(parents=True, exist_ok=False)
    config = geofl_config(spec, scenario.sections(spec, setup.deadlines), workdir, setup.partition)
    path = workdir / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = workdir / "result.json"
    argv = [sys.executable, "-m", "benchmarks.wan_schedule", "--child", str(path), str(result)]
    code, wall_s = run_logged(argv, workdir, spec.timeout_s)
    record: dict[str, Any] = {"config": config, "exit_code": code, "wall_s": wall_s}
    if result.exists():
        record["child"] = json.loads(result.read_text())
    if code != 0 or not (workdir / "run.db").exists():
        record["error"] = f"exit code {code}: {_log_tail(workdir)}"
        return record
    curve = read_geofl_curve(f"sqlite:///{workdir / 'run.db'}")
    record["curve"] = curve.as_dict()
    return record


def run_scenario(
    spec: WanSpec, scenario: Scenario, setup: Setup, lock: bool = True
) -> dict[str, Any]:
    """Run (or explain) one scenario; the record the JSON keeps for it."""
    record: dict[str, Any] = {
        "name": scenario.name,
        "label": scenario.label,
        "system": scenario.system,
    }
    if scenario.system == "unavailable":
        if scenario.unavailable is None:
            raise ValueError(f"{scenario.name} is unavailable but does not say why")
        return record | {"available": False, "reason": scenario.unavailable(spec)}
    load_before = os.getloadavg()[0]
    with heavy_lock() if lock else contextlib.nullcontext():
        if scenario.system == "flower":
            record |= _flower_record(spec, setup)
        else:
            record |= run_geofl(spec, scenario, setup)
    record |= {"available": True, "load_before": load_before, "load_after": os.getloadavg()[0]}
    return record


def flower_run_config(spec: WanSpec, partition: Path) -> dict[str, int | float | str]:
    """The Flower app's run config: the same clients, split, rounds and training settings."""
    return {
        "num-clients": spec.clients,
        "per-round": spec.per_round,
        "num-rounds": spec.rounds,
        "local-epochs": spec.local_epochs,
        "lr": spec.lr,
        "batch-size": spec.batch_size,
        "max-train-samples": spec.max_train_samples,
        "partition-file": str(partition),
    }


def _flower_record(spec: WanSpec, setup: Setup) -> dict[str, Any]:
    from geofl.server.config.models import SimulationConfig
    from geofl.server.simulation.links import LinkModel

    workdir = setup.root / "flower"
    workdir.mkdir(parents=True, exist_ok=False)
    run = run_flower(workdir, flower_run_config(spec, setup.partition), spec.timeout_s)
    if run.get("error"):
        return run
    section = SimulationConfig.model_validate(simulation_section(spec))
    links = LinkModel.from_config(section, spec.seed).links
    curve = flower_curve(run["events"], links, setup.nbytes)
    return {**run, "curve": curve.as_dict()}


# ---------------------------------------------------------------- the child


def run_child(config_path: Path, result_path: Path) -> int:
    """``geofl simulate -c config_path`` on the virtual clock; write what the fleet moved."""
    from geofl.server.config import load_config
    from geofl.server.simulation.preflight import check_simulation
    from geofl.server.simulation.virtual import run_virtual_simulation

    config = load_config(config_path)
    traces = check_simulation(config, str(config_path))
    started = time.monotonic()
    run = run_virtual_simulation(config, traces)
    result = {
        "status": run.result.status,
        "error": run.result.error,
        "run_id": run.result.run_id,
        "simulated_s": run.simulated_s,
        "fleet": asdict(run.stats),
        "real_s": time.monotonic() - started,
    }
    result_path.write_text(json.dumps(result, indent=2))
    return 0 if run.result.status == "completed" else 1


# ---------------------------------------------------------------- command line


def build_report(
    spec: WanSpec, setup: Setup, records: list[dict[str, Any]], wall: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON document: workload, setup, every scenario (paths scrubbed), the summary."""
    return {
        "benchmark": "wan_schedule",
        "created_unix": time.time(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "spec": asdict(spec),
        "setup": {
            "deadline_s": setup.deadlines.epochs_s,
            "diloco_deadline_s": setup.deadlines.steps_s,
            "model_bytes": setup.nbytes,
            "initial_accuracy": setup.initial_accuracy,
            "share_sizes": setup.shares,
        },
        "scenarios": scrub_paths(records),
        "summary": summarize(records, spec.target),
        "wall_validation": scrub_paths(wall) if wall is not None else None,
    }


_DEFAULT_OUT = "benchmarks/results/wan_schedule.json"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = WanSpec()
    parser = argparse.ArgumentParser(description="WAN-aware scheduling: time to 85 %")
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--per-round", type=int, default=defaults.per_round)
    parser.add_argument("--min-clients", type=int, default=defaults.min_clients)
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="cap per run")
    parser.add_argument("--deadline-s", type=float, default=None, help="default: computed")
    parser.add_argument("--deadline-quantile", type=float, default=defaults.deadline_quantile)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--diloco-steps", type=int, default=defaults.diloco_steps)
    parser.add_argument("--outer-lr", type=float, default=defaults.outer_lr)
    parser.add_argument("--outer-momentum", type=float, default=defaults.outer_momentum)
    parser.add_argument("--sync-points", type=int, default=defaults.sync_points)
    parser.add_argument("--tail-steps", type=int, default=0, help="0: automatic")
    parser.add_argument("--max-train-samples", type=int, default=0, help="0: whole shares")
    parser.add_argument(
        "--scenarios", default=",".join(s.name for s in SCENARIOS), help="comma-separated"
    )
    parser.add_argument("--wall", action="store_true", help="also run the wall-clock check")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / _DEFAULT_OUT)
    parser.add_argument("--png", type=Path, default=None, help="write the plot here")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="recompute the summary of --out, print its table, redraw --png (no runs)",
    )
    parser.add_argument("--resume", action="store_true", help="keep scenarios --out has")
    parser.add_argument(
        "--rerun", default="", help="with --resume: comma-separated scenarios to run again"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep work files here")
    parser.add_argument("--no-lock", action="store_true", help="already under flock")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in _BY_NAME]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; expected some of {list(_BY_NAME)}")
    return args


def _spec(args: argparse.Namespace) -> WanSpec:
    return replace(
        WanSpec(),
        clients=args.clients,
        per_round=args.per_round,
        min_clients=min(args.min_clients, args.per_round),
        rounds=args.rounds,
        deadline_s=args.deadline_s,
        deadline_quantile=args.deadline_quantile,
        workers=args.workers,
        diloco_steps=args.diloco_steps,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        sync_points=args.sync_points,
        tail_steps=args.tail_steps or None,
        max_train_samples=args.max_train_samples,
    )


def _previous(out: Path, spec: WanSpec) -> list[dict[str, Any]]:
    """Scenarios of an earlier report with the same workload (for ``--resume``)."""
    if not out.exists():
        return []
    report = json.loads(out.read_text())
    old = report.get("spec") or {}
    current, defaults = asdict(spec), asdict(WanSpec())
    # A key added to WanSpec after the report was written counts at its default value.
    same = set(old) <= set(current) and all(
        old.get(key, defaults[key]) == value for key, value in current.items()
    )
    return list(report["scenarios"]) if same else []


def _previous_wall(out: Path) -> dict[str, Any] | None:
    """The wall-clock validation an earlier report holds, if any."""
    if not out.exists():
        return None
    wall = json.loads(out.read_text()).get("wall_validation")
    return dict(wall) if isinstance(wall, dict) else None


def run_benchmark(
    spec: WanSpec,
    names: Sequence[str],
    root: Path,
    lock: bool = True,
    done: Sequence[dict[str, Any]] = (),
    on_record: Callable[[Setup, list[dict[str, Any]]], None] = lambda setup, records: None,
) -> tuple[Setup, list[dict[str, Any]]]:
    """Every named scenario in order (those in ``done`` are kept, not rerun)."""
    with heavy_lock() if lock else contextlib.nullcontext():
        setup = prepare(spec, root)
    kept = {record["name"]: record for record in done if not record.get("error")}
    records: list[dict[str, Any]] = []
    for name in names:
        record = kept.get(name) or run_scenario(spec, _BY_NAME[name], setup, lock)
        records.append(record)
        on_record(setup, records)
        print(f"{name}: {_one_line(record, spec.target)}", flush=True)
    return setup, records


def _one_line(record: Mapping[str, Any], target: float) -> str:
    row = scenario_summary(record, target)
    if not row.get("available") or row.get("error"):
        return str(row.get("reason") or row.get("error"))
    reached, final = row["time_to_target_s"], row["final_accuracy"]
    return (
        f"time to target {'not reached' if reached is None else f'{reached:.1f} s'}, final "
        f"{'none' if final is None else f'{final:.4f}'}, {row['rounds_run']} rounds in "
        f"{row['duration_s']:.0f} s"
    )


def report_only(out: Path, png: Path | None) -> int:
    """Recompute the summary of the report in ``out`` (rewritten), print it, plot it."""
    report = json.loads(out.read_text())
    report["summary"] = summarize(report["scenarios"], report["spec"]["target"])
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(render_markdown(report))
    if png is not None:
        plot(report, png)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``, one geofl simulation)."""
    args = _parse_args(argv)
    if args.child is not None:
        return run_child(*args.child)
    if args.report_only:
        return report_only(args.out, args.png)
    try:
        spec = _spec(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    rerun = {s.strip() for s in args.rerun.split(",") if s.strip()}
    done = [r for r in _previous(args.out, spec) if r["name"] not in rerun] if args.resume else []
    root = args.keep or Path(tempfile.mkdtemp(prefix="geofl-wan-"))
    root.mkdir(parents=True, exist_ok=True)
    # --resume without --wall keeps the earlier report's wall-clock check.
    wall = _previous_wall(args.out) if args.resume and not args.wall else None

    def save(setup: Setup, records: list[dict[str, Any]]) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = build_report(spec, setup, records, wall)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    try:
        setup, records = run_benchmark(
            spec, args.scenarios, root, not args.no_lock, done, on_record=save
        )
        if args.wall:
            from benchmarks.wan_schedule_wall import validate

            wall = validate(root / "wall", lock=not args.no_lock)
            save(setup, records)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    report = build_report(spec, setup, records, wall)
    print(render_markdown(report))
    if args.png is not None:
        plot(report, args.png)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
