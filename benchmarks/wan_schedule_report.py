"""Summary, table and plot of :mod:`benchmarks.wan_schedule`'s report.

The report is the benchmark's JSON document: ``spec`` (the workload), ``setup`` (deadlines,
initial accuracy), ``scenarios`` (one record per configuration, with its :class:`Curve`
where it ran) and ``summary`` (:func:`summarize`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.wan_schedule_runs import Curve

__all__ = [
    "ACCURACY_SLACK",
    "FINAL_WINDOW",
    "SPEEDUP_TARGET",
    "plot",
    "render_markdown",
    "scenario_summary",
    "summarize",
]

#: The issue's targets: the best geofl configuration reaches the accuracy target at least
#: this many times sooner than plain FedAvg ...
SPEEDUP_TARGET = 5.0
#: ... with a final accuracy at most this much lower.
ACCURACY_SLACK = 0.01
#: Final accuracy: the mean of the last this many evaluations (one is noisy, about +-1 pt).
FINAL_WINDOW = 3


# ---------------------------------------------------------------- summary


def scenario_summary(record: Mapping[str, Any], target: float) -> dict[str, Any]:
    """One table row: the record's identity, and its curve's summary where it ran."""
    row = {key: record.get(key) for key in ("name", "label", "system", "available", "reason")}
    curve = record.get("curve")
    if not record.get("available") or curve is None:
        return row | {"error": record.get("error")}
    return row | Curve.from_dict(curve).summary(target, FINAL_WINDOW)


def summarize(records: Sequence[Mapping[str, Any]], target: float) -> dict[str, Any]:
    """Per-scenario figures, speed-ups against plain FedAvg, and the issue's target.

    The target: a geofl configuration (plain FedAvg and Flower excluded) reaches
    ``target`` at least :data:`SPEEDUP_TARGET` times sooner than plain FedAvg with a final
    accuracy at most :data:`ACCURACY_SLACK` below it. It is judged on the soonest of the
    configurations within that accuracy (the soonest of all if none is); None where it
    cannot be judged (plain FedAvg or every candidate never reached the target).
    """
    rows = [scenario_summary(record, target) for record in records]
    plain = next((r for r in rows if r["name"] == "fedavg"), None)
    base_t = plain.get("time_to_target_s") if plain else None
    for row in rows:
        t = row.get("time_to_target_s")
        row["speedup"] = base_t / t if base_t and t else None
    candidates = [
        r
        for r in rows
        if r["system"] == "geofl" and r["name"] != "fedavg" and r.get("time_to_target_s")
    ]
    if plain is None or not base_t or not candidates:
        return {"rows": rows, "target": {"best": None, "met": None}}
    for row in candidates:
        row["accuracy_drop"] = plain["final_accuracy"] - row["final_accuracy"]
    within = [r for r in candidates if r["accuracy_drop"] <= ACCURACY_SLACK]
    best = min(within or candidates, key=lambda r: r["time_to_target_s"])
    verdict = {
        "best": best["name"],
        "speedup": best["speedup"],
        "accuracy_drop": best["accuracy_drop"],
        "met": best["speedup"] >= SPEEDUP_TARGET and best["accuracy_drop"] <= ACCURACY_SLACK,
    }
    return {"rows": rows, "target": verdict}


def _fmt(value: object, spec: str) -> str:
    if value is None:
        return "\u2013"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def render_markdown(report: Mapping[str, Any]) -> str:
    """The summary table and the verdict, as in ``benchmarks/README.md``."""
    spec, summary = report["spec"], report["summary"]
    lines = [
        f"{spec['clients']} clients, {spec['per_round']} per round, up to {spec['rounds']} "
        f"rounds, target {spec['target']:.0%}, deadlines {report['setup']['deadline_s']:.2f} s "
        f"(epochs), {report['setup']['diloco_deadline_s']:.2f} s (DiLoCo steps)",
        "",
        "| configuration | time to target (s) | rounds to target | speed-up | held 3 evals (s) "
        "| final acc. | best acc. | WAN MB to target | WAN MB total | rounds run | simulated s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        if not row.get("available"):
            lines.append(f"| {row['label']} | not available: {row.get('reason')} |")
            continue
        if row.get("error"):
            lines.append(f"| {row['label']} | failed: {row['error'][:200]} |")
            continue
        cells = [
            row["label"],
            _fmt(row["time_to_target_s"], ".1f"),
            _fmt(row["rounds_to_target"], "d"),
            _fmt(row["speedup"], ".2f"),
            _fmt(row["time_to_target_held_s"], ".1f"),
            _fmt(row["final_accuracy"], ".4f"),
            _fmt(row["best_accuracy"], ".4f"),
            _fmt(_mb(row["bytes_to_target"]), ".1f"),
            _fmt(_mb(row["bytes_total"]), ".1f"),
            _fmt(row["rounds_run"], "d"),
            _fmt(row["duration_s"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    verdict = summary["target"]
    lines += ["", f"Target (>= {SPEEDUP_TARGET:g}x sooner, <= 1 pt lower): {verdict}"]
    return "\n".join(lines) + "\n"


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 1e6


# ---------------------------------------------------------------- plot


def plot(report: Mapping[str, Any], png: Path) -> None:
    """Accuracy against simulated seconds, one line per configuration that ran.

    Left: the whole runs; right: the approach to the target, each configuration's time to
    it marked.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, target = report["spec"], report["spec"]["target"]
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(13, 5.2))
    # More rows than the default cycle's ten colours: tab20 keeps every line distinct.
    colours = plt.get_cmap("tab20")
    for index, record in enumerate(r for r in report["scenarios"] if r.get("curve")):
        curve = Curve.from_dict(record["curve"])
        times, accuracy = curve.points(report["setup"]["initial_accuracy"])
        style = "--" if record["system"] == "flower" else "-"
        colour = colours((2 * index) % 20 + (2 * index) // 20)  # dark shades, then light
        for ax in (whole, zoom):
            ax.plot(times, accuracy, style, color=colour, label=record["label"], linewidth=1.2)
        hit = curve.first_at_least(target)
        if hit is not None:
            zoom.plot(curve.times[hit], curve.accuracy[hit], "o", color=colour)
    limit = max(
        (
            row["time_to_target_s"]
            for row in report["summary"]["rows"]
            if row.get("time_to_target_s") is not None
        ),
        default=100.0,
    )
    zoom.set_xlim(0, 1.4 * limit)
    zoom.set_ylim(target - 0.12, target + 0.06)
    whole.set_ylim(0.4, 0.92)
    for ax in (whole, zoom):
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("simulated seconds (Flower: computed from the link model)")
        ax.grid(True, linewidth=0.3)
    whole.set_ylabel("test accuracy (10,000 images)")
    whole.set_title(
        f"Fashion-MNIST CNN, {spec['clients']} clients ({spec['per_round']} per round), "
        "3-region WAN"
    )
    zoom.set_title(f"to {target:.0%} (dots: first evaluation at or above it)")
    whole.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
