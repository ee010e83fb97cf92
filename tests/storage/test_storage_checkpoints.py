"""Checkpoint store: exact round trips, order, atomic content addressing, corruption."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols.types import Weights, WeightsView
from geofl.storage import STATE_PREFIX, CheckpointCorruptError, CheckpointRecord, CheckpointStore

DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _weights() -> Weights:
    rng = np.random.default_rng(7)
    weights: Weights = {}
    for index, dtype in enumerate(DTYPES):
        # Names deliberately out of alphabetical order: safetensors sorts, we must not.
        weights[f"{9 - index}.layer.{dtype}"] = (rng.standard_normal((3, index + 1)) * 50).astype(
            dtype
        )
    weights["scalar"] = np.array(2.5, dtype=np.float32)
    weights["empty"] = np.zeros((0, 4), dtype=np.float32)
    return weights


def _assert_same(loaded: WeightsView, expected: WeightsView) -> None:
    assert list(loaded) == list(expected)
    for name, array in expected.items():
        assert loaded[name].dtype == array.dtype, name
        assert loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)


def test_round_trip_keeps_dtypes_values_and_order(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    weights = _weights()
    extra = {"m": np.ones(3, np.float64), "b.count": np.array([4], np.int64)}
    record = store.save(run_id=1, round=3, weights=weights, extra=extra)
    loaded, state = store.load(record)
    _assert_same(loaded, weights)
    _assert_same(state, extra)
    assert record.num_tensors == len(weights) + len(extra)


def test_file_is_content_addressed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, {"w": np.arange(5, dtype=np.float32)})
    path = store.path_of(record)
    data = path.read_bytes()
    assert record.path == f"{record.sha256}.safetensors" and not Path(record.path).is_absolute()
    assert hashlib.sha256(data).hexdigest() == record.sha256 and len(data) == record.size_bytes
    assert [p.name for p in tmp_path.iterdir()] == [record.path]  # no temporary left over


def test_non_contiguous_and_big_endian_inputs(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    swapped = np.arange(4, dtype=">i4")
    loaded, _ = store.load(store.save(1, 1, {"s": strided, "b": swapped}))
    np.testing.assert_array_equal(loaded["s"], strided)
    np.testing.assert_array_equal(loaded["b"], swapped)
    assert loaded["b"].dtype == np.dtype("int32")


def test_weights_are_not_mutated(tmp_path: Path) -> None:
    weights = {"w": np.arange(4, dtype=np.float64)}
    CheckpointStore(tmp_path).save(1, 1, weights)
    np.testing.assert_array_equal(weights["w"], np.arange(4, dtype=np.float64))


@pytest.mark.parametrize("offset", [0, 9, -1])
def test_tampered_byte_is_detected(tmp_path: Path, offset: int) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, _weights())
    path = store.path_of(record)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="SHA-256") as caught:
        store.load(record)
    assert record.path in str(caught.value)


def test_crc_checked_files_round_trip_under_unique_names(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    weights = _weights()
    first = store.save(1, 1, weights, checksum="crc32")
    second = store.save(1, 1, weights, checksum="crc32")
    assert first.sha256 is None and second.sha256 is None
    for record in (first, second):
        assert record.crc32 == zlib.crc32(store.path_of(record).read_bytes())
    assert first.path != second.path  # a CRC may collide: never content-addressed
    _assert_same(store.load(second)[0], weights)
    store.delete(second)
    _assert_same(store.load(first)[0], weights)


@pytest.mark.parametrize("offset", [0, 9, -1])
def test_tampered_byte_is_detected_by_the_crc(tmp_path: Path, offset: int) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, _weights(), checksum="crc32")
    path = store.path_of(record)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"CRC-32 is [0-9a-f]{8}, recorded"):
        store.load(record)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match="size"):
        store.load(record)


def test_a_record_without_any_digest_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, _weights(), checksum="crc32")
    with pytest.raises(CheckpointCorruptError, match="neither SHA-256 nor CRC-32"):
        store.load(CheckpointRecord(record.path, None, record.size_bytes, record.num_tensors))


def test_truncated_and_missing_files(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, _weights())
    path = store.path_of(record)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointCorruptError, match="size"):
        store.load(record)
    path.unlink()
    with pytest.raises(CheckpointCorruptError, match="missing"):
        store.load(record)


def test_valid_file_without_geofl_metadata_is_refused(tmp_path: Path) -> None:
    import safetensors.numpy

    store = CheckpointStore(tmp_path)
    path = tmp_path / "foreign.safetensors"
    safetensors.numpy.save_file({"w": np.zeros(2, np.float32)}, path)
    data = path.read_bytes()
    record = CheckpointRecord(path.name, hashlib.sha256(data).hexdigest(), len(data), 1)
    with pytest.raises(CheckpointCorruptError, match="not a geofl checkpoint"):
        store.load(record)


def test_paths_outside_the_store_are_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store")
    for path in ("../escape.safetensors", str(tmp_path / "abs.safetensors")):
        with pytest.raises(CheckpointCorruptError, match="outside"):
            store.load(CheckpointRecord(path, "0" * 64, 1, 1))


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError, match=r"'z'.*complex"):
        store.save(1, 1, {"z": np.zeros(2, np.complex64)})
    with pytest.raises(ValueError, match="reserved prefix"):
        store.save(1, 1, {STATE_PREFIX + "x": np.zeros(2)})


def test_order_is_recorded_in_metadata(tmp_path: Path) -> None:
    from safetensors import safe_open

    store = CheckpointStore(tmp_path)
    record = store.save(4, 2, {"b": np.zeros(1), "a": np.zeros(1)}, {"s": np.zeros(1)})
    with safe_open(store.path_of(record), framework="np") as handle:
        metadata = handle.metadata()
    assert json.loads(metadata["geofl.order"]) == ["b", "a", STATE_PREFIX + "s"]
    assert (metadata["geofl.run_id"], metadata["geofl.round"]) == ("4", "2")


_NAMES = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
    lambda name: not name.startswith(STATE_PREFIX)
)
_ARRAYS = hnp.arrays(
    dtype=st.sampled_from([np.dtype(d) for d in DTYPES]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_NAMES, _ARRAYS, min_size=1, max_size=5))
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, weights: dict[str, npt.NDArray[np.generic]]
) -> None:
    store = CheckpointStore(tmp_path_factory.getbasetemp() / "property")
    loaded, extra = store.load(store.save(1, 1, weights))
    assert extra == {}
    assert list(loaded) == list(weights)
    for name, array in weights.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        # Bitwise equality: NaN payloads and signed zeros must survive too.
        assert loaded[name].tobytes() == np.ascontiguousarray(array).tobytes()


def test_half_written_files_of_dead_writers_are_discarded(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, {"w": np.ones(3, np.float32)})
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = tmp_path / f".tmp-{gone.stdout.strip()}-0a1b.safetensors"
    legacy = tmp_path / ".tmp-6fd580eaced047d0944b4250bb71a311.safetensors"  # before the pid
    live = tmp_path / f".tmp-{os.getpid()}-0a1b.safetensors"  # this process may be writing it
    for path in (dead, legacy, live):
        path.write_bytes(b"half")
    assert store.discard_partial_writes() == 2
    assert not dead.exists() and not legacy.exists() and live.exists()
    assert store.path_of(record).exists()  # finished checkpoints are never touched
    assert CheckpointStore(tmp_path / "never-created").discard_partial_writes() == 0
