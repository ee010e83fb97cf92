"""A partially synchronized fit: local steps in segments, one layer group sent after each.

The round config (:mod:`geofl.protocols.partial_sync`) names ``N`` layer groups and
``local_steps`` H. The client app's ``fit`` is called ``N`` times, each for one segment
of the H steps (config ``local_steps`` = the segment's steps, ``sync_segment`` = its
index, so an app such as :class:`geofl.client.torch.TorchClient` can keep its optimizer
and data order across segments). After segment ``k`` the difference of group ``k``'s
tensors to the global model is handed to ``send`` (a background sender, so it travels
while the next segments train).

What a layer learns after its group was sent is kept by the client
(:class:`LocalProgress`) and added to its next upload of that layer, so no local
progress is thrown away; with ``keep_local`` off it is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from geofl.client.app import Client
from geofl.protocols import partial_sync
from geofl.protocols.tensors import check_matches, spec_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights

__all__ = [
    "GroupSender",
    "GroupUpdate",
    "LocalProgress",
    "SegmentedFit",
    "combined_metrics",
    "fit_in_segments",
]

Array = npt.NDArray[np.generic]
#: One layer group's update tensors.
GroupUpdate = dict[str, Array]
#: Receives (group index, that group's update) as soon as the group is final.
GroupSender = Callable[[int, GroupUpdate], None]


@dataclass
class LocalProgress:
    """Per-tensor progress made after the tensor was last sent, awaiting the next upload."""

    run_id: int | None = None
    residual: dict[str, Array] = field(default_factory=dict)

    def for_run(self, run_id: int) -> LocalProgress:
        """Forget progress made for another run (it belongs to a different model)."""
        if self.run_id != run_id:
            self.residual.clear()
            self.run_id = run_id
        return self


@dataclass
class SegmentedFit:
    """What the segments reported together."""

    num_examples: int
    metrics: Metrics
    #: The fit's reply of each segment: (num_examples, metrics, that segment's config).
    segments: list[tuple[int, Metrics, Config]]


def fit_in_segments(
    client: Client,
    global_weights: Weights,
    config: Mapping[str, Scalar],
    send: GroupSender,
    progress: LocalProgress | None = None,
) -> SegmentedFit:
    """Train the round's H steps segment by segment, sending each group when it is final.

    Raises
    ------
    ProtocolError
        If the config's groups do not cover the model exactly once.
    ValueError
        If the config has no integer ``local_steps`` or fewer steps than groups.
    """
    groups = partial_sync.groups_of(config, list(global_weights))
    if groups is None:
        raise ValueError(f"config has no {partial_sync.CONFIG_KEY!r}: not a partial-sync round")
    steps = partial_sync.segments_of(config, _local_steps(config), len(groups))
    spec = spec_of(global_weights)
    params = {name: value.copy() for name, value in global_weights.items()}
    sent_at: dict[str, Array] = {}
    segments: list[tuple[int, Metrics, Config]] = []
    for index, (group, count) in enumerate(zip(groups, steps, strict=True)):
        segment_config: Config = {
            **config,
            "local_steps": count,
            partial_sync.SEGMENT_KEY: index,
        }
        new, num_examples, metrics = client.fit(params, segment_config)
        params = {name: np.asarray(value) for name, value in new.items()}
        check_matches(spec, params)
        segments.append((int(num_examples), dict(metrics), segment_config))
        update = {}
        for name in group:
            sent_at[name] = params[name].copy()
            update[name] = _with_residual(name, params[name], global_weights[name], progress)
        send(index, update)
    if progress is not None:  # only now: a failed fit's upload is discarded, keep it all
        for name in sent_at:
            progress.residual.pop(name, None)
        _keep_unsent(progress, params, sent_at)
    return SegmentedFit(sum(n for n, _, _ in segments), combined_metrics(segments), segments)


def _local_steps(config: Mapping[str, Scalar]) -> int:
    steps = config.get("local_steps")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise ValueError(
            "a partial-sync round needs an integer 'local_steps' in its config "
            f"(got {steps!r}); the server sets it in schedule.mode diloco"
        )
    return steps


def _with_residual(name: str, value: Array, base: Array, progress: LocalProgress | None) -> Array:
    """``value - base`` plus what the client kept of this tensor from earlier rounds."""
    delta: Array = np.subtract(value, base, dtype=base.dtype)
    if progress is None or base.dtype.kind != "f":
        return delta
    kept = progress.residual.get(name)
    if kept is not None and kept.shape == delta.shape:
        delta = np.add(delta, kept, dtype=base.dtype)
    return delta


def _keep_unsent(progress: LocalProgress, final: Weights, sent_at: Mapping[str, Array]) -> None:
    """Remember what each float tensor learned after it was sent."""
    for name, snapshot in sent_at.items():
        if snapshot.dtype.kind != "f":
            continue
        later = np.subtract(final[name], snapshot, dtype=snapshot.dtype)
        if np.any(later):
            progress.residual[name] = later


def combined_metrics(segments: list[tuple[int, Metrics, Config]]) -> Metrics:
    """The last segment's metrics, with losses averaged over all segments by examples."""
    metrics: Metrics = dict(segments[-1][1])
    total = sum(n for n, _, _ in segments)
    for key in ("train_loss", "loss", "train_accuracy"):
        values = [(n, m.get(key)) for n, m, _ in segments]
        numbers = [(n, float(v)) for n, v in values if isinstance(v, int | float)]
        if len(numbers) == len(segments) and total > 0:
            metrics[key] = sum(n * v for n, v in numbers) / total
    return metrics
