"""Hypothesis strategies shared by the codec tests (no tests here).

One module so that every codec test draws tensors the same way: float16/32/64,
shapes from 0-d and empty up to 4-d, and non-contiguous views.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols.codecs import Chain, parse_chain

FLOAT_DTYPES = ("float32", "float64", "float16")
#: Magnitudes stay where float16 is finite so every codec accepts every draw.
BOUND = 1000.0
_WIDTHS: dict[str, Literal[16, 32, 64]] = {"float16": 16, "float32": 32, "float64": 64}

#: One configuration per codec (and a few chains), used for contract tests.
CODEC_CONFIGS: dict[str, object] = {
    "none": "none",
    "fp16": "fp16",
    "bf16": "bf16",
    "qsgd8": {"qsgd": {"bits": 8, "block": 16}},
    "qsgd4": {"qsgd": {"bits": 4, "block": 8}},
    "qsgd2": {"qsgd": {"bits": 2, "block": 24, "stochastic": False}},
    "topk": {"topk": {"ratio": 0.3}},
    "topk-k": {"topk": {"k": 3}},
    "randk": {"randk": {"ratio": 0.5, "unbiased": True}},
    "powersgd": {"powersgd": {"rank": 2}},
    "sign": "sign",
    "sign-block": {"sign": {"block": 8}},
    "topk+qsgd8": [{"topk": {"ratio": 0.5}}, {"qsgd": {"bits": 8, "block": 8}}],
    "topk+fp16": [{"topk": {"k": 5}}, "fp16"],
    "randk+bf16": [{"randk": {"ratio": 0.5}}, "bf16"],
    "powersgd+qsgd4": [{"powersgd": {"rank": 1}}, {"qsgd": {"bits": 4, "block": 8}}],
    "none+sign": ["none", "sign"],
}


def chain(label: str) -> Chain:
    """The chain configured under ``label`` in :data:`CODEC_CONFIGS`."""
    return parse_chain(CODEC_CONFIGS[label])


shapes = st.one_of(
    st.just(()),
    hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=7),
)
seeds = st.integers(min_value=0, max_value=2**64 - 1)


def elements(dtype: str) -> st.SearchStrategy[float]:
    """Finite values of ``dtype`` within ±:data:`BOUND`."""
    width = _WIDTHS[dtype]
    return st.floats(-BOUND, BOUND, width=width, allow_nan=False, allow_infinity=False)


@st.composite
def tensors(draw: st.DrawFn, dtypes: tuple[str, ...] = FLOAT_DTYPES) -> npt.NDArray[np.floating]:
    """A float tensor, sometimes a non-contiguous view (strided or transposed)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes)
    view = draw(st.sampled_from(["plain", "strided", "transposed"]))
    if view == "strided" and shape:
        base = draw(hnp.arrays(dtype, (shape[0] * 2, *shape[1:]), elements=elements(dtype)))
        return base[::2]
    array = draw(hnp.arrays(dtype, shape, elements=elements(dtype)))
    return array.T if view == "transposed" else array


def matrices_of_rank(
    rng: np.random.Generator, n: int, m: int, rank: int
) -> npt.NDArray[np.float32]:
    """A random ``n x m`` float32 matrix of exactly ``rank`` (generic factors)."""
    left = rng.standard_normal((n, rank))
    right = rng.standard_normal((m, rank))
    return (left @ right.T).astype(np.float32)
