"""The server's fit-update rules: one check, the same refusals streamed or held in memory.

Properties: a random valid update passes both forms of the check (a stream through the
assembler, an update held in memory); any single corruption is refused by both, with
the same error class and message, naming what was wrong. Then the real callers: the gRPC
servicer and the simulated fleet refuse the same bad upload for the same reason.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols import partial_sync, streams
from geofl.protocols.codecs import encode_tensor, parse_chain
from geofl.protocols.errors import (
    ErrorCode,
    GeoflError,
    NonFiniteError,
    ProtocolError,
    TensorError,
    TruncatedStreamError,
)
from geofl.protocols.tensor_checks import PAYLOAD_SLACK, TensorCheck, payload_limit
from geofl.protocols.tensors import EncodedTensor, ModelSpec, Tensorish, model_bytes, spec_of
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.config.compression import CompressionConfig
from geofl.server.models.store import ModelStore
from geofl.server.nodes import updates
from geofl.server.nodes.clock import WALL_CLOCK
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.simulation.backends import Backend
from geofl.server.simulation.fleet import VirtualFleet
from geofl.server.simulation.workers import JobResult, UploadedTensor
from geofl.server.transport.servicer import CoordinatorServicer, ServerState

Arrays = dict[str, np.ndarray]

# ----------------------------------------------------------------- the two forms


@dataclass
class Update:
    """A fit result as the rules see it; ``expected`` is the model in upload order."""

    expected: ModelSpec
    tensors: Arrays
    num_examples: int
    payload_bytes: int


DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8", "bool")


def _held(tensors: Mapping[str, np.ndarray]) -> dict[str, UploadedTensor]:
    """The update as a simulated client hands it over: raw little-endian bytes."""
    return {
        name: UploadedTensor(
            np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes(), a.dtype.name, a.shape
        )
        for name, a in tensors.items()
    }


def _payload_bytes(tensors: Mapping[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in tensors.values())


def _check_held(update: Update) -> None:
    updates.check_fit(
        update.num_examples, update.payload_bytes, _held(update.tensors), update.expected
    )


def _check_streamed(update: Update) -> None:
    """What the servicer does with the same update arriving as chunks (through real bytes)."""
    updates.check_num_examples(update.num_examples)
    size = updates.announced_size(update.payload_bytes, update.expected)
    assembler = streams.Assembler(
        streams.ArraySink(), check=updates.delta_check(update.expected, size)
    )
    for chunk in streams.iter_chunks(update.tensors, 64):
        assembler.feed(pb.TensorChunk.FromString(chunk.SerializeToString()))
    assembler.finish()


def _refusals(update: Update) -> tuple[GeoflError, GeoflError]:
    refused = []
    for check in (_check_held, _check_streamed):
        with pytest.raises(GeoflError) as info:
            check(update)
        refused.append(info.value)
    return refused[0], refused[1]


# ----------------------------------------------------------------- strategies


def _array(dtype: str, min_side: int = 0) -> st.SearchStrategy[np.ndarray]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=min_side, max_side=5)
    finite = {"allow_nan": False, "allow_infinity": False} if np.dtype(dtype).kind == "f" else None
    return hnp.arrays(np.dtype(dtype), shapes, elements=finite)


@st.composite
def valid_updates(draw: st.DrawFn) -> Update:
    """1-4 tensors of any wire dtype, at least one float tensor with values in it."""
    names = draw(
        st.lists(
            st.text("abcdefw.0123", min_size=1, max_size=6), min_size=1, max_size=4, unique=True
        )
    )
    arrays = [draw(_array(draw(st.sampled_from(("float32", "float16"))), min_side=1))]
    arrays += [draw(_array(draw(st.sampled_from(DTYPES)))) for _ in names[1:]]
    order = draw(st.permutations(range(len(names))))
    tensors = {names[i]: arrays[j] for i, j in enumerate(order)}
    examples = draw(st.integers(1, 10_000))
    return Update(spec_of(tensors), tensors, examples, _payload_bytes(tensors))


@settings(max_examples=150, deadline=None)
@given(valid_updates())
def test_a_valid_update_passes_streamed_and_held(update: Update) -> None:
    _check_held(update)
    _check_streamed(update)


def _floats(update: Update) -> list[str]:
    return [n for n, a in update.tensors.items() if a.dtype.kind == "f" and a.size]


def _corrupt(kind: str, update: Update, data: st.DataObject) -> tuple[type[GeoflError], str]:
    """Break ``update`` in one way; the error class and a text the refusal must contain."""
    names = list(update.tensors)
    name = data.draw(st.sampled_from(names))
    tensors = update.tensors
    if kind == "shape":
        tensors[name] = tensors[name].reshape((*tensors[name].shape, 1))
    elif kind == "dtype":
        other = data.draw(st.sampled_from([d for d in DTYPES if d != tensors[name].dtype.name]))
        tensors[name] = np.zeros(tensors[name].shape, other)
    elif kind == "missing":
        del tensors[name]
        if name == names[-1]:  # the sender stops early
            return TruncatedStreamError, f"stream ended before tensors [{name!r}]"
        want = next(t for t in update.expected if t.name == name)
        return TensorError, f"expected {want.describe()}, got "  # the next one came instead
    elif kind == "extra":
        tensors["extra!"] = np.zeros(2, np.float32)
        return TensorError, "unexpected extra tensor 'extra!'"
    elif kind == "non-finite":
        name = data.draw(st.sampled_from(_floats(update)))
        flat = tensors[name].reshape(-1)
        flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
        return NonFiniteError, f"tensor {name!r} holds NaN or Inf values"
    elif kind == "oversized":
        update.payload_bytes = payload_limit(model_bytes(update.expected)) + data.draw(
            st.integers(1, 1 << 20)
        )
        return TensorError, f"an upload of {update.payload_bytes} bytes"
    elif kind == "num_examples":
        # Nothing, a negative count, or more than the database's INTEGER column holds.
        update.num_examples = data.draw(st.integers(-5, 0) | st.integers(2**31, 2**64 - 1))
        return ProtocolError, "1 <= num_examples <= 2147483647"
    update.payload_bytes = _payload_bytes(tensors)
    want = next(t for t in update.expected if t.name == name)
    return TensorError, f"expected {want.describe()}, got {name}: "


CORRUPTIONS = ("shape", "dtype", "missing", "extra", "non-finite", "oversized", "num_examples")


@pytest.mark.parametrize("kind", CORRUPTIONS)
@settings(max_examples=60, deadline=None)
@given(update=valid_updates(), data=st.data())
def test_any_single_corruption_is_refused_alike_naming_it(
    kind: str, update: Update, data: st.DataObject
) -> None:
    error, text = _corrupt(kind, update, data)
    event(error.__name__)
    held, streamed = _refusals(update)
    assert type(held) is type(streamed) and str(held) == str(streamed)
    assert isinstance(held, error), (kind, held)
    assert text in str(held), (kind, str(held))


def test_refusals_carry_their_catalogued_codes() -> None:
    spec = spec_of({"w": np.zeros(3, np.float32)})
    cases: list[tuple[Any, ErrorCode]] = [
        (lambda: updates.check_num_examples(0), ErrorCode.MALFORMED_MESSAGE),
        (lambda: updates.announced_size(payload_limit(12) + 1, spec), ErrorCode.TENSOR_MISMATCH),
        (
            lambda: updates.check_fit(
                1, 12, _held({"w": np.array([0, np.nan, 0], np.float32)}), spec
            ),
            ErrorCode.NON_FINITE,
        ),
        (lambda: updates.check_fit(1, 0, {}, spec), ErrorCode.MALFORMED_MESSAGE),
    ]
    for call, code in cases:
        with pytest.raises(GeoflError) as info:
            call()
        assert info.value.code is code, info.value


def test_announced_size_is_the_model_size_when_unannounced_and_allows_the_slack() -> None:
    spec = spec_of({"w": np.zeros(1000, np.float32)})
    assert updates.announced_size(0, spec) == 4000
    assert updates.announced_size(8000 + PAYLOAD_SLACK, spec) == 8000 + PAYLOAD_SLACK
    with pytest.raises(TensorError, match="an upload of 73537 bytes for a 4000-byte model"):
        updates.announced_size(8001 + PAYLOAD_SLACK, spec)


def test_a_compressed_payload_too_large_for_its_tensor_is_refused_alike() -> None:
    spec = spec_of({"w": np.zeros(12, np.float32)})
    chain = parse_chain("fp16")
    huge = bytes(payload_limit(48) + 1)
    held = {"w": UploadedTensor(huge, "float32", (12,), chain)}
    message = f"tensor 'w': {len(huge)}-byte payload for a 48-byte tensor"
    with pytest.raises(TensorError, match=re.escape(message)):
        updates.check_fit(1, 0, held, spec)  # nothing announced: the model's 48 bytes
    stream = streams.Assembler(streams.ArraySink(), check=updates.delta_check(spec, 48))
    with pytest.raises(TensorError, match=re.escape(message)):
        for chunk in streams.iter_chunks({"w": EncodedTensor(huge, chain, "float32", (12,))}, 1024):
            stream.feed(chunk)


def test_a_compressed_tensor_is_checked_by_what_it_announces() -> None:
    """Its values are the decoder's to check: here that would be a decode pass per upload."""
    spec = spec_of({"w": np.zeros(4, np.float32)})
    chain = parse_chain("fp16")
    payload = encode_tensor(np.ones(4, np.float32), chain, seed=0)
    updates.check_fit(1, len(payload), {"w": UploadedTensor(payload, "float32", (4,), chain)}, spec)


def test_a_raw_tensor_of_the_wrong_length_is_refused() -> None:
    spec = spec_of({"w": np.zeros(4, np.float32)})
    short = {"w": UploadedTensor(bytes(12), "float32", (4,))}
    with pytest.raises(ProtocolError, match=r"'w': 12 of 16 bytes"):
        updates.check_fit(1, 12, short, spec)


def test_a_check_accepts_anything_without_expectations() -> None:
    check = TensorCheck()
    spec = spec_of({"x": np.zeros((2, 2), np.int64)})[0]
    check.begin(spec, spec)
    check.values(spec, bytes(32))
    assert check.finish() == (spec,) and check.total_bytes == check.payload_bytes == 32


# ----------------------------------------------------------------- servicer and fleet

GOOD: Arrays = {
    "w": np.ones((4, 3), np.float32),
    "b": np.ones(3, np.float32),
    "steps": np.ones((), np.int64),
}
SPEC = spec_of(GOOD)
CHAIN = parse_chain("fp16")
#: A payload one byte over what a 48-byte tensor may take, in an upload the model allows.
TOO_BIG = bytes(payload_limit(48) + 1)


def _upload(case: str) -> tuple[Mapping[str, Tensorish], int, int | None]:
    """(tensors, num_examples, declared payload bytes or None for the true size)."""
    tensors: dict[str, Tensorish] = dict(GOOD)
    if case == "shape":
        tensors["w"] = np.ones((3, 4), np.float32)
    elif case == "dtype":
        tensors["b"] = np.ones(3, np.float64)
    elif case == "names":
        tensors = {"x": GOOD["w"], "b": GOOD["b"], "steps": GOOD["steps"]}
    elif case == "missing":
        del tensors["steps"]
    elif case == "extra":
        tensors["bonus"] = np.ones(2, np.float32)
    elif case == "nan":
        tensors["b"] = np.array([0, np.nan, 0], np.float32)
    elif case == "inf":
        tensors["b"] = np.array([np.inf, 0, 0], np.float32)
    elif case == "oversized":
        return tensors, 10, payload_limit(model_bytes(SPEC)) + 1
    elif case == "num_examples":
        return tensors, 0, None
    elif case == "payload":
        tensors["w"] = EncodedTensor(TOO_BIG, CHAIN, "float32", (4, 3))
    return tensors, 10, None


def _size(tensors: Mapping[str, Tensorish]) -> int:
    return sum(
        len(t.payload) if isinstance(t, EncodedTensor) else int(t.nbytes) for t in tensors.values()
    )


async def _servicer(case: str) -> tuple[Outcome, GeoflError | None]:
    """Upload through the real Submit handler (past the gRPC layer); its outcome and error."""
    tensors, examples, declared = _upload(case)
    registry = Registry(heartbeat_interval_s=5.0)
    session = registry.session(registry.add(7, "node", None, {}))
    servicer = CoordinatorServicer(ServerState(registry, 1, "run", SPEC, lambda *_: 7))
    task = registry.assign(session, "fit", 1, 1, {}, time.time() + 60)
    header = pb.UploadHeader(
        task_id=task.task_id,
        round=1,
        attempt=1,
        status=pb.RESULT_STATUS_OK,
        update_kind=pb.UPDATE_KIND_DELTA,
        num_examples=examples,
        payload_bytes=_size(tensors) if declared is None else declared,
    )

    async def messages() -> AsyncIterator[bytes]:
        for raw in streams.encode_upload(header, tensors, 64):
            yield raw

    error = None
    try:
        await servicer._submit(session, messages())
    except GeoflError as exc:
        error = exc
    return await task.future, error


def _fleet(spec: ModelSpec = SPEC) -> VirtualFleet:
    return VirtualFleet(
        registry=Registry(heartbeat_interval_s=5.0),
        models=ModelStore(),
        backend=cast(Backend, None),  # _outcome runs no job
        clock=WALL_CLOCK,
        links=[],
        traces=None,
        compression=CompressionConfig(),
        spec=spec,
        run_id=1,
        seed=0,
    )


def _task(config: dict[str, Any] | None = None) -> TaskRecord:
    future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
    return TaskRecord(1, 7, "fit", 1, 1, config or {}, time.time() + 60, future)


async def _simulated(case: str) -> Outcome:
    """The same upload from a simulated client: what the fleet makes of it."""
    tensors, examples, declared = _upload(case)
    held = {
        name: UploadedTensor(t.payload, t.dtype, t.shape, t.chain)
        if isinstance(t, EncodedTensor)
        else _held({name: t})[name]
        for name, t in tensors.items()
    }
    size = _size(tensors) if declared is None else declared
    result = JobResult("ok", num_examples=examples, tensors=held, payload_bytes=size)
    return _fleet()._outcome(_task(), result, 0.0)


REFUSED = {
    "shape": ErrorCode.TENSOR_MISMATCH,
    "dtype": ErrorCode.TENSOR_MISMATCH,
    "names": ErrorCode.TENSOR_MISMATCH,
    "missing": ErrorCode.MALFORMED_MESSAGE,
    "extra": ErrorCode.TENSOR_MISMATCH,
    "nan": ErrorCode.NON_FINITE,
    "inf": ErrorCode.NON_FINITE,
    "oversized": ErrorCode.TENSOR_MISMATCH,
    "num_examples": ErrorCode.MALFORMED_MESSAGE,
    "payload": ErrorCode.TENSOR_MISMATCH,
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_servicer_and_fleet_refuse_the_same_upload_for_the_same_reason(case: str) -> None:
    served, error = asyncio.run(_servicer(case))
    simulated = asyncio.run(_simulated(case))
    assert error is not None and error.code is REFUSED[case], error
    # A stream that stops before the model's last tensor reads as a client gone away.
    assert served.status == ("dropped" if isinstance(error, TruncatedStreamError) else "rejected")
    assert simulated.status == "rejected" and simulated.payload is None
    assert simulated.reason == str(error) and str(error) in (served.reason or "")


def test_servicer_and_fleet_keep_a_good_upload() -> None:
    served, error = asyncio.run(_servicer("good"))
    simulated = asyncio.run(_simulated("good"))
    assert error is None and served.status == simulated.status == "ok"
    for outcome in (served, simulated):
        assert isinstance(outcome.payload, DeltaUpdate)
        assert {n: np.asarray(a).tolist() for n, a in outcome.payload.tensors.items()} == {
            n: a.tolist() for n, a in GOOD.items()
        }
        outcome.release()


def test_fleet_expects_a_partial_sync_upload_in_group_order() -> None:
    config = {partial_sync.CONFIG_KEY: partial_sync.encode_groups([["b", "steps"], ["w"]])}
    in_groups = {n: GOOD[n] for n in ("b", "steps", "w")}

    async def outcomes() -> tuple[Outcome, Outcome]:
        fleet = _fleet()
        results = [
            JobResult("ok", num_examples=5, tensors=_held(t), payload_bytes=_payload_bytes(t))
            for t in (in_groups, GOOD)
        ]
        return fleet._outcome(_task(config), results[0], 0.0), fleet._outcome(
            _task(config), results[1], 0.0
        )

    kept, refused = asyncio.run(outcomes())
    assert kept.status == "ok"
    kept.release()
    assert refused.status == "rejected"
    assert refused.reason == "expected b: float32[3], got w: float32[4, 3]"


def test_fleet_names_a_compressed_tensor_that_does_not_decode() -> None:
    chain = parse_chain({"qsgd": {"bits": 8}})
    good = encode_tensor(np.ones((4, 3), np.float32), chain, seed=1)
    held = {**_held(GOOD), "w": UploadedTensor(good[: len(good) // 2], "float32", (4, 3), chain)}
    size = sum(len(t.payload) for t in held.values())

    async def outcome() -> Outcome:
        return _fleet()._outcome(
            _task(), JobResult("ok", num_examples=5, tensors=held, payload_bytes=size), 0.0
        )

    refused = asyncio.run(outcome())
    assert refused.status == "rejected"
    assert (refused.reason or "").startswith("tensor 'w' does not decode: ")
