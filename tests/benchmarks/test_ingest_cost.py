"""The ingest-cost benchmark runs against the current stream API (it once called a removed one)."""

from __future__ import annotations

from benchmarks.ingest_cost import ingest_costs


def test_every_step_of_the_receive_path_is_timed() -> None:
    costs = ingest_costs(params=4096, repeats=1, chunk_bytes=1024)
    assert set(costs) == {
        "decode_upload",
        "crc32",
        "isfinite",
        "receive_in_memory",
        "receive_spilled",
        "client_encode_upload",
    }
    assert all(seconds >= 0 for seconds in costs.values())
