"""A Streaming DiLoCo fit on the client: send early, keep the model, merge a round later."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from geofl.client.app import Client
from geofl.client.partial_sync import GroupUpdate, SegmentedFit
from geofl.client.streaming import StreamingState, fit_streaming
from geofl.protocols import streaming
from geofl.protocols.types import Config, Metrics, Weights, WeightsView


class Stepper(Client):
    """Adds ``rate x local_steps`` to every tensor; remembers each call's config."""

    def __init__(self, rate: float = 1.0, fail_segment: int | None = None) -> None:
        self.rate = rate
        self.fail_segment = fail_segment
        self.calls: list[Config] = []

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        self.calls.append(dict(config))
        if config.get("sync_segment") == self.fail_segment:
            raise ValueError("deliberate failure")
        steps = int(config["local_steps"])  # type: ignore[arg-type]
        out = {k: v + self.rate * steps for k, v in parameters.items()}
        return out, 10 * steps, {"train_loss": 1.0}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        return 0.0, 1, {}


def _config(fragment: list[str], merge: list[str], steps: int, overlap: int, alpha: float) -> Any:
    return {
        streaming.FRAGMENT_KEY: streaming.encode_names(fragment),
        streaming.MERGE_KEY: streaming.encode_names(merge),
        streaming.OVERLAP_KEY: overlap,
        streaming.ALPHA_KEY: alpha,
        "local_steps": steps,
    }


def _model(a: float = 0.0, b: float = 0.0) -> Weights:
    return {"a": np.full(2, a, np.float32), "b": np.full(3, b, np.float32)}


Sent = list[tuple[int, GroupUpdate, int]]  # (index, update, fit calls made before it)


def _run(
    client: Stepper, state: StreamingState, global_weights: Weights, config: Any, r: int
) -> tuple[SegmentedFit, Sent]:
    sent: Sent = []

    def send(index: int, update: GroupUpdate) -> None:
        sent.append((index, update, len(client.calls)))

    fit = fit_streaming(client, global_weights, config, send, state, run_id=1, server_round=r)
    return fit, sent


def test_the_fragment_is_sent_after_the_steps_before_the_overlap() -> None:
    client, state = Stepper(rate=2.0), StreamingState()
    fit, sent = _run(client, state, _model(), _config(["a"], [], 5, 2, 0.5), 1)
    # Two calls: 3 steps, then the 2 overlap steps; the fragment went after the first.
    assert [(c["local_steps"], c["sync_segment"]) for c in client.calls] == [(3, 0), (2, 1)]
    assert len(sent) == 1 and sent[0][0] == 0 and sent[0][2] == 1
    assert list(sent[0][1]) == ["a"]
    np.testing.assert_array_equal(sent[0][1]["a"], np.full(2, 6.0))
    assert fit.num_examples == 50
    # The kept model has all 5 steps of every tensor.
    assert state.round == 1
    np.testing.assert_array_equal(state.local["b"], np.full(3, 10.0))


def test_the_next_round_mixes_the_arriving_fragment_and_keeps_the_rest_local() -> None:
    client, state = Stepper(rate=1.0), StreamingState()
    _run(client, state, _model(), _config(["a"], [], 2, 1, 0.25), 1)  # local a = b = 2
    arriving = _model(a=6.0)  # the server moved a; b unchanged (0)
    _, sent = _run(client, state, arriving, _config(["b"], ["a"], 2, 1, 0.25), 2)
    # a = 0.25 x 2 + 0.75 x 6 = 5; b stays local (2); one step each before b is sent.
    np.testing.assert_allclose(sent[0][1]["b"], np.full(3, 3.0))  # 2 + 1 - global 0
    np.testing.assert_allclose(state.local["a"], np.full(2, 5.0 + 2))


def test_a_client_that_missed_a_round_starts_from_the_global_model() -> None:
    client, state = Stepper(), StreamingState()
    _run(client, state, _model(), _config(["a"], [], 2, 0, 0.5), 1)
    _, sent = _run(client, state, _model(a=1.0, b=1.0), _config(["a"], ["b"], 2, 0, 0.5), 3)
    np.testing.assert_allclose(sent[0][1]["a"], np.full(2, 2.0))  # only this round's steps
    assert state.round == 3


def test_with_no_overlap_and_alpha_zero_each_round_starts_from_the_global_model() -> None:
    client, state = Stepper(), StreamingState()
    _run(client, state, _model(), _config(["a", "b"], [], 3, 0, 0.0), 1)
    arriving = _model(a=7.0, b=-1.0)
    _, sent = _run(client, state, arriving, _config(["a", "b"], ["a", "b"], 3, 0, 0.0), 2)
    assert len(client.calls) == 2  # one call per round: nothing overlapped
    np.testing.assert_array_equal(sent[0][1]["a"], np.full(2, 3.0))
    np.testing.assert_array_equal(sent[0][1]["b"], np.full(3, 3.0))


def test_a_failed_fit_leaves_nothing_to_continue() -> None:
    client, state = Stepper(fail_segment=1), StreamingState()
    with pytest.raises(ValueError, match="deliberate"):
        _run(client, state, _model(), _config(["a"], [], 2, 1, 0.5), 1)
    assert state.round is None and not state.local
