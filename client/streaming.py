"""A Streaming DiLoCo fit: train on, send one fragment early, merge it a round later.

A streaming round (:mod:`geofl.protocols.streaming`) gives the client the global model,
the fragment ``f`` to synchronize now, the fragment ``m`` the previous round synchronized,
``local_steps`` (H / P) and the overlap ``tau``. Unlike a DiLoCo round, the client does
not restart from the global model: it keeps its own model across rounds
(:class:`StreamingState`) and

1. merges the arriving global values of fragment ``m`` into its own,
   ``local = alpha x local + (1 - alpha) x global`` (the rest stays local: each fragment
   is synchronized in its own round);
2. trains ``local_steps - tau`` steps, then hands ``local_f - global_f`` (the fragment's
   outer pseudo-gradient over its last H steps) to ``send``, a background sender;
3. trains the last ``tau`` steps while the fragment travels, and keeps the result for the
   next round, whose first act is step 1: the merge happens ``tau`` steps after the send.

The app's ``fit`` is called once per part with ``sync_segment`` 0 and 1, as in a
partial-sync fit, so :class:`geofl.client.torch.TorchClient` continues its optimizer
across the two. A client that missed the previous round (or is new, or restarted) starts
from the global model: its own copy of the other fragments would be rounds stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from geofl.client.app import Client
from geofl.client.partial_sync import Array, GroupSender, SegmentedFit, combined_metrics
from geofl.protocols import partial_sync, streaming
from geofl.protocols.streaming import StreamingRound
from geofl.protocols.tensors import check_matches, spec_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights

__all__ = ["StreamingState", "fit_streaming", "merged_start"]


@dataclass
class StreamingState:
    """The client's own model between streaming rounds (in memory only)."""

    run_id: int | None = None
    #: The round whose fit produced ``local``; None when there is nothing to continue.
    round: int | None = None
    local: dict[str, Array] = field(default_factory=dict)


def merged_start(
    state: StreamingState,
    global_weights: Weights,
    plan: StreamingRound,
    run_id: int,
    server_round: int,
) -> Weights:
    """Where this round's training starts: the kept model with fragment ``merge`` mixed in.

    The global model when there is no kept model of the previous round of this run (or
    it does not match the model's tensors).
    """
    continues = (
        state.run_id == run_id
        and state.round == server_round - 1
        and state.local.keys() == global_weights.keys()
        and all(state.local[n].shape == w.shape for n, w in global_weights.items())
    )
    if not continues:
        return {name: np.array(value, copy=True) for name, value in global_weights.items()}
    start = {name: value.copy() for name, value in state.local.items()}
    for name in plan.merge:
        arriving = global_weights[name]
        if arriving.dtype.kind != "f":
            start[name] = np.array(arriving, copy=True)
            continue
        local = start[name].astype(np.float64)
        mixed = plan.alpha * local + (1 - plan.alpha) * arriving.astype(np.float64)
        start[name] = mixed.astype(arriving.dtype)
    return start


def fit_streaming(
    client: Client,
    global_weights: Weights,
    config: Mapping[str, Scalar],
    send: GroupSender,
    state: StreamingState,
    *,
    run_id: int,
    server_round: int,
) -> SegmentedFit:
    """Train one streaming round; the fragment goes to ``send`` ``tau`` steps before the end.

    Raises
    ------
    ProtocolError
        If the round's streaming config is malformed or does not fit the model.
    """
    plan = streaming.streaming_round(config, list(global_weights))
    params = merged_start(state, global_weights, plan, run_id, server_round)
    state.run_id, state.round, state.local = run_id, None, {}  # nothing to continue if we fail
    spec = spec_of(global_weights)
    segments: list[tuple[int, Metrics, Config]] = []
    parts = [plan.steps_before_send] + ([plan.overlap] if plan.overlap else [])
    for index, steps in enumerate(parts):
        segment_config: Config = {**config, "local_steps": steps, partial_sync.SEGMENT_KEY: index}
        new, num_examples, metrics = client.fit(params, segment_config)
        params = {name: np.asarray(value) for name, value in new.items()}
        check_matches(spec, params)
        segments.append((int(num_examples), dict(metrics), segment_config))
        if index == 0:
            send(0, _pseudo_gradient(params, global_weights, plan.fragment))
    state.round, state.local = server_round, {n: np.array(v, copy=True) for n, v in params.items()}
    return SegmentedFit(sum(n for n, _, _ in segments), combined_metrics(segments), segments)


def _pseudo_gradient(
    params: Weights, global_weights: Weights, fragment: tuple[str, ...]
) -> dict[str, Array]:
    """``local - global`` of the fragment's tensors, in model order (the upload's order)."""
    wanted = set(fragment)
    return {
        name: np.subtract(params[name], base, dtype=base.dtype)
        for name, base in global_weights.items()
        if name in wanted
    }
