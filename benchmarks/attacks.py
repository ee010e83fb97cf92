"""Robust aggregation under attack (issue 15): named attacks x rules on the virtual clock.

The attacks and rules are named in ``benchmarks/attacks.yaml``. Every case is one
``geofl simulate`` run of the same workload (Fashion-MNIST split by Dirichlet(alpha) among
``clients`` virtual clients, ``per_round`` sampled per round, the 784-64-10 MLP client),
the same seed and the same malicious clients; only the attack (what the malicious
clients' app does, :mod:`benchmarks.apps.attackers`, client-side) and the rule (the
``strategy`` section) change. Flower's FedMedian, FedTrimmedAvg and Krum are Flower 1.42's
own strategy classes, whose ``aggregate_train`` geofl's Flower-strategy adapter calls on
the round's replies (``strategy.flower``), so they see exactly the same updates.

Each case runs in a child process (this module with ``--child``) with the clients in
the server process (``simulation.workers: 0``), so one case uses one core. The child
records the run's status, the server-side test accuracy after every round, each
round's wall seconds, what the rule did to the malicious clients (from
``geofl runs show --json``) and the process's peak RSS.

``--cost`` measures what a rule costs the server instead: the echo client of
:mod:`benchmarks.apps.geofl_echo` (no training) at ``--params`` parameters, one worker
process for the clients, so the child is the server alone; seconds per round is the
median of rounds 2..R of the wall time between round ends, and server peak RSS the
child's ``ru_maxrss``; both as medians over ``--repeats``.

Run as ``python -m benchmarks.attacks --matrix [--attacks a,b] [--rules r,s]`` or
``python -m benchmarks.attacks --cost --params 50890,1000000 --repeats 3``; the JSON goes
to ``benchmarks/results/attacks_matrix.json`` / ``attacks_cost.json`` (rewritten after
every case) and ``--report`` prints the Markdown tables of a results file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.apps.attackers import ATTACKS, baruch_z
from benchmarks.compare import scrub_paths
from benchmarks.core import REPO_ROOT, heavy_lock

__all__ = [
    "AttackDef",
    "BenchSpec",
    "Workload",
    "attack_node_config",
    "cost_run_config",
    "load_spec",
    "main",
    "malicious_ids",
    "matrix_run_config",
    "render_cost",
    "render_matrix",
    "summarize_case",
]

SPEC_FILE = REPO_ROOT / "benchmarks" / "attacks.yaml"
RESULTS = REPO_ROOT / "benchmarks" / "results"
MLP_APP = "benchmarks.apps.attackers:client_app"
ECHO_APP = "benchmarks.apps.geofl_echo:client_app"
#: Seeds the choice of malicious clients together with the run's seed.
MALICIOUS_SEED = 15


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Workload(_Strict):
    """What every case of the matrix shares."""

    clients: int = Field(ge=2)
    per_round: int = Field(ge=1)
    rounds: int = Field(ge=1)
    seed: int
    dirichlet_alpha: float = Field(gt=0)
    malicious_share: float = Field(ge=0, lt=0.5)
    byzantine: int = Field(ge=0)
    round_config: dict[str, int | float]
    #: Test-only knob: keep at most this many training images per client (0 = all).
    max_train_samples: int = Field(default=0, ge=0)


class AttackDef(_Strict):
    """One named attack: the malicious clients' node config."""

    attack: str
    scale: float | None = None
    z: float | Literal["baruch"] | None = None
    claim_factor: float | None = Field(default=None, gt=0)


class BenchSpec(_Strict):
    """``benchmarks/attacks.yaml``."""

    workload: Workload
    attacks: dict[str, AttackDef]
    rules: dict[str, dict[str, Any]]


def load_spec(path: Path = SPEC_FILE) -> BenchSpec:
    """Read and check the attack definitions.

    Raises
    ------
    ValueError
        If an attack names an unknown behaviour or the workload is inconsistent.
    """
    spec = BenchSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    for name, attack in spec.attacks.items():
        if attack.attack not in ATTACKS:
            raise ValueError(f"{path}: attack {name!r} has unknown behaviour {attack.attack!r}")
    if spec.workload.per_round > spec.workload.clients:
        raise ValueError(f"{path}: per_round exceeds clients")
    return spec


def malicious_ids(workload: Workload) -> list[int]:
    """The partition ids that attack: ``malicious_share`` of the pool, seeded."""
    count = round(workload.malicious_share * workload.clients)
    rng = np.random.default_rng([workload.seed, MALICIOUS_SEED])
    return sorted(int(i) for i in rng.choice(workload.clients, size=count, replace=False))


def attack_node_config(workload: Workload, attack: AttackDef) -> dict[str, str | float]:
    """The ``simulation.node_config`` entries of one attack (read by every client)."""
    if attack.attack == "none":
        return {"attack": "none"}
    ids = malicious_ids(workload)
    config: dict[str, str | float] = {
        "attack": attack.attack,
        "malicious-ids": ",".join(str(i) for i in ids),
    }
    if attack.scale is not None:
        config["attack-scale"] = attack.scale
    if attack.claim_factor is not None:
        config["attack-claim-factor"] = attack.claim_factor
    if attack.z == "baruch":
        expected = round(workload.malicious_share * workload.per_round)
        config["attack-z"] = baruch_z(workload.per_round, expected)
    elif attack.z is not None:
        config["attack-z"] = attack.z
    return config


def _storage(workdir: Path) -> dict[str, Any]:
    return {
        "url": f"sqlite:///{workdir / 'run.db'}",
        "checkpoints": str(workdir / "checkpoints"),
        "keep_checkpoints": 1,
    }


def _strategy(rule: Mapping[str, Any], per_round: int) -> dict[str, Any]:
    return {**rule, "clients_per_round": per_round, "min_clients": per_round}


def matrix_run_config(
    spec: BenchSpec, attack: str, rule: str, workdir: Path, name: str = "attack"
) -> dict[str, Any]:
    """The ``geofl simulate`` run file of one (attack, rule) case, as a mapping."""
    load = spec.workload
    node_config: dict[str, Any] = {
        "torch-threads": 1,
        **attack_node_config(load, spec.attacks[attack]),
    }
    if load.max_train_samples:
        node_config["max-train-samples"] = load.max_train_samples
    return {
        "run": {"name": f"{name}-{attack}-{rule}", "rounds": load.rounds, "seed": load.seed},
        "model": "examples.fashion_mnist.task:make_mlp_model",
        "strategy": _strategy(spec.rules[rule], load.per_round),
        "schedule": {"deadline_s": 3600, "wait_for_clients_s": 60},
        "round_config": dict(load.round_config),
        "evaluation": {"every": 0, "server": "examples.fashion_mnist.task:mlp_server_evaluate"},
        "storage": _storage(workdir),
        "simulation": {
            "clients": load.clients,
            "clock": "virtual",
            "workers": 0,
            "app": MLP_APP,
            "partition": {"dirichlet": {"alpha": load.dirichlet_alpha}},
            "labels": "examples.fashion_mnist.task:train_labels",
            "node_config": node_config,
        },
    }


def cost_run_config(
    spec: BenchSpec, rule: str, rounds: int, workdir: Path, name: str = "cost"
) -> dict[str, Any]:
    """One cost case: the echo client (no training), the rule, one client worker."""
    load = spec.workload
    return {
        "run": {"name": f"{name}-{rule}", "rounds": rounds, "seed": load.seed},
        "model": "benchmarks.apps.geofl_echo:make_model",
        "strategy": _strategy(spec.rules[rule], load.per_round),
        "schedule": {"deadline_s": 3600, "wait_for_clients_s": 60},
        "evaluation": {"every": 0},
        "storage": _storage(workdir),
        "simulation": {"clients": load.clients, "clock": "virtual", "workers": 1, "app": ECHO_APP},
    }


# ---------------------------------------------------------------- the child


def _participations(config_path: Path, database_url: str, run_id: int) -> list[dict[str, Any]]:
    from geofl.server.cli.main import main as geofl_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = geofl_main(["runs", "show", str(run_id), "--db", database_url, "--json"])
    if code != 0:
        return []
    shown = json.loads(out.getvalue())
    return [p for p in shown["participations"] if p["kind"] == "fit"]


def run_child(config_path: Path, out_path: Path) -> int:
    """Run one case (``geofl simulate -c config_path`` on the virtual clock), write JSON."""
    from geofl.server.config import load_config
    from geofl.server.rounds.observers import RoundEndCallback
    from geofl.server.simulation.preflight import check_simulation
    from geofl.server.simulation.virtual import run_virtual_simulation

    config = load_config(config_path)
    traces = check_simulation(config, str(config_path))
    rounds: list[dict[str, Any]] = []
    started = time.perf_counter()

    def on_round_end(record: Any, status: str) -> None:
        accuracy = record.server_eval_metrics.get("accuracy")
        rounds.append(
            {
                "round": record.number,
                "status": status,
                "t": time.perf_counter() - started,
                "accuracy": None if accuracy is None else float(accuracy),
            }
        )

    run = run_virtual_simulation(config, traces, observers=[RoundEndCallback(on_round_end)])
    result: dict[str, Any] = {
        "status": run.result.status,
        "error": run.result.error,
        "wall_s": time.perf_counter() - started,
        "rounds": rounds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if run.result.run_id is not None and config.evaluation.server is not None:
        result["participations"] = _participations(
            config_path, config.storage.url, run.result.run_id
        )
    out_path.write_text(json.dumps(result), encoding="utf-8")
    return 0 if run.result.status == "completed" else 1


def _run_in_child(
    config: Mapping[str, Any], workdir: Path, env: Mapping[str, str], timeout_s: float
) -> dict[str, Any]:
    config_path = workdir / "run.yaml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    out_path = workdir / "result.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.attacks",
        "--child",
        str(config_path),
        str(out_path),
    ]
    child_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result within {timeout_s:.0f} s"}
    if not out_path.exists():
        return {"status": "crashed", "error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
    return result


# ---------------------------------------------------------------- summaries


def _node_partition(name: str) -> int | None:
    prefix, _, number = name.rpartition("-")
    return int(number) if prefix == "sim" and number.isdigit() else None


def summarize_case(result: Mapping[str, Any], malicious: Sequence[int]) -> dict[str, Any]:
    """Final accuracy and what became of the malicious clients' updates in one case."""
    rounds = result.get("rounds", [])
    by_round = [r.get("accuracy") for r in rounds]
    accuracies = [a for a in by_round if a is not None]
    failed = [f"round {r['round']}: {r['status']}" for r in rounds if r["status"] != "committed"]
    bad = set(malicious)
    selected = used = reasoned = 0
    per_round = [0] * len(rounds)
    for row in result.get("participations", []):
        partition = _node_partition(str(row.get("node_name", "")))
        if partition not in bad:
            continue
        number = int(row.get("round_number", row.get("round", 0)))
        if 1 <= number <= len(rounds):
            per_round[number - 1] += 1
        selected += 1
        used += row.get("status") == "ok"
        reasoned += row.get("reason") is not None
    return {
        "status": result.get("status"),
        # A failed round leaves the model as it was: the final model is the last committed.
        "final_accuracy": accuracies[-1] if accuracies else None,
        "best_accuracy": max(accuracies) if accuracies else None,
        "accuracy_by_round": by_round,
        "failed_rounds": len(failed),
        "first_failure": failed[0] if failed else None,
        "malicious_by_round": per_round,
        "malicious_selected": selected,
        "malicious_used": used,
        "malicious_with_reason": reasoned,
        "wall_s": result.get("wall_s"),
        "error": result.get("error"),
    }


def _round_seconds(result: Mapping[str, Any]) -> list[float]:
    times = [0.0] + [float(r["t"]) for r in result.get("rounds", [])]
    return [b - a for a, b in itertools.pairwise(times)]


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# ---------------------------------------------------------------- drivers


def _load_average() -> float:
    return os.getloadavg()[0]


def _write(path: Path, report: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scrub_paths(dict(report)), indent=1) + "\n", encoding="utf-8")


def _header(spec: BenchSpec, command: Sequence[str]) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.attacks " + " ".join(command),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "spec": spec.model_dump(mode="json"),
        "malicious_ids": malicious_ids(spec.workload),
    }


def run_matrix(
    spec: BenchSpec,
    attacks: Sequence[str],
    rules: Sequence[str],
    out: Path,
    argv: Sequence[str],
    timeout_s: float = 1200.0,
) -> dict[str, Any]:
    """Every (attack, rule) case, plus attack-free FedAvg, one child each; JSON after each."""
    report = {**_header(spec, argv), "cases": []}
    pairs = [(a, r) for a in attacks for r in rules if a != "none"]
    if "none" in spec.attacks and "fedavg" in spec.rules:
        pairs.insert(0, ("none", "fedavg"))
    for attack, rule in pairs:
        with tempfile.TemporaryDirectory(prefix="geofl-attacks-") as tmp:
            config = matrix_run_config(spec, attack, rule, Path(tmp))
            before = _load_average()
            result = _run_in_child(config, Path(tmp), {}, timeout_s)
        case = {"attack": attack, "rule": rule, "load": [before, _load_average()]}
        case.update(summarize_case(result, report["malicious_ids"]))
        report["cases"].append(case)
        print(f"{attack:12s} {rule:20s} {case['status']} acc={case['final_accuracy']}", flush=True)
        _write(out, report)
    return report


def run_cost(
    spec: BenchSpec,
    rules: Sequence[str],
    params: Sequence[int],
    rounds: int,
    repeats: int,
    out: Path,
    argv: Sequence[str],
    lock: bool,
) -> dict[str, Any]:
    """Each rule at each model size ``repeats`` times (rules interleaved within a repeat)."""
    report = {**_header(spec, argv), "rounds": rounds, "repeats": repeats, "cases": []}
    for repeat, size, rule in ((r, p, u) for r in range(repeats) for p in params for u in rules):
        with tempfile.TemporaryDirectory(prefix="geofl-attack-cost-") as tmp:
            config = cost_run_config(spec, rule, rounds, Path(tmp))
            env = {"GEOFL_BENCH_PARAMS": str(size)}
            before = _load_average()
            with heavy_lock() if lock else contextlib.nullcontext():
                result = _run_in_child(config, Path(tmp), env, 1200.0)
        seconds = _round_seconds(result)
        case = {
            "rule": rule,
            "params": size,
            "repeat": repeat + 1,
            "status": result.get("status"),
            "round_s": seconds,
            "steady_s_per_round": _median(seconds[1:]),
            "server_peak_rss_mb": result.get("peak_rss_mb"),
            "load": [before, _load_average()],
            "error": result.get("error"),
        }
        report["cases"].append(case)
        print(
            f"{size:>9d} {rule:20s} r{repeat + 1} {case['status']} "
            f"{case['steady_s_per_round']} s {case['server_peak_rss_mb']} MB",
            flush=True,
        )
        _write(out, report)
    return report


# ---------------------------------------------------------------- reports


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def render_matrix(report: Mapping[str, Any]) -> str:
    """Final accuracy per (attack, rule), and the issue's two targets per attack."""
    cases = report["cases"]
    acc = {(c["attack"], c["rule"]): c["final_accuracy"] for c in cases}
    attacks = list(dict.fromkeys(c["attack"] for c in cases if c["attack"] != "none"))
    rules = list(dict.fromkeys(c["rule"] for c in cases if c["attack"] != "none"))
    baseline = acc.get(("none", "fedavg"))
    lines = [
        f"Attack-free FedAvg: {_fmt(baseline, '.4f')}",
        "",
        "| rule | " + " | ".join(attacks) + " |",
        "|---|" + "---|" * len(attacks),
    ]
    for rule in rules:
        row = [_fmt(acc.get((a, rule)), ".4f") for a in attacks]
        lines.append(f"| {rule} | " + " | ".join(row) + " |")
    lines += [
        "",
        "| attack | best geofl rule | best Flower rule | within 2 pt of attack-free "
        "| >= best Flower |",
        "|---|---|---|---|---|",
    ]
    for attack in attacks:
        ours = _best(acc, attack, [r for r in rules if not r.startswith("flower_")])
        theirs = _best(acc, attack, [r for r in rules if r.startswith("flower_")])
        near = None if baseline is None or ours[1] is None else ours[1] >= baseline - 0.02
        beats = None if ours[1] is None or theirs[1] is None else ours[1] >= theirs[1]
        lines.append(
            f"| {attack} | {ours[0]} {_fmt(ours[1], '.4f')} | {theirs[0]} {_fmt(theirs[1], '.4f')} "
            f"| {_verdict(near)} | {_verdict(beats)} |"
        )
    return "\n".join(lines)


def _best(
    acc: Mapping[tuple[str, str], float | None], attack: str, rules: Sequence[str]
) -> tuple[str, float | None]:
    scored = [(acc[(attack, r)], r) for r in rules if acc.get((attack, r)) is not None]
    if not scored:
        return "-", None
    value, rule = max(scored)
    return rule, value


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("**met**" if ok else "**missed**")


def render_cost(report: Mapping[str, Any]) -> str:
    """Median steady s/round and server peak RSS per rule and size, with ratios to FedAvg."""
    lines = [
        "| params | rule | ok | s/round | x FedAvg | server peak RSS MB | x FedAvg |",
        "|---|---|---|---|---|---|---|",
    ]
    sizes = list(dict.fromkeys(c["params"] for c in report["cases"]))
    rules = list(dict.fromkeys(c["rule"] for c in report["cases"]))
    for size in sizes:
        medians = {}
        for rule in rules:
            cases = [c for c in report["cases"] if c["params"] == size and c["rule"] == rule]
            ok = [c for c in cases if c["status"] == "completed"]
            medians[rule] = (
                len(ok),
                len(cases),
                _median([c["steady_s_per_round"] for c in ok]),
                _median([c["server_peak_rss_mb"] for c in ok]),
            )
        base = medians.get("fedavg", (0, 0, None, None))
        for rule, (good, total, seconds, rss) in medians.items():
            lines.append(
                f"| {size:,} | {rule} | {good}/{total} | {_fmt(seconds)} "
                f"| {_fmt(_ratio(seconds, base[2]), '.2f')} "
                f"| {_fmt(rss, '.0f')} | {_fmt(_ratio(rss, base[3]), '.2f')} |"
            )
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------- command line


def _names(raw: str | None, known: Sequence[str], what: str) -> list[str]:
    if raw is None:
        return list(known)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="robust aggregation under attack")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--matrix", action="store_true", help="accuracy per (attack, rule)")
    mode.add_argument("--cost", action="store_true", help="s/round and server RSS per rule")
    mode.add_argument("--report", type=Path, help="print the tables of a results file")
    mode.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, default=SPEC_FILE)
    parser.add_argument("--attacks", help="comma-separated names (default: all)")
    parser.add_argument("--rules", help="comma-separated names (default: all)")
    parser.add_argument("--params", default="50890,1000000", help="cost: model sizes")
    parser.add_argument("--rounds", type=int, default=5, help="cost: rounds per run")
    parser.add_argument("--repeats", type=int, default=3, help="cost: runs per case")
    parser.add_argument("--lock", action="store_true", help="cost: hold the heavy-work lock")
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parse_args(raw)
    if args.child is not None:
        return run_child(*args.child)
    if args.report is not None:
        report = json.loads(args.report.read_text(encoding="utf-8"))
        print(render_cost(report) if "repeats" in report else render_matrix(report))
        return 0
    spec = load_spec(args.spec)
    rules = _names(args.rules, list(spec.rules), "rules")
    if args.matrix:
        attacks = _names(args.attacks, list(spec.attacks), "attacks")
        out = args.out or RESULTS / "attacks_matrix.json"
        print(render_matrix(run_matrix(spec, attacks, rules, out, raw)))
        return 0
    params = [int(p) for p in args.params.split(",")]
    out = args.out or RESULTS / "attacks_cost.json"
    report = run_cost(spec, rules, params, args.rounds, args.repeats, out, raw, args.lock)
    print(render_cost(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
