"""Fuzzing a running coordinator over real gRPC: it never crashes, never commits a
corrupted round, and records every message it refuses.

Two campaigns. The first throws hostile bytes at every method of a server that is
waiting for clients, with a valid, a missing or a forged session. The second runs real
rounds of two honest clients while a third participant ("mallory") answers each of
its fit tasks with a hostile upload; afterwards the global model must be exactly what
the honest clients and mallory's *accepted* uploads add up to.

``GEOFL_FUZZ_EXAMPLES`` raises the number of examples and draws them at random
(``benchmarks/fuzz.py`` runs such a campaign and reports the counts); the suite's
default is a fixed, derandomized draw so that CI is reproducible.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from geofl.client.connection import Connection
from geofl.protocols.errors import GeoflError
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.storage import open_database, queries

from .conftest import ServerHandle, final_weights, run_config
from .fuzzing import RawPeer, Tally, hostile_upload, valid_header, wire_bytes

CAMPAIGN = int(os.environ.get("GEOFL_FUZZ_EXAMPLES", "0"))
REPORT = os.environ.get("GEOFL_FUZZ_REPORT")


def _settings(examples: int) -> settings:
    return settings(
        max_examples=CAMPAIGN or examples,
        deadline=None,
        database=None,
        derandomize=not CAMPAIGN,
        # Each example changes the live server's state, so replaying one to shrink it
        # would not reproduce it: report the first failure as it happened.
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _report(name: str, tally: Tally, **extra: Any) -> None:
    if REPORT:
        entry = {
            "campaign": name,
            "messages": tally.calls,
            "refused": tally.total_refused,
            "polls_timed_out": tally.polls_timed_out,
            **extra,
        }
        with Path(REPORT).open("a") as out:
            out.write(json.dumps(entry) + "\n")


def _ledger(server: ServerHandle) -> dict[tuple[str, str], int]:
    return dict(server.coordinator.rejections.counts)


VALID_REQUESTS: dict[str, Any] = {
    "Challenge": pb.ChallengeRequest(),
    "Join": pb.JoinRequest(protocol_versions=[1], node_name="fuzz", client_version="0"),
    "Heartbeat": pb.HeartbeatRequest(),
    "GetTask": pb.GetTaskRequest(poll_timeout_s=0.0),
    "Download": pb.DownloadRequest(task_id=1, model_version=0),
}
FAKE_TASK = pb.Task(kind=pb.TASK_KIND_FIT, task_id=1, round=1)


def test_every_rpc_survives_hostile_messages(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 1},
        evaluation={"every": 0},
        strategy={"clients_per_round": 50, "min_clients": 50},
        schedule={"deadline_s": 20, "wait_for_clients_s": 600},
    )
    server = serve(config)
    peer = RawPeer(server.port, call_timeout_s=1.0)
    joined = peer.call("Join", VALID_REQUESTS["Join"].SerializeToString(), None)
    assert joined is not None
    token = pb.JoinReply.FromString(joined).session_token
    tokens = {"valid": token, "missing": None, "forged": token[::-1] + "x"}

    @_settings(examples=300)
    @given(
        method=st.sampled_from([*VALID_REQUESTS, "Submit"]),
        session=st.sampled_from(sorted(tokens)),
        data=st.data(),
    )
    def attack(method: str, session: str, data: st.DataObject) -> None:
        body: Any
        if method == "Submit":
            body = data.draw(hostile_upload(FAKE_TASK))
        else:
            body = data.draw(wire_bytes(VALID_REQUESTS[method]))
        peer.call(method, body, tokens[session])
        assert not server.result.done(), "the coordinator stopped while being fuzzed"

    attack()
    oversize = pb.JoinRequest(node_name="x" * (9 << 20)).SerializeToString()
    with pytest.raises(grpc.RpcError) as refused:
        peer.channel.unary_unary("/geofl.v1.Coordinator/Join")(oversize, timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # Every refusal the fuzzer saw is in the server's ledger, and nothing else is.
    assert _ledger(server) == dict(peer.tally.refused)
    assert peer.tally.total_refused > peer.tally.calls // 4  # the campaign did attack
    # And the server still serves a correct client.
    probe = Connection(f"127.0.0.1:{server.port}")
    probe.join("after-the-storm", None, {}, timeout=5)
    probe.heartbeat(timeout=5)
    probe.close()
    assert not server.result.done()
    _report("every-rpc", peer.tally)
    peer.close()


class Mallory:
    """A participant that downloads correctly and uploads whatever it is given."""

    def __init__(self, server: ServerHandle, patience_s: float) -> None:
        port = server.port
        self.server = server
        self.patience_s = patience_s
        self.conn = Connection(f"127.0.0.1:{port}")
        self.token = self.conn.join("mallory", None, {}, timeout=5).token
        self.peer = RawPeer(port)
        #: For each upload the server accepted: (round, its header).
        self.accepted: list[tuple[int, pb.UploadHeader]] = []
        self.pending: pb.Task | None = None
        self.refused = 0  # hostile uploads the server refused
        self.declined = 0  # fit tasks declined as client errors (accepted declines)
        self._done = threading.Event()
        self._beat = threading.Thread(target=self._heartbeats, daemon=True)
        self._beat.start()

    def _heartbeats(self) -> None:
        while not self._done.wait(0.2):
            with contextlib.suppress(GeoflError):
                self.conn.heartbeat(timeout=2)

    def next_fit_task(self) -> pb.Task | None:
        """The fit task to answer: the one still unanswered, or the next one to arrive.

        Hypothesis may abandon an example midway through drawing its data; the task it
        had taken stays pending for the next example, so no round waits for it.
        """
        waiting_since = time.monotonic()
        while self.pending is None:
            if self.server.result.done():  # a crash shows here (the clients would just wait)
                ended = self.server.result.result()
                raise AssertionError(f"the coordinator ended mid-run: {ended}")
            if time.monotonic() - waiting_since > self.patience_s:
                raise AssertionError(f"no fit task for {self.patience_s:.0f} s: a round is stuck")
            task = self.conn.get_task(poll_timeout_s=2.0)
            if task.kind == pb.TASK_KIND_SHUTDOWN:
                return None
            if task.kind == pb.TASK_KIND_FIT:
                self.conn.download(task, timeout=10)
                self.pending = task
        return self.pending

    def submit(self, task: pb.Task, stream: list[bytes]) -> None:
        """Send ``stream``; if it was refused, also decline the task as a client error.

        A refusal settles the task only when the upload could be tied to it (a refused
        upload naming another task leaves this one open): the decline, accepted or
        refused in turn, tells the two apart, and keeps the round from waiting for the
        deadline.
        """
        self.pending = None
        reply = self.peer.call("Submit", stream, self.token)
        if reply is not None:
            assert pb.SubmitReply.FromString(reply).accepted
            self.accepted.append((task.round, pb.UploadMessage.FromString(stream[0]).header))
            return
        self.refused += 1
        if self.peer.call("Submit", [self.decline(task)], self.token) is not None:
            self.declined += 1

    @staticmethod
    def decline(task: pb.Task) -> bytes:
        header = valid_header(task)
        header.status, header.error = pb.RESULT_STATUS_CLIENT_ERROR, "declined"
        return pb.UploadMessage(header=header).SerializeToString()

    def decline_the_rest(self) -> None:
        while (task := self.next_fit_task()) is not None:
            self.pending = None
            assert self.peer.call("Submit", [self.decline(task)], self.token) is not None
            self.declined += 1

    def close(self) -> None:
        self._done.set()
        self._beat.join(5)
        self.peer.close()
        self.conn.close()


def test_rounds_stay_exact_while_a_participant_sends_hostile_uploads(
    tmp_path: Path, serve: Any
) -> None:
    examples = CAMPAIGN or 40
    config = run_config(
        tmp_path,
        run={"rounds": examples + 10},
        evaluation={"every": 0},
        strategy={"clients_per_round": 3, "min_clients": 2},
        schedule={"deadline_s": 30, "wait_for_clients_s": 30},
        # Liveness is not under test: a loaded host must not expire mallory mid-campaign.
        server={"heartbeat_interval_s": 2.0},
    )
    server = serve(config)
    # A round lasts well under a second; past its deadline (30 s) it must have ended.
    mallory = Mallory(server, patience_s=60)
    server.add_client(0)
    server.add_client(1)

    @_settings(examples=examples)
    @given(data=st.data())
    def one_round(data: st.DataObject) -> None:
        task = mallory.next_fit_task()
        assert task is not None, "the run ended before the campaign did"
        mallory.submit(task, data.draw(hostile_upload(task)))

    one_round()
    declined_in_campaign = mallory.declined
    mallory.decline_the_rest()
    rounds_after_campaign = mallory.declined - declined_in_campaign
    result = server.wait(timeout=120)
    mallory.close()
    assert result.status == "completed"

    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        detail = queries.run_detail(session, result.run_id)
    assert [r.status for r in detail.rounds] == ["committed"] * config.run.rounds
    statuses = [p.status for p in detail.participations if p.node_name == "mallory"]
    ok = [h for _, h in mallory.accepted if h.status == pb.RESULT_STATUS_OK]
    assert statuses.count("ok") == len(ok)
    assert statuses.count("failed") == len(mallory.accepted) - len(ok) + mallory.declined
    settled_by_refusal = mallory.refused - (mallory.declined - rounds_after_campaign)
    assert statuses.count("rejected") + statuses.count("dropped") == settled_by_refusal
    assert len(statuses) == config.run.rounds
    assert _ledger(server) == dict(mallory.peer.tally.refused)

    # Honest clients add 1 and 2 with 10 and 20 examples; mallory's accepted uploads
    # are zero deltas with the weight they claimed. No other update may have counted.
    weight_by_round = {
        r: int(h.num_examples) for r, h in mallory.accepted if h.status == pb.RESULT_STATUS_OK
    }
    expected = sum(
        50.0 / (30.0 + weight_by_round.get(r, 0)) for r in range(1, config.run.rounds + 1)
    )
    weights = final_weights(config, result.run_id)
    assert all(np.isfinite(v).all() for v in weights.values())
    np.testing.assert_allclose(weights["w"], np.full((4, 3), expected), rtol=1e-5)
    np.testing.assert_allclose(weights["b"], np.full(3, expected), rtol=1e-5)
    _report("hostile-uploads", mallory.peer.tally, rounds=config.run.rounds, accepted=len(ok))
