"""Per-link adaptive compression: the least lossy upload chain that meets the deadline.

The model: an update of ``B`` raw bytes compressed by a chain of ratio ``r``
(compressed / raw bytes) uploads in ``rtt / 2 + 8 r B / bandwidth`` seconds, the
jitter- and loss-free part of :func:`geofl.server.simulation.links.transfer_time_s`.
The client's budget for the upload is what is left of the safety-margined deadline
after its predicted download and compute (:func:`upload_budget_s`).
:func:`choose_upload_chain` walks a ladder of chains from least to most lossy and takes
the first that fits; if none does, it takes the smallest and says so. Since upload time
only falls as bandwidth grows, more bandwidth never yields a lossier chain.

The ratios of :data:`DEFAULT_LADDER` are measured, not assumed: :func:`measure_ladder`
encodes a seeded Gaussian float32 tensor with each chain through
:mod:`geofl.protocols.codecs` and divides the payload by the uncompressed one. They are
for large tensors; tensors below the compression rules' ``min_bytes`` travel raw, which
makes the real ratio of a model with many small tensors somewhat higher.

None of the ladder's lossy chains is linear (see ``docs/compression.md``), so adaptive
choice does not combine with secure aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geofl.protocols.codecs import Chain, encode_tensor, parse_chain

__all__ = [
    "DEFAULT_CHAINS",
    "DEFAULT_LADDER",
    "ChainChoice",
    "ChainOption",
    "choose_upload_chain",
    "measure_ladder",
    "upload_budget_s",
    "upload_time_s",
]

#: The default ladder's chains, least lossy first: raw, half precision, 8-bit QSGD,
#: top 10 % in half precision, top 1 % in half precision.
DEFAULT_CHAINS: tuple[Chain, ...] = (
    (),
    parse_chain("fp16"),
    parse_chain({"qsgd": {"bits": 8}}),
    parse_chain([{"topk": {"ratio": 0.1}}, "fp16"]),
    parse_chain([{"topk": {"ratio": 0.01}}, "fp16"]),
)
#: Elements of the tensor :func:`measure_ladder` encodes by default.
MEASURE_ELEMENTS = 100_000


@dataclass(frozen=True)
class ChainOption:
    """A chain, its compressed / raw size ratio, and its rank in loss (0 = lossless)."""

    chain: Chain
    ratio: float
    loss_rank: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 0):
            raise ValueError(f"ratio must be a finite number > 0, got {self.ratio!r}")
        if self.loss_rank < 0:
            raise ValueError(f"loss_rank must be >= 0, got {self.loss_rank}")


@dataclass(frozen=True)
class ChainChoice:
    """The chosen option, its predicted upload seconds, and whether that fits the budget.

    ``note`` explains a choice that does not fit; it is ``None`` when it does.
    """

    option: ChainOption
    predicted_upload_s: float
    fits: bool
    note: str | None = None

    @property
    def chain(self) -> Chain:
        """The chosen chain."""
        return self.option.chain


def measure_ladder(
    chains: Sequence[Chain], elements: int = MEASURE_ELEMENTS, seed: int = 0
) -> tuple[ChainOption, ...]:
    """Options for ``chains`` (least lossy first) with ratios measured by encoding.

    Each chain encodes the same seeded standard-normal float32 tensor of ``elements``
    values; the ratio is its payload over the payload of the empty chain, so raw is
    exactly 1. ``loss_rank`` is the chain's position in ``chains``.
    """
    if elements < 1:
        raise ValueError(f"elements must be >= 1, got {elements}")
    if not chains:
        raise ValueError("a ladder needs at least one chain")
    update = np.random.default_rng(seed).standard_normal(elements, dtype=np.float32)
    raw = len(encode_tensor(update, (), seed=seed))
    return tuple(
        ChainOption(chain, len(encode_tensor(update, chain, seed=seed)) / raw, rank)
        for rank, chain in enumerate(chains)
    )


#: :data:`DEFAULT_CHAINS` with measured ratios (measured once, at import).
DEFAULT_LADDER: tuple[ChainOption, ...] = measure_ladder(DEFAULT_CHAINS)


def upload_time_s(bandwidth_bps: float, rtt_s: float, nbytes: float) -> float:
    """``rtt / 2 + 8 nbytes / bandwidth``: seconds to upload ``nbytes``."""
    if not (math.isfinite(bandwidth_bps) and bandwidth_bps > 0):
        raise ValueError(f"bandwidth_bps must be a finite number > 0, got {bandwidth_bps!r}")
    if not (math.isfinite(rtt_s) and rtt_s >= 0):
        raise ValueError(f"rtt_s must be a finite number >= 0, got {rtt_s!r}")
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"the upload size must be a finite number >= 0, got {nbytes!r}")
    return rtt_s / 2 + 8 * nbytes / bandwidth_bps


def upload_budget_s(
    deadline_s: float, predicted_download_s: float, predicted_compute_s: float, margin: float
) -> float:
    """Seconds left for the upload: ``margin * deadline_s - download - compute``.

    May be zero or negative: then no upload fits and :func:`choose_upload_chain` falls
    back to the smallest chain.
    """
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ValueError(f"deadline_s must be a finite number > 0, got {deadline_s!r}")
    if not (math.isfinite(margin) and 0 < margin <= 1):
        raise ValueError(f"margin must be in (0, 1], got {margin!r}")
    for name, value in (("download", predicted_download_s), ("compute", predicted_compute_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"predicted {name} seconds must be finite and >= 0, got {value!r}")
    return margin * deadline_s - predicted_download_s - predicted_compute_s


def choose_upload_chain(
    bandwidth_bps: float,
    rtt_s: float,
    update_bytes: int,
    budget_s: float,
    options: Sequence[ChainOption] = DEFAULT_LADDER,
) -> ChainChoice:
    """The least lossy option whose upload fits ``budget_s``; else the smallest one.

    Options are tried by ``loss_rank`` (ties: smaller ratio first). If none fits, the
    option with the smallest ratio (ties: less lossy) is chosen with ``fits=False``.

    Raises
    ------
    ValueError
        If there are no options, ``budget_s`` is not a number, or the link or size is
        invalid (see :func:`upload_time_s`).
    """
    if not options:
        raise ValueError("no compression options to choose from")
    if math.isnan(budget_s):
        raise ValueError("budget_s is NaN")
    if update_bytes < 0:
        raise ValueError(f"update_bytes must be >= 0, got {update_bytes}")

    def seconds(option: ChainOption) -> float:
        return upload_time_s(bandwidth_bps, rtt_s, option.ratio * update_bytes)

    for option in sorted(options, key=lambda o: (o.loss_rank, o.ratio)):
        if seconds(option) <= budget_s:
            return ChainChoice(option, seconds(option), fits=True)
    smallest = min(options, key=lambda o: (o.ratio, o.loss_rank))
    note = (
        f"no chain uploads {update_bytes} bytes at {bandwidth_bps:.4g} bit/s within "
        f"{budget_s:.3g} s; chose the smallest (ratio {smallest.ratio:.3g}, "
        f"predicted {seconds(smallest):.3g} s)"
    )
    return ChainChoice(smallest, seconds(smallest), fits=False, note=note)
