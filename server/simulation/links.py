"""The WAN model: which region each client is in, its link, and its compute speed.

The model, deliberately simple so that a virtual clock and a user-space shaper can both
follow it exactly:

- A client's region is fixed. Region counts are ``share * N`` rounded by largest
  remainder (so they sum to ``N``); which clients land in which region is a seeded
  permutation, so region and client index are unrelated.
- Sending ``B`` bytes over a link of rate ``R`` bit/s with round-trip time ``rtt`` takes
  ``rtt / 2 + j + 8 B / R`` seconds: one-way propagation, a jitter sample ``j`` (uniform
  in ``[-jitter, +jitter]``, as netem's default, with the delay clipped at zero) and
  serialization. Rates are Mbit/s = 10^6 bit/s.
- Loss ``p`` is modelled as retransmission delay: each :data:`SEGMENT_BYTES`-byte segment
  is lost with probability ``p`` and a lost one stalls the link for one ``rtt`` (fast
  retransmit). The shaper draws the losses; the time formula adds their expectation,
  ``p * ceil(B / SEGMENT_BYTES) * rtt``.
- Compute takes ``samples / samples_per_s``; a client's ``samples_per_s`` and both its
  rates are the region's (or the baseline's) times a multiplier drawn once per client
  from :class:`~geofl.server.config.simulation.Heterogeneity`. A client trace, when given,
  replaces the drawn speed and bandwidth by the measured ones.
- A task that needs the model costs one round trip more than its bytes' transfer: the
  task's notice reaches the client (``rtt / 2``), which then asks for the model
  (``rtt / 2``) before the model's own trip (:meth:`ClientLink.fetch_s`). A task whose
  model the client holds costs only the notice. (Measured: on the wall clock with the
  shaper, the fit of a far client took this round trip longer than a charge without it.)
- A synchronous round ends when the slowest client's upload has arrived:
  ``max_i(fetch_i + compute_i + up_i)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from geofl.server.config.models import SimulationConfig
from geofl.server.config.simulation import (
    ComputeConfig,
    Distribution,
    Heterogeneity,
    RegionModel,
    check_region_names,
    check_shares,
)
from geofl.server.simulation.traces import ClientTrace

__all__ = [
    "DEFAULT_REGION",
    "SEGMENT_BYTES",
    "ClientLink",
    "Heterogeneity",
    "LinkModel",
    "RegionModel",
    "draw_multipliers",
    "region_counts",
    "sync_round_time_s",
    "transfer_time_s",
]

#: The one region of a model built from a trace alone: zero RTT, as in FedScale.
DEFAULT_REGION = "default"
BITS_PER_MBIT = 1e6
#: Payload bytes of one TCP segment (a 1500-byte Ethernet MTU less IP and TCP headers
#: with timestamps): the unit that :func:`transfer_time_s` and the shaper lose.
SEGMENT_BYTES = 1448
# Independent random streams, so that changing one distribution leaves the others' draws.
_REGION_STREAM, _COMPUTE_STREAM, _BANDWIDTH_STREAM = 0, 1, 2


def transfer_time_s(
    nbytes: int, rate_bps: float, rtt_s: float, jitter_s: float = 0.0, loss: float = 0.0
) -> float:
    """Seconds to deliver ``nbytes`` one way, expected over losses.

    ``max(0, rtt/2 + jitter) + 8 nbytes / rate + loss * ceil(nbytes / SEGMENT_BYTES) * rtt``:
    propagation, serialization and one ``rtt`` of stall per expected lost segment, the
    model the shaper (:mod:`geofl.server.simulation.shaper`) draws from.

    Raises
    ------
    ValueError
        If ``nbytes`` or ``rtt_s`` is negative, ``rate_bps`` is not positive or ``loss``
        is outside ``[0, 1)``.
    """
    if nbytes < 0 or rtt_s < 0 or not rate_bps > 0:
        raise ValueError(
            f"need nbytes >= 0, rtt_s >= 0 and rate_bps > 0, got {nbytes}, {rtt_s}, {rate_bps}"
        )
    if not 0 <= loss < 1:
        raise ValueError(f"loss must be in [0, 1), got {loss}")
    retransmit_s = loss * math.ceil(nbytes / SEGMENT_BYTES) * rtt_s
    return max(0.0, rtt_s / 2 + jitter_s) + nbytes * 8 / rate_bps + retransmit_s


@dataclass(frozen=True)
class ClientLink:
    """One client's concrete link and compute speed (seconds and bit/s throughout)."""

    client: int
    region: str
    rtt_s: float
    up_bps: float
    down_bps: float
    jitter_s: float
    loss: float
    samples_per_s: float

    def sample_jitter_s(self, rng: np.random.Generator) -> float:
        """One jitter sample, uniform in ``[-jitter_s, +jitter_s]`` (0 without jitter)."""
        return float(rng.uniform(-self.jitter_s, self.jitter_s)) if self.jitter_s else 0.0

    def download_s(self, nbytes: int, jitter_s: float = 0.0) -> float:
        """Seconds for ``nbytes`` from the server to this client (expected over losses)."""
        return transfer_time_s(nbytes, self.down_bps, self.rtt_s, jitter_s, self.loss)

    def fetch_s(self, nbytes: int, jitter_s: float = 0.0) -> float:
        """Seconds from a task's hand-out to its model on this client: the notice, then,
        when ``nbytes`` must be downloaded, the request's trip and the download."""
        if nbytes == 0:
            return self.download_s(0, jitter_s)
        return self.rtt_s + self.download_s(nbytes, jitter_s)

    def upload_s(self, nbytes: int, jitter_s: float = 0.0) -> float:
        """Seconds for ``nbytes`` from this client to the server (expected over losses)."""
        return transfer_time_s(nbytes, self.up_bps, self.rtt_s, jitter_s, self.loss)

    def compute_s(self, samples: int) -> float:
        """Seconds to train on ``samples`` samples."""
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        return samples / self.samples_per_s

    def round_s(
        self,
        download_bytes: int,
        upload_bytes: int,
        samples: int,
        rng: np.random.Generator | None = None,
    ) -> float:
        """Fetch the model, train, upload; with ``rng``, each transfer gets a jitter sample."""
        down_jitter = self.sample_jitter_s(rng) if rng is not None else 0.0
        up_jitter = self.sample_jitter_s(rng) if rng is not None else 0.0
        return (
            self.fetch_s(download_bytes, down_jitter)
            + self.compute_s(samples)
            + self.upload_s(upload_bytes, up_jitter)
        )


def sync_round_time_s(
    links: Sequence[ClientLink],
    download_bytes: int,
    upload_bytes: int,
    samples: Sequence[int],
    rng: np.random.Generator | None = None,
) -> float:
    """Duration of a synchronous round: the slowest client's download + compute + upload.

    Parameters
    ----------
    links
        The cohort.
    download_bytes, upload_bytes
        Bytes of the broadcast and of each update.
    samples
        Samples each client trains on, in the order of ``links``.
    rng
        Draws jitter when given; without it the result is the jitter-free time.
    """
    if len(samples) != len(links):
        raise ValueError(f"{len(samples)} sample counts for {len(links)} clients")
    if not links:
        raise ValueError("a round needs at least one client")
    return max(
        link.round_s(download_bytes, upload_bytes, n, rng)
        for link, n in zip(links, samples, strict=True)
    )


def region_counts(shares: Mapping[str, float], num_clients: int) -> dict[str, int]:
    """Clients per region: ``share * N`` by largest remainder, summing to ``N`` exactly.

    Ties in the remainder go to the region named first.

    Raises
    ------
    ValueError
        If there are no regions, ``num_clients`` is negative or the shares do not sum to 1.
    """
    if not shares:
        raise ValueError("no regions to assign clients to")
    if num_clients < 0:
        raise ValueError(f"num_clients must be >= 0, got {num_clients}")
    check_shares(shares)
    total = sum(shares.values())
    quotas = {name: share / total * num_clients for name, share in shares.items()}
    counts = {name: int(quota) for name, quota in quotas.items()}
    left = num_clients - sum(counts.values())
    by_remainder = sorted(quotas, key=lambda name: quotas[name] - counts[name], reverse=True)
    for name in by_remainder[:left]:
        counts[name] += 1
    return counts


def draw_multipliers(
    distribution: Distribution, size: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """``size`` per-client multipliers from ``distribution``."""
    if distribution.lognormal is not None:
        return rng.lognormal(0.0, distribution.lognormal.sigma, size)
    if distribution.uniform is not None:
        return rng.uniform(distribution.uniform.low, distribution.uniform.high, size)
    return np.ones(size, dtype=np.float64)


def _assign_regions(shares: Mapping[str, float], num_clients: int, seed: int) -> list[str]:
    counts = region_counts(shares, num_clients)
    ordered = [name for name, count in counts.items() for _ in range(count)]
    order = np.random.default_rng([seed, _REGION_STREAM]).permutation(num_clients)
    return [ordered[i] for i in order]


def _check_traces(traces: Sequence[ClientTrace] | None, num_clients: int, regions: bool) -> None:
    if traces is None:
        if not regions:
            raise ValueError("no regions and no trace: nothing to build a link model from")
        return
    if len(traces) != num_clients:
        raise ValueError(f"{len(traces)} client traces for {num_clients} clients")
    if not regions:
        lacking = next((i for i, t in enumerate(traces) if t.capacity is None), None)
        if lacking is not None:
            raise ValueError(
                f"client {lacking}'s trace gives no communication speed and there are no "
                "regions to take one from; define simulation.regions or use a trace with "
                "device_capacity"
            )


@dataclass(frozen=True)
class LinkModel:
    """Every client's link: build it with :meth:`build` or :meth:`from_config`."""

    regions: Mapping[str, RegionModel]
    links: tuple[ClientLink, ...]

    @classmethod
    def build(
        cls,
        num_clients: int,
        seed: int,
        regions: Mapping[str, RegionModel],
        heterogeneity: Heterogeneity | None = None,
        compute: ComputeConfig | None = None,
        traces: Sequence[ClientTrace] | None = None,
    ) -> LinkModel:
        """Assign regions and draw per-client speeds, deterministically from ``seed``.

        Parameters
        ----------
        num_clients
            Clients to model, numbered ``0 .. num_clients - 1``.
        seed
            Seed of every draw (region permutation, compute and bandwidth multipliers).
        regions
            The regions by name; shares must sum to 1. May be empty only with ``traces``
            that give every client a capacity: then all clients are in
            :data:`DEFAULT_REGION` with zero RTT.
        heterogeneity, compute
            Multiplier distributions and the baseline speed; defaults: none, 200 samples/s.
        traces
            One trace per client (e.g. ``TraceSet.for_clients(num_clients)``); a trace's
            capacity replaces the drawn speed and bandwidth.

        Raises
        ------
        ValueError
            On inconsistent shares, bad names, or a trace list of the wrong length.
        """
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        check_region_names(regions)
        _check_traces(traces, num_clients, bool(regions))
        heterogeneity = heterogeneity or Heterogeneity()
        baseline = (compute or ComputeConfig()).samples_per_s
        names = (
            _assign_regions({n: r.share for n, r in regions.items()}, num_clients, seed)
            if regions
            else [DEFAULT_REGION] * num_clients
        )
        speed = baseline * draw_multipliers(
            heterogeneity.compute, num_clients, np.random.default_rng([seed, _COMPUTE_STREAM])
        )
        rate = draw_multipliers(
            heterogeneity.bandwidth, num_clients, np.random.default_rng([seed, _BANDWIDTH_STREAM])
        )
        links = tuple(
            _link(
                client,
                name,
                regions.get(name),
                float(speed[client]),
                float(rate[client]),
                traces[client] if traces is not None else None,
            )
            for client, name in enumerate(names)
        )
        return cls(dict(regions), links)

    @classmethod
    def from_config(
        cls,
        simulation: SimulationConfig,
        seed: int,
        traces: Sequence[ClientTrace] | None = None,
    ) -> LinkModel:
        """The model the ``simulation`` section describes, for ``simulation.clients``."""
        return cls.build(
            simulation.clients,
            seed,
            simulation.regions,
            simulation.heterogeneity,
            simulation.compute,
            traces,
        )

    def link(self, client: int) -> ClientLink:
        """Client ``client``'s link."""
        if not 0 <= client < len(self.links):
            raise IndexError(f"client {client} is not in 0..{len(self.links) - 1}")
        return self.links[client]

    @property
    def client_regions(self) -> tuple[str, ...]:
        """The region of each client, by client index."""
        return tuple(link.region for link in self.links)

    def region_counts(self) -> dict[str, int]:
        """Clients per region, in the regions' order."""
        names = list(self.regions) or [DEFAULT_REGION]
        counts = dict.fromkeys(names, 0)
        for link in self.links:
            counts[link.region] += 1
        return counts

    def clients_in(self, region: str) -> tuple[int, ...]:
        """Indices of the clients of ``region``.

        Raises
        ------
        KeyError
            If no region has that name, listing the ones that exist.
        """
        counts = self.region_counts()
        if region not in counts:
            raise KeyError(f"unknown region {region!r}; the regions are {sorted(counts)}")
        return tuple(link.client for link in self.links if link.region == region)


def _link(
    client: int,
    region_name: str,
    region: RegionModel | None,
    samples_per_s: float,
    bandwidth_multiplier: float,
    trace: ClientTrace | None,
) -> ClientLink:
    """One client's link: the region's delays, and its rates scaled or measured."""
    if trace is not None and trace.capacity is not None:
        speed = trace.capacity.samples_per_s
        up = down = trace.capacity.bandwidth_bps
    elif region is not None:
        speed = samples_per_s
        up = region.up_mbps * BITS_PER_MBIT * bandwidth_multiplier
        down = region.down_mbps * BITS_PER_MBIT * bandwidth_multiplier
    else:
        raise ValueError(f"client {client} has neither a region nor a measured capacity")
    return ClientLink(
        client=client,
        region=region_name,
        rtt_s=region.rtt_ms / 1000 if region is not None else 0.0,
        up_bps=up,
        down_bps=down,
        jitter_s=region.jitter_ms / 1000 if region is not None else 0.0,
        loss=region.loss if region is not None else 0.0,
        samples_per_s=speed,
    )
