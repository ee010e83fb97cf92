"""StreamingMean: equals the weighted mean taken at once, rejects atomically, keeps nothing."""

from __future__ import annotations

import gc
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.strategies import StrategyError, StreamingMean, UpdateRejected

Array = npt.NDArray[Any]
Update = dict[str, Array]
FLOAT_DTYPES = (np.float16, np.float32, np.float64)
#: Absolute slack on top of one rounding of the result to its dtype (float16 subnormals).
ATOL = {np.float16: 1e-7, np.float32: 1e-10, np.float64: 1e-10}

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[dict[str, Array], list[tuple[Update, float]]]:
    """A model spec (as zero arrays) and 1-6 client deltas with positive weights."""
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4, unique=True))
    spec: dict[str, Array] = {}
    for name in names:
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
        spec[name] = np.zeros(shape, dtype=draw(st.sampled_from(FLOAT_DTYPES)))
    clients = []
    for _ in range(draw(st.integers(1, 6))):
        update = {name: draw(_values(ref.dtype, ref.shape)) for name, ref in spec.items()}
        weight = draw(st.one_of(st.integers(1, 10_000), st.floats(1e-3, 1e4)))
        clients.append((update, float(weight)))
    return spec, clients


def _values(dtype: Any, shape: tuple[int, ...]) -> st.SearchStrategy[Array]:
    width = np.dtype(dtype).itemsize * 8
    elements = st.floats(-100, 100, width=width, allow_subnormal=False)
    return hnp.arrays(dtype, shape, elements=elements)


def _reference(spec: Mapping[str, Array], clients: list[tuple[Update, float]]) -> dict[str, Array]:
    """Weighted mean computed at once, in float64 (not cast back)."""
    total = sum(weight for _, weight in clients)
    return {
        name: np.sum(
            [weight * update[name].astype(np.float64) for update, weight in clients], axis=0
        )
        / total
        for name in spec
    }


def _assert_close(actual: Mapping[str, Array], expected: Mapping[str, Array], spec: Any) -> None:
    assert list(actual) == list(spec)
    for name, ref in spec.items():
        assert actual[name].dtype == ref.dtype
        assert actual[name].shape == ref.shape
        tolerance = float(np.finfo(ref.dtype).eps)
        np.testing.assert_allclose(
            actual[name].astype(np.float64),
            expected[name],
            rtol=tolerance,
            atol=ATOL[ref.dtype.type],
        )


def _folded(spec: Mapping[str, Array], clients: list[tuple[Update, float]]) -> StreamingMean:
    acc = StreamingMean(spec)
    for update, weight in clients:
        acc.add(update, weight)
    return acc


@SETTINGS
@given(rounds())
def test_streaming_mean_equals_weighted_mean_at_once(case: Any) -> None:
    spec, clients = case
    acc = _folded(spec, clients)
    assert acc.count == len(clients)
    assert acc.total_weight == pytest.approx(sum(w for _, w in clients), rel=1e-12)
    _assert_close(acc.mean(), _reference(spec, clients), spec)


@SETTINGS
@given(rounds(), st.randoms(use_true_random=False))
def test_streaming_mean_is_order_independent(case: Any, rnd: Any) -> None:
    spec, clients = case
    shuffled = list(clients)
    rnd.shuffle(shuffled)
    expected = _folded(spec, clients).mean()
    _assert_close(
        _folded(spec, shuffled).mean(),
        {k: v.astype(np.float64) for k, v in expected.items()},
        spec,
    )


def test_integer_tensors_round_and_unsigned_become_signed() -> None:
    spec: dict[str, Array] = {"count": np.zeros((), np.int64), "u": np.zeros(2, np.uint8)}
    acc = StreamingMean(spec)
    acc.add({"count": np.array(3), "u": np.array([-3.0, 1.0])}, 1.0)
    acc.add({"count": np.array(4), "u": np.array([-4.0, 2.0])}, 3.0)
    mean = acc.mean()
    assert mean["count"].dtype == np.int64
    assert mean["count"] == 4  # (3 + 12) / 4 = 3.75
    assert mean["u"].dtype == np.int8
    np.testing.assert_array_equal(mean["u"], [-4, 2])  # -3.75 -> -4, 1.75 -> 2


def test_mean_of_nothing_and_unsupported_dtypes_raise() -> None:
    with pytest.raises(StrategyError, match="zero updates"):
        StreamingMean({"a": np.zeros(2)}).mean()
    with pytest.raises(StrategyError, match=r"'flag'.*bool"):
        StreamingMean({"flag": np.zeros(2, dtype=bool)})


def test_mean_that_overflows_the_tensor_dtype_raises() -> None:
    acc = StreamingMean({"h": np.zeros(1, np.float16)})
    acc.add({"h": np.array([1e6])}, 1.0)
    with pytest.raises(StrategyError, match="overflows float16"):
        acc.mean()


SPEC: dict[str, Array] = {"a": np.zeros(3, np.float32), "b": np.zeros((2, 2), np.float32)}
GOOD: dict[str, Array] = {
    "a": np.array([1.0, 2.0, 3.0], np.float32),
    "b": np.full((2, 2), 0.5, np.float32),
}
BAD_UPDATES: dict[str, tuple[Update, float, str]] = {
    "missing": ({"a": GOOD["a"]}, 1.0, r"missing \['b'\]"),
    "unexpected": ({**GOOD, "c": np.zeros(1)}, 1.0, r"unexpected \['c'\]"),
    "shape": ({**GOOD, "b": np.zeros((2, 3))}, 1.0, r"'b'.*expected shape \(2, 2\), got \(2, 3\)"),
    "transposed-rank": ({**GOOD, "b": np.zeros(4)}, 1.0, "'b'.*shape"),
    "nan": ({**GOOD, "b": np.array([[0, 1], [np.nan, 2]])}, 1.0, "'b'.*finite"),
    "inf": ({**GOOD, "b": np.array([[0, 1], [np.inf, 2]])}, 1.0, "'b'.*finite"),
    "-inf": ({**GOOD, "b": np.full((2, 2), -np.inf, np.float16)}, 1.0, "'b'.*finite"),
    "complex": ({**GOOD, "b": np.zeros((2, 2), complex)}, 1.0, "'b'.*complex"),
    "overflow": ({**GOOD, "b": np.full((2, 2), 1e300)}, 1e10, "'b'.*overflows"),
    "zero-weight": (GOOD, 0.0, "weight"),
    "negative-weight": (GOOD, -2.0, "weight"),
    "nan-weight": (GOOD, float("nan"), "weight"),
    "inf-weight": (GOOD, float("inf"), "weight"),
    "bool-weight": (GOOD, True, "weight"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_rejected_update_leaves_accumulator_unchanged(case: str) -> None:
    update, weight, message = BAD_UPDATES[case]
    acc = StreamingMean(SPEC)
    acc.add(GOOD, 2.0)
    before = acc.mean()
    with pytest.raises(UpdateRejected, match=message):
        acc.add(update, weight)
    assert (acc.count, acc.total_weight) == (1, 2.0)
    for name, value in acc.mean().items():
        np.testing.assert_array_equal(value, before[name])
    later = {"a": np.array([-1.0, 0.0, 7.0], np.float32), "b": np.full((2, 2), 4.0, np.float32)}
    acc.add(later, 5.0)
    clean = _folded(SPEC, [(GOOD, 2.0), (later, 5.0)])
    for name, value in acc.mean().items():
        np.testing.assert_array_equal(value, clean.mean()[name])


def test_rejection_reason_is_kept() -> None:
    with pytest.raises(UpdateRejected) as info:
        StreamingMean(SPEC).add({**GOOD, "a": np.zeros(4)}, 1.0)
    assert "expected shape (3,), got (4,)" in info.value.reason


class CountingMapping(Mapping[str, Array]):
    """A lazily-read update: every ``[name]`` produces a fresh array and is counted."""

    def __init__(self, make: Mapping[str, Callable[[], Array]]) -> None:
        self._make = make
        self.reads: Counter[str] = Counter()

    def __getitem__(self, name: str) -> Array:
        self.reads[name] += 1
        return self._make[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._make)

    def __len__(self) -> int:
        return len(self._make)


def test_lazy_update_is_read_at_most_twice_per_tensor() -> None:
    lazy = CountingMapping({name: value.copy for name, value in GOOD.items()})
    acc = StreamingMean(SPEC)
    acc.add(lazy, 3.0)
    assert set(lazy.reads) == set(SPEC)
    assert max(lazy.reads.values()) <= 2
    np.testing.assert_array_equal(acc.mean()["a"], GOOD["a"])


def test_lazy_update_rejected_before_any_fold() -> None:
    bad = {**GOOD, "b": np.full((2, 2), np.nan, np.float32)}
    lazy = CountingMapping({name: value.copy for name, value in bad.items()})
    acc = StreamingMean(SPEC)
    with pytest.raises(UpdateRejected):
        acc.add(lazy, 1.0)
    assert max(lazy.reads.values()) <= 1
    assert acc.count == 0


def test_added_arrays_are_not_retained() -> None:
    acc = StreamingMean(SPEC)
    refs: list[weakref.ref[Array]] = []
    rng = np.random.default_rng(0)
    for _ in range(100):
        update = {name: rng.normal(size=ref.shape).astype(np.float32) for name, ref in SPEC.items()}
        refs.extend(weakref.ref(value) for value in update.values())
        acc.add(update, 1.0)
        del update
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []
    assert acc.count == 100
    assert acc.names == ("a", "b")


def test_spec_arrays_are_not_retained_or_mutated() -> None:
    spec = {"a": np.ones(3, np.float32)}
    ref = weakref.ref(spec["a"])
    acc = StreamingMean(spec)
    acc.add({"a": np.ones(3)}, 1.0)
    np.testing.assert_array_equal(spec["a"], np.ones(3, np.float32))
    del spec
    gc.collect()
    assert ref() is None


def test_concurrent_adds_fold_every_update_once() -> None:
    acc = StreamingMean(SPEC)
    rng = np.random.default_rng(1)
    clients = [
        ({n: rng.normal(size=r.shape) for n, r in SPEC.items()}, float(i + 1)) for i in range(64)
    ]

    def feed(part: list[tuple[Update, float]]) -> None:
        for update, weight in part:
            acc.add(update, weight)

    threads = [threading.Thread(target=feed, args=(clients[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert acc.count == 64
    assert acc.total_weight == sum(w for _, w in clients)
    _assert_close(acc.mean(), _reference(SPEC, clients), SPEC)
