"""Single-core CPU cost of the steps geofl's server runs per received update.

The framework benchmark shows where a round's time goes by phase (``fit`` includes every
upload); this splits one update's server-side work into its steps, run in one thread the
way the coordinator's event loop runs them: parse each ``UploadMessage``, the chunk's data
left in place as a view (:func:`geofl.protocols.serde.decode_upload_view`), then the
:class:`~geofl.protocols.streams.Assembler`
(CRC32 check, NaN/Inf check, copy into the staging area), staged in memory or spilled to a
temporary file. ``crc32`` (:func:`geofl.protocols.serde.crc32`, as the assembler checks it)
and ``isfinite`` are also timed alone over the same chunks.

Run as ``python -m benchmarks.ingest_cost --params 10000000 --repeats 5``; prints JSON with
the median seconds of each step for one update.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from geofl.protocols import serde, streams
from geofl.protocols.tensors import model_bytes, spec_of
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.models.spool import MemoryBudget, SpoolSink

__all__ = ["ingest_costs", "main"]


def _median_s(step: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ingest_costs(params: int, repeats: int, chunk_bytes: int) -> dict[str, float]:
    """Median seconds of each server-side step for one update of ``params`` float32 values."""
    update = {"w": np.random.default_rng(0).standard_normal(params, dtype=np.float32)}
    spec = spec_of(update)
    header = pb.UploadHeader(task_id=1, round=1, attempt=1)
    raw = list(streams.encode_upload(header, update, chunk_bytes))[1:]
    chunks = [serde.decode_upload(r).chunk for r in raw]

    def assemble(limit: int) -> None:
        sink = SpoolSink(MemoryBudget(limit), model_bytes(spec))
        assembler = streams.Assembler(sink, spec, check_finite=True)
        for message in raw:
            parsed, data = serde.decode_upload_view(message)
            assembler.feed(parsed.chunk, data)
        assembler.finish()
        sink.discard()

    return {
        "decode_upload": _median_s(lambda: [serde.decode_upload_view(r) for r in raw], repeats),
        "crc32": _median_s(lambda: [serde.crc32(c.data) for c in chunks], repeats),
        "isfinite": _median_s(
            lambda: [np.isfinite(np.frombuffer(c.data, np.float32)).all() for c in chunks],
            repeats,
        ),
        "receive_in_memory": _median_s(lambda: assemble(1 << 40), repeats),
        "receive_spilled": _median_s(lambda: assemble(0), repeats),
        "client_encode_upload": _median_s(
            lambda: list(streams.encode_upload(header, update, chunk_bytes)), repeats
        ),
    }


def main(argv: list[str] | None = None) -> None:
    """Command line: print the step costs as JSON."""
    parser = argparse.ArgumentParser(description="geofl server CPU cost per received update")
    parser.add_argument("--params", type=int, default=10_000_000, help="float32 parameters")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-bytes", type=int, default=serde.DEFAULT_CHUNK_BYTES)
    args = parser.parse_args(argv)
    costs = ingest_costs(args.params, args.repeats, args.chunk_bytes)
    print(json.dumps({"params": args.params, "seconds_per_update": costs}, indent=2))


if __name__ == "__main__":
    main()
