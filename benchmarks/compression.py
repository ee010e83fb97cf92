"""Accuracy against upload bytes for each upload codec, on real Fashion-MNIST (issue 4).

For each configuration this runs the real ``geofl simulate`` of
``examples/fashion_mnist/run.yaml`` (ten non-IID clients, same seeds), changing only the
``compression`` section with ``--set``; every run gets its own SQLite database and checkpoint
directory in a temporary folder.  The figures are read back from the database with
``geofl runs show ID --json``: wire and raw upload bytes per round and the server-side test
accuracy after every round.  Codec throughput is re-measured on one core with
:func:`benchmarks.codecs_throughput.measure`.  Every heavy step holds
``geofl-heavy.lock`` in the temporary directory; the JSON is rewritten after every
configuration so that partial results survive.

Run as ``python -m benchmarks.compression [--rounds R] [--clients N] [--configs a,b]
--out benchmarks/results/compression.json [--png benchmarks/compression_accuracy_vs_bytes.png]``.
"""

from __future__ import annotations

import os

#: The caller's BLAS settings, restored for the geofl processes (training uses its own).
_ORIGINAL_ENV = {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
for _var in (*_ORIGINAL_ENV, "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core for the codec throughput, before NumPy loads

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.codecs_throughput import CASES, measure  # noqa: E402
from benchmarks.core import heavy_lock  # noqa: E402
from geofl.protocols.codecs import parse_chain  # noqa: E402

__all__ = [
    "ACCURACY_TARGET",
    "CONFIGS",
    "CodecConfig",
    "check_targets",
    "main",
    "overrides",
    "plot",
    "rounds_to_reach",
    "summarize",
]

ACCURACY_TARGET = 0.85
RUN_YAML = "examples/fashion_mnist/run.yaml"
BYTES_TARGET = 50.0  # fewer upload bytes than uncompressed, at most ...
ACCURACY_LOSS_PP = 1.0  # ... percentage points of final accuracy lost
THROUGHPUT_TARGET = 200.0  # MB/s encode + decode on one core, for the quantizers


@dataclass(frozen=True)
class CodecConfig:
    """One benchmarked upload configuration: chain, error feedback, throughput case."""

    up: list[Any]
    error_feedback: bool
    throughput_case: str
    quantizer: bool = False
    min_bytes: int | None = None  # None: the YAML's default (4096)


#: The issue's list, in its order (labels are the ``--configs`` names).
CONFIGS: dict[str, CodecConfig] = {
    "none": CodecConfig([], False, "none"),
    "fp16": CodecConfig(["fp16"], False, "fp16", quantizer=True),
    "int8": CodecConfig([{"qsgd": {"bits": 8}}], False, "qsgd8", quantizer=True),
    "int4": CodecConfig([{"qsgd": {"bits": 4}}], False, "qsgd4", quantizer=True),
    "topk1%+ef": CodecConfig([{"topk": {"ratio": 0.01}}], True, "topk1%"),
    "topk0.1%+ef": CodecConfig([{"topk": {"ratio": 0.001}}], True, "topk0.1%"),
    "powersgd4+ef": CodecConfig([{"powersgd": {"rank": 4}}], True, "powersgd4"),
}
#: Not in the default list: what the 4096-byte threshold costs (every tensor compressed).
EXTRA_CONFIGS: dict[str, CodecConfig] = {
    "topk1%+int8+ef": CodecConfig(
        [{"topk": {"ratio": 0.01}}, {"qsgd": {"bits": 8}}], True, "topk1%"
    ),
    "topk1%+ef-min0": CodecConfig([{"topk": {"ratio": 0.01}}], True, "topk1%", min_bytes=0),
    "topk0.1%+ef-min0": CodecConfig([{"topk": {"ratio": 0.001}}], True, "topk0.1%", min_bytes=0),
}


def overrides(
    config: CodecConfig, rounds: int, clients: int, workdir: Path, max_train_samples: int = 0
) -> list[str]:
    """``--set`` arguments for one run: compression section, size, storage, evaluation.

    Federated evaluation is turned off (``evaluation.every=0``): it only repeats the
    server-side figure, which ``evaluation.server`` computes after every round regardless.
    Chains are written as JSON, which is valid YAML flow syntax.
    """
    parse_chain(config.up)  # a typo fails here, not after minutes of training
    values: dict[str, object] = {
        "run.rounds": rounds,
        "simulation.clients": clients,
        "strategy.clients_per_round": clients,
        "strategy.min_clients": clients,
        "storage.url": f"sqlite:///{(workdir / 'run.db').resolve()}",
        "storage.checkpoints": str((workdir / "checkpoints").resolve()),
        "storage.keep_checkpoints": 1,
        "evaluation.every": 0,
        "compression.up": config.up,
        "compression.down": [],
        "compression.error_feedback": config.error_feedback,
    }
    if config.min_bytes is not None:
        values["compression.min_bytes"] = config.min_bytes
    if max_train_samples > 0:
        values["simulation.node_config.max-train-samples"] = max_train_samples
    args: list[str] = []
    for key, value in values.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def rounds_to_reach(accuracies: Sequence[float | None], target: float) -> int | None:
    """First round (1-based) whose accuracy is at least ``target``; None if never."""
    for number, accuracy in enumerate(accuracies, start=1):
        if accuracy is not None and accuracy >= target:
            return number
    return None


def summarize(run: Mapping[str, Any], target: float = ACCURACY_TARGET) -> dict[str, Any]:
    """Per-round rows and the headline figures of one ``geofl runs show --json`` document."""
    rounds = sorted(run["rounds"], key=lambda r: int(r["number"]))
    rows, cumulative, cumulative_raw = [], 0, 0
    for record in rounds:
        cumulative += int(record["bytes_up"] or 0)
        cumulative_raw += int(record["bytes_up_raw"] or 0)
        accuracy = (record.get("server_eval_metrics") or {}).get("accuracy")
        rows.append(
            {
                "round": int(record["number"]),
                "status": record["status"],
                "accuracy": None if accuracy is None else float(accuracy),
                "bytes_up": int(record["bytes_up"] or 0),
                "bytes_up_raw": int(record["bytes_up_raw"] or 0),
                "cum_bytes_up": cumulative,
                "clients_ok": record["num_succeeded"],
                "duration_s": record["duration_s"],
            }
        )
    accuracies = [row["accuracy"] for row in rows]
    wire = cumulative / len(rows) if rows else 0.0
    return {
        "rounds": rows,
        "bytes_up_per_round": wire,
        "bytes_up_raw_per_round": cumulative_raw / len(rows) if rows else 0.0,
        "ratio": cumulative_raw / cumulative if cumulative else None,
        "final_accuracy": accuracies[-1] if accuracies else None,
        "rounds_to_target": rounds_to_reach(accuracies, target),
    }


def check_targets(
    configs: Mapping[str, Mapping[str, Any]], throughput: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, Any]]:
    """Each configuration against the issue's targets, relative to the ``none`` run.

    Bytes: uncompressed wire bytes / this config's wire bytes >= 50 with a final accuracy at
    most 1 point below uncompressed.  Throughput: encode + decode >= 200 MB/s, for quantizers.
    """
    base = configs.get("none", {})
    out: dict[str, dict[str, Any]] = {}
    for label, result in configs.items():
        row: dict[str, Any] = {}
        spec = CONFIGS.get(label) or EXTRA_CONFIGS.get(label)
        if "error" not in result and "error" not in base and base:
            reduction = base["bytes_up_per_round"] / result["bytes_up_per_round"]
            loss_pp = 100.0 * (base["final_accuracy"] - result["final_accuracy"])
            row.update(reduction_vs_none=reduction, accuracy_loss_pp=loss_pp)
            row["bytes_and_accuracy_met"] = (
                reduction >= BYTES_TARGET and loss_pp <= ACCURACY_LOSS_PP
            )
        if spec is not None and spec.quantizer and spec.throughput_case in throughput:
            speed = throughput[spec.throughput_case]["roundtrip_mb_s"]
            row["throughput_met"] = speed >= THROUGHPUT_TARGET
        out[label] = row
    return out


def plot(configs: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Server accuracy after each round against cumulative upload bytes (log x).

    Two panels: every round, and a zoom on 80-90 % where the codecs differ.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 2, figsize=(13, 5.5), dpi=110)
    for panel, zoom in zip(panels, (False, True), strict=True):
        _draw_panel(panel, configs)
        if zoom:
            panel.set_ylim(0.80, 0.90)
            panel.set_title("zoom: 80-90 %")
        else:
            panel.set_title("Fashion-MNIST, 10 non-IID clients: accuracy vs upload bytes")
            panel.legend(loc="lower right", fontsize=8, title="config (raw/wire)")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _draw_panel(axes: Any, configs: Mapping[str, Mapping[str, Any]]) -> None:
    """One line per successful configuration, the 85 % target, log x, grid."""
    markers = "os^vD<>ph*"
    for index, (label, result) in enumerate(configs.items()):
        if "error" in result:
            continue
        rows = [r for r in result["rounds"] if r["accuracy"] is not None]
        xs = [r["cum_bytes_up"] / 1e6 for r in rows]
        ys = [r["accuracy"] for r in rows]
        name = f"{label} ({result['ratio']:.0f}x)"
        axes.plot(xs, ys, marker=markers[index % len(markers)], markersize=4, label=name)
    axes.axhline(ACCURACY_TARGET, color="grey", linestyle=":", linewidth=1, label="85 %")
    axes.set_xscale("log")
    axes.set_xlabel("cumulative upload bytes, all clients (MB, log scale)")
    axes.set_ylabel("server test accuracy (10k images)")
    axes.grid(True, which="both", alpha=0.3)


def _geofl() -> str:
    """The ``geofl`` script of the running interpreter's environment."""
    return str(Path(sys.executable).parent / "geofl")


def _child_env() -> dict[str, str]:
    """Our environment with the caller's BLAS thread settings put back."""
    env = dict(os.environ)
    for var, value in _ORIGINAL_ENV.items():
        if value is None:
            env.pop(var, None)
        else:
            env[var] = value
    env.pop("MKL_NUM_THREADS", None)
    return env


def run_config(label: str, config: CodecConfig, args: argparse.Namespace) -> dict[str, Any]:
    """One ``geofl simulate`` under the lock; the summary, or the error and log tail."""
    with tempfile.TemporaryDirectory(prefix="geofl-compression-") as tmp:
        workdir = Path(tmp)
        command = [_geofl(), "simulate", "-c", RUN_YAML]
        command += overrides(config, args.rounds, args.clients, workdir, args.max_train_samples)
        log = workdir / "simulate.log"
        start = time.monotonic()
        with heavy_lock(), log.open("w") as out:
            load = os.getloadavg()[0]
            code = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                timeout=args.timeout,
                check=False,
            ).returncode
        elapsed = time.monotonic() - start
        meta = {"command": " ".join(command[1:]), "wall_s": elapsed, "load_before": load}
        tail = log.read_text(errors="replace").splitlines()[-20:]
        if code != 0:
            return {**meta, "error": f"geofl simulate exited {code}", "log_tail": tail}
        shown = subprocess.run(
            [_geofl(), "runs", "show", "1", "--db", f"sqlite:///{workdir / 'run.db'}", "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if shown.returncode != 0:
            return {**meta, "error": f"geofl runs show failed: {shown.stderr.strip()}"}
        summary = summarize(json.loads(shown.stdout))
        if len(summary["rounds"]) != args.rounds:
            summary["error"] = f"{len(summary['rounds'])} of {args.rounds} rounds recorded"
        return {**meta, "up": config.up, "error_feedback": config.error_feedback, **summary}


def measure_throughput(cases: Sequence[str], elements: int, repeats: int) -> dict[str, Any]:
    """Encode/decode MB/s of each case on one core, under the lock (1000-row matrix)."""
    rows = 1000 if elements % 1000 == 0 else 1
    tensor = np.random.default_rng(0).standard_normal(elements, dtype=np.float32)
    tensor = tensor.reshape(rows, -1)
    with heavy_lock():
        return {case: measure(parse_chain(CASES[case]), tensor, repeats) for case in cases}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated, of {', '.join([*CONFIGS, *EXTRA_CONFIGS])}",
    )
    parser.add_argument("--max-train-samples", type=int, default=0, help="0 = all")
    parser.add_argument("--elements", type=int, default=10_000_000, help="throughput tensor")
    parser.add_argument("--repeats", type=int, default=5, help="throughput repeats")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/compression.json"))
    parser.add_argument("--png", type=Path, default=None, help="also draw the plot here")
    parser.add_argument("--plot-only", action="store_true", help="redraw --png from --out")
    args = parser.parse_args(argv)
    known = {**CONFIGS, **EXTRA_CONFIGS}
    unknown = [c for c in args.configs.split(",") if c not in known]
    if unknown:
        parser.error(f"unknown configs {unknown}; allowed: {', '.join(known)}")
    return args


def _print_table(doc: Mapping[str, Any]) -> None:
    print(
        f"{'config':<18}{'KB up/round':>12}{'raw/wire':>9}{'final acc':>10}"
        f"{'to 85%':>8}{'enc+dec MB/s':>14}"
    )
    for label, result in doc["configs"].items():
        if "error" in result:
            print(f"{label:<18}ERROR: {result['error']}")
            continue
        case = (CONFIGS.get(label) or EXTRA_CONFIGS[label]).throughput_case
        speed = doc["throughput"].get(case, {}).get("roundtrip_mb_s", float("nan"))
        reach = result["rounds_to_target"] or "never"
        print(
            f"{label:<18}{result['bytes_up_per_round'] / 1e3:>12.1f}{result['ratio']:>9.1f}"
            f"{result['final_accuracy']:>10.4f}{reach!s:>8}{speed:>14.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run every configuration, write the JSON after each one, then plot and print."""
    args = _parse_args(argv)
    if args.plot_only:
        if args.png is None:
            raise SystemExit("--plot-only needs --png")
        plot(json.loads(args.out.read_text())["configs"], args.png)
        return 0
    labels = args.configs.split(",")
    specs = {label: {**CONFIGS, **EXTRA_CONFIGS}[label] for label in labels}
    doc: dict[str, Any] = {
        "argv": sys.argv,
        "yaml": RUN_YAML,
        "rounds": args.rounds,
        "clients": args.clients,
        "max_train_samples": args.max_train_samples,
        "started": time.strftime("%FT%TZ", time.gmtime()),
        "throughput": measure_throughput(
            sorted({s.throughput_case for s in specs.values()}), args.elements, args.repeats
        ),
        "configs": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for label, spec in specs.items():
        print(f"running {label} ...", flush=True)
        doc["configs"][label] = run_config(label, spec, args)
        doc["targets"] = check_targets(doc["configs"], doc["throughput"])
        args.out.write_text(json.dumps(doc, indent=2))
    doc["finished"] = time.strftime("%FT%TZ", time.gmtime())
    args.out.write_text(json.dumps(doc, indent=2))
    if args.png is not None:
        plot(doc["configs"], args.png)
    _print_table(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
