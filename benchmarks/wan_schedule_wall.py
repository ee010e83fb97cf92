"""How far off is the virtual clock on the WAN-scheduling workload? One configuration, both clocks.

The configuration is :mod:`benchmarks.wan_schedule`'s plain FedAvg scaled to what real
processes on a 2-core host can carry (:data:`WALL_SPEC`: 12 clients, all 12 in every
round, 6 rounds, each client's Dirichlet share capped at 600 images), with the same
regions, heterogeneity and seeds. Every client takes part in every round so that both
clocks run the same cohorts (geofl's uniform sample is seeded, but draws from the clients
in the order they joined, which on the wall clock is the order their processes connected;
deadline-aware selection also depends on each clock's own measurements). It runs twice
with ``geofl simulate``:

* ``clock: wall``: one ``geofl client`` process per client over real gRPC, each through
  its own link of geofl's user-space shaper; since the shaper delays only the network,
  every client is :func:`benchmarks.apps.wan_fashion.paced_client_app`, which trains for
  real and then sleeps out the link model's compute time for its speed;
* ``clock: virtual``: the same YAML with ``simulation.clock: virtual`` (the same app, not
  paced: the virtual clock charges the modelled compute time itself).

Server-side evaluation is off in both: the virtual clock charges nothing for server work
(documented), so evaluating would only add this host's evaluation time to the wall rounds.
Per round the two databases give each round's duration (select to commit) and every
client's fit duration (task handed out to result received); errors are
``(virtual - wall) / wall``. Round 1 on the wall clock also waits for the client processes
to start and connect and pays each one's first data load, so it is reported but left out
of the medians and totals.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from benchmarks.core import heavy_lock
from benchmarks.wan_schedule import (
    WanSpec,
    deadlines_for,
    geofl_config,
    model_bytes,
    run_logged,
    scenario,
    simulation_section,
    write_partition,
)
from geofl.storage import open_database
from geofl.storage.models import Node, Participation, Round

__all__ = ["SCENARIO", "WALL_SPEC", "compare_runs", "read_rounds", "validate", "wall_configs"]

WALL_SPEC = WanSpec(
    clients=12, per_round=12, min_clients=12, rounds=6, max_train_samples=600, timeout_s=1200
)
#: The configuration validated (see the module docstring for why not a deadline-aware one).
SCENARIO = "fedavg"
PACED_APP = "benchmarks.apps.wan_fashion:paced_client_app"


def _speeds_file(spec: WanSpec, directory: Path) -> Path:
    """Every client's modelled samples per second, for the paced app on the wall clock."""
    from geofl.server.config.models import SimulationConfig
    from geofl.server.simulation.links import LinkModel

    section = SimulationConfig.model_validate(simulation_section(spec))
    speeds = [link.samples_per_s for link in LinkModel.from_config(section, spec.seed).links]
    path = directory / "speeds.json"
    path.write_text(json.dumps(speeds))
    return path


def wall_configs(spec: WanSpec, root: Path) -> dict[str, dict[str, Any]]:
    """The two run files (``wall``, ``virtual``), identical but for the clock and pacing."""
    partition, shares = write_partition(spec, root)
    deadlines = deadlines_for(spec, shares, model_bytes())
    speeds = _speeds_file(spec, root)
    sections = scenario(SCENARIO).sections
    if sections is None:
        raise ValueError(f"{SCENARIO} is not a geofl configuration")
    configs = {}
    for clock in ("wall", "virtual"):
        workdir = root / clock
        workdir.mkdir(parents=True, exist_ok=False)
        config = geofl_config(spec, sections(spec, deadlines), workdir, partition)
        config["evaluation"] = {"every": 0, "clients": 0, "server": None}
        config["server"] = {"address": "127.0.0.1:0"}
        config["schedule"]["wait_for_clients_s"] = 300
        simulation = config["simulation"]
        simulation |= {"clock": clock, "app": PACED_APP}
        simulation.pop("target_accuracy")
        if clock == "wall":
            simulation.pop("workers")
            simulation["node_config"] = {
                **simulation["node_config"],
                "compute-speeds-file": str(speeds),
            }
        configs[clock] = config
    return configs


def read_rounds(url: str) -> list[dict[str, Any]]:
    """Each round's number, duration (select to commit), status, phase durations and fit
    cohort (client name -> status, region and fit duration)."""
    db = open_database(url)
    try:
        with db.session() as session:
            rounds = list(session.scalars(select(Round).order_by(Round.number)))
            fits = session.execute(
                select(
                    Participation.round_id,
                    Node.name,
                    Node.region,
                    Participation.status,
                    Participation.duration_s,
                )
                .join(Node, Participation.node_id == Node.id)
                .where(Participation.kind == "fit")
            ).all()
            cohorts: dict[int, dict[str, dict[str, Any]]] = {}
            for round_id, name, region, status, duration in fits:
                cohorts.setdefault(round_id, {})[name] = {
                    "status": status,
                    "region": region,
                    "duration_s": duration,
                }
            return [
                {
                    "round": row.number,
                    "duration_s": row.duration_s,
                    "status": row.status,
                    "phases": dict(row.phase_durations),
                    "cohort": dict(sorted(cohorts.get(row.id, {}).items())),
                }
                for row in rounds
            ]
    finally:
        db.close()


def _relative(virtual: float, wall: float) -> float:
    return (virtual - wall) / wall


def _fit_errors(
    wall: Sequence[Mapping[str, Any]], virtual: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per region: the median wall and virtual fit duration of the same client in the same
    round (rounds 2..R, fits that succeeded on both clocks), and the median error."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for w, v in list(zip(wall, virtual, strict=False))[1:]:
        for name, fit in w["cohort"].items():
            other = v["cohort"].get(name)
            if other is None or fit["status"] != "ok" or other["status"] != "ok":
                continue
            pairs.setdefault(str(fit["region"]), []).append(
                (fit["duration_s"], other["duration_s"])
            )
    return {
        region: {
            "fits": len(values),
            "wall_s": statistics.median(w for w, _ in values),
            "virtual_s": statistics.median(v for _, v in values),
            "median_error": statistics.median(_relative(v, w) for w, v in values),
        }
        for region, values in sorted(pairs.items())
    }


def compare_runs(
    wall: Sequence[Mapping[str, Any]], virtual: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Round-by-round durations and errors; medians and totals over rounds 2..R; per
    region, the fit durations of the same clients in the same rounds."""
    per_round = []
    for w, v in zip(wall, virtual, strict=False):
        per_round.append(
            {
                "round": w["round"],
                "wall_s": w["duration_s"],
                "virtual_s": v["duration_s"],
                "error": _relative(v["duration_s"], w["duration_s"]),
                "same_cohort": set(w["cohort"]) == set(v["cohort"]),
            }
        )
    steady = per_round[1:]
    if not steady:
        return {"per_round": per_round}
    wall_total = sum(r["wall_s"] for r in steady)
    virtual_total = sum(r["virtual_s"] for r in steady)
    return {
        "per_round": per_round,
        "median_error": statistics.median(r["error"] for r in steady),
        "median_abs_error": statistics.median(abs(r["error"]) for r in steady),
        "max_abs_error": max(abs(r["error"]) for r in steady),
        "total_s": {"wall": wall_total, "virtual": virtual_total},
        "total_error": _relative(virtual_total, wall_total),
        "same_cohorts": sum(r["same_cohort"] for r in steady),
        "rounds_compared": len(steady),
        "fits_by_region": _fit_errors(wall, virtual),
    }


def _simulate(config: dict[str, Any], workdir: Path, timeout_s: float) -> dict[str, Any]:
    path = workdir / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "geofl.server.cli.main", "simulate", "-c", str(path)]
    code, wall_s = run_logged(argv, workdir, timeout_s)
    if code != 0:
        tail = (workdir / "child.log").read_text(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"geofl simulate exited {code}:\n" + "\n".join(tail))
    return {"run_s": wall_s, "rounds": read_rounds(config["storage"]["url"])}


def validate(root: Path, spec: WanSpec = WALL_SPEC, lock: bool = True) -> dict[str, Any]:
    """Run :data:`WALL_SPEC` on both clocks (each under the heavy-work lock); compare."""
    root.mkdir(parents=True, exist_ok=True)
    configs = wall_configs(spec, root)
    runs: dict[str, Any] = {}
    for clock, config in configs.items():
        if lock:
            with heavy_lock():
                runs[clock] = _simulate(config, root / clock, spec.timeout_s)
        else:
            runs[clock] = _simulate(config, root / clock, spec.timeout_s)
    return {
        "spec": asdict(spec),
        "scenario": SCENARIO,
        "deadline_s": configs["wall"]["schedule"]["deadline_s"],
        "configs": configs,
        "runs": runs,
        "comparison": compare_runs(runs["wall"]["rounds"], runs["virtual"]["rounds"]),
    }
