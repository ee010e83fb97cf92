"""geofl's client trace format: its entries, checked parsing, and reading JSON or CSV files.

Documented, with the FedScale facts it follows, in :mod:`geofl.server.simulation.traces`,
which exports these names and runs the converter from FedScale's pickles. They live here so
that the converter (:mod:`geofl.server.simulation.fedscale`) can use them without
importing ``traces`` back.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geofl.protocols.errors import GeoflError
from geofl.server.config.simulation import trace_suffix_problem

__all__ = [
    "BEHAVIOUR_FIELDS",
    "BITS_PER_KBIT",
    "CAPACITY_FIELDS",
    "FORMAT",
    "TRAINING_COST_FACTOR",
    "VERSION",
    "Availability",
    "ClientTrace",
    "DeviceCapacity",
    "TraceError",
    "TraceSet",
    "load_trace",
    "parse_trace",
]

FORMAT = "geofl-client-trace"
VERSION = 1
#: FedScale's ``augmentation_factor``: a training step costs 3 inferences.
TRAINING_COST_FACTOR = 3.0
#: FedScale's "kbit" is 1024 bits (sizes are ``bytes / 1024 * 8``).
BITS_PER_KBIT = 1024.0
_CAPACITY_KEYS = ("computation", "communication")
_BEHAVIOUR_KEYS = ("active", "inactive", "finish_time")
_IGNORED_KEYS = ("duration", "model")
#: Fields of a capacity entry and of a behaviour entry that a trace may hold.
CAPACITY_FIELDS = _CAPACITY_KEYS
BEHAVIOUR_FIELDS = (*_BEHAVIOUR_KEYS, *_IGNORED_KEYS)
_TABLES = ("device_capacity", "behave_trace")


class TraceError(GeoflError):
    """A trace file that cannot be used; the message names the file, client and field."""


@dataclass(frozen=True)
class DeviceCapacity:
    """One entry of FedScale's capacity trace, in its units."""

    computation_ms: float
    communication_kbps: float

    @property
    def samples_per_s(self) -> float:
        """Training samples per second: ``1000 / (3 * computation)``."""
        return 1000.0 / (TRAINING_COST_FACTOR * self.computation_ms)

    @property
    def bandwidth_bps(self) -> float:
        """Bandwidth in bit/s, the same up and down."""
        return self.communication_kbps * BITS_PER_KBIT


@dataclass(frozen=True)
class Availability:
    """When a client is online: disjoint, sorted windows ``[start, end)`` in seconds.

    With ``period_s`` the windows repeat every period (FedScale's ``finish_time``) and lie
    within ``[0, period_s)``; without it they are absolute and the client is offline after
    the last one.
    """

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    period_s: float | None = None

    @classmethod
    def from_windows(
        cls, windows: Iterable[tuple[float, float]], period_s: float | None = None
    ) -> Availability:
        """Clip windows to the period, drop empty ones, sort and merge overlaps."""
        limit = math.inf if period_s is None else period_s
        kept = sorted((s, min(e, limit)) for s, e in windows if s < min(e, limit))
        merged: list[list[float]] = []
        for start, end in kept:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return cls(tuple(w[0] for w in merged), tuple(w[1] for w in merged), period_s)

    @property
    def windows(self) -> list[tuple[float, float]]:
        """The windows as ``(start, end)`` pairs."""
        return list(zip(self.starts, self.ends, strict=True))

    def _window_at(self, local: float) -> int | None:
        index = bisect.bisect_right(self.starts, local) - 1
        return index if index >= 0 and local < self.ends[index] else None

    def _local(self, t: float) -> tuple[float, float]:
        """(start of the period holding ``t``, ``t`` within it)."""
        if self.period_s is None:
            return 0.0, t
        base = math.floor(t / self.period_s) * self.period_s
        return base, t - base

    def available_at(self, t: float) -> bool:
        """Whether the client is online at time ``t`` (seconds)."""
        return self._window_at(self._local(t)[1]) is not None

    def available_until(self, t: float) -> float:
        """When the client goes offline if online at ``t``; ``t`` itself if offline.

        A window that ends at the period's end and continues in one starting at 0 counts
        as one; ``inf`` if the client never goes offline.
        """
        base, local = self._local(t)
        index = self._window_at(local)
        if index is None:
            return t
        end = base + self.ends[index]
        if self.period_s is None or self.ends[index] < self.period_s:
            return end
        if self.starts[0] > 0:
            return end
        if len(self.starts) == 1:
            return math.inf  # one window covering the whole period
        return end + self.ends[0]


@dataclass(frozen=True)
class ClientTrace:
    """What a trace says about one simulated client; ``None`` where it says nothing."""

    capacity: DeviceCapacity | None
    availability: Availability | None

    @property
    def samples_per_s(self) -> float | None:
        """Training samples per second, if the trace gives a capacity."""
        return None if self.capacity is None else self.capacity.samples_per_s

    @property
    def bandwidth_bps(self) -> float | None:
        """Bandwidth in bit/s (up and down), if the trace gives a capacity."""
        return None if self.capacity is None else self.capacity.bandwidth_bps

    def available_at(self, t: float) -> bool:
        """Online at ``t``; always, when the trace gives no availability."""
        return self.availability is None or self.availability.available_at(t)


@dataclass(frozen=True)
class TraceSet:
    """A parsed trace file: ``(trace id, entry)`` pairs of each table, in file order."""

    source: str
    capacities: tuple[tuple[str, DeviceCapacity], ...]
    behaviours: tuple[tuple[str, Availability], ...]

    def for_client(self, client: int) -> ClientTrace:
        """Client ``client``'s entries, cycling through each table in file order."""
        if client < 0:
            raise ValueError(f"client index must be >= 0, got {client}")
        capacity = self.capacities[client % len(self.capacities)][1] if self.capacities else None
        behaviour = self.behaviours[client % len(self.behaviours)][1] if self.behaviours else None
        return ClientTrace(capacity, behaviour)

    def for_clients(self, num_clients: int) -> list[ClientTrace]:
        """Entries for clients ``0 .. num_clients - 1``."""
        return [self.for_client(client) for client in range(num_clients)]


def _problem(source: str, client: str | None, field: str | None, text: str) -> TraceError:
    where = [source] + ([f"client {client!r}"] if client is not None else [])
    return TraceError(": ".join([*where, *([field] if field else []), text]))


def _number(value: object, where: tuple[str, str | None, str], *, positive: bool) -> float:
    """A finite number, > 0 if ``positive`` else >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _problem(*where, f"expected a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise _problem(*where, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _times(value: object, where: tuple[str, str | None, str]) -> list[float]:
    if not isinstance(value, list):
        raise _problem(*where, f"expected a list of seconds, got {value!r}")
    return [_number(item, where, positive=False) for item in value]


def _entry(value: object, source: str, client: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _problem(source, client, None, f"expected a mapping, got {value!r}")
    unknown = [key for key in value if key not in allowed]
    if unknown:
        raise _problem(source, client, str(unknown[0]), f"unknown field; expected {allowed}")
    return value


def _capacity(value: object, source: str, client: str) -> DeviceCapacity:
    entry = _entry(value, source, client, _CAPACITY_KEYS)
    missing = [key for key in _CAPACITY_KEYS if key not in entry]
    if missing:
        raise _problem(source, client, missing[0], "missing")
    return DeviceCapacity(
        _number(entry["computation"], (source, client, "computation"), positive=True),
        _number(entry["communication"], (source, client, "communication"), positive=True),
    )


def _behaviour(value: object, source: str, client: str) -> Availability:
    entry = _entry(value, source, client, (*_BEHAVIOUR_KEYS, *_IGNORED_KEYS))
    for key in ("active", "inactive"):
        if key not in entry:
            raise _problem(source, client, key, "missing")
    active = _times(entry["active"], (source, client, "active"))
    inactive = _times(entry["inactive"], (source, client, "inactive"))
    if len(active) != len(inactive):
        raise _problem(
            source, client, "inactive", f"has {len(inactive)} times but active has {len(active)}"
        )
    for index, (start, end) in enumerate(zip(active, inactive, strict=True)):
        if start > end:
            raise _problem(
                source, client, f"active[{index}]", f"{start:g} is after inactive {end:g}"
            )
    finish = entry.get("finish_time")
    where = (source, client, "finish_time")
    period = None if finish is None else _number(finish, where, positive=True)
    if entry.get("model") is not None and not isinstance(entry["model"], str):
        raise _problem(source, client, "model", f"expected a string, got {entry['model']!r}")
    if entry.get("duration") is not None:
        _number(entry["duration"], (source, client, "duration"), positive=False)
    return Availability.from_windows(zip(active, inactive, strict=True), period)


def _table(data: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, Mapping):
        raise _problem(
            source, None, key, f"expected a mapping of client id to entry, got {table!r}"
        )
    return table


def parse_trace(data: object, source: str) -> TraceSet:
    """Validate a trace document (JSON's structure, see the module docstring).

    Raises
    ------
    TraceError
        Naming ``source``, the client and the field of the first problem found.
    """
    if not isinstance(data, Mapping):
        raise _problem(source, None, None, f"expected a mapping, got {type(data).__name__}")
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise _problem(
            source,
            None,
            None,
            f'not a geofl client trace: expected "format": "{FORMAT}" and "version": '
            f"{VERSION}, got {data.get('format')!r} and {data.get('version')!r}",
        )
    unknown = [key for key in data if key not in ("format", "version", *_TABLES)]
    if unknown:
        raise _problem(source, None, str(unknown[0]), f"unknown key; expected {_TABLES}")
    capacities = _table(data, "device_capacity", source)
    behaviours = _table(data, "behave_trace", source)
    if not capacities and not behaviours:
        raise _problem(
            source,
            None,
            None,
            "holds no clients (device_capacity and behave_trace are both empty or missing)",
        )
    return TraceSet(
        source,
        tuple((str(c), _capacity(v, source, str(c))) for c, v in capacities.items()),
        tuple((str(c), _behaviour(v, source, str(c))) for c, v in behaviours.items()),
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _read_json(text: str, source: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise _problem(
            source, None, None, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise _problem(source, None, None, f"not usable JSON: {exc}") from None


def _cell_number(cell: str, where: tuple[str, str | None, str]) -> float:
    try:
        return float(cell)
    except ValueError:
        raise _problem(*where, f"expected a number, got {cell!r}") from None


def _csv_row(row: Mapping[str, str], source: str, client: str) -> tuple[dict[str, Any], ...]:
    """(capacity entry, behaviour entry) of one CSV row; empty dicts where not given."""
    given = {key: cell.strip() for key, cell in row.items() if cell and cell.strip()}
    capacity = {
        k: _cell_number(given[k], (source, client, k)) for k in _CAPACITY_KEYS if k in given
    }
    behaviour: dict[str, Any] = {}
    for key in ("active", "inactive"):
        if key in given:
            behaviour[key] = [_cell_number(c, (source, client, key)) for c in given[key].split()]
    if "finish_time" in given:
        behaviour["finish_time"] = _cell_number(
            given["finish_time"], (source, client, "finish_time")
        )
    if not capacity and not behaviour:
        raise _problem(source, client, None, "row gives neither capacity nor availability")
    return capacity, behaviour


def _read_csv(text: str, source: str) -> dict[str, Any]:
    """The CSV table as a JSON-shaped trace document."""
    reader = csv.DictReader(text.splitlines())
    columns = reader.fieldnames or []
    allowed = ("client_id", *_CAPACITY_KEYS, *_BEHAVIOUR_KEYS, *_IGNORED_KEYS)
    unknown = [c for c in columns if c not in allowed]
    if "client_id" not in columns or unknown:
        raise _problem(
            source,
            None,
            None,
            f"CSV columns must be client_id and some of {allowed[1:]}, got {columns}",
        )
    capacities: dict[str, Any] = {}
    behaviours: dict[str, Any] = {}
    for line, row in enumerate(reader, start=2):
        client = (row.get("client_id") or "").strip()
        if not client or client in capacities or client in behaviours:
            raise _problem(
                source, None, f"line {line}", f"missing or repeated client_id {client!r}"
            )
        capacity, behaviour = _csv_row(row, source, client)
        if capacity:
            capacities[client] = capacity
        if behaviour:
            behaviours[client] = behaviour
    return {"format": FORMAT, "version": VERSION, _TABLES[0]: capacities, _TABLES[1]: behaviours}


def load_trace(path: Path | str) -> TraceSet:
    """Read and validate a JSON or CSV trace file.

    Raises
    ------
    TraceError
        If the file cannot be read, is not JSON/CSV (pickles are refused, with the command
        that converts them), or any entry is invalid; naming the file, client and field.
    """
    path = Path(path)
    source = str(path)
    refusal = trace_suffix_problem(path.suffix)
    if refusal:
        raise _problem(source, None, None, refusal)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _problem(source, None, None, "not UTF-8 text (is it a pickle? convert it)") from None
    except OSError as exc:
        raise _problem(source, None, None, f"cannot read: {exc.strerror or exc}") from None
    data = _read_csv(text, source) if path.suffix.lower() == ".csv" else _read_json(text, source)
    return parse_trace(data, source)
