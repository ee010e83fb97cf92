"""Client traces in FedScale's content: JSON and CSV parsing, availability, the converter."""

from __future__ import annotations

import ast
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geofl.server.simulation.traces import (
    Availability,
    TraceError,
    load_trace,
    main,
    parse_trace,
)

DAY = 86400
SAMPLE: dict[str, Any] = {
    "format": "geofl-client-trace",
    "version": 1,
    "device_capacity": {
        "1": {"computation": 20.0, "communication": 5000.0},
        "2": {"computation": 50, "communication": 800.5},
    },
    "behave_trace": {
        "7": {
            "active": [0, 7200],
            "inactive": [3600, 9000],
            "finish_time": DAY,
            "duration": DAY,
            "model": "Pixel 3",
        },
        "8": {"active": [100], "inactive": [200]},
    },
}


def _write(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_json_sample_parses_into_speeds_and_windows(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "t.json", SAMPLE))
    assert [cid for cid, _ in trace.capacities] == ["1", "2"]
    first = trace.for_client(0)
    assert first.samples_per_s == pytest.approx(1000 / (3 * 20.0))
    assert first.bandwidth_bps == pytest.approx(5000 * 1024)
    assert first.availability is not None
    assert first.availability.windows == [(0, 3600), (7200, 9000)]
    assert first.availability.period_s == DAY
    # Cycling in file order, each table on its own.
    assert trace.for_client(1).capacity == trace.capacities[1][1]
    assert trace.for_client(2).capacity == trace.capacities[0][1]
    assert trace.for_client(1).availability == trace.behaviours[1][1]
    assert len(trace.for_clients(5)) == 5
    with pytest.raises(ValueError, match="client index must be >= 0"):
        trace.for_client(-1)


def test_availability_is_half_open_and_periodic() -> None:
    windows = Availability.from_windows([(0, 3600), (7200, 9000)], period_s=DAY)
    assert windows.available_at(0) and windows.available_at(3599.9)
    assert not windows.available_at(3600) and not windows.available_at(5000)
    assert windows.available_at(DAY + 100) and windows.available_at(3 * DAY + 8000)
    assert windows.available_until(100) == 3600
    assert windows.available_until(DAY + 7300) == DAY + 9000
    assert windows.available_until(5000) == 5000
    absolute = Availability.from_windows([(10, 20)])
    assert not absolute.available_at(DAY + 15) and absolute.available_at(15)


def test_windows_are_merged_clipped_and_wrapped() -> None:
    merged = Availability.from_windows([(50, 80), (0, 60), (90, 90)], period_s=100)
    assert merged.windows == [(0, 80)]
    clipped = Availability.from_windows([(80, 150), (120, 130)], period_s=100)
    assert clipped.windows == [(80, 100)]
    wrapping = Availability.from_windows([(0, 10), (90, 100)], period_s=100)
    assert wrapping.available_until(95) == 110
    assert wrapping.available_until(195) == 210
    always = Availability.from_windows([(0, 100)], period_s=100)
    assert always.available_until(42) == math.inf


@st.composite
def availabilities(draw: st.DrawFn) -> Availability:
    period = draw(st.one_of(st.none(), st.integers(10, 1000)))
    top = period or 1000
    points = draw(st.lists(st.integers(0, top), min_size=0, max_size=12))
    pairs = [(float(a), float(b)) for a, b in zip(points[::2], points[1::2], strict=False)]
    return Availability.from_windows(
        [(min(p), max(p)) for p in pairs], None if period is None else float(period)
    )


@given(availability=availabilities(), t=st.floats(0, 5000), step=st.floats(0, 1))
def test_available_until_is_consistent_with_available_at(
    availability: Availability, t: float, step: float
) -> None:
    until = availability.available_until(t)
    if not availability.available_at(t):
        assert until == t
        return
    assert until > t
    if math.isfinite(until):
        inside = t + step * (until - t)
        assert inside == until or availability.available_at(inside)
        assert not availability.available_at(until)
    starts, ends = availability.starts, availability.ends
    assert list(starts) == sorted(starts)
    assert all(s < e for s, e in zip(starts, ends, strict=True))
    assert all(e < s for e, s in zip(ends, starts[1:], strict=False))


CSV = """client_id,computation,communication,active,inactive,finish_time
1,20.0,5000,,,
2,50,800.5,,,
7,,,0 7200,3600 9000,86400
8,,,100,200,
"""


def test_csv_holds_the_same_content(tmp_path: Path) -> None:
    from_csv = load_trace(_write(tmp_path, "t.csv", CSV))
    from_json = load_trace(_write(tmp_path, "t.json", SAMPLE))
    assert from_csv.capacities == from_json.capacities
    assert from_csv.behaviours == from_json.behaviours


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"device_capacity": {"3": {"computation": 1, "communication": -2}}},
            "client '3': communication: must be > 0, got -2",
        ),
        (
            {"device_capacity": {"3": {"computation": True, "communication": 2}}},
            "client '3': computation: expected a finite number, got True",
        ),
        ({"device_capacity": {"3": {"computation": 1}}}, "client '3': communication: missing"),
        (
            {"device_capacity": {"3": {"computation": 1, "communication": 2, "speed": 1}}},
            "client '3': speed: unknown field",
        ),
        ({"device_capacity": {"3": [1, 2]}}, "client '3': expected a mapping"),
        (
            {"behave_trace": {"9": {"active": [0, 5], "inactive": [3]}}},
            "client '9': inactive: has 1 times but active has 2",
        ),
        (
            {"behave_trace": {"9": {"active": [5], "inactive": [3]}}},
            "client '9': active\\[0\\]: 5 is after inactive 3",
        ),
        ({"behave_trace": {"9": {"inactive": [3]}}}, "client '9': active: missing"),
        (
            {"behave_trace": {"9": {"active": "0", "inactive": [3]}}},
            "client '9': active: expected a list of seconds",
        ),
        (
            {"behave_trace": {"9": {"active": [0], "inactive": [3], "finish_time": 0}}},
            "client '9': finish_time: must be > 0",
        ),
        (
            {"behave_trace": {"9": {"active": [0], "inactive": [3], "model": 7}}},
            "client '9': model: expected a string",
        ),
        ({"format": "fedscale"}, 'expected "format": "geofl-client-trace"'),
        ({"clients": {}}, "clients: unknown key"),
        ({"device_capacity": {}, "behave_trace": {}}, "holds no clients"),
        ({"behave_trace": [1]}, "behave_trace: expected a mapping of client id"),
    ],
)
def test_bad_entries_name_the_file_client_and_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path, "bad.json", {**SAMPLE, **change})
    with pytest.raises(TraceError, match=message) as caught:
        load_trace(path)
    assert str(caught.value).startswith(str(path))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("t.json", "{nope", "not JSON: Expecting property name"),
        ("t.json", '{"format": 1, "format": 2}', "duplicate key 'format'"),
        ("t.json", "[1, 2]", "expected a mapping, got list"),
        ("t.csv", "id,computation\n1,2\n", "CSV columns must be client_id"),
        (
            "t.csv",
            "client_id,computation,communication\n1,fast,2\n",
            "client '1': computation: expected a number, got 'fast'",
        ),
        (
            "t.csv",
            "client_id,computation,communication\n1,2,3\n1,2,3\n",
            "line 3: missing or repeated client_id '1'",
        ),
        ("t.csv", "client_id,computation,communication\n1,,\n", "client '1': row gives neither"),
        ("t.csv", "client_id,finish_time\n1,10\n", "client '1': active: missing"),
        ("client_behave_trace", "x", "convert IN.pkl OUT.json --trust-pickle"),
        ("t.pkl", "x", "geofl never unpickles"),
    ],
)
def test_unreadable_files_are_named(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = _write(tmp_path, name, content)
    with pytest.raises(TraceError, match=message) as caught:
        load_trace(path)
    assert str(caught.value).startswith(str(path))


def test_binary_and_missing_files(tmp_path: Path) -> None:
    binary = tmp_path / "t.json"
    binary.write_bytes(b"\x80\x04\x95")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        load_trace(binary)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.json")
    with pytest.raises(TraceError, match="<doc>: expected a mapping"):
        parse_trace(None, "<doc>")


def _fedscale_pickles(tmp_path: Path) -> tuple[Path, Path]:
    """Files shaped like FedScale's: int keys, a field geofl does not read."""
    capacity = {
        1: {"computation": 20.0, "communication": 5000.0},
        2: {"computation": 50, "communication": 800.5},
    }
    behaviour = {
        7: {
            "active": [0, 7200],
            "inactive": [3600, 9000],
            "finish_time": DAY,
            "duration": DAY,
            "model": "Pixel 3",
            "battery": [1, 2],
        }
    }
    paths = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    for path, table in zip(paths, (capacity, behaviour), strict=True):
        path.write_bytes(pickle.dumps(table))
    return paths


def test_converter_refuses_without_trust(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capacity, behaviour = _fedscale_pickles(tmp_path)
    out = tmp_path / "trace.json"
    assert main(["convert", str(capacity), str(behaviour), str(out)]) == 2
    assert not out.exists()
    assert "refusing to unpickle" in capsys.readouterr().err


def test_converter_merges_trusted_pickles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capacity, behaviour = _fedscale_pickles(tmp_path)
    out = tmp_path / "trace.json"
    assert main(["convert", str(capacity), str(behaviour), str(out), "--trust-pickle"]) == 0
    streams = capsys.readouterr()
    assert "warning: unpickling" in streams.err
    assert "dropped fields geofl does not read: ['battery']" in streams.err
    assert "1 availability entries" in streams.out
    converted = load_trace(out)
    expected = load_trace(
        _write(
            tmp_path,
            "expected.json",
            {**SAMPLE, "behave_trace": {"7": SAMPLE["behave_trace"]["7"]}},
        )
    )
    assert converted.capacities == expected.capacities
    assert converted.behaviours == expected.behaviours


def test_converter_reports_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capacity, _ = _fedscale_pickles(tmp_path)
    out = tmp_path / "trace.json"
    args = ["--trust-pickle"]
    assert main(["convert", str(capacity), str(capacity), str(out), *args]) == 1
    assert "a second device_capacity table" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.write_bytes(pickle.dumps({1: {"computation": -1, "communication": 3}}))
    assert main(["convert", str(broken), str(out), *args]) == 1
    assert "client '1': computation: must be > 0" in capsys.readouterr().err
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a pickle")
    assert main(["convert", str(garbage), str(out), *args]) == 1
    assert "cannot unpickle" in capsys.readouterr().err
    other = tmp_path / "other"
    other.write_bytes(pickle.dumps({1: {"x": 1}}))
    assert main(["convert", str(other), str(out), *args]) == 1
    assert "neither a FedScale capacity trace" in capsys.readouterr().err
    assert main(["convert", str(capacity), str(tmp_path / "t.yaml"), *args]) == 1
    assert not out.exists()


def test_converter_runs_as_a_module(tmp_path: Path) -> None:
    capacity, _ = _fedscale_pickles(tmp_path)
    out = tmp_path / "trace.json"
    command = [
        sys.executable,
        "-m",
        "geofl.server.simulation.traces",
        "convert",
        str(capacity),
        str(out),
        "--trust-pickle",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" not in result.stderr
    assert len(load_trace(out).capacities) == 2


def test_only_the_converter_imports_pickle() -> None:
    package = Path(__file__).resolve().parents[2] / "server" / "simulation"
    importers = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] in ("pickle", "cPickle", "dill") for name in names):
                importers.add(path.name)
    assert importers == {"fedscale.py"}
