"""Geo-distributed LM training (issue 17): DiLoCo variants against synchronous data parallel.

Workload (:mod:`examples.geo_lm`): a 1.85 M-parameter byte-level transformer, four sites in
three regions (two at 20 ms RTT, one at 80, one at 220) each training on its own top-level
packages of the interpreter's standard library; validation bits per byte on a fixed set of
held-out files, evaluated by the server after every round and compared at equal token
counts (every H steps, :attr:`~benchmarks.geo_lm_runs.Method.eval_every`). Every site runs
at the measured speed of one AdamW step on one core (measured at the start, in a child
process: ``examples.geo_lm.steptime``); links at ``--mbps`` (100 and 1000) each way.

Methods (:data:`METHODS`): synchronous data parallel (each step's gradients averaged through
the coordinator, AdamW applied there: strategy ``adamw``); DiLoCo (H AdamW steps on each
site, its state kept across rounds, outer Nesterov) uncompressed, int8 and int4 (qsgd, error
feedback, both directions); DiLoCo with DreamDDP-style layer-wise partial sync; Streaming
DiLoCo (P fragments, overlap tau, int4).

On the virtual clock a synchronous method's training does not depend on the bandwidth
(every site is in every round, nothing is late, batches and codecs are seeded), so each
method is trained once, at the first bandwidth; at the others a short probe run (the first
round and two periods of the method's traffic pattern) gives the round durations and bytes,
its validation figures must equal the full run's (else the method runs in full there), and
the full run's trajectory is put on the probe's rounds (``reused_from`` in the JSON, and
"(reused)" in the table, say so). Partial sync re-plans its groups every round and always
runs in full; ``--no-reuse`` runs everything in full. ``--reference`` takes synchronous data
parallel's records from an earlier report with the same training inputs (another H does not
change them); ``--resume`` goes on from an interrupted run's partial report.

Also: DiLoCo under secure aggregation on the wall clock (``--secagg``: it runs; the figure
is its bpb), and the honesty check (``--wall``, ``--wall-methods``): each named method at
100 Mbit/s on the wall clock with the shaper against the same YAML on the virtual clock,
whose compute model is then the step time measured with four trainers sharing this
machine's cores at once; server evaluation off on both.

    python -m benchmarks.geo_lm --steps 1000 --local-steps 100 --fragments 2 \\
        --overlap-steps 5 --secagg --wall --wall-methods sync_dp diloco_int4 \\
        --out benchmarks/results/geo_lm.json --png benchmarks/geo_lm.png
    python -m benchmarks.geo_lm --report-only --out ... --png ...   # redraw, reprint
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.core import REPO_ROOT, heavy_lock
from benchmarks.geo_lm_report import plot, render_markdown, summarize
from benchmarks.geo_lm_runs import (
    INT4,
    INT8,
    LM,
    Curve,
    GeoSpec,
    Method,
    base_config,
    diloco_method,
    read_curve,
    streaming_method,
)
from benchmarks.wan_schedule import deep_merge, run_logged

__all__ = [
    "METHODS",
    "SECAGG",
    "SYNC_DP",
    "initial_bpb",
    "main",
    "measure_tokens_per_s",
    "method",
    "probe_and_reuse",
    "reference_records",
    "run_method",
    "wall_validation",
]


def _sync_dp_sections(spec: GeoSpec) -> dict[str, Any]:
    return {
        "strategy": {
            "name": "adamw",
            "server_lr": spec.lr,
            "weight_decay": spec.weight_decay,
            **spec.lr_schedule,
        },
        "round_config": {"mode": "gradient"},
    }


SYNC_DP = Method(
    "sync_dp",
    "sync data parallel (fp32)",
    _sync_dp_sections,
    rounds=lambda spec: spec.steps,
    eval_every=lambda spec: spec.local_steps,
    tokens_per_round=lambda spec: spec.tokens_per_step,
)
METHODS: tuple[Method, ...] = (
    SYNC_DP,
    diloco_method("diloco", "DiLoCo (fp32)"),
    diloco_method("diloco_int8", "DiLoCo, int8 + EF", compression=INT8),
    diloco_method("diloco_int4", "DiLoCo, int4 + EF", compression=INT4),
    diloco_method(
        "partial_sync",
        "DiLoCo + DreamDDP partial sync (4 groups)",
        {"partial_sync": {"sync_points": 4}},
        reusable=False,
    ),
    streaming_method("streaming_int4", "Streaming DiLoCo, int4 + EF", compression=INT4),
)
#: DiLoCo under secure aggregation (wall clock only: the key exchange is not simulated).
SECAGG = diloco_method(
    "diloco_secagg",
    "DiLoCo under secure aggregation",
    extra={
        "secure_aggregation": {"enabled": True, "clip": 1.0, "ring_bits": 32},
        "simulation": {"clock": "wall"},
    },
)


def method(name: str) -> Method:
    """The method called ``name``."""
    for candidate in (*METHODS, SECAGG):
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown method {name!r}; known: {[m.name for m in METHODS]}")


def _child_python(code: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    return completed.stdout.strip().splitlines()[-1]


def measure_tokens_per_s(concurrent: int = 1) -> dict[str, float]:
    """Tokens per second of one site: ``concurrent`` step-timing processes at once, median."""
    command = [sys.executable, "-m", "examples.geo_lm.steptime", "--json"]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        for _ in range(concurrent)
    ]
    results = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
    return {
        "concurrent": concurrent,
        "step_s": statistics.median(r["step_s"] for r in results),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
        "params": results[0]["params"],
    }


def initial_bpb() -> float:
    """Validation bits per byte of the initial model (the curves' first point)."""
    code = (
        f"from {LM} import make_model, server_evaluate; "
        "print(server_evaluate(make_model())[1]['bpb'])"
    )
    return float(_child_python(code))


def run_method(
    spec: GeoSpec,
    chosen: Method,
    mbps: float,
    root: Path,
    rounds: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``geofl simulate`` run in a child process; its config, exit code and curve."""
    label = f"{chosen.name}-{mbps:g}" + ("" if rounds is None else f"-probe{rounds}")
    workdir = root / label
    workdir.mkdir(parents=True, exist_ok=False)
    config = base_config(spec, chosen, mbps, workdir)
    if rounds is not None:
        config["run"]["rounds"] = rounds
    config = deep_merge(config, overrides or {})
    path = workdir / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [sys.executable, "-m", "geofl.server.cli.main", "simulate", "-c", str(path)]
    code, wall_s = run_logged(argv, workdir, spec.timeout_s)
    record: dict[str, Any] = {"method": chosen.name, "mbps": mbps, "exit_code": code}
    record |= {"wall_s": wall_s, "rounds": config["run"]["rounds"]}
    if code != 0 or not (workdir / "run.db").exists():
        tail = (workdir / "child.log").read_text(errors="replace").splitlines()[-15:]
        record["error"] = f"exit code {code}: " + "\n".join(tail)
        return record
    record["curve"] = read_curve(f"sqlite:///{workdir / 'run.db'}").as_dict()
    return record


#: What synchronous data parallel's training depends on: a report whose spec has the same
#: values trained the same curve (the virtual clock is deterministic; H is not among them).
_SYNC_DP_INPUTS = (
    "sites",
    "steps",
    "batch",
    "lr",
    "weight_decay",
    "warmup_steps",
    "cosine",
    "final_lr_ratio",
    "seed",
    "tokens_per_s",
)


def reference_records(
    path: Path, spec: GeoSpec, bandwidths: Sequence[float]
) -> list[dict[str, Any]]:
    """Synchronous data parallel's records of an earlier report, instead of training it again.

    Raises
    ------
    ValueError
        If the report's spec differs from ``spec`` in what the reference's training depends
        on (:data:`_SYNC_DP_INPUTS`), or it has no successful record at a bandwidth asked for.
    """
    earlier = json.loads(path.read_text())
    defaults = asdict(GeoSpec())  # reports from before a setting existed had its default
    differing = [
        k for k in _SYNC_DP_INPUTS if earlier["spec"].get(k, defaults[k]) != getattr(spec, k)
    ]
    if differing:
        raise ValueError(f"{path}: its spec differs in {differing}; run sync_dp again instead")
    found = {
        float(r["mbps"]): r
        for r in earlier["records"]
        if r["method"] == SYNC_DP.name and "error" not in r
    }
    missing = [mbps for mbps in bandwidths if float(mbps) not in found]
    if missing:
        raise ValueError(f"{path} has no successful sync_dp record at {missing} Mbit/s")
    return [{**found[float(mbps)], "reused_from_report": str(path)} for mbps in bandwidths]


#: A probe's validation figures must equal the full run's this closely to stand for it.
REUSE_TOLERANCE_BPB = 1e-6


def _probe_rounds(spec: GeoSpec, chosen: Method) -> int:
    """The first round (it downloads the whole model) and two periods of steady rounds."""
    return 1 + 2 * chosen.period(spec)


def _probe_round(index: int, probed: int, period: int) -> int:
    """Which probe round (0-based) stands for round ``index``: itself while the probe has
    it, then the one of the probe's last period in the same phase (the same fragment)."""
    if index < probed:
        return index
    return probed - period + (index - probed) % period


def probe_and_reuse(
    spec: GeoSpec, chosen: Method, full: Mapping[str, Any], mbps: float, root: Path
) -> dict[str, Any]:
    """``full``'s trajectory on the round times and bytes of a short run at ``mbps``.

    Round ``k`` takes the probe's round ``k`` while the probe has one, then the probe round
    of the same phase (:func:`_probe_round`). The probe's validation figures must equal the
    full run's (:data:`REUSE_TOLERANCE_BPB`): if they do not, training depended on the
    bandwidth and the method is run in full at ``mbps`` instead. A method that is not
    ``reusable`` is always run in full.
    """
    if "error" in full:
        return {
            "method": chosen.name,
            "mbps": mbps,
            "error": "the full run failed: nothing to reuse",
        }
    if not chosen.reusable:
        return run_method(spec, chosen, mbps, root)
    probe = run_method(spec, chosen, mbps, root, rounds=_probe_rounds(spec, chosen))
    if "error" in probe:
        return probe
    trained, short = Curve.from_dict(full["curve"]), Curve.from_dict(probe["curve"])
    checks = [
        abs(a - b)
        for a, b in zip(short.bpb, trained.bpb, strict=False)
        if a is not None and b is not None
    ]
    if not checks or max(checks) > REUSE_TOLERANCE_BPB:
        record = run_method(spec, chosen, mbps, root)
        return {
            **record,
            "reuse_refused": {"probe": probe, "max_abs_diff_bpb": max(checks, default=None)},
        }
    period, probed = chosen.period(spec), len(short.rounds)
    picks = [_probe_round(i, probed, period) for i in range(len(trained.rounds))]
    durations = [short.durations[j] for j in picks]
    times, elapsed = [], short.times[0] - short.durations[0]
    for duration in durations:
        elapsed += duration
        times.append(elapsed)
    reused = Curve(
        trained.rounds,
        times,
        trained.bpb,
        [short.bytes_up[j] for j in picks],
        [short.bytes_down[j] for j in picks],
        list(trained.compute_s),
        durations,
        trained.status,
    )
    return {
        "method": chosen.name,
        "mbps": mbps,
        "reused_from": full["mbps"],
        "probe": probe,
        "trajectory_max_abs_diff_bpb": max(checks),
        "curve": reused.as_dict(),
        "exit_code": 0,
    }


def wall_validation(spec: GeoSpec, chosen: Method, root: Path, rounds: int) -> dict[str, Any]:
    """``chosen`` at 100 Mbit/s on the wall clock with the shaper and on the virtual clock.

    The virtual clock's compute model is the step time measured with all sites training at
    once on this machine's cores (as the wall clock's sites do). Server-side evaluation is
    off on both clocks: the virtual clock charges no server work, so evaluating would only
    add this host's evaluation time to the wall rounds.
    """
    shared = measure_tokens_per_s(concurrent=spec.sites)
    local = replace(spec, tokens_per_s=shared["tokens_per_s"], workers=spec.sites)
    overrides = {"evaluation": {"every": 0, "server": None}}
    runs = {}
    for clock in ("wall", "virtual"):
        variant = replace(chosen, name=f"honesty_{chosen.name}_{clock}", clock=clock)
        runs[clock] = run_method(local, variant, 100, root, rounds=rounds, overrides=overrides)
    result: dict[str, Any] = {"method": chosen.name, "compute_model": shared, "runs": runs}
    if any("error" in run for run in runs.values()):
        return result
    wall, virtual = (Curve.from_dict(runs[c]["curve"]) for c in ("wall", "virtual"))
    medians = {
        "wall": statistics.median(wall.durations[1:]),
        "virtual": statistics.median(virtual.durations[1:]),
    }
    totals = {"wall": sum(wall.durations), "virtual": sum(virtual.durations)}
    result["median_round_s"] = medians
    result["round_error"] = (medians["virtual"] - medians["wall"]) / medians["wall"]
    result["total_s"] = totals
    result["total_error"] = (totals["virtual"] - totals["wall"]) / totals["wall"]
    return result


def _secagg_run(spec: GeoSpec, root: Path) -> dict[str, Any]:
    small = replace(
        spec, steps=2 * 5, local_steps=5, fragments=1, overlap_steps=0, workers=spec.sites
    )
    return run_method(small, SECAGG, 1000, root)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/geo_lm.json"))
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=GeoSpec.steps)
    parser.add_argument("--local-steps", type=int, default=GeoSpec.local_steps)
    parser.add_argument("--workers", type=int, default=GeoSpec.workers)
    parser.add_argument("--fragments", type=int, default=GeoSpec.fragments)
    parser.add_argument("--overlap-steps", type=int, default=GeoSpec.overlap_steps)
    parser.add_argument("--outer-lr", type=float, default=GeoSpec.outer_lr)
    parser.add_argument("--outer-momentum", type=float, default=GeoSpec.outer_momentum)
    parser.add_argument("--warmup-steps", type=int, default=GeoSpec.warmup_steps)
    parser.add_argument(
        "--cosine",
        action="store_true",
        help="decay the inner (and data parallel's) learning rate by a cosine to "
        "--final-lr-ratio of it at the last step",
    )
    parser.add_argument("--final-lr-ratio", type=float, default=GeoSpec.final_lr_ratio)
    parser.add_argument("--mbps", type=float, nargs="+", default=[100.0, 1000.0])
    parser.add_argument("--methods", nargs="+", default=[m.name for m in METHODS])
    parser.add_argument("--target-bpb", type=float, default=None, help="default: see report")
    parser.add_argument("--tokens-per-s", type=float, default=None, help="skip measuring")
    parser.add_argument("--no-reuse", action="store_true")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="take sync_dp's records from this earlier report (same steps, batch, lr, "
        "weight decay, seed and --tokens-per-s) instead of training it again",
    )
    parser.add_argument("--wall", action="store_true", help="also the wall-clock honesty check")
    parser.add_argument("--wall-rounds", type=int, default=8)
    parser.add_argument(
        "--wall-methods",
        nargs="+",
        default=[SYNC_DP.name],
        help="the methods the wall-clock check runs (each: --wall-rounds rounds)",
    )
    parser.add_argument("--secagg", action="store_true", help="also DiLoCo under secure agg.")
    parser.add_argument("--no-lock", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from --out's .partial.json (same arguments): keep its step time and "
        "its successful runs, run the rest",
    )
    return parser.parse_args(argv)


def _spec(args: argparse.Namespace, tokens_per_s: float) -> GeoSpec:
    return GeoSpec(
        steps=args.steps,
        local_steps=args.local_steps,
        workers=args.workers,
        fragments=args.fragments,
        overlap_steps=args.overlap_steps,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        warmup_steps=args.warmup_steps,
        cosine=args.cosine,
        final_lr_ratio=args.final_lr_ratio,
        tokens_per_s=tokens_per_s,
    )


def _partial_path(out: Path) -> Path:
    return out.with_suffix(".partial.json")


def _resumed(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The step time and the successful records of an interrupted run (``--resume``).

    Raises
    ------
    ValueError
        If the partial report was made with another spec than these arguments give.
    """
    partial = json.loads(_partial_path(args.out).read_text())
    speed = partial["step_time"]
    spec = asdict(_spec(args, float(speed["tokens_per_s"])))
    if partial["spec"] != spec:
        differing = sorted(k for k in spec if partial["spec"].get(k) != spec[k])
        raise ValueError(f"--resume: the partial report's spec differs in {differing}")
    return speed, [r for r in partial["records"] if "error" not in r]


def _run_all(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    if args.resume:
        speed, records = _resumed(args)
    elif args.tokens_per_s is not None:
        speed, records = {"tokens_per_s": args.tokens_per_s, "given": True}, []
    else:
        speed, records = measure_tokens_per_s(), []
    spec = _spec(args, float(speed["tokens_per_s"]))
    done = {(r["method"], float(r["mbps"])) for r in records}
    for name in args.methods:
        chosen = method(name)
        if chosen is SYNC_DP and args.reference is not None:
            records.extend(reference_records(args.reference, spec, args.mbps))
            continue
        if (name, float(args.mbps[0])) in done:
            first = next(r for r in records if (r["method"], r["mbps"]) == (name, args.mbps[0]))
        else:
            first = run_method(spec, chosen, args.mbps[0], root)
            records.append(first)
            print(_line(first), flush=True)
        for mbps in args.mbps[1:]:
            if (name, float(mbps)) in done:
                continue
            other = (
                run_method(spec, chosen, mbps, root)
                if args.no_reuse
                else probe_and_reuse(spec, chosen, first, mbps, root)
            )
            records.append(other)
            print(_line(other), flush=True)
        _save_partial(args.out, spec, speed, records)
    report: dict[str, Any] = {
        "spec": asdict(spec),
        "step_time": speed,
        "initial_bpb": initial_bpb(),
        "labels": {m.name: m.label for m in (*METHODS, SECAGG)},
        "tokens_per_round": {m.name: m.tokens_per_round(spec) for m in METHODS},
        "records": records,
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
    }
    if args.secagg:
        report["secagg"] = _secagg_run(spec, root)
        print(_line(report["secagg"]), flush=True)
    if args.wall:
        report["wall_validations"] = [
            wall_validation(spec, method(name), root, args.wall_rounds)
            for name in args.wall_methods
        ]
        for check in report["wall_validations"]:
            print(json.dumps({k: v for k, v in check.items() if k != "runs"}))
    return report


def _save_partial(
    out: Path, spec: GeoSpec, speed: Mapping[str, Any], records: list[dict[str, Any]]
) -> None:
    """The records so far, next to ``out``: a run cut short keeps what it measured, and
    ``--resume`` goes on from it."""
    partial = _partial_path(out)
    partial.parent.mkdir(parents=True, exist_ok=True)
    document = {"spec": asdict(spec), "step_time": dict(speed), "records": records}
    partial.write_text(json.dumps(document, indent=1))


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def _line(record: Mapping[str, Any]) -> str:
    if "error" in record:
        return f"{record['method']} @ {record['mbps']:g} Mbit/s FAILED: {record['error'][-400:]}"
    curve = Curve.from_dict(record["curve"])
    last = next((b for b in reversed(curve.bpb) if b is not None), None)
    return (
        f"{record['method']} @ {record['mbps']:g} Mbit/s: {len(curve.rounds)} rounds, "
        f"{curve.times[-1]:.1f} simulated s, final bpb {last}, "
        f"{(sum(curve.bytes_up) + sum(curve.bytes_down)) / 1e6:.1f} MB"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.report_only:
        report = json.loads(args.out.read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="geofl-geolm-") as tmp:
            root = args.keep if args.keep is not None else Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            if args.no_lock:
                report = _run_all(args, root)
            else:
                with heavy_lock():
                    report = _run_all(args, root)
    spec = GeoSpec(**report["spec"])
    report["eval_every"] = {m.name: m.eval_every(spec) for m in METHODS}
    report["summary"] = summarize(report, args.target_bpb)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(render_markdown(report))
    if args.png is not None:
        plot(report, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
