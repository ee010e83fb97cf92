"""The round engine's scheduler: measurements in, cohorts and per-client codecs out.

Composes the pure pieces: every settled task feeds the :class:`LinkEstimator`; selection
turns the estimates into :class:`~geofl.server.scheduling.planner.Candidate` objects and
asks :func:`plan_cohort`; with ``compression.adaptive`` each selected client's upload chain
is the least lossy one its measured uplink can carry within what the deadline leaves after
its predicted download and compute (:func:`choose_upload_chain`). Selection predicts each
client's round with that same chain, not the raw model: otherwise only clients that fit
uncompressed would be admitted, and adaptive compression would never compress. The engine
records the plan (predicted seconds per client, any fallback) and the estimates after
every round.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from geofl.protocols.compression import UploadPlan
from geofl.server.config.schedule import SelectionConfig
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import NodeSession, TaskRecord
from geofl.server.scheduling.adaptive import ChainChoice, choose_upload_chain, upload_budget_s
from geofl.server.scheduling.measurements import LinkEstimate, LinkEstimator, trained_samples
from geofl.server.scheduling.planner import (
    Candidate,
    Plan,
    PlannerSettings,
    plan_cohort,
    statistical_utility,
)

__all__ = ["CohortChoice", "Scheduler", "SchedulerSettings"]


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler needs from the run configuration."""

    selection: SelectionConfig
    deadline_s: float
    over_select: float
    #: Bytes of one full download and one raw upload (the model's size).
    model_bytes: int
    #: The round fails below this many results: predicted-late clients are only added to
    #: reach it (as a recorded fallback), never to fill a cohort that can succeed without.
    min_clients: int = 1
    adaptive: bool = False
    min_bytes: int = 0
    error_feedback: bool = False
    max_staleness: int = 10


@dataclass
class _History:
    """What the last fit of a node said, for utility and compute prediction."""

    samples: int = 0
    num_examples: int = 0
    loss: float | None = None
    last_round: int | None = None
    #: Seconds the last fit ran without finishing (late or dropped): a lower bound of its
    #: duration. A client too slow to ever finish is never measured otherwise.
    unfinished_s: float | None = None


@dataclass(frozen=True)
class _AdaptiveUpload:
    """The chain adaptive compression gives a node, and the round it predicts with it."""

    choice: ChainChoice
    #: Download, compute and this chain's upload, on the budget's terms.
    round_s: float


@dataclass(frozen=True)
class CohortChoice:
    """The chosen sessions and what the planner predicted (for the record)."""

    sessions: list[NodeSession]
    plan: Plan | None
    predicted_s: dict[int, float | None] = field(default_factory=dict)

    def event(self) -> tuple[str, dict[str, Any]] | None:
        """The message and data recorded for this plan (None for a uniform draw)."""
        if self.plan is None:
            return None
        message = self.plan.fallback or (
            f"{len(self.sessions)} selected, {self.plan.excluded_late} predicted late left out"
        )
        data: dict[str, Any] = {
            "predicted_s": {str(k): v for k, v in self.predicted_s.items()},
            "reasons": {str(p.node_id): p.reason for p in self.plan.selected},
            "fallback": self.plan.fallback is not None,
            "notes": list(self.plan.notes),
        }
        return message, data


class Scheduler:
    """Measurement-driven cohort selection and per-link compression."""

    def __init__(self, settings: SchedulerSettings, estimator: LinkEstimator | None = None):
        self.settings = settings
        self.estimator = estimator or LinkEstimator()
        self._history: dict[int, _History] = {}
        self._budget: dict[int, float] = {}

    # ------------------------------------------------------------ measurements

    def observe(self, task: TaskRecord, outcome: Outcome) -> None:
        """Learn from a settled task (any kind, any outcome)."""
        self.estimator.observe(task, outcome)
        if task.kind != "fit":
            return
        history = self._history.setdefault(task.node_id, _History())
        if outcome.status == "ok":
            history.num_examples = outcome.num_examples
            history.samples = trained_samples(outcome.num_examples, outcome.metrics, task.config)
            history.loss = outcome.loss
            history.last_round = task.round
            history.unfinished_s = None
        elif outcome.status in ("late", "dropped") and task.settled_at is not None:
            history.unfinished_s = task.settled_at - (task.started_at or task.issued_at)

    def estimates(self) -> list[LinkEstimate]:
        """Every node's current estimate (recorded after each round)."""
        return self.estimator.snapshot()

    # ------------------------------------------------------------ selection

    def predict_s(self, node_id: int) -> float | None:
        """Predicted seconds of one fit task of ``node_id`` (None: not measured).

        With ``adaptive`` the upload is the chain :meth:`upload_plan` would hand the node.
        """
        history = self._history.get(node_id)
        if history is None:
            return None
        predicted = self._predict_round_s(node_id, history.samples)
        if history.unfinished_s is None:
            return predicted
        return max(predicted or 0.0, history.unfinished_s)

    def _predict_round_s(self, node_id: int, samples: int) -> float | None:
        size = self.settings.model_bytes
        raw = self.estimator.predict_round_s(node_id, size, size, samples)
        upload = self._adaptive_upload(node_id) if self.settings.adaptive else None
        # A rate that is still unknown leaves the node unmeasured, with or without adaptive.
        if raw is None or upload is None:
            return raw
        return upload.round_s

    def choose(
        self, available: Sequence[NodeSession], target: int, number: int, rng: random.Random
    ) -> CohortChoice:
        """The cohort for round ``number`` (``target`` already includes over-selection)."""
        selection = self.settings.selection
        if selection.policy == "uniform":
            return CohortChoice(rng.sample(list(available), min(target, len(available))), None)
        by_id = {s.node_id: s for s in available}
        candidates = [self._candidate(s) for s in available]
        plan = _without_needless_stragglers(
            plan_cohort(candidates, self._planner_settings(target), rng, number),
            self.settings.min_clients,
        )
        chosen = [by_id[p.node_id] for p in plan.selected]
        predicted = {p.node_id: p.predicted_s for p in plan.selected}
        return CohortChoice(chosen, plan, predicted)

    def _candidate(self, session: NodeSession) -> Candidate:
        history = self._history.get(session.node_id)
        utility = None
        if history is not None and history.loss is not None and history.num_examples > 0:
            utility = statistical_utility(history.num_examples, history.loss**2)
        return Candidate(
            session.node_id,
            session.region,
            self.predict_s(session.node_id),
            utility,
            history.last_round if history is not None else None,
        )

    def _planner_settings(self, target: int) -> PlannerSettings:
        selection = self.settings.selection
        return PlannerSettings(
            target=target,
            over_select=1.0,
            deadline_s=self.settings.deadline_s,
            fairness=selection.fairness,
            min_per_region=selection.min_per_region,
            utility=selection.utility,
            exploration=selection.exploration,
            margin=selection.margin,
        )

    # ------------------------------------------------------------ compression

    def upload_plan(self, session: NodeSession, default: UploadPlan | None) -> UploadPlan | None:
        """``default`` unless adaptive: then the chain this node's uplink can carry in time."""
        if not self.settings.adaptive:
            return default
        upload = self._adaptive_upload(session.node_id)
        if upload is None:
            return default  # not measured yet: the configured chain
        if not upload.choice.chain:
            return None
        return UploadPlan(
            upload.choice.chain,
            self.settings.min_bytes,
            self.settings.error_feedback,
            self.settings.max_staleness,
        )

    def _adaptive_upload(self, node_id: int) -> _AdaptiveUpload | None:
        """The chain adaptive compression gives ``node_id`` (None: uplink not measured).

        The least lossy chain of the ladder whose upload fits what the margined deadline
        leaves after the predicted download and compute, else the smallest. Selection
        (:meth:`predict_s`) and :meth:`upload_plan` both take the chain from here, so a
        client admitted as fitting is handed the chain it was admitted with.
        """
        estimate = self.estimator.estimate(node_id)
        history = self._history.get(node_id)
        if estimate.up_bps is None or history is None:
            return None
        size = self.settings.model_bytes
        download_s = _download_s(estimate, size)
        compute_s = _compute_s(estimate, history.samples)
        budget = upload_budget_s(
            self.settings.deadline_s, download_s, compute_s, self.settings.selection.margin
        )
        choice = choose_upload_chain(estimate.up_bps, estimate.rtt_s or 0.0, size, budget)
        return _AdaptiveUpload(choice, download_s + compute_s + choice.predicted_upload_s)


def _download_s(estimate: LinkEstimate, size: int) -> float:
    """``rtt / 2 + 8 size / down_bps``, as :meth:`LinkEstimator.predict_round_s` counts it.

    Half the RTT belongs to the download and half to the upload (which
    :func:`choose_upload_chain` charges), so a chain fits its budget exactly when the round
    it predicts is within the planner's cutoff. An unknown rate counts as no time.
    """
    serialization = 8 * size / estimate.down_bps if estimate.down_bps else 0.0
    return (estimate.rtt_s or 0.0) / 2 + serialization


def _compute_s(estimate: LinkEstimate, samples: int) -> float:
    """Training seconds of ``samples``; an unknown speed counts as no time."""
    return samples / estimate.samples_per_s if estimate.samples_per_s else 0.0


def _without_needless_stragglers(plan: Plan, min_clients: int) -> Plan:
    """Drop the planner's predicted-late top-up when the cohort can succeed without it."""
    in_time = tuple(p for p in plan.selected if p.reason != "fallback-fastest")
    if len(in_time) < min_clients or len(in_time) == len(plan.selected):
        return plan
    return replace(plan, selected=in_time, fallback=None)
