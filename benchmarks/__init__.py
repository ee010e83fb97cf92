"""Benchmarks comparing geofl with Flower as real deployments on loopback.

Entry point: ``python -m benchmarks.framework`` (see :mod:`benchmarks.framework`).
Building blocks: :mod:`benchmarks.byteproxy` (byte-counting TCP proxy),
:mod:`benchmarks.procmon` (per-group peak RSS), :mod:`benchmarks.loopback_bound`
(transfer time with no framework), :mod:`benchmarks.core` (the ``System`` seam).
"""

__all__ = [
    "apps",
    "byteproxy",
    "compression",
    "core",
    "flower_system",
    "framework",
    "geofl_system",
    "harness",
    "ingest_cost",
    "loopback_bound",
    "metrics",
    "procmon",
]
