"""Benchmarks comparing geofl with Flower as real deployments on loopback.

Entry points: ``python -m benchmarks.compare`` (a named workload on Flower and geofl, both
runtimes; see :mod:`benchmarks.compare` and :mod:`benchmarks.workloads`) and
``python -m benchmarks.framework`` (framework overhead by model size).
Building blocks: :mod:`benchmarks.byteproxy` (byte-counting TCP proxy),
:mod:`benchmarks.procmon` (per-group peak RSS), :mod:`benchmarks.loopback_bound`
(transfer time with no framework), :mod:`benchmarks.core` (the ``System`` seam).
"""

__all__ = [
    "apps",
    "byteproxy",
    "compare",
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
    "workloads",
]
