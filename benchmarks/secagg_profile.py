"""Where geofl's SecAgg+ round spends its CPU: one round replayed in one process.

The real classes (:class:`~geofl.client.secagg.SecAggClient`,
:class:`~geofl.server.rounds.secagg.SecAggServer`, the client's ``weighted_flat``,
``mean_of_sum`` and the strategy's accumulator) run one round of ``n`` clients over a
``d``-parameter float32 delta, with no transport, and every step is timed. The client's
``mask()`` and the server's ``finish()`` are also split into their primitives (quantize,
one AES-CTR mask expansion, X25519+HKDF agreements, Shamir reconstruction, decoding), timed
on their own, so the integrator knows which one to optimise. For scale, the plain round's
per-client server work (folding one float32 delta into the running mean) is timed too.

Usage (single-threaded; run it under the heavy-work lock)::

    python -m benchmarks.secagg_profile --clients 50 --params 1000000 --variant matched \\
        --out benchmarks/results/secagg_geofl_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.secagg import SecAggCase
from benchmarks.secagg_geofl import VARIANTS, effective_params, secure_section
from geofl.client.secagg import SecAggClient
from geofl.client.secure_rounds import flatten, weighted_flat, weighted_vector
from geofl.protocols.secagg import (
    MASK_PURPOSE,
    SecAggParams,
    agree,
    agreement_info,
    expand,
    generate_private_key,
    public_bytes,
    reconstruct,
    split,
)
from geofl.protocols.tensors import Difference, spec_of
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.rounds.secagg import SecAggServer
from geofl.server.rounds.secure import mean_of_sum
from geofl.server.strategies.streaming import StreamingMean

__all__ = ["Timings", "main", "profile_round"]


@dataclass
class Timings:
    """Seconds per step: every call's duration, summarised by :meth:`summary`."""

    calls: dict[str, list[float]] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Record the duration of the ``with`` body under ``name``."""
        started = time.perf_counter()
        yield
        self.calls.setdefault(name, []).append(time.perf_counter() - started)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per step: calls, median and total seconds."""
        return {
            name: {
                "calls": len(values),
                "median_s": statistics.median(values),
                "total_s": sum(values),
            }
            for name, values in self.calls.items()
        }


def _client_stages(
    t: Timings, params: SecAggParams, server: SecAggServer
) -> dict[int, SecAggClient]:
    """Advertise and share for every client (timed), the server closing each stage."""
    clients = {u: SecAggClient(u, params) for u in params.cohort}
    for u, client in clients.items():
        with t.step("client advertise()"):
            keys = client.advertise()
        server.add_keys(u, keys)
    with t.step("server close_advertise()"):
        rosters = server.close_advertise()
    for u, client in clients.items():
        with t.step("client share_keys()"):
            shares = client.share_keys(rosters[u])
        server.add_shares(u, shares)
    with t.step("server close_sharing()"):
        inboxes = server.close_sharing()
    for u, client in clients.items():
        with t.step("client receive_shares()"):
            client.receive_shares(inboxes[u])
    return clients


def _delta(d: int, shift: float) -> dict[str, Difference]:
    base = np.random.default_rng(0).standard_normal(d, dtype=np.float32)
    return {"w": Difference(base + np.float32(shift), base)}


def profile_round(n: int, d: int, variant: str, dropped: int = 0) -> dict[str, Any]:
    """One secure round of ``n`` clients, ``dropped`` of them failing after sharing."""
    section = secure_section(variant, SecAggCase(n=n, d=d, rounds=1, secure=True))
    if section is None:
        raise ValueError("profile a secure variant, not plain")
    params = effective_params(section, n)
    t = Timings()
    server = SecAggServer(params)
    clients = _client_stages(t, params, server)
    gone = set(list(params.cohort)[:dropped])
    for u, client in clients.items():
        if u in gone:
            continue
        delta = _delta(d, 0.001 * u)
        with t.step("client weighted_flat(delta)"):
            vector = weighted_flat(delta, 1.0)
        with t.step("client mask() total"):
            masked = client.mask(vector)
        with t.step("server add_masked()"):
            server.add_masked(u, masked)
    with t.step("server close_masking()"):
        survivors, dropouts = server.close_masking()
    for u in sorted(survivors):
        with t.step("client reveal()"):
            revealed = clients[u].reveal(survivors, dropouts)
        server.add_reveal(u, revealed)
    with t.step("server finish() total"):
        total = server.finish()
    model = {"w": np.zeros(d, dtype=np.float32)}
    with t.step("server mean_of_sum()"):
        mean, weight = mean_of_sum(total, spec_of(model), pb.SecAggSetup(max_examples=1))
    with t.step("server accumulator.add(mean)"):
        StreamingMean(model).add(mean, weight)
    _primitives(t, params, d, _vector_of(d))
    return {
        "n": n,
        "d": d,
        "variant": variant,
        "degree": params.effective_degree,
        "threshold": params.threshold,
        "dropped": dropped,
        "steps": t.summary(),
    }


def _vector_of(d: int) -> npt.NDArray[np.float64]:
    return weighted_vector(flatten(_delta(d, 0.01)), 1.0)


def _primitives(t: Timings, params: SecAggParams, d: int, vector: npt.NDArray[Any]) -> None:
    """The parts of ``mask()`` and ``finish()`` on their own, a few times each."""
    rng = np.random.default_rng(0)
    quantizer = params.quantizer()
    key = bytes(range(32))
    mine, peer = generate_private_key(), public_bytes(generate_private_key())
    info = agreement_info(MASK_PURPOSE, 1, 1, 1, 2)
    secret_shares = split(bytes(32), params.threshold, list(range(1, params.effective_degree + 2)))
    some = dict(list(secret_shares.items())[: params.threshold])
    ring = quantizer.encode(vector, rng)
    zero = np.zeros_like(ring)
    model = {"w": np.zeros(d, dtype=np.float32)}
    update = {"w": np.ones(d, dtype=np.float32)}
    for _ in range(3):
        with t.step("part: quantizer.encode(d+1)"):
            quantizer.encode(vector, rng)
        with t.step("part: expand(key, d+1), one AES-CTR mask"):
            expand(key, d + 1, 32)
        with t.step("part: ring add of one mask"):
            np.add(ring, ring, out=ring)
        with t.step("part: X25519 + HKDF agree()"):
            agree(mine, peer, info=info)
        with t.step("part: Shamir reconstruct()"):
            reconstruct(some, params.threshold)
        with t.step("part: decode_sum(d+1)"):
            quantizer.decode_sum(zero, 1)
        accumulator = StreamingMean(model)
        with t.step("plain: server accumulator.add(float32 delta)"):
            accumulator.add(update, 1.0)


def _print(result: dict[str, Any]) -> None:
    print(
        f"n={result['n']} d={result['d']} {result['variant']}: degree {result['degree']}, "
        f"threshold {result['threshold']}, dropped {result['dropped']}"
    )
    for name, s in result["steps"].items():
        print(
            f"  {name:48s} {s['calls']:4d} calls  median {1e3 * s['median_s']:9.3f} ms  "
            f"total {s['total_s']:8.3f} s"
        )


def main(argv: list[str] | None = None) -> None:
    """Profile each requested variant and print (and optionally write) the timings."""
    parser = argparse.ArgumentParser(description="CPU profile of one geofl SecAgg+ round")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    parser.add_argument("--dropped", type=int, default=0, help="clients failing after sharing")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = [
        profile_round(args.clients, args.params, v, args.dropped)
        for v in args.variant or ["matched"]
    ]
    for result in results:
        _print(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"profiles": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
