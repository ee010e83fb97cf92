"""The user-space link shaper: its schedule, the bytes it carries and its process.

No test measures time: the schedule is checked as arithmetic, the proxy on bytes,
closes and queue sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geofl.server.simulation.shaper as shaper_module
from geofl.server.simulation.links import SEGMENT_BYTES, ClientLink, transfer_time_s
from geofl.server.simulation.shaper import (
    LISTEN_HOST,
    SPARE_CHUNKS,
    Direction,
    LinkShaper,
    LinkSpec,
    Pacer,
    ShaperConfigError,
    ShaperSet,
    ShaperStartError,
    link_name,
    load_links,
    main,
    parse_address,
    parse_links,
    plan_transfer,
    schedule_chunk,
    start_shaper_process,
)

#: Fast enough that a test's bytes take milliseconds, lossy and jittery to exercise both.
FAST = LinkSpec("fast", rtt_s=0.002, up_bps=2e8, down_bps=2e8, jitter_s=0.001, loss=0.05)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _client_link(client: int) -> ClientLink:
    return ClientLink(client, "far", 0.22, 5e6, 10e6, 0.004, 0.01, samples_per_s=100)


# --- the schedule, as arithmetic -------------------------------------------------------


def test_back_to_back_chunks_leave_at_the_rate_and_land_half_an_rtt_later() -> None:
    pacer = Pacer(Direction(rate_bps=8e6, rtt_s=0.1), np.random.default_rng(0))  # 1 byte/us
    last = -math.inf
    slots = []
    for _ in range(3):
        slot = pacer.next_slot(0.0, 1000, last)
        slots.append(slot)
        last = slot.delivery_s
    assert [s.departure_s for s in slots] == pytest.approx([0.001, 0.002, 0.003])
    assert [s.delivery_s for s in slots] == pytest.approx([0.051, 0.052, 0.053])
    # An idle link starts serializing when the next chunk arrives.
    assert pacer.next_slot(5.0, 1000, last).departure_s == pytest.approx(5.001)


def test_schedule_chunk_stalls_one_rtt_per_lost_segment_and_never_delivers_early() -> None:
    direction = Direction(rate_bps=8e6, rtt_s=0.1)
    slot = schedule_chunk(direction, 1.0, 1000, 2.0, 0.0, delay_s=0.05, lost_segments=2)
    assert slot.departure_s == pytest.approx(2.0 + 0.001 + 0.2)
    assert slot.delivery_s == pytest.approx(2.251)
    assert slot.lost_segments == 2
    held = schedule_chunk(direction, 1.0, 1000, 0.0, 9.0, delay_s=0.05, lost_segments=0)
    assert held.delivery_s == 9.0  # behind the connection's previous chunk


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 0.05), min_size=1, max_size=40),
    sizes=st.lists(st.integers(0, 200_000), min_size=40, max_size=40),
    rtt_s=st.floats(0, 0.3),
    jitter_s=st.floats(0, 0.05),
    seed=st.integers(0, 2**32),
)
def test_jitter_never_reorders_and_nothing_beats_the_pacer(
    gaps: list[float], sizes: list[int], rtt_s: float, jitter_s: float, seed: int
) -> None:
    direction = Direction(rate_bps=1e7, rtt_s=rtt_s, jitter_s=jitter_s)
    pacer = Pacer(direction, np.random.default_rng(seed))
    arrival, departure, delivery = 0.0, -math.inf, -math.inf
    for gap, size in zip(gaps, sizes, strict=False):
        arrival += gap
        slot = pacer.next_slot(arrival, size, delivery)
        serialization = size * 8 / direction.rate_bps
        assert slot.departure_s == pytest.approx(max(arrival, departure) + serialization)
        assert slot.delivery_s >= delivery  # monotone: bytes are not reordered
        assert slot.delivery_s >= slot.departure_s + max(0.0, rtt_s / 2 - jitter_s) - 1e-12
        assert slot.delivery_s <= max(delivery, slot.departure_s + rtt_s / 2 + jitter_s) + 1e-12
        departure, delivery = slot.departure_s, slot.delivery_s


def test_delay_is_clipped_at_zero() -> None:
    pacer = Pacer(Direction(1e6, rtt_s=0.002, jitter_s=0.01), np.random.default_rng(1))
    delays = [pacer.draw_delay_s() for _ in range(200)]
    assert min(delays) == 0.0
    assert max(delays) > 0.001


def test_a_lossless_jitterless_link_draws_nothing() -> None:
    rng = np.random.default_rng(2)
    before = rng.bit_generator.state
    pacer = Pacer(Direction(1e6, rtt_s=0.1), rng)
    assert all(pacer.next_slot(0.0, 10_000, 0.0).lost_segments == 0 for _ in range(10))
    assert rng.bit_generator.state == before


def test_losses_are_seeded_and_each_stalls_the_pacer_one_rtt() -> None:
    direction = Direction(rate_bps=8e6, rtt_s=0.1, loss=0.1)

    def run(seed: int) -> list[int]:
        pacer = Pacer(direction, np.random.default_rng(seed))
        lost, departure = [], 0.0
        for _ in range(2000):
            slot = pacer.next_slot(0.0, 10 * SEGMENT_BYTES, 0.0)
            stall = slot.departure_s - departure - 10 * SEGMENT_BYTES * 8 / direction.rate_bps
            assert stall == pytest.approx(slot.lost_segments * 0.1, abs=1e-9)
            lost.append(slot.lost_segments)
            departure = slot.departure_s
        return lost

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    # 20,000 segments at 10 %: binomial, mean 2000 and standard deviation 42.
    assert abs(sum(first) - 2000) < 5 * 42


@pytest.mark.parametrize(
    ("direction", "nbytes"),
    [
        (Direction(rate_bps=20e6, rtt_s=0.08), 2_000_000),
        (Direction(rate_bps=5e6, rtt_s=0.22, loss=0.01), 1_000_000),
    ],
)
def test_a_message_takes_the_link_models_time(direction: Direction, nbytes: int) -> None:
    penalties = []
    for seed in range(300):
        slots = plan_transfer(direction, nbytes, np.random.default_rng(seed), start_s=1.0)
        lost = sum(slot.lost_segments for slot in slots)
        lossless = transfer_time_s(nbytes, direction.rate_bps, direction.rtt_s)
        # Exactly the lossless time plus one rtt per lost segment ...
        assert slots[-1].delivery_s - 1.0 == pytest.approx(lossless + lost * direction.rtt_s)
        penalties.append(lost * direction.rtt_s)
    expected = transfer_time_s(
        nbytes, direction.rate_bps, direction.rtt_s, loss=direction.loss
    ) - transfer_time_s(nbytes, direction.rate_bps, direction.rtt_s)
    # ... and on average the expected penalty links.transfer_time_s adds (3 sigma here).
    assert np.mean(penalties) == pytest.approx(expected, abs=0.09)


def test_chunks_are_whole_segments_of_about_ten_milliseconds() -> None:
    assert Direction(5e6, 0.1).chunk_bytes == 4 * SEGMENT_BYTES  # the floor
    assert Direction(20e6, 0.1).chunk_bytes == 17 * SEGMENT_BYTES  # 25 kB in 10 ms
    assert Direction(1e9, 0.1).chunk_bytes == 45 * SEGMENT_BYTES  # the cap, under 64 KiB
    direction = Direction(8e6, rtt_s=0.1, jitter_s=0.01)
    assert direction.queue_limit_bytes == 60_000 + SPARE_CHUNKS * direction.chunk_bytes


# --- link descriptions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"up_bps": -1.0}, "up_bps"),
        ({"down_bps": 0.0}, "down_bps"),
        ({"rtt_s": float("nan")}, "rtt_s"),
        ({"jitter_s": -0.1}, "jitter_s"),
        ({"loss": 1.0}, "loss"),
        ({"name": ""}, "non-empty name"),
    ],
)
def test_bad_links_are_refused_naming_the_field(change: dict[str, object], named: str) -> None:
    fields: dict[str, object] = {"name": "a", "rtt_s": 0.1, "up_bps": 1e6, "down_bps": 1e6}
    with pytest.raises(ShaperConfigError, match=named):
        LinkSpec(**(fields | change))  # type: ignore[arg-type]


def test_a_client_link_becomes_a_named_spec() -> None:
    spec = LinkSpec.from_client_link(_client_link(3))
    assert spec == LinkSpec("client-3", 0.22, 5e6, 10e6, 0.004, 0.01)
    assert spec.name == link_name(3)
    assert spec.up == Direction(5e6, 0.22, 0.004, 0.01)
    assert spec.down == Direction(10e6, 0.22, 0.004, 0.01)
    assert LinkSpec.from_client_link(_client_link(3), name="x").name == "x"
    assert parse_links(json.dumps([spec.to_json()]), "f") == (spec,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{", r"links\.json: not JSON"),
        ('{"name": "a"}', "expected a non-empty JSON list"),
        ("[]", "expected a non-empty JSON list"),
        ("[3]", "link 0: expected an object"),
        ('[{"name": "a", "rtt_s": 0, "up_bps": 1, "down_bps": 1, "rate": 2}]', r"\['rate'\]"),
        ('[{"name": "a", "rtt_s": 0, "up_bps": 1}]', r"missing key\(s\) \['down_bps'\]"),
        ('[{"name": "a", "rtt_s": "20", "up_bps": 1, "down_bps": 1}]', "rtt_s must be a number"),
        ('[{"name": "a", "rtt_s": 0, "up_bps": 1, "down_bps": 1, "loss": true}]', "loss must"),
        ('[{"name": "a", "rtt_s": 0, "up_bps": -5, "down_bps": 1}]', "link 'a': up_bps"),
        (
            '[{"name": "a", "rtt_s": 0, "up_bps": 1, "down_bps": 1},'
            ' {"name": "a", "rtt_s": 0, "up_bps": 1, "down_bps": 1}]',
            r"repeated: \['a'\]",
        ),
    ],
)
def test_bad_links_files_are_refused_naming_file_and_problem(text: str, message: str) -> None:
    with pytest.raises(ShaperConfigError, match=message) as caught:
        parse_links(text, "links.json")
    assert str(caught.value).startswith("links.json: ")


def test_an_unreadable_links_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ShaperConfigError, match=r"nope\.json: cannot read"):
        load_links(tmp_path / "nope.json")


def test_upstream_addresses() -> None:
    assert parse_address("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad in ("127.0.0.1", ":80", "host:0", "host:70000", "host:http"):
        with pytest.raises(ShaperConfigError, match="HOST:PORT"):
            parse_address(bad)


# --- the proxy ------------------------------------------------------------------------


async def _collect_then_reply(reply: list[bytes], got: asyncio.Future[bytes]) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.set_result(await reader.read())  # to the end of stream: the half-close came
        for piece in reply:
            writer.write(piece)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    return handle


async def _exchange(spec: LinkSpec, up: list[bytes], down: list[bytes]) -> tuple[bytes, bytes]:
    """Send ``up`` and half-close; the server answers ``down`` and closes."""
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(await _collect_then_reply(down, got), LISTEN_HOST, 0)
    async with server, LinkShaper(spec, ("127.0.0.1", server.sockets[0].getsockname()[1])) as link:
        reader, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
        for piece in up:
            writer.write(piece)
            await writer.drain()
        writer.write_eof()
        back = await reader.read()
        writer.close()
        await writer.wait_closed()
        assert (link.stats.up.bytes, link.stats.down.bytes) == (len(b"".join(up)), len(back))
        return await got, back


@settings(max_examples=25, deadline=None)
@given(
    up=st.lists(st.binary(max_size=20_000), max_size=6),
    down=st.lists(st.binary(max_size=20_000), max_size=6),
)
def test_bytes_pass_unchanged_both_ways(up: list[bytes], down: list[bytes]) -> None:
    received, back = asyncio.run(_exchange(FAST, up, down))
    assert received == b"".join(up)
    assert back == b"".join(down)


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in 5 s")


async def _with_upstream(
    handle: Handler, body: Callable[[LinkShaper], Awaitable[None]], spec: LinkSpec = FAST
) -> None:
    server = await asyncio.start_server(handle, LISTEN_HOST, 0)
    async with server, LinkShaper(spec, ("127.0.0.1", server.sockets[0].getsockname()[1])) as link:
        await body(link)
        await _until(lambda: link.stats.open_connections == 0)
    assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing leaked


def test_a_server_close_reaches_the_client() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"bye")
        writer.close()

    async def body(link: LinkShaper) -> None:
        reader, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
        assert await reader.read() == b"bye"  # then the end of stream
        writer.close()
        await writer.wait_closed()

    asyncio.run(_with_upstream(handle, body))


def test_a_client_close_reaches_the_server() -> None:
    async def scenario() -> None:
        seen: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(await reader.read())
            writer.close()

        async def body(link: LinkShaper) -> None:
            _, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
            writer.write(b"hello")
            writer.close()
            await writer.wait_closed()
            assert await seen == b"hello"

        await _with_upstream(handle, body)

    asyncio.run(scenario())


def test_a_reset_client_cuts_the_upstream_connection() -> None:
    async def scenario() -> None:
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while await reader.read(65536):
                    pass
            except ConnectionError:
                pass
            ended.set_result(None)
            writer.close()

        async def body(link: LinkShaper) -> None:
            _, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
            writer.write(b"x" * 100_000)
            await writer.drain()
            writer.transport.abort()
            await ended

        await _with_upstream(handle, body)

    asyncio.run(scenario())


def test_closing_the_shaper_cuts_open_connections_and_leaks_nothing() -> None:
    async def scenario() -> None:
        relayed: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            relayed.set_result(await reader.readexactly(5))
            await reader.read()
            writer.close()

        server = await asyncio.start_server(handle, LISTEN_HOST, 0)
        async with server:
            link = LinkShaper(FAST, ("127.0.0.1", server.sockets[0].getsockname()[1]))
            reader, writer = await asyncio.open_connection(LISTEN_HOST, await link.start())
            writer.write(b"hello")
            assert await relayed == b"hello"
            await link.close()
            assert link.stats.open_connections == 0
            with contextlib.suppress(ConnectionError):  # ended or reset: either way, cut
                assert await reader.read() == b""
            writer.close()
            await link.close()  # idempotent
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(scenario())


def test_an_unreachable_upstream_cuts_the_client() -> None:
    async def scenario() -> None:
        placeholder = await asyncio.start_server(lambda r, w: None, LISTEN_HOST, 0)
        port = placeholder.sockets[0].getsockname()[1]
        placeholder.close()
        await placeholder.wait_closed()
        async with LinkShaper(FAST, ("127.0.0.1", port)) as link:
            reader, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
            with contextlib.suppress(ConnectionError):
                assert await reader.read() == b""
            writer.close()
            await _until(lambda: link.stats.open_connections == 0)

    asyncio.run(scenario())


def test_a_fast_sender_is_held_back_by_the_queue_bound() -> None:
    spec = LinkSpec("slow", rtt_s=0.01, up_bps=80e6, down_bps=80e6)  # 2 MB take 0.2 s
    payload = bytes(range(256)) * 8192

    async def scenario() -> None:
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        handle = await _collect_then_reply([], got)

        async def body(link: LinkShaper) -> None:
            _, writer = await asyncio.open_connection(LISTEN_HOST, link.port)
            writer.write(payload)  # all at once: only the bound stops the shaper reading
            writer.write_eof()
            assert await got == payload
            writer.close()
            stats = link.stats.up
            assert stats.queue_limit_bytes == spec.up.queue_limit_bytes < len(payload) // 4
            assert spec.up.chunk_bytes <= stats.peak_queued_bytes <= stats.queue_limit_bytes

        await _with_upstream(handle, body, spec)

    asyncio.run(scenario())


def _echo_reversed() -> grpc.GenericRpcHandler[bytes, bytes]:
    async def reverse(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request[::-1]

    return grpc.method_handlers_generic_handler(
        "test.Echo", {"Reverse": grpc.unary_unary_rpc_method_handler(reverse)}
    )


def test_a_grpc_call_goes_through_the_shaper() -> None:
    payload = np.random.default_rng(0).bytes(300_000)

    async def call(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            reverse = channel.unary_unary("/test.Echo/Reverse", None, None)
            assert await reverse(payload) == payload[::-1]
            assert await reverse(b"again") == b"niaga"

    async def scenario() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_echo_reversed(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        links = ShaperSet([FAST], ("127.0.0.1", port))
        try:
            ports = await links.start()
            await call(f"{LISTEN_HOST}:{ports['fast']}")
        finally:
            await links.close()
            await server.stop(None)
        stats = links.shapers["fast"].stats
        assert stats.connections >= 1
        assert stats.up.bytes > len(payload) and stats.down.bytes > len(payload)

    asyncio.run(scenario())


def test_repeated_names_are_refused_by_a_set() -> None:
    with pytest.raises(ShaperConfigError, match=r"repeated: \['fast'\]"):
        ShaperSet([FAST, FAST], ("127.0.0.1", 1))


# --- the process ----------------------------------------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.read())
    writer.close()


async def _ping(port: int) -> bytes:
    reader, writer = await asyncio.open_connection(LISTEN_HOST, port)
    writer.write(b"ping")
    writer.write_eof()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


def test_the_shaper_process_serves_named_ports_and_stops_cleanly(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(_echo, LISTEN_HOST, 0)
        upstream = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            links = [_client_link(0), _client_link(1)]
            process = await asyncio.to_thread(start_shaper_process, links, upstream, tmp_path)
            try:
                assert sorted(process.ports) == ["client-0", "client-1"]
                assert process.port_of("client-0") != process.port_of("client-1")
                assert process.address_of("client-1") == f"127.0.0.1:{process.ports['client-1']}"
                with pytest.raises(KeyError, match=r"the links are \['client-0', 'client-1'\]"):
                    process.port_of("client-2")
                assert await _ping(process.port_of("client-1")) == b"ping"
            finally:
                assert await asyncio.to_thread(process.stop) == 0  # SIGTERM: clean exit
        assert json.loads((tmp_path / "shaper-links.json").read_text())[0]["name"] == "client-0"

    asyncio.run(scenario())


def test_the_shaper_cli_prints_ports_and_exits_cleanly_on_sigint(tmp_path: Path) -> None:
    links = tmp_path / "links.json"
    links.write_text(json.dumps([FAST.to_json()]))
    command = shaper_module.shaper_command(links, "127.0.0.1:9", seed=0)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        ports = json.loads(process.stdout.readline())["ports"]
        assert list(ports) == ["fast"] and ports["fast"] > 0
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_the_shaper_cli_names_a_malformed_links_file(tmp_path: Path) -> None:
    links = tmp_path / "links.json"
    links.write_text("[{")
    command = shaper_module.shaper_command(links, "127.0.0.1:9", seed=0)
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert f"{links}: not JSON" in result.stderr
    assert result.stdout == ""


def test_main_refuses_unknown_keys_and_bad_upstreams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    links = tmp_path / "links.json"
    links.write_text(json.dumps([FAST.to_json() | {"delay": 1}]))
    assert main(["--upstream", "127.0.0.1:9", "--links", str(links)]) == 2
    assert "unknown key(s) ['delay']" in capsys.readouterr().err
    assert main(["--upstream", "nowhere", "--links", str(links)]) == 2
    assert "upstream must be HOST:PORT" in capsys.readouterr().err


def _fake_command(code: str) -> Callable[[Path, str, int], list[str]]:
    return lambda links_path, upstream, seed: [sys.executable, "-c", code]


def test_a_dying_shaper_process_reports_its_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = "import sys; sys.stderr.write('boom'); sys.exit(3)"
    monkeypatch.setattr(shaper_module, "shaper_command", _fake_command(code))
    with pytest.raises(ShaperStartError, match=r"exited with code 3 .*stderr:\nboom"):
        start_shaper_process([FAST], "127.0.0.1:9", tmp_path)


def test_a_silent_shaper_process_times_out_and_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        shaper_module, "shaper_command", _fake_command("import time; time.sleep(60)")
    )
    with pytest.raises(ShaperStartError, match=r"did not report its ports within 0\.5 s"):
        start_shaper_process([FAST], "127.0.0.1:9", tmp_path, timeout_s=0.5)


def test_start_refuses_bad_input_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ShaperConfigError, match="repeated"):
        start_shaper_process([FAST, FAST], "127.0.0.1:9", tmp_path)
    with pytest.raises(ShaperConfigError, match="HOST:PORT"):
        start_shaper_process([FAST], "localhost", tmp_path)
    with pytest.raises(ShaperConfigError, match="no links"):
        start_shaper_process([], "127.0.0.1:9", tmp_path)
    assert not (tmp_path / "shaper.log").exists()
