"""Evaluation of a round's model: federated (a seeded sample of clients) and on the server."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from functools import partial

from geofl.protocols.types import Scalar, WeightsView
from geofl.server.nodes.registry import NodeSession
from geofl.server.rounds.records import EngineSettings, RoundRecord
from geofl.server.rounds.tasks import TaskRunner, summarise
from geofl.server.strategies import Strategy

log = logging.getLogger(__name__)

#: The user's server-side evaluation: (loss, metrics) of a model.
ServerEvaluate = Callable[[WeightsView], tuple[float, dict[str, Scalar]]]


class Evaluation:
    """Evaluates a round's model on clients and with the configured server function."""

    def __init__(
        self,
        settings: EngineSettings,
        runner: TaskRunner,
        strategy: Strategy,
        server_evaluate: ServerEvaluate | None,
    ) -> None:
        self._cfg = settings
        self._runner = runner
        self._strategy = strategy
        self._server_evaluate = server_evaluate

    def due(self, number: int) -> bool:
        """Whether round ``number`` evaluates on clients (every ``evaluation.every``)."""
        every = self._cfg.evaluate_every
        return bool(every and number % every == 0 and self._cfg.evaluate_clients)

    async def on_clients(self, record: RoundRecord, candidates: Sequence[NodeSession]) -> None:
        """Federated evaluation by a seeded sample of ``candidates``; weighted means."""
        rng = random.Random(self._cfg.seed * 7_919 + record.number)
        cohort = rng.sample(list(candidates), min(self._cfg.evaluate_clients, len(candidates)))
        config = self._strategy.configure_evaluate(record.number, self._cfg.evaluate_config)
        runner = self._runner
        tasks = runner.dispatch(cohort, "evaluate", record.number, record.number, config)
        results = await runner.settle(tasks, partial(runner.record, record))
        record.eval_loss, record.eval_metrics = summarise(self._strategy, results)

    async def on_server(self, record: RoundRecord, weights: WeightsView) -> None:
        """The configured server-side evaluation; a failure is logged, the model commits."""
        if self._server_evaluate is None:
            return
        try:
            loss, metrics = await asyncio.to_thread(self._server_evaluate, weights)
        except Exception:  # the user's evaluation failed: the model still commits
            log.exception("server-side evaluation failed for round %d", record.number)
        else:
            record.server_eval_loss, record.server_eval_metrics = float(loss), dict(metrics)


__all__ = ["Evaluation", "ServerEvaluate"]
