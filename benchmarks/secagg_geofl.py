"""geofl's side of the secure-aggregation benchmark: SecAgg+ against plain rounds (issue 7).

The workload and the record are :mod:`benchmarks.secagg`'s (Flower's side): ``n`` clients
that return the received model plus the Flower app's client constant (``0.001 * (1 +
partition-id)``, weight 1), one float32 tensor of ``d`` parameters, every client in every
round, FedAvg, the median of rounds 2..R. geofl runs it plain (no ``secure_aggregation``
section) and in three secure variants:

``matched``
    ``{degree: 4, threshold: 0.6}`` for Flower's ``num_shares=5, threshold=3``: 5 share
    holders (4 neighbours and the client itself), 3 of them to reconstruct.
``auto``
    geofl's default graph, ``{degree: auto, threshold: 0.66}``: ``2 ceil(1.5 log2 n)``
    neighbours.
``full``
    ``{degree: full}``: the complete graph of the original protocol.

Every secure variant sets ``max_examples: 1``, so a client's weight is 1 as in Flower. With
the default (10 000) the weight would be 10^-4, and the total weight, quantized with the
same absolute step as every coordinate, would scale the mean by a random factor off by
~2·10^-4 at n = 100: far more than the shared correctness tolerance allows (the cost of a
round does not change).

Modes: ``simulation`` is ``geofl simulate`` (the coordinator and ``n`` client processes on
loopback); ``deployment`` is ``geofl server`` plus ``n`` ``geofl client`` processes dialling
the harness's byte proxy. Dropout: ``benchmarks.apps.geofl_secagg_echo`` (the Flower app's
seeded draw; a dropped client's fit raises after the key exchange and the client comes back
next round); ``min_clients`` is what is left, so plain rounds commit like Flower's FedAvg.

Everything comes from ``geofl runs show --json``: round times (select to commit), the bytes
of each participation by kind (advertise, share, fit, unmask), phase durations and client
compute times. The server records no download bytes for the key-exchange tasks, so their
size is computed from the protobuf messages the engine builds (:func:`stage_task_bytes`).

Usage::

    python -m benchmarks.secagg_geofl --cases headline          # n=50, d=1e6, 0 %
    python -m benchmarks.secagg_geofl --cases grid,deployment,full-graph
    python -m benchmarks.secagg_geofl --mode simulation --clients 10 --params 100000 \\
        --dropout 0,0.1 --variants plain,matched

Each case holds the heavy-work lock while it runs (``--no-lock`` when the whole command
already runs under ``flock``); the JSON is rewritten after every case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from benchmarks.apps.geofl_echo import PARAMS_ENV, make_model
from benchmarks.apps.geofl_secagg_echo import client_shift
from benchmarks.core import (
    SERVER_GROUP,
    BenchmarkError,
    RunContext,
    Workload,
    console_script,
    wait_for_port,
)
from benchmarks.geofl_system import GEOFL_REPO_ROOT, RUN_NAME, checkpoint_dir, final_shift
from benchmarks.geofl_system import run_yaml as plain_run_yaml
from benchmarks.secagg import (
    MODES,
    RoundMeasure,
    SecAggCase,
    SecAggRecord,
    SecAggRun,
    SecAggSystem,
    run_secagg_case,
)
from geofl.protocols.secagg import SHARE_CIPHERTEXT_BYTES, PublicKeys, SecAggParams
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config import SecureAggregationConfig
from geofl.server.rounds.secure import SecureSettings, roster_to_proto, round_params, setup_to_proto
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

__all__ = [
    "APP",
    "CASE_SETS",
    "KEY_EXCHANGE_KINDS",
    "PLAIN_VARIANTS",
    "VARIANTS",
    "GeoflSecAgg",
    "effective_params",
    "expected_shift",
    "main",
    "record_key",
    "run_config",
    "run_from_reply",
    "secure_section",
    "stage_task_bytes",
]

APP = "benchmarks.apps.geofl_secagg_echo:client_app"
#: Secure variants (see the module docstring); ``plain`` is the run without the section.
VARIANTS = ("matched", "auto", "full")
#: Plain variants: ``plain`` is geofl's default run (every accepted fit update staged to
#: disk before its ack, ``storage.stage_uploads``); ``plain-unstaged`` turns the staging
#: off, as a secure round (which never stages) runs.
PLAIN_VARIANTS = ("plain", "plain-unstaged")
#: The participation kinds of the key exchange (the masked upload is a ``fit``).
KEY_EXCHANGE_KINDS = ("advertise", "share", "unmask")
_KIND_ORDER = ("advertise", "share", "fit", "unmask")


@dataclass(frozen=True)
class CaseSpec:
    """One case of a named set: the common case and geofl's variant (``plain`` or secure)."""

    mode: str
    n: int
    d: int
    dropout: float
    variant: str


def _grid(
    modes: Sequence[str],
    ns: Sequence[int],
    ds: Sequence[int],
    dropouts: Sequence[float],
    variants: Sequence[str],
) -> list[CaseSpec]:
    return [
        CaseSpec(m, n, d, p, v)
        for m in modes
        for n in ns
        for d in ds
        for p in dropouts
        for v in variants
    ]


#: Named case sets for ``--cases`` (run in this order when several are named).
CASE_SETS: dict[str, list[CaseSpec]] = {
    "smoke": _grid(["simulation"], [3], [1000], [0.0], ["plain", "matched"]),
    "headline": _grid(["simulation"], [50], [1_000_000], [0.0], ["plain", "matched", "auto"]),
    "grid": _grid(
        ["simulation"],
        [10, 50, 100],
        [100_000, 1_000_000],
        [0.0, 0.1],
        ["plain", "matched", "auto"],
    ),
    "deployment": _grid(["deployment"], [10], [100_000], [0.0], ["plain", "matched", "auto"]),
    "full-graph": _grid(["simulation"], [50, 100], [100_000], [0.0], ["full"]),
}


def secure_section(variant: str, case: SecAggCase) -> dict[str, Any] | None:
    """The ``secure_aggregation`` section of ``variant`` (None for ``plain``)."""
    if variant in PLAIN_VARIANTS:
        return None
    weight_one = {"enabled": True, "max_examples": 1}
    if variant == "matched":
        # geofl counts the client among the holders as Flower's num_shares does.
        return {
            **weight_one,
            "degree": case.num_shares - 1,
            "threshold": case.threshold / case.num_shares,
        }
    if variant == "auto":
        return {**weight_one, "degree": "auto"}
    if variant == "full":
        return {**weight_one, "degree": "full"}
    raise ValueError(f"unknown variant {variant!r}; use plain or one of {VARIANTS}")


def _settings(section: Mapping[str, Any]) -> SecureSettings:
    """The engine's settings for a ``secure_aggregation`` section (defaults filled in)."""
    cfg = SecureAggregationConfig.model_validate(dict(section))
    return SecureSettings(
        run_id=1,
        degree=cfg.degree,
        threshold=cfg.threshold,
        clip=cfg.clip,
        ring_bits=cfg.ring_bits,
        max_examples=cfg.max_examples,
        stage_deadline_s=cfg.stage_deadline_s,
    )


def effective_params(section: Mapping[str, Any], n: int) -> SecAggParams:
    """The SecAgg+ parameters a round over ``n`` clients gets (degree and threshold resolved)."""
    return round_params(_settings(section), 1, list(range(1, n + 1)))


def run_config(
    case: SecAggCase, variant: str, server_port: int, db_path: Path, *, pooled: bool = True
) -> dict[str, Any]:
    """The run's YAML mapping: the framework benchmark's run plus dropout and secure settings.

    ``min_clients`` is the cohort less the clients drawn to drop each round, so a round
    commits with the survivors (Flower's FedAvg accepts failures); never below 2.
    ``pooled=False`` (simulation only) runs one client process per client instead of
    geofl's default worker pool.
    """
    workload = Workload(params=case.d, clients=case.n, rounds=case.rounds, timeout_s=case.timeout_s)
    config = plain_run_yaml(workload, server_port, db_path)
    config["strategy"]["min_clients"] = max(2, case.n - round(case.dropout * case.n))
    section = secure_section(variant, case)
    if section is not None:
        config["secure_aggregation"] = section
    if case.mode == "simulation":
        config["simulation"] = {
            "clients": case.n,
            "app": APP,
            "node_config": _drop_config(case),
        }
        if not pooled:
            config["simulation"]["pooled"] = False
    if variant == "plain-unstaged":
        config["storage"]["stage_uploads"] = False
    return config


def _drop_config(case: SecAggCase) -> dict[str, float | int]:
    return {"drop-fraction": case.dropout, "drop-seed": case.drop_seed}


# ------------------------------------------------------------------ reading the database


def _steady_rounds(reply: Mapping[str, Any]) -> set[int]:
    numbers = sorted(int(r["number"]) for r in reply["rounds"])
    return set(numbers[1:] if len(numbers) > 1 else numbers)


def _median_map(values: Mapping[str, list[float]]) -> dict[str, float]:
    return {key: statistics.median(v) for key, v in sorted(values.items()) if v}


def _bytes_by_kind(reply: Mapping[str, Any], n: int) -> dict[str, dict[str, float]]:
    """Per kind, bytes per client each way: the median over steady rounds of round sum / n."""
    steady_numbers = _steady_rounds(reply)
    sums: dict[tuple[str, int, str], int] = {}
    for p in reply["participations"]:
        if p["round_number"] in steady_numbers:
            for way in ("up", "down"):
                key = (str(p["kind"]), int(p["round_number"]), way)
                sums[key] = sums.get(key, 0) + int(p[f"bytes_{way}"])
    out: dict[str, dict[str, float]] = {}
    kinds = sorted({k for k, _, _ in sums}, key=lambda k: (_rank(k), k))
    for kind in kinds:
        out[kind] = {
            way: statistics.median(
                [sums.get((kind, r, way), 0) / n for r in sorted(steady_numbers)]
            )
            for way in ("up", "down")
        }
    return out


def _rank(kind: str) -> int:
    return _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)


def _phases(reply: Mapping[str, Any]) -> dict[str, float]:
    """Median seconds per phase over the steady committed rounds."""
    steady_numbers = _steady_rounds(reply)
    per: dict[str, list[float]] = {}
    for r in reply["rounds"]:
        if r["number"] in steady_numbers and r["status"] == "committed":
            for name, seconds in (r.get("phase_durations") or {}).items():
                per.setdefault(str(name), []).append(float(seconds))
    return _median_map(per)


def _per_task(reply: Mapping[str, Any], field_name: str) -> dict[str, float]:
    """Median of a participation field per task kind over the steady rounds' good tasks.

    ``compute_s`` is the client's own time (download, fit and masking for a fit task);
    ``duration_s`` runs from the task's start to the server's recording of its result.
    """
    steady_numbers = _steady_rounds(reply)
    per: dict[str, list[float]] = {}
    for p in reply["participations"]:
        value = p.get(field_name)
        if p["round_number"] in steady_numbers and p["status"] == "ok" and value:
            per.setdefault(str(p["kind"]), []).append(float(value))
    return _median_map(per)


def _contributors(reply: Mapping[str, Any]) -> dict[int, list[int]]:
    """Committed round -> the partition ids whose fit succeeded (reported in the clear)."""
    committed = {int(r["number"]) for r in reply["rounds"] if r["status"] == "committed"}
    out: dict[int, list[int]] = {number: [] for number in committed}
    for p in reply["participations"]:
        if p["kind"] == "fit" and p["status"] == "ok" and p["round_number"] in committed:
            partition = (p.get("metrics") or {}).get("partition-id")
            if not isinstance(partition, int):
                raise BenchmarkError(f"fit participation {p['id']} reports no partition-id")
            out[int(p["round_number"])].append(partition)
    return {number: sorted(ids) for number, ids in sorted(out.items())}


def expected_shift(contributors: Mapping[int, Sequence[int]]) -> float:
    """What FedAvg of the contributors' constants adds up to over the committed rounds."""
    return sum(
        statistics.fmean(client_shift(p) for p in partitions)
        for partitions in contributors.values()
        if partitions
    )


def run_from_reply(reply: Mapping[str, Any], n: int) -> SecAggRun:
    """Rounds, bytes and notes from ``geofl runs show --json`` (the final shift is not set).

    A failed round (a secure round that aborted) aggregated nothing. Bytes per client are
    every participation's bytes in the round divided by ``n``.
    """
    rounds = []
    for r in sorted(reply["rounds"], key=lambda r: int(r["number"])):
        mine = [p for p in reply["participations"] if p["round_number"] == r["number"]]
        fits = [p for p in mine if p["kind"] == "fit" and p["status"] == "ok"]
        rounds.append(
            RoundMeasure(
                number=int(r["number"]),
                duration_s=float(r["duration_s"]),
                start_wall=_unix(str(r["started_at"])),
                aggregated=len(fits) if r["status"] == "committed" else 0,
                payload_up_bytes=sum(int(p["bytes_up"]) for p in mine) / n,
                payload_down_bytes=sum(int(p["bytes_down"]) for p in mine) / n,
            )
        )
    by_kind = _bytes_by_kind(reply, n)
    contributors = _contributors(reply)
    notes: dict[str, Any] = {
        "bytes_per_client_by_kind": by_kind,
        "key_exchange_up_bytes": sum(by_kind.get(k, {}).get("up", 0.0) for k in KEY_EXCHANGE_KINDS),
        "phase_s": _phases(reply),
        "client_compute_s": _per_task(reply, "compute_s"),
        "task_duration_s": _per_task(reply, "duration_s"),
        "contributors_by_round": {str(k): v for k, v in contributors.items()},
        "round_errors": {str(r["number"]): r["error"] for r in reply["rounds"] if r["error"]},
    }
    return SecAggRun(
        rounds=rounds, final_shift=None, expected_shift=expected_shift(contributors), notes=notes
    )


def _unix(text: str) -> float:
    parsed = datetime.fromisoformat(text)
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def stage_task_bytes(section: Mapping[str, Any], n: int) -> dict[str, float]:
    """Mean bytes per client of the ``SecAggTask`` the server sends in each stage (computed).

    Built with the engine's own conversions for a round of ``n`` clients (node ids 1..n,
    nobody dropped): ``advertise`` (the setup), ``share`` (setup and the neighbours' public
    keys), ``inbox`` (setup and the encrypted shares riding on the fit task) and ``unmask``
    (setup and the survivor list). The database records none of these downloads.
    """
    settings = _settings(section)
    params = round_params(settings, 1, list(range(1, n + 1)))
    setup = setup_to_proto(params, settings)
    key = PublicKeys(encrypt=bytes(32), mask=bytes(32))
    graph = params.neighbourhoods()
    cohort = list(params.cohort)
    totals = {"advertise": 0, "share": 0, "inbox": 0, "unmask": 0}
    for node in cohort:
        peers = sorted(graph[node])
        totals["advertise"] += pb.SecAggTask(setup=setup).ByteSize()
        roster = roster_to_proto({p: key for p in peers})
        totals["share"] += pb.SecAggTask(setup=setup, roster=roster).ByteSize()
        inbox = {p: bytes(SHARE_CIPHERTEXT_BYTES) for p in peers}
        totals["inbox"] += pb.SecAggTask(setup=setup, inbox=inbox).ByteSize()
        totals["unmask"] += pb.SecAggTask(setup=setup, survivors=cohort).ByteSize()
    return {stage: total / n for stage, total in totals.items()}


# ------------------------------------------------------------------ the system


class GeoflSecAgg(SecAggSystem):
    """geofl with one secure-aggregation variant (or ``plain``), in either mode."""

    name = "geofl"
    modes = MODES

    def __init__(self, variant: str = "matched", *, pooled: bool = True) -> None:
        if variant not in PLAIN_VARIANTS and variant not in VARIANTS:
            raise ValueError(
                f"unknown variant {variant!r}; use one of {PLAIN_VARIANTS} or {VARIANTS}"
            )
        self.variant = variant
        #: Simulation only: clients in a few worker processes (geofl's default) or one
        #: process per client (``simulation.pooled: false``).
        self.pooled = pooled

    def default_drop_stage(self, secure: bool) -> str:
        """Dropped clients fail their (masked) fit, after the key exchange."""
        return "fit"

    def run(self, case: SecAggCase, ctx: RunContext) -> SecAggRun:
        """Deploy, wait until every process exits 0, read the run back from the database."""
        if case.secure != (self.variant not in PLAIN_VARIANTS):
            raise ValueError(f"variant {self.variant!r} does not match secure={case.secure}")
        db_path = ctx.workdir / "geofl.db"
        config = ctx.workdir / "run.yaml"
        yaml = run_config(case, self.variant, ctx.server_port, db_path, pooled=self.pooled)
        config.write_text(json.dumps(yaml, indent=2) + "\n")
        env = {PARAMS_ENV: str(case.d), "PYTHONPATH": str(GEOFL_REPO_ROOT)}
        geofl = console_script("geofl")
        if case.mode == "simulation":
            ctx.spawn(SERVER_GROUP, "geofl-simulate", [geofl, "simulate", "-c", str(config)], env)
        else:
            self._deploy(case, ctx, geofl, config, env)
        _wait_for_exit(ctx, case.timeout_s)
        url = f"sqlite:///{db_path}"
        reply = _runs_show(ctx, geofl, url)
        run = run_from_reply(reply, case.n)
        run.final_shift = _final_shift(case.d, db_path, int(reply["run"]["id"]))
        section = secure_section(self.variant, case)
        if section is not None:
            stages = stage_task_bytes(section, case.n)
            run.notes["stage_task_bytes"] = stages
            run.notes["key_exchange_down_bytes"] = sum(stages[k] for k in KEY_EXCHANGE_KINDS)
        return run

    def _deploy(
        self, case: SecAggCase, ctx: RunContext, geofl: str, config: Path, env: dict[str, str]
    ) -> None:
        ctx.spawn(SERVER_GROUP, "geofl-server", [geofl, "server", "-c", str(config)], env)
        wait_for_port(ctx.server_port, timeout_s=300, ctx=ctx)
        drop = " ".join(f"{k}={v}" for k, v in _drop_config(case).items())
        for i in range(case.n):
            argv = [geofl, "client", "--server", f"127.0.0.1:{ctx.client_port}", "--app", APP]
            argv += ["--name", f"site-{i}", "--node-config"]
            argv.append(f"partition-id={i} num-partitions={case.n} {drop}")
            ctx.spawn(f"site-{i}", f"geofl-client-{i}", argv, env)


def _wait_for_exit(ctx: RunContext, timeout_s: float) -> None:
    """Until every spawned process exited; a non-zero exit is a failure."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ctx.check_alive()
        if all(proc.poll() is not None for proc in ctx.procs):
            return
        time.sleep(0.25)
    raise BenchmarkError(f"geofl run did not finish within {timeout_s:.0f} s")


def _runs_show(ctx: RunContext, geofl: str, url: str) -> dict[str, Any]:
    """``geofl runs show --json`` of the one benchmark run in the case's database."""
    listed = _cli_json(ctx, [geofl, "runs", "list", "--db", url, "--json"])
    ids = [r["id"] for r in listed if isinstance(r, dict) and r.get("name") == RUN_NAME]
    if len(ids) != 1:
        raise BenchmarkError(f"expected one run named {RUN_NAME!r}, found {listed!r}")
    reply = _cli_json(ctx, [geofl, "runs", "show", str(ids[0]), "--db", url, "--json"])
    if not isinstance(reply, dict) or not isinstance(reply.get("rounds"), list):
        raise BenchmarkError(f"`geofl runs show` printed no run with rounds: {reply!r:.300}")
    return reply


def _cli_json(ctx: RunContext, argv: list[str]) -> Any:
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=ctx.workdir, timeout=120, check=False
    )
    if done.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv[1:3])} exited {done.returncode}: {done.stderr}")
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise BenchmarkError(f"{' '.join(argv[1:3])} printed no JSON") from exc


def _final_shift(d: int, db_path: Path, run_id: int) -> float:
    """Mean shift of the last checkpoint against the seeded initial model."""
    database = open_database(f"sqlite:///{db_path}", migrate=False)
    with database.session() as session:
        row = queries.latest_checkpoint(session, run_id)
        if row is None:
            raise BenchmarkError(f"run {run_id} has no checkpoint")
        record = CheckpointRecord.from_row(row)
    final, _ = CheckpointStore(checkpoint_dir(db_path)).load(record)
    previous = os.environ.get(PARAMS_ENV)
    os.environ[PARAMS_ENV] = str(d)
    try:
        initial = make_model()
    finally:
        if previous is None:
            del os.environ[PARAMS_ENV]
        else:
            os.environ[PARAMS_ENV] = previous
    return final_shift(initial, final)


# ------------------------------------------------------------------ command line


def record_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two records the same measurement (a re-run replaces the old one)."""
    fields = ("system", "mode", "n", "d", "dropout", "secure", "rounds")
    settings = record.get("settings", {})
    return (
        *(record[f] for f in fields),
        settings.get("drop_stage"),
        settings.get("variant"),
        settings.get("pooled", True),
    )


def _measured(
    done: Sequence[Mapping[str, Any]], case: SecAggCase, variant: str, pooled: bool = True
) -> bool:
    """Whether ``done`` holds a good record of ``case`` in ``variant``."""
    record = {**asdict(case), "system": GeoflSecAgg.name}
    record["settings"] = {"drop_stage": GeoflSecAgg(variant).default_drop_stage(case.secure)}
    record["settings"]["variant"] = variant
    record["settings"]["pooled"] = pooled
    return any(c.get("ok") and record_key(c) == record_key(record) for c in done)


def _merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    replaced = {record_key(c) for c in new}
    return [c for c in old if record_key(c) not in replaced] + new


def _load(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    cases = json.loads(out.read_text())["cases"]
    if not isinstance(cases, list):
        raise ValueError(f"{out}: 'cases' is not a list")
    return cases


def _write(out: Path, cases: list[dict[str, Any]]) -> None:
    report = {
        "benchmark": "secure-aggregation",
        "created_unix": time.time(),
        "host": {
            "cpus": os.cpu_count(),
            "memory_gb": psutil.virtual_memory().total / 1e9,
            "python": platform.python_version(),
        },
        "geofl_commit": _commit(),
        "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def _commit() -> str | None:
    """The checked-out commit (the tree may hold uncommitted changes too)."""
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=GEOFL_REPO_ROOT
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _list(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part.replace("_", "")) for part in text.split(",") if part.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad list {text!r}: {exc}") from exc

    return parse


def _sets(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in CASE_SETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown case sets {unknown}; known: {list(CASE_SETS)}")
    return names


def _variant(text: str) -> str:
    if text not in PLAIN_VARIANTS and text not in VARIANTS:
        raise ValueError(f"unknown variant {text!r}; use one of {PLAIN_VARIANTS} or {VARIANTS}")
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="geofl SecAgg+ vs plain aggregation cost")
    parser.add_argument("--cases", type=_sets, help=f"named sets: {', '.join(CASE_SETS)}")
    parser.add_argument("--mode", default="simulation", choices=MODES)
    parser.add_argument("--clients", type=_list(int), default=[10])
    parser.add_argument("--params", type=_list(int), default=[100_000])
    parser.add_argument("--dropout", type=_list(float), default=[0.0])
    parser.add_argument("--variants", type=_list(_variant), default=["plain", "matched"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num-shares", type=int, default=5)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--drop-seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per case, seconds")
    parser.add_argument("--max-rss-gb", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/secagg_geofl.json"))
    parser.add_argument("--replace", action="store_true", help="start a new file (else merge)")
    parser.add_argument("--keep-workdirs", action="store_true")
    parser.add_argument("--no-lock", action="store_true", help="already under flock(1)")
    parser.add_argument("--resume", action="store_true", help="skip cases already measured ok")
    parser.add_argument(
        "--unpooled",
        action="store_true",
        help="simulation: one process per client (simulation.pooled: false)",
    )
    return parser.parse_args(argv)


def build_specs(args: argparse.Namespace) -> list[CaseSpec]:
    """The named sets in order, or the grid of the explicit options."""
    if args.cases:
        return [spec for name in args.cases for spec in CASE_SETS[name]]
    return _grid([args.mode], args.clients, args.params, args.dropout, args.variants)


def to_case(spec: CaseSpec, args: argparse.Namespace) -> SecAggCase:
    """The common case of ``spec`` with the command line's protocol settings."""
    return SecAggCase(
        n=spec.n,
        d=spec.d,
        rounds=args.rounds,
        secure=spec.variant not in PLAIN_VARIANTS,
        dropout=spec.dropout,
        mode=spec.mode,
        num_shares=args.num_shares,
        threshold=args.threshold,
        drop_seed=args.drop_seed,
        timeout_s=args.timeout,
    )


def describe_variant(
    record: SecAggRecord, variant: str, case: SecAggCase, pooled: bool = True
) -> None:
    """Add the variant, its effective degree and threshold, and (simulation) whether the
    clients ran pooled to ``record.settings``."""
    record.settings["variant"] = variant
    if case.mode == "simulation":
        record.settings["pooled"] = pooled
    section = secure_section(variant, case)
    if section is not None:
        params = effective_params(section, case.n)
        record.settings["degree"] = params.effective_degree
        record.settings["holders"] = params.effective_degree + 1
        record.settings["reconstruct_threshold"] = params.threshold


def _summary(r: SecAggRecord) -> str:
    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    state = "ok" if r.ok else f"FAILED: {(r.error or '')[:300]}"
    return (
        f"geofl {r.settings.get('variant')} {r.mode} n={r.n} d={r.d} dropout={r.dropout}: "
        f"steady {fmt(r.steady_round_s, '.3f')} s/round, rounds "
        f"{' '.join(f'{t:.2f}' for t in r.round_s)}, aggregated {r.aggregated_per_round}, "
        f"up/down per client {fmt(r.payload_up_bytes, '.0f')}/{fmt(r.payload_down_bytes, '.0f')} "
        f"B, phases {r.notes.get('phase_s')}, peak RSS {fmt(r.peak_rss_mb, '.0f')} MB; {state}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run every case, merging each record into ``--out`` as soon as it is measured."""
    args = parse_args(argv)
    done = [] if args.replace else _load(args.out)
    for spec in build_specs(args):
        case = to_case(spec, args)
        pooled = not args.unpooled
        if args.resume and _measured(done, case, spec.variant, pooled):
            continue
        print(f"running geofl {spec.variant} {case}", flush=True)
        record = run_secagg_case(
            GeoflSecAgg(spec.variant, pooled=pooled),
            case,
            use_lock=not args.no_lock,
            max_rss_bytes=int(args.max_rss_gb * 1e9),
            keep_workdir=args.keep_workdirs,
        )
        describe_variant(record, spec.variant, case, pooled)
        done = _merge(done, [asdict(record)])
        _write(args.out, done)
        print(_summary(record), flush=True)


if __name__ == "__main__":
    main()
