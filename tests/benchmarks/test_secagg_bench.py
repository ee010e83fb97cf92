"""Tests of the secure-aggregation benchmark: its reductions, the Flower app's logic, one run.

Everything but the last test runs without Ray or other processes. The last one runs the
smallest real case (Flower simulation, 3 clients, 1000 parameters, 2 rounds, SecAgg+ with
one client dropping out per round) and checks the record it produces (~20 s, Ray start-up
included).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

_ROOT = Path(__file__).resolve().parents[2]


def _register_package(name: str, folder: Path) -> ModuleType:
    """Import a package folder under ``name`` without putting its parent on sys.path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot locate the {name} package in {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if importlib.util.find_spec("benchmarks") is None:
    _register_package("benchmarks", _ROOT / "benchmarks")
_register_package("flwrsecagg", _ROOT / "benchmarks" / "flower_secagg_app" / "flwrsecagg")

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Context,
        Error,
        Message,
        MetricRecord,
        RecordDict,
    )
    from flwr.app.message_type import MessageType
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
    )
    from flwr.serverapp import Grid
    from flwr.supercore.task_identity import TaskIdentity
    from flwrsecagg.client_app import dropout_mod, message_stage
    from flwrsecagg.common import (
        ClientDropoutError,
        client_shift,
        dropped_partitions,
        validate_drop_stage,
    )
    from flwrsecagg.server_app import CountingGrid, EventLog, record_bytes

from benchmarks.core import BenchmarkError  # noqa: E402
from benchmarks.metrics import ByteSample  # noqa: E402
from benchmarks.secagg import (  # noqa: E402
    FlowerSecAgg,
    RoundMeasure,
    SecAggCase,
    SecAggRun,
    build_cases,
    flower_run_config,
    flower_run_from_events,
    make_record,
    merge_cases,
    parse_args,
    process_kind,
    run_secagg_case,
    shift_tolerance,
    steady,
    steady_completed,
)

# ---------------------------------------------------------------- shared app logic


@given(
    clients=st.integers(2, 300),
    fraction=st.floats(0.0, 0.99),
    server_round=st.integers(1, 50),
    seed=st.integers(0, 2**31),
)
def test_dropped_partitions_size_range_and_determinism(
    clients: int, fraction: float, server_round: int, seed: int
) -> None:
    dropped = dropped_partitions(clients, fraction, server_round, seed)
    assert len(dropped) == round(fraction * clients)
    assert all(0 <= p < clients for p in dropped)
    assert dropped == dropped_partitions(clients, fraction, server_round, seed)


def test_dropped_partitions_change_between_rounds() -> None:
    draws = {dropped_partitions(50, 0.1, r, 0) for r in range(1, 6)}
    assert len(draws) > 1


@pytest.mark.parametrize(("clients", "fraction", "rnd"), [(0, 0.1, 1), (5, 1.0, 1), (5, 0.1, 0)])
def test_dropped_partitions_rejects_bad_input(clients: int, fraction: float, rnd: int) -> None:
    with pytest.raises(ValueError):
        dropped_partitions(clients, fraction, rnd, 0)


def test_client_shifts_are_distinct_and_small() -> None:
    shifts = [client_shift(p) for p in range(100)]
    assert len(set(shifts)) == 100
    assert max(shifts) <= 0.1  # far inside SecAgg+'s clipping range of 8


def test_validate_drop_stage_knows_each_mode() -> None:
    assert validate_drop_stage("unmask", secure=True) == "unmask"
    assert validate_drop_stage("train", secure=False) == "train"
    with pytest.raises(ValueError, match="plain"):
        validate_drop_stage("unmask", secure=False)
    with pytest.raises(ValueError, match="secure"):
        validate_drop_stage("train", secure=True)


# ---------------------------------------------------------------- client mods


@pytest.fixture
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower stamps new messages with the process's task identity; give it one."""
    for attribute in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attribute, 1)


def _train_message(stage: str | None, server_round: int, node: int = 1) -> Message:
    content = RecordDict()
    if stage is not None:
        content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({Key.STAGE: stage})
    return Message(
        content=content,
        dst_node_id=node,
        message_type=MessageType.TRAIN,
        group_id=str(server_round),
    )


def _context(partition_id: int, stage: str, fraction: float = 0.1) -> Context:
    return Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": partition_id, "num-partitions": 10},
        state=RecordDict(),
        run_config={
            "dropout": fraction,
            "drop-stage": stage,
            "num-clients": 10,
            "drop-seed": 0,
        },
    )


def _passed(msg: Message, ctx: Context) -> Message:
    return Message(RecordDict({"ok": ConfigRecord({"passed": True})}), reply_to=msg)


def test_message_stage_reads_secaggplus_config_or_is_train(task_identity: None) -> None:
    assert message_stage(_train_message("unmask", 1)) == "unmask"
    assert message_stage(_train_message(None, 1)) == "train"


def test_dropout_mod_raises_only_for_the_rounds_dropped_client_in_its_stage(
    task_identity: None,
) -> None:
    (victim,) = dropped_partitions(10, 0.1, 3, 0)
    survivor = (victim + 1) % 10
    stage = "collect_masked_vectors"
    with pytest.raises(ClientDropoutError, match=f"partition {victim}"):
        dropout_mod(_train_message(stage, 3), _context(victim, stage), _passed)
    for msg, ctx in [
        (_train_message(stage, 3), _context(survivor, stage)),  # not dropped
        (_train_message("setup", 3), _context(victim, stage)),  # other stage
        (_train_message(stage, 3), _context(victim, stage, fraction=0.0)),  # no dropout
    ]:
        assert dropout_mod(msg, ctx, _passed).content.config_records["ok"]["passed"] is True


# ---------------------------------------------------------------- ServerApp logic


def test_record_bytes_matches_flower_and_tolerates_empty_lists() -> None:
    arrays = ArrayRecord({"w": Array(np.arange(10, dtype=np.float32))})
    config = ConfigRecord({"stage": "unmask", "ids": [1, 2, 3], "blobs": [b"abc", b"de"]})
    metrics = MetricRecord({"partition-id": 4, "loss": 0.5})
    for record in (arrays, config, metrics):
        assert record_bytes(record) == record.count_bytes()
    empty = ConfigRecord({"dead_nids": [], "stage": "unmask"})
    assert record_bytes(empty) == len("dead_nids") + len("stage") + len("unmask")


class _EchoGrid(Grid):
    """A grid double: each message gets a reply carrying two bytes; node 2 answers an error."""

    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return [1, 2]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            if msg.metadata.dst_node_id == 2:
                replies.append(Message(error=Error(code=1, reason="dropped"), reply_to=msg))
            else:
                replies.append(Message(RecordDict({"r": ConfigRecord({"x": b"ab"})}), reply_to=msg))
        return replies


def test_counting_grid_logs_stage_round_and_bytes(tmp_path: Path, task_identity: None) -> None:
    log_path = tmp_path / "t.jsonl"
    grid = CountingGrid(_EchoGrid(), EventLog(str(log_path)))
    outgoing = [_train_message("share_keys", 4, node) for node in (1, 2, 3)]
    replies = list(grid.send_and_receive(outgoing))
    assert len(replies) == 3
    (event,) = [json.loads(line) for line in log_path.read_text().splitlines()]
    per_message_down = len(Key.STAGE) + len("share_keys")
    assert event["round"] == 4 and event["stage"] == "share_keys"
    assert event["sent"] == 3 and event["replies"] == 3 and event["errors"] == 1
    assert event["down_bytes"] == 3 * per_message_down
    assert event["up_bytes"] == 2 * (len("x") + 2)  # the error reply carries nothing
    assert event["down_records"] == {RECORD_KEY_CONFIGS: per_message_down}
    assert event["up_records"] == {"r": len("x") + 2}
    assert list(grid.get_node_ids()) == [1, 2]


# ---------------------------------------------------------------- harness reductions


def _events() -> list[dict[str, Any]]:
    """Three rounds; round 2 was halted by the workflow (no round_end)."""
    ex = {"event": "exchange", "stage": "setup", "sent": 4, "replies": 4, "errors": 0}
    return [
        {"event": "round_start", "t": 10.0, "round": 1, "nodes": 4},
        {**ex, "t": 11.0, "started": 10.0, "round": 1, "down_bytes": 400, "up_bytes": 800},
        {"event": "round_end", "t": 12.0, "round": 1, "results": 4, "contributors": [0, 1]},
        {"event": "round_start", "t": 12.5, "round": 2, "nodes": 4},
        {**ex, "t": 13.0, "started": 12.5, "round": 2, "down_bytes": 40, "up_bytes": 0},
        {"event": "round_start", "t": 14.0, "round": 3, "nodes": 4},
        {**ex, "t": 14.5, "started": 14.0, "round": 3, "down_bytes": 400, "up_bytes": 800},
        {"event": "round_end", "t": 15.0, "round": 3, "results": 3, "contributors": [0]},
        {"event": "end", "t": 15.1, "final_shift": 0.5, "expected_shift": 0.5, "max_abs_error": 0},
    ]


def test_flower_run_from_events_times_halted_rounds_and_bytes() -> None:
    run = flower_run_from_events(_events())
    assert [r.duration_s for r in run.rounds] == [2.0, 1.5, 1.0]
    assert [r.aggregated for r in run.rounds] == [4, 0, 3]
    assert [r.payload_up_bytes for r in run.rounds] == [200.0, 0.0, 200.0]
    assert [r.payload_down_bytes for r in run.rounds] == [100.0, 10.0, 100.0]
    assert run.notes["stage_s"] == {"setup": 0.5}  # rounds 2 and 3 only
    assert run.final_shift == run.expected_shift == 0.5


def test_flower_run_from_events_rejects_incomplete_logs() -> None:
    with pytest.raises(BenchmarkError, match="end"):
        flower_run_from_events(_events()[:-1])
    gap = [e for e in _events() if e.get("round") != 2]
    with pytest.raises(BenchmarkError, match=r"rounds 1\.\.R"):
        flower_run_from_events(gap)


def test_steady_is_the_median_after_round_one() -> None:
    assert steady([10.0, 1.0, 3.0, 2.0]) == 2.0
    assert steady([7.0]) == 7.0
    assert steady([5.0, None]) is None


def test_steady_completed_skips_halted_rounds() -> None:
    durations = [(9.0, 4), (1.0, 0), (3.0, 4), (5.0, 4), (0.5, 0)]
    rounds = [RoundMeasure(i + 1, t, 0.0, agg) for i, (t, agg) in enumerate(durations)]
    assert steady_completed(rounds) == 4.0
    assert steady_completed(rounds[:2]) is None
    assert steady_completed(rounds[:1]) == 9.0


def _run(final: float, expected: float, rounds: int = 3) -> SecAggRun:
    measures = [
        RoundMeasure(r, 1.0 + (r == 1), float(10 * r), 4, 100.0 * r, 50.0) for r in range(1, 4)
    ]
    return SecAggRun(measures[:rounds], final, expected, 0.01)


def test_make_record_checks_the_model_and_rounds() -> None:
    case = SecAggCase(n=4, d=100_000, rounds=3, secure=True)
    good = make_record("flower", case, _run(0.5, 0.5), [])
    assert good.ok and good.steady_round_s == 1.0 and good.payload_up_bytes == 250.0
    assert good.wire_up_bytes is None
    off = make_record("flower", case, _run(0.5 + 0.001 / 4, 0.5), [])  # one client's shift lost
    assert not off.ok and "imply" in (off.error or "")
    short = make_record("flower", case, _run(0.5, 0.5, rounds=2), [])
    assert not short.ok and "2 of 3" in (short.error or "")


def test_make_record_divides_proxy_bytes_per_client_and_round() -> None:
    case = SecAggCase(n=4, d=10, rounds=3, secure=False, mode="deployment")
    # rounds span [10, 12], [20, 21], [30, 31]; counters step inside each of them
    steps = [(10.0, 0, 0), (11.0, 4000, 400), (20.5, 12000, 800), (30.5, 24000, 1200)]
    samples = [ByteSample(t, up, down) for t, up, down in steps]
    record = make_record("flower", case, _run(0.5, 0.5), samples)
    assert record.notes["wire_bytes_per_client_by_round"] == [
        [1000.0, 100.0],
        [2000.0, 100.0],
        [3000.0, 100.0],
    ]
    assert record.wire_up_bytes == 2500.0 and record.wire_down_bytes == 100.0


@pytest.mark.parametrize("n", [3, 10, 100])
def test_shift_tolerance_catches_a_lost_client(n: int) -> None:
    for d in (1000, 1_000_000):
        secure = SecAggCase(n=n, d=d, rounds=2, secure=True, num_shares=3, threshold=2)
        plain = SecAggCase(n=n, d=d, rounds=2, secure=False, num_shares=3, threshold=2)
        assert shift_tolerance(plain) < shift_tolerance(secure)
        # losing the smallest constant moves the mean by (mean - 0.001) / (n - 1) per round
        smallest_loss = (np.mean([client_shift(p) for p in range(n)]) - 0.001) / (n - 1)
        assert shift_tolerance(secure) < smallest_loss


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 1},
        {"d": 0},
        {"dropout": 1.0},
        {"mode": "cloud"},
        {"num_shares": 3, "threshold": 3},
    ],
)
def test_case_rejects_bad_settings(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {"n": 4, "d": 10, "rounds": 2, "secure": True}
    with pytest.raises(ValueError):
        SecAggCase(**(base | kwargs))


def test_build_cases_orders_plain_before_secure() -> None:
    args = parse_args(["--clients", "10,50", "--params", "1000", "--dropout", "0,0.1"])
    cases = build_cases(args)
    assert len(cases) == 8
    assert [(c.n, c.dropout, c.secure) for c in cases[:4]] == [
        (10, 0.0, False),
        (10, 0.0, True),
        (10, 0.1, False),
        (10, 0.1, True),
    ]


def test_merge_cases_replaces_same_key_and_keeps_others() -> None:
    def rec(n: int, value: float) -> dict[str, Any]:
        return {
            "system": "flower",
            "mode": "simulation",
            "n": n,
            "d": 1,
            "dropout": 0.0,
            "secure": True,
            "rounds": 6,
            "settings": {"drop_stage": "x"},
            "steady_round_s": value,
        }

    merged = merge_cases([rec(10, 1.0), rec(50, 2.0)], [rec(10, 3.0)])
    assert [(c["n"], c["steady_round_s"]) for c in merged] == [(50, 2.0), (10, 3.0)]


def test_flower_run_config_quotes_strings() -> None:
    case = SecAggCase(n=3, d=7, rounds=2, secure=False, dropout=0.25, drop_stage="train")
    text = flower_run_config(case, Path("t.jsonl"))
    assert 'drop-stage="train"' in text and "secure=false" in text and "dropout=0.25" in text


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["/v/bin/python", "/v/bin/flwr-simulation", "--run-once"], "simulation"),
        (["/v/lib/site-packages/ray/core/src/ray/gcs/gcs_server", "--x"], "ray"),
        (["ray::ClientAppActor"], "ray"),
        (["/v/bin/python", "/v/bin/flower-superlink", "--simulation"], "superlink"),
    ],
)
def test_process_kind_names_simulation_and_ray(cmdline: list[str], kind: str) -> None:
    assert process_kind(cmdline) == kind


# ---------------------------------------------------------------- one real run


def test_smallest_flower_simulation_case_produces_a_sane_record() -> None:
    """3 clients, 1000 params, 2 rounds, SecAgg+ (3 shares, threshold 2), one drops a round."""
    case = SecAggCase(
        n=3, d=1000, rounds=2, secure=True, dropout=0.34, num_shares=3, threshold=2, timeout_s=240
    )
    record = run_secagg_case(FlowerSecAgg(), case, use_lock=False)
    assert record.ok, record.error
    assert record.aggregated_per_round == [2, 2]  # the dropped client's masks were removed
    assert record.notes["error_replies_by_stage"]["collect_masked_vectors"] == 2
    assert record.steady_round_s is not None and 0 < record.steady_round_s < record.round_s[0]
    # the masked upload is int64: 8 bytes per parameter, more than the float32 model
    assert record.payload_up_bytes is not None and record.payload_up_bytes > 2 / 3 * 8 * 1000
    assert record.payload_down_bytes is not None and record.payload_down_bytes > 2 / 3 * 4 * 1000
    assert record.wire_up_bytes is None  # nothing goes over a network in simulation
    assert record.peak_rss_mb is not None and record.peak_rss_mb > 100
    assert {"ray", "simulation", "superlink"} <= set(record.rss_by_kind_mb)
    assert record.final_shift == pytest.approx(record.expected_shift, abs=1e-3)
