"""Keys sent ahead: a survivor's unmask answer carries its next round's public keys.

:class:`~geofl.server.rounds.secure.SecureRound` is driven over several rounds with the
clients' real :class:`~geofl.client.secure_rounds.SecureRounds` (no transport): from the
second round on nobody who unmasked advertises again, the sums stay exact, every key pair
serves one round only, and whoever cannot use keys sent ahead (a dropped client, a client
that joined again, a restarted one) falls back to the advertise stage or drops out as
the protocol allows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.client.secure_rounds import SecureRounds
from geofl.protocols.errors import GeoflError
from geofl.protocols.secagg import PublicKeys, SecAggError
from geofl.protocols.tensors import Difference, TensorSpec
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.nodes.outcomes import MaskedVector, Outcome, StageResult
from geofl.server.nodes.registry import NodeSession, TaskKindName, TaskRecord
from geofl.server.rounds.secure import KeysAhead, SecureRound, SecureSettings, round_params
from geofl.server.rounds.tasks import StageInput, TakeResult

SPEC = (TensorSpec("w", "float32", (6,)),)
KINDS = {
    "advertise": pb.TASK_KIND_SECAGG_ADVERTISE,
    "share": pb.TASK_KIND_SECAGG_SHARE,
    "fit": pb.TASK_KIND_FIT,
    "unmask": pb.TASK_KIND_SECAGG_UNMASK,
}


def _settings() -> SecureSettings:
    return SecureSettings(
        run_id=3,
        degree="full",
        threshold=0.6,
        clip=4.0,
        ring_bits=32,
        max_examples=1,
        stage_deadline_s=10.0,
    )


def _session(node_id: int) -> NodeSession:
    return NodeSession(node_id, f"n{node_id}", None, {}, token=f"t{node_id}")


def _update(node_id: int, number: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.full(6, 0.01 * node_id + 0.1 * number, dtype=np.float32)


class Harness:
    """The engine's side of the stages, answered in process by each node's SecureRounds."""

    def __init__(self, nodes: Sequence[int], ahead: KeysAhead | None = None) -> None:
        self.sessions = {n: _session(n) for n in nodes}
        self.clients = {n: SecureRounds() for n in nodes}
        self.ahead = ahead if ahead is not None else KeysAhead()
        self.use_ahead = True
        self.unmask_tasks: list[pb.SecAggTask] = []
        self.unmask_answers: list[pb.SecAggResult] = []
        self.tasks: Counter[tuple[int, str]] = Counter()  # (round, kind) -> tasks handed out
        #: (round, node) whose fit fails: it shared its secrets but uploads nothing.
        self.fail_fit: set[tuple[int, int]] = set()
        #: Applied to every unmask answer before the server sees it.
        self.edit_unmask: Callable[[int, pb.SecAggResult], None] = lambda n, r: None
        self.keys: dict[tuple[int, int], PublicKeys] = {}  # (round, node) -> keys it used
        self._next_task = 0

    def message(self, number: int, kind: str, secagg: pb.SecAggTask) -> pb.Task:
        return pb.Task(kind=KINDS[kind], task_id=0, run_id=3, round=number, secagg=secagg)

    def run(self, number: int, cohort: Sequence[int]) -> tuple[np.ndarray[Any, Any], float]:
        sessions = [self.sessions[n] for n in cohort]
        ahead = self.ahead if self.use_ahead else None
        secure = SecureRound(_settings(), number, sessions, SPEC, ahead)

        async def stage(
            members: Sequence[NodeSession], kind: TaskKindName, inputs: StageInput, take: TakeResult
        ) -> None:
            for session in members:
                node = session.node_id
                self.tasks[number, kind] += 1
                message = self.message(number, kind, inputs(session))
                rounds = self.clients[node]
                if kind == "fit":
                    if (number, node) in self.fail_fit:
                        continue
                    delta = {"w": Difference(_update(node, number), np.zeros(6, np.float32))}
                    outcome = Outcome("ok", payload=MaskedVector(rounds.mask(message, delta, 1)))
                else:
                    try:
                        if kind == "advertise":
                            result = rounds.advertise(message, node)
                        elif kind == "share":
                            result = rounds.share(message)
                        else:
                            result = rounds.unmask(message)
                    except GeoflError:
                        continue  # the client fails its task: dropped from this stage on
                    if kind == "advertise":
                        self.keys[number, node] = PublicKeys(
                            bytes(result.keys.encrypt), bytes(result.keys.mask)
                        )
                    if kind == "share" and message.secagg.HasField("own"):
                        own = message.secagg.own
                        self.keys[number, node] = PublicKeys(bytes(own.encrypt), bytes(own.mask))
                    if kind == "unmask":
                        self.edit_unmask(node, result)
                        self.unmask_tasks.append(message.secagg)
                        self.unmask_answers.append(result)
                    outcome = Outcome("ok", payload=StageResult(result))
                self._next_task += 1
                future = asyncio.get_running_loop().create_future()
                task = TaskRecord(self._next_task, node, kind, number, number - 1, {}, 0.0, future)
                await take(task, outcome)

        mean, weight = asyncio.run(secure.run(stage, stage))
        return np.asarray(mean["w"], dtype=np.float64), weight


def _expected(nodes: Sequence[int], number: int) -> np.ndarray[Any, Any]:
    return np.mean([_update(n, number).astype(np.float64) for n in nodes], axis=0)


def test_from_the_second_round_on_nobody_advertises_and_the_sums_stay_exact() -> None:
    nodes = [1, 2, 3, 4, 5]
    h = Harness(nodes)
    for number in (1, 2, 3):
        mean, weight = h.run(number, nodes)
        np.testing.assert_allclose(mean, _expected(nodes, number), atol=1e-6)
        assert weight == pytest.approx(5.0, abs=1e-6)
    assert h.tasks[1, "advertise"] == 5
    assert h.tasks[2, "advertise"] == 0 and h.tasks[3, "advertise"] == 0
    assert h.tasks[2, "share"] == 5 and h.tasks[3, "unmask"] == 5
    # Every round used fresh keys: no key pair (or half of one) serves two rounds.
    halves = [k.encrypt for k in h.keys.values()] + [k.mask for k in h.keys.values()]
    assert len(h.keys) == 15 and len(set(halves)) == len(halves)
    assert len(h.ahead) == 5  # round 3's survivors sent keys for round 4


def test_a_client_dropped_in_the_fit_advertises_again_and_the_rest_do_not() -> None:
    nodes = [1, 2, 3, 4, 5]
    h = Harness(nodes)
    h.fail_fit = {(1, 4)}
    mean, _ = h.run(1, nodes)
    np.testing.assert_allclose(mean, _expected([1, 2, 3, 5], 1), atol=1e-6)
    mean, _ = h.run(2, nodes)
    np.testing.assert_allclose(mean, _expected(nodes, 2), atol=1e-6)
    assert h.tasks[2, "advertise"] == 1  # node 4 only: it never unmasked round 1


def test_keys_sent_by_an_earlier_session_of_a_node_are_not_used() -> None:
    nodes = [1, 2, 3, 4]
    h = Harness(nodes)
    h.run(1, nodes)
    h.sessions[2] = _session(2)  # node 2 joined again: a new session
    h.clients[2] = SecureRounds()  # ... from a restarted client, its secrets gone
    mean, _ = h.run(2, nodes)
    np.testing.assert_allclose(mean, _expected(nodes, 2), atol=1e-6)
    assert h.tasks[2, "advertise"] == 1


def test_a_client_that_lost_its_keys_drops_out_and_the_round_still_sums() -> None:
    """The same session, but the client's state is gone: its share fails, it is pruned."""
    nodes = [1, 2, 3, 4, 5]
    h = Harness(nodes)
    h.run(1, nodes)
    h.clients[5] = SecureRounds()
    mean, weight = h.run(2, nodes)
    np.testing.assert_allclose(mean, _expected([1, 2, 3, 4], 2), atol=1e-6)
    assert weight == pytest.approx(4.0, abs=1e-6)
    mean, _ = h.run(3, nodes)  # node 5 did not unmask round 2: it advertises in round 3
    np.testing.assert_allclose(mean, _expected(nodes, 3), atol=1e-6)
    assert h.tasks[3, "advertise"] == 1


def test_malformed_keys_in_an_unmask_answer_cost_only_the_next_advertise() -> None:
    nodes = [1, 2, 3, 4]
    h = Harness(nodes)

    def spoil(node: int, result: pb.SecAggResult) -> None:
        if node == 3:
            result.keys.mask = b"short"

    h.edit_unmask = spoil
    mean, _ = h.run(1, nodes)  # node 3's reveal still counts
    np.testing.assert_allclose(mean, _expected(nodes, 1), atol=1e-6)
    h.edit_unmask = lambda n, r: None
    mean, _ = h.run(2, nodes)
    np.testing.assert_allclose(mean, _expected(nodes, 2), atol=1e-6)
    assert h.tasks[2, "advertise"] == 1


def test_a_partial_cohort_uses_its_keys_later_and_once() -> None:
    """Node 4 sits out round 2; its keys from round 1 serve its next round, round 3."""
    h = Harness([1, 2, 3, 4])
    h.run(1, [1, 2, 3, 4])
    h.run(2, [1, 2, 3])
    mean, _ = h.run(3, [1, 2, 3, 4])
    np.testing.assert_allclose(mean, _expected([1, 2, 3, 4], 3), atol=1e-6)
    assert h.tasks[2, "advertise"] == 0 and h.tasks[3, "advertise"] == 0
    assert h.keys[3, 4] != h.keys[1, 4]


# ------------------------------------------------------------------ the client alone


def _unmasked_client() -> tuple[SecureRounds, PublicKeys, Harness]:
    """A client of a finished round 1 that sent keys ahead, and those keys."""
    h = Harness([1, 2, 3])
    h.run(1, [1, 2, 3])
    rounds = h.clients[1]
    entry = h.ahead.take(h.sessions[1])
    assert entry is not None
    return rounds, entry, h


def _share_task(h: Harness, own: PublicKeys | None) -> pb.Task:
    """Round 2's share task for node 1, with neighbours 2 and 3 (keys of their own)."""
    setup = pb.SecAggSetup(
        cohort=[1, 2, 3], threshold=2, degree=2, graph_seed=bytes(32), clip=4.0, ring_bits=32
    )
    advertise = h.message(2, "advertise", pb.SecAggTask(setup=setup))
    others = {n: SecureRounds().advertise(advertise, n) for n in (2, 3)}
    task = pb.SecAggTask(setup=setup, roster={n: r.keys for n, r in others.items()})
    if own is not None:
        task.own.CopyFrom(pb.PublicKeys(encrypt=own.encrypt, mask=own.mask))
    return h.message(2, "share", task)


def test_keys_sent_ahead_serve_one_share_only() -> None:
    rounds, keys, h = _unmasked_client()
    assert len(rounds.share(_share_task(h, keys)).shares) == 2
    with pytest.raises(SecAggError, match="has none"):
        rounds.share(_share_task(h, keys))  # the same keys named again: refused


def test_an_advertise_task_discards_the_keys_sent_ahead() -> None:
    rounds, keys, h = _unmasked_client()
    setup = _share_task(h, None).secagg.setup
    rounds.advertise(h.message(2, "advertise", pb.SecAggTask(setup=setup)), 1)
    with pytest.raises(SecAggError, match="has none"):
        rounds.share(_share_task(h, keys))


def test_a_share_naming_other_keys_is_refused() -> None:
    rounds, keys, h = _unmasked_client()
    wrong = PublicKeys(encrypt=keys.mask, mask=keys.encrypt)
    with pytest.raises(SecAggError, match="did not send ahead"):
        rounds.share(_share_task(h, wrong))
    with pytest.raises(SecAggError, match="has none"):  # and the secrets are gone too
        rounds.share(_share_task(h, keys))


def test_no_keys_ahead_unless_the_unmask_task_asks() -> None:
    """An engine without a KeysAhead (FedBuff groups): every round advertises, as before."""
    h = Harness([1, 2, 3])
    h.use_ahead = False
    for number in (1, 2):
        mean, _ = h.run(number, [1, 2, 3])
        np.testing.assert_allclose(mean, _expected([1, 2, 3], number), atol=1e-6)
    assert h.tasks[1, "advertise"] == h.tasks[2, "advertise"] == 3
    assert not any(t.keys_ahead for t in h.unmask_tasks)
    assert not any(r.HasField("keys") for r in h.unmask_answers)
    assert len(h.ahead) == 0


@settings(max_examples=15, deadline=None)
@given(
    cohorts=st.lists(
        st.sets(st.integers(min_value=1, max_value=6), min_size=3, max_size=6),
        min_size=2,
        max_size=4,
    ),
    failing=st.sets(st.tuples(st.integers(1, 4), st.integers(1, 6)), max_size=2),
)
def test_any_sequence_of_cohorts_sums_exactly_with_fresh_keys(
    cohorts: list[set[int]], failing: set[tuple[int, int]]
) -> None:
    """Any cohorts over rounds, some fits failing: exact sums, one round per key pair."""
    h = Harness(range(1, 7))
    for number, cohort in enumerate(cohorts, start=1):
        members = sorted(cohort)
        h.fail_fit = {(r, n) for r, n in failing if r == number and n in cohort}
        survivors = [n for n in members if (number, n) not in h.fail_fit]
        if len(survivors) < round_params(_settings(), number, members).threshold:
            h.fail_fit = set()
            survivors = members
        mean, weight = h.run(number, members)
        np.testing.assert_allclose(mean, _expected(survivors, number), atol=1e-6)
        assert weight == pytest.approx(len(survivors), abs=1e-6)
    halves = [k.encrypt for k in h.keys.values()] + [k.mask for k in h.keys.values()]
    assert len(set(halves)) == len(halves)
