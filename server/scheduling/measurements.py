"""What the server measures of each client: RTT, throughput both ways, compute, availability.

The estimates come from the tasks the round engine hands out anyway, plus a small
handshake the servicer may time; there is no probe traffic. Every time is a field of the
finished :class:`~geofl.server.nodes.registry.TaskRecord` (dated by the registry's injected
clock, so a virtual-clock simulation measures simulated seconds); nothing here reads a
clock.

The link model (the one :mod:`geofl.server.simulation.links` simulates)
------------------------------------------------------------------------
Sending ``B`` bytes one way over a link of rate ``R`` bit/s and round-trip time ``rtt``
takes ``t = rtt/2 + 8 B / R``: one-way propagation, then serialization. A task's timeline
on the server's clock is::

    started_at ──download──> downloaded_at ──compute, upload──> settled_at

so, for a task whose outcome is known:

- download: ``t_down = downloaded_at - started_at`` carries ``B = bytes_down`` (only when
  ``bytes_down > 0``: a node that held the model was marked downloaded at pick-up);
- upload: ``t_up = settled_at - downloaded_at - compute_s`` carries ``B = bytes_up``
  (only for an ``ok`` outcome that reports ``compute_s``);
- compute: ``samples / compute_s`` for an ``ok`` fit, where ``samples`` is the client's
  ``samples_trained`` metric, else ``num_examples`` times the task's ``local_epochs`` (or
  ``epochs``, default 1) -- what the simulator charges compute time for.

The time between ``issued_at`` and ``started_at`` is a long poll's wait, not a round trip,
and is not used. On a real network a transfer the client opens with a request (Download,
Submit) also pays that request's trip, so these intervals hold a whole ``rtt`` of latency
rather than ``rtt/2``: an RTT derived from transfers absorbs that (and predicts round
times consistently), a handshake RTT does not.

Each one-way transfer ``(B, t)`` is a sample of

- one-way latency ``t - 8 B / R̂`` when ``B == 0`` or the serialization that the current
  rate ``R̂`` predicts is at most ``max_serialization_share`` of ``t`` (a small transfer:
  an evaluation's result, a small delta);
- throughput ``8 B / max(t - rtt/2, ε)`` when it is payload-sized: at least
  ``payload_fraction`` of the largest transfer seen in its direction, so that the small
  transfers above never drag the rate down. One ``1 / payload_fraction`` times larger than
  any before replaces the rate instead of being averaged in: what came before was too
  small to measure it. Where even the payloads are dominated by latency the rate is
  loosely determined, but so is its share of a predicted round.

RTT is the smoothed handshake time when the servicer reports one
(:meth:`LinkEstimator.observe_handshake`); otherwise twice the minimum of the last
``latency_window`` one-way latency samples (queueing only ever adds delay, so the
minimum is the propagation time). Until either exists RTT is unknown and the rates are
computed with ``rtt = 0``: effective throughputs that include latency, conservative, and
exact for predicting transfers of the sizes seen so far.

Smoothing: every rate, speed and handshake RTT is an exponentially weighted moving
average ``x <- (1 - alpha) x + alpha clip(s, clip_low x, clip_high x)``; the first sample
sets ``x``. Clipping bounds what one outlier can do (a 100x sample moves the estimate by
at most ``1 - alpha + alpha clip_high``), while a real change is still followed
geometrically. Availability is the same average, unclipped, of 1 (the task ended ok,
failed or rejected: the node answered) and 0 (dropped or late).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from geofl.protocols.types import Scalar
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage.measurements import LinkMeasurement

__all__ = ["LinkEstimate", "LinkEstimator", "trained_samples"]

#: Outcomes that count against a node's availability: it was not there to finish.
_ABSENT = frozenset({"dropped", "late"})


@dataclass(frozen=True)
class LinkEstimate:
    """What the server estimates of one node; each value is ``None`` until observed.

    Attributes
    ----------
    node_id:
        The node.
    rtt_s:
        Round-trip time, seconds.
    down_bps, up_bps:
        Server-to-node and node-to-server throughput, bit/s.
    samples_per_s:
        Training speed, samples per second.
    availability:
        Smoothed fraction of assigned tasks that did not end dropped or late, in [0, 1].
    observations:
        How many finished tasks went into the estimates.
    last_round:
        The newest round among those tasks.
    """

    node_id: int
    rtt_s: float | None = None
    down_bps: float | None = None
    up_bps: float | None = None
    samples_per_s: float | None = None
    availability: float | None = None
    observations: int = 0
    last_round: int | None = None


@dataclass
class _Direction:
    """The throughput of one direction, and the sizes it was measured on."""

    bps: float | None = None
    #: The largest transfer measured; ``None`` after :meth:`LinkEstimator.load` (unknown).
    largest_bytes: int | None = 0


@dataclass
class _NodeState:
    """The running averages of one node."""

    one_way_s: deque[float]
    handshake_rtt_s: float | None = None
    down: _Direction = field(default_factory=_Direction)
    up: _Direction = field(default_factory=_Direction)
    samples_per_s: float | None = None
    availability: float | None = None
    observations: int = 0
    last_round: int | None = None

    def rtt_s(self) -> float | None:
        """The handshake RTT if any, else twice the smallest recent one-way latency."""
        if self.handshake_rtt_s is not None:
            return self.handshake_rtt_s
        return 2 * min(self.one_way_s) if self.one_way_s else None


@dataclass(frozen=True)
class _Transfer:
    """One one-way transfer: its wire bytes and how long it took."""

    nbytes: int
    seconds: float


@dataclass(kw_only=True, eq=False)
class LinkEstimator:
    """Per-node estimates of RTT, throughput, compute speed and availability.

    Feed it every finished task (:meth:`observe`) and, where the servicer times one, each
    handshake (:meth:`observe_handshake`); read :meth:`estimate`, :meth:`estimates` or
    :meth:`predict_round_s`. :meth:`snapshot` and :meth:`load` carry the estimates across
    a coordinator restart (through :func:`geofl.storage.queries.record_measurements` and
    :func:`~geofl.storage.queries.latest_measurements`). The model and every formula are
    in the module docstring.

    Parameters
    ----------
    alpha:
        Weight of a new sample in the moving averages, in (0, 1].
    clip_low, clip_high:
        A sample is clipped to ``[clip_low x, clip_high x]`` of the current estimate
        ``x`` before it is averaged in (``0 < clip_low <= 1 <= clip_high``).
    min_transfer_s:
        ``ε``: transfer times are floored at this many seconds (timer resolution), so one
        very short transfer cannot claim an unbounded rate.
    max_serialization_share:
        In (0, 1): a transfer is a latency sample when the serialization its rate
        predicts takes at most this share of its time.
    payload_fraction:
        In (0, 1): a transfer is a throughput sample when it is at least this fraction of
        the largest one measured in its direction.
    latency_window:
        How many recent one-way latency samples the RTT fallback takes the minimum of.

    Raises
    ------
    ValueError
        A parameter outside its range (the message names it).
    """

    alpha: float = 0.3
    clip_low: float = 0.2
    clip_high: float = 5.0
    min_transfer_s: float = 1e-3
    max_serialization_share: float = 0.25
    payload_fraction: float = 0.1
    latency_window: int = 16
    _nodes: dict[int, _NodeState] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0 < self.clip_low <= 1 <= self.clip_high:
            raise ValueError(
                "need 0 < clip_low <= 1 <= clip_high, "
                f"got clip_low={self.clip_low}, clip_high={self.clip_high}"
            )
        if not self.min_transfer_s > 0:
            raise ValueError(f"min_transfer_s must be > 0, got {self.min_transfer_s}")
        for name in ("max_serialization_share", "payload_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        if self.latency_window < 1:
            raise ValueError(f"latency_window must be >= 1, got {self.latency_window}")

    # ------------------------------------------------------------ observing

    def observe(self, task: TaskRecord, outcome: Outcome) -> None:
        """Fold one finished task into its node's estimates.

        Every task counts towards availability and ``observations``; the download, the
        upload and the training each give a sample when the task's fields allow it (see
        the module docstring). A timing that runs backwards (a wall clock stepped back)
        gives no sample; unusable client reports (a negative ``compute_s``) are ignored.
        """
        state = self._state(task.node_id)
        state.observations += 1
        state.last_round = (
            task.round if state.last_round is None else max(state.last_round, task.round)
        )
        present = 0.0 if outcome.status in _ABSENT else 1.0
        state.availability = self._average(state.availability, present, clip=False)
        download = _download(task)
        if download is not None:
            self._transfer(state, state.down, download)
        upload = _upload(task, outcome)
        if upload is not None:
            self._transfer(state, state.up, upload)
        speed = _training_speed(task, outcome)
        if speed is not None:
            state.samples_per_s = self._average(state.samples_per_s, speed)

    def observe_handshake(self, node_id: int, rtt_s: float) -> None:
        """Fold one timed request-reply exchange (e.g. Join or GetTask) into the RTT.

        Once a node has a handshake RTT it is the node's RTT; the transfer-based
        fallback is no longer used for it.

        Raises
        ------
        ValueError
            ``rtt_s`` is negative or not finite.
        """
        if not (math.isfinite(rtt_s) and rtt_s >= 0):
            raise ValueError(f"rtt_s must be a finite number >= 0, got {rtt_s!r}")
        state = self._state(node_id)
        state.handshake_rtt_s = self._average(state.handshake_rtt_s, rtt_s)

    def _state(self, node_id: int) -> _NodeState:
        state = self._nodes.get(node_id)
        if state is None:
            state = _NodeState(deque(maxlen=self.latency_window))
            self._nodes[node_id] = state
        return state

    def _transfer(self, state: _NodeState, direction: _Direction, transfer: _Transfer) -> None:
        """Take a latency and/or a throughput sample from one transfer."""
        nbytes, seconds = transfer.nbytes, transfer.seconds
        predicted = None if direction.bps is None else 8 * nbytes / direction.bps
        if nbytes == 0 or (
            predicted is not None and predicted <= self.max_serialization_share * seconds
        ):
            state.one_way_s.append(max(0.0, seconds - (predicted or 0.0)))
        largest = direction.largest_bytes
        if nbytes == 0 or (largest is not None and nbytes < self.payload_fraction * largest):
            return
        serialization = seconds - (state.rtt_s() or 0.0) / 2
        sample = 8 * nbytes / max(serialization, self.min_transfer_s)
        outgrown = largest is not None and self.payload_fraction * nbytes >= largest
        direction.bps = sample if outgrown else self._average(direction.bps, sample)
        direction.largest_bytes = nbytes if largest is None else max(largest, nbytes)

    def _average(self, current: float | None, sample: float, *, clip: bool = True) -> float:
        """The moving average after ``sample`` (clipped around ``current`` first)."""
        if current is None:
            return sample
        if clip and current > 0:
            sample = min(max(sample, self.clip_low * current), self.clip_high * current)
        return (1 - self.alpha) * current + self.alpha * sample

    # ------------------------------------------------------------ reading

    def estimate(self, node_id: int) -> LinkEstimate:
        """The current estimates of one node (all ``None`` for a node never observed)."""
        state = self._nodes.get(node_id)
        if state is None:
            return LinkEstimate(node_id)
        return LinkEstimate(
            node_id=node_id,
            rtt_s=state.rtt_s(),
            down_bps=state.down.bps,
            up_bps=state.up.bps,
            samples_per_s=state.samples_per_s,
            availability=state.availability,
            observations=state.observations,
            last_round=state.last_round,
        )

    def estimates(self) -> dict[int, LinkEstimate]:
        """Every node observed (or loaded) so far, by node id."""
        return {node_id: self.estimate(node_id) for node_id in sorted(self._nodes)}

    def predict_round_s(
        self, node_id: int, download_bytes: int, upload_bytes: int, samples: int
    ) -> float | None:
        """Seconds a node would take for one task: ``rtt + 8 Bd/Rd + samples/speed + 8 Bu/Ru``.

        That is a download and an upload of the link model (``rtt/2 + 8 B/R`` each) with
        the training in between. An unknown RTT counts as 0 (the rates are then effective
        rates that include latency).

        Returns
        -------
        float or None
            ``None`` when a term that matters is not known yet: the node was never
            observed, or a non-zero size or sample count lacks its rate or speed.

        Raises
        ------
        ValueError
            A negative size or sample count.
        """
        for name, value in (("download_bytes", download_bytes), ("upload_bytes", upload_bytes)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        if node_id not in self._nodes:
            return None
        estimate = self.estimate(node_id)
        terms = (
            _seconds(8 * download_bytes, estimate.down_bps),
            _seconds(samples, estimate.samples_per_s),
            _seconds(8 * upload_bytes, estimate.up_bps),
        )
        if any(term is None for term in terms):
            return None
        return (estimate.rtt_s or 0.0) + sum(term for term in terms if term is not None)

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> list[LinkEstimate]:
        """Every node's estimates, by node id: what to store after a round."""
        return list(self.estimates().values())

    def load(self, rows: Iterable[LinkMeasurement]) -> None:
        """Start from stored estimates (e.g. ``latest_measurements`` after a restart).

        Each row replaces what this estimator held for its node; other nodes are kept. A
        loaded RTT counts as one transfer-based latency sample, so the node's next
        handshake, or smaller latencies measured later, take over from it. The sizes the
        loaded rates were measured on are not stored: the node's next transfers are
        averaged into them and set the payload size anew.

        Raises
        ------
        ValueError
            A node appears twice, or a value is negative or not finite, or an
            availability is above 1 (the message names the node and the field).
        """
        states: dict[int, _NodeState] = {}
        for row in rows:
            if row.node_id in states:
                raise ValueError(f"node {row.node_id} appears twice in the rows to load")
            states[row.node_id] = self._loaded(row)
        self._nodes.update(states)

    def _loaded(self, row: LinkMeasurement) -> _NodeState:
        values = {
            name: _valid(row.node_id, name, getattr(row, name))
            for name in ("rtt_s", "down_bps", "up_bps", "samples_per_s", "availability")
        }
        if values["availability"] is not None and values["availability"] > 1:
            raise ValueError(f"node {row.node_id}: availability {row.availability} is above 1")
        if row.observations < 0:
            raise ValueError(f"node {row.node_id}: observations {row.observations} is negative")
        state = _NodeState(deque(maxlen=self.latency_window))
        if values["rtt_s"] is not None:
            state.one_way_s.append(values["rtt_s"] / 2)
        state.down = _Direction(values["down_bps"], largest_bytes=None)
        state.up = _Direction(values["up_bps"], largest_bytes=None)
        state.samples_per_s, state.availability = values["samples_per_s"], values["availability"]
        state.observations, state.last_round = row.observations, row.last_round
        return state


def _valid(node_id: int, name: str, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"node {node_id}: {name} must be a finite number >= 0, got {value!r}")
    return value


def _seconds(amount: float, rate: float | None) -> float | None:
    """``amount / rate``; 0 for nothing to do, ``None`` when the rate is unknown."""
    if amount == 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return amount / rate


def _download(task: TaskRecord) -> _Transfer | None:
    """The model download: ``downloaded_at - started_at`` for ``bytes_down > 0``."""
    if task.bytes_down <= 0 or task.started_at is None or task.downloaded_at is None:
        return None
    seconds = task.downloaded_at - task.started_at
    return _Transfer(task.bytes_down, seconds) if seconds > 0 else None


def _upload(task: TaskRecord, outcome: Outcome) -> _Transfer | None:
    """The result upload: ``settled_at - downloaded_at - compute_s`` of an ``ok`` task."""
    compute_s = outcome.compute_s
    if outcome.status != "ok" or task.downloaded_at is None or task.settled_at is None:
        return None
    if compute_s is None or not (math.isfinite(compute_s) and compute_s >= 0):
        return None
    seconds = task.settled_at - task.downloaded_at - compute_s
    if seconds < 0 or (seconds == 0 and outcome.bytes_up > 0):
        return None
    return _Transfer(outcome.bytes_up, seconds)


def _training_speed(task: TaskRecord, outcome: Outcome) -> float | None:
    """Samples per second of an ``ok`` fit: ``samples / compute_s``."""
    compute_s = outcome.compute_s
    if task.kind != "fit" or outcome.status != "ok" or compute_s is None:
        return None
    if not (math.isfinite(compute_s) and compute_s > 0):
        return None
    samples = trained_samples(outcome.num_examples, outcome.metrics, task.config)
    return samples / compute_s if samples > 0 else None


def trained_samples(
    num_examples: int, metrics: Mapping[str, Scalar], config: Mapping[str, Scalar]
) -> int:
    """Samples a fit processed: what compute speed is measured and simulated by.

    The client's integer ``samples_trained`` metric, else ``num_examples`` times the
    round's ``local_epochs`` (or ``epochs``), default 1. One rule for the estimator, the
    scheduler and the virtual clock's compute model.
    """
    reported = metrics.get("samples_trained")
    if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
        return reported
    epochs = config.get("local_epochs", config.get("epochs", 1))
    if isinstance(epochs, bool) or not isinstance(epochs, int | float) or not epochs > 0:
        epochs = 1
    return round(num_examples * float(epochs))
