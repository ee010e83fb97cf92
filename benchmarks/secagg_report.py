"""The secure-aggregation comparison as Markdown: geofl and Flower side by side.

Reads the records of :mod:`benchmarks.secagg_geofl` and :mod:`benchmarks.secagg` (Flower)
and prints three tables:

1. per case (mode, n, d, dropout): seconds per steady round of geofl plain, geofl secure
   (``matched``: Flower's 5 shares / threshold 3) and geofl secure with its ``auto`` degree,
   each secure/plain ratio; Flower plain and SecAgg+; Flower-secure / geofl-secure; upload
   bytes per client (the masked upload against the plain one); key-exchange bytes per client;
   peak RSS of the secure runs;
2. key-exchange bytes per client against n, per geofl graph (``auto`` grows with log n,
   ``full`` with n) next to Flower's;
3. the phases of geofl's rounds (median seconds over the steady rounds).

Key exchange means the advertise, share and unmask stages, both ways: for geofl the uploads
are measured and the downloads computed (see ``stage_task_bytes``); for Flower both are its
payload counts of the setup, share_keys and unmask exchanges. The encrypted shares that ride
on the masked-fit message (geofl) or the collect_masked_vectors message (Flower) are not in
it. A failed case shows ``failed``, a missing one ``-``.

Usage::

    python -m benchmarks.secagg_report [--geofl PATH] [--flower PATH]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "FLOWER_KEY_STAGES",
    "flower_key_exchange_bytes",
    "geofl_key_exchange_bytes",
    "load_cases",
    "main",
    "render",
]

Record = Mapping[str, Any]
#: Flower's SecAgg+ stages that make up the key exchange.
FLOWER_KEY_STAGES = ("setup", "share_keys", "unmask")
_PHASES = ("select", "advertise", "share", "broadcast", "fit", "unmask", "aggregate", "evaluate")
_RESULTS = Path("benchmarks/results")


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The records of one results file; none when the file does not exist yet."""
    if not path.exists():
        return []
    cases = json.loads(path.read_text())["cases"]
    if not isinstance(cases, list):
        raise ValueError(f"{path}: 'cases' is not a list")
    return cases


def geofl_key_exchange_bytes(record: Record) -> float | None:
    """Advertise + share + unmask bytes per client and round: uploads plus computed downloads."""
    notes = record.get("notes", {})
    up, down = notes.get("key_exchange_up_bytes"), notes.get("key_exchange_down_bytes")
    return None if up is None or down is None else float(up) + float(down)


def flower_key_exchange_bytes(record: Record) -> float | None:
    """Setup + share_keys + unmask payload per client: one message down, one reply up each."""
    notes = record.get("notes", {})
    down = notes.get("stage_down_bytes_per_message", {})
    up = notes.get("stage_up_bytes_per_reply", {})
    if not all(s in down and s in up for s in FLOWER_KEY_STAGES):
        return None
    return sum(float(down[s]) + float(up[s]) for s in FLOWER_KEY_STAGES)


def _fit_up(record: Record) -> float | None:
    value = record.get("notes", {}).get("bytes_per_client_by_kind", {}).get("fit", {}).get("up")
    return None if value is None else float(value)


def _variant(record: Record) -> str:
    return str(record.get("settings", {}).get("variant", "plain" if not record["secure"] else ""))


def _case(record: Record) -> tuple[str, int, int, float]:
    return (str(record["mode"]), int(record["n"]), int(record["d"]), float(record["dropout"]))


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or bottom is None or bottom == 0 else top / bottom


class _Lookup:
    """The records of both systems by case and variant (a re-run keeps the last)."""

    def __init__(self, geofl: Sequence[Record], flower: Sequence[Record]) -> None:
        self.geofl = {(*_case(r), _variant(r)): r for r in geofl}
        self.flower = {(*_case(r), bool(r["secure"])): r for r in flower}

    def g(self, case: tuple[str, int, int, float], variant: str) -> Record | None:
        return self.geofl.get((*case, variant))

    def f(self, case: tuple[str, int, int, float], secure: bool) -> Record | None:
        return self.flower.get((*case, secure))


def _cell(record: Record | None, value: Callable[[Record], float | None], spec: str) -> str:
    if record is None:
        return "-"
    if not record.get("ok", False):
        return "failed"
    return _num(value(record), spec)


def _ok(record: Record | None, value: Callable[[Record], float | None]) -> float | None:
    return value(record) if record is not None and record.get("ok", False) else None


def _steady(record: Record) -> float | None:
    value = record.get("steady_round_s")
    return None if value is None else float(value)


def _peak(record: Record) -> float | None:
    value = record.get("peak_rss_mb")
    return None if value is None else float(value)


def _times_row(case: tuple[str, int, int, float], look: _Lookup) -> list[str]:
    plain, secure, auto = look.g(case, "plain"), look.g(case, "matched"), look.g(case, "auto")
    f_plain, f_secure = look.f(case, False), look.f(case, True)
    g_plain_s, g_secure_s = _ok(plain, _steady), _ok(secure, _steady)
    masked, plain_up = _ok(secure, _fit_up), _ok(plain, _fit_up)
    up_ratio = _num(_ratio(masked, plain_up), ".2f")
    return [
        case[0],
        str(case[1]),
        f"{case[2]:.0e}",
        f"{case[3]:.0%}",
        _cell(plain, _steady, ".3f"),
        _cell(secure, _steady, ".3f"),
        _num(_ratio(g_secure_s, g_plain_s), ".2f"),
        _cell(auto, _steady, ".3f"),
        _num(_ratio(_ok(auto, _steady), g_plain_s), ".2f"),
        _cell(f_plain, _steady, ".3f"),
        _cell(f_secure, _steady, ".3f"),
        _num(_ratio(_ok(f_secure, _steady), g_secure_s), ".1f"),
        f"{_num(masked, ',.0f')} / {_num(plain_up, ',.0f')} ({up_ratio})",
        f"{_cell(secure, geofl_key_exchange_bytes, ',.0f')} / "
        f"{_cell(f_secure, flower_key_exchange_bytes, ',.0f')}",
        f"{_cell(secure, _peak, '.0f')} / {_cell(f_secure, _peak, '.0f')}",
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _times_table(look: _Lookup) -> list[str]:
    cases = sorted({k[:4] for k in look.geofl} | {k[:4] for k in look.flower})
    header = [
        "mode",
        "n",
        "d",
        "drop",
        "geofl plain s",
        "geofl secure s",
        "sec/plain",
        "geofl auto s",
        "auto/plain",
        "Flower plain s",
        "Flower SecAgg+ s",
        "Flower sec / geofl sec",
        "geofl up B/client masked / plain (x)",
        "key exch. B/client geofl / Flower",
        "peak RSS MB geofl sec / Flower sec",
    ]
    return _table(header, [_times_row(c, look) for c in cases])


def _key_rows(look: _Lookup) -> list[list[str]]:
    rows = []
    for key, record in sorted(look.geofl.items(), key=lambda kv: (kv[0][4], kv[0][:4])):
        if key[4] == "plain" or key[3] != 0.0:
            continue
        settings, notes = record.get("settings", {}), record.get("notes", {})
        flower = look.f(key[:4], True)
        rows.append(
            [
                key[4],
                key[0],
                str(key[1]),
                f"{key[2]:.0e}",
                str(settings.get("holders", "-")),
                str(settings.get("reconstruct_threshold", "-")),
                _num(notes.get("key_exchange_up_bytes"), ",.0f"),
                _num(notes.get("key_exchange_down_bytes"), ",.0f"),
                _cell(record, geofl_key_exchange_bytes, ",.0f"),
                _cell(flower, flower_key_exchange_bytes, ",.0f"),
            ]
        )
    return rows


def _phase_rows(look: _Lookup) -> list[list[str]]:
    rows = []
    for key, record in sorted(look.geofl.items()):
        phases = record.get("notes", {}).get("phase_s", {})
        compute = record.get("notes", {}).get("client_compute_s", {})
        cells = [_num(phases.get(p), ".3f") for p in _PHASES]
        fit_compute = _num(compute.get("fit"), ".3f")
        rows.append(
            [key[0], str(key[1]), f"{key[2]:.0e}", f"{key[3]:.0%}", key[4], *cells, fit_compute]
        )
    return rows


def render(geofl: Sequence[Record], flower: Sequence[Record]) -> str:
    """The three Markdown tables (see the module docstring)."""
    look = _Lookup(geofl, flower)
    key_header = [
        "geofl graph",
        "mode",
        "n",
        "d",
        "holders",
        "threshold",
        "up B (measured)",
        "down B (computed)",
        "geofl total B",
        "Flower total B",
    ]
    phase_header = ["mode", "n", "d", "drop", "variant", *_PHASES, "client fit compute s"]
    lines = [
        "### Seconds per steady round (median of rounds 2..R), bytes per client and round",
        "",
        *_times_table(look),
        "",
        "### Key exchange (advertise/setup + share + unmask, both ways) per client and round",
        "",
        *_table(key_header, _key_rows(look)),
        "",
        "### geofl round phases, median seconds over the steady rounds",
        "",
        *_table(phase_header, _phase_rows(look)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Print the report for the two results files."""
    parser = argparse.ArgumentParser(description="geofl vs Flower secure-aggregation tables")
    parser.add_argument("--geofl", type=Path, default=_RESULTS / "secagg_geofl.json")
    parser.add_argument("--flower", type=Path, default=_RESULTS / "secagg_flower.json")
    args = parser.parse_args(argv)
    flower = [r for r in load_cases(args.flower) if r.get("system") == "flower"]
    print(render(load_cases(args.geofl), flower), end="")


if __name__ == "__main__":
    main()
