"""The Fashion-MNIST CNN client, paced to the WAN model's compute speed on the wall clock.

On the virtual clock a fit costs ``samples / samples_per_s`` simulated seconds, with
``samples_per_s`` drawn per client by the link model (``simulation.compute`` and
``simulation.heterogeneity.compute``). On the wall clock nothing plays that part: the
shaper delays only the network, and a client trains as fast as this machine lets it. To
compare the two clocks on one configuration (:mod:`benchmarks.wan_schedule`), this app
trains for real and then sleeps until the fit has lasted what the model says it costs.

Node config ``compute-speeds-file`` names a JSON list of every client's ``samples_per_s``
(indexed by ``partition-id``, written from the same link model); without it the client
is :func:`examples.fashion_mnist.task.client_app` unchanged. A fit that took longer than
the modelled time (a contended host) is not shortened: the overrun shows up as clock
error, which is what the comparison measures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from examples.fashion_mnist.task import client_app
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Weights, WeightsView
from geofl.server.simulation.workers import trained_samples

__all__ = ["SPEEDS_KEY", "PacedClient", "paced_client_app", "read_speeds"]

#: Node-config key of the JSON file with each client's modelled samples per second.
SPEEDS_KEY = "compute-speeds-file"


@lru_cache(maxsize=2)
def read_speeds(path: str) -> tuple[float, ...]:
    """The modelled samples per second of every client, by partition id.

    Raises
    ------
    ValueError
        If the file is not a non-empty JSON list of positive numbers.
    """
    speeds = json.loads(Path(path).read_text(encoding="utf-8"))
    if (
        not isinstance(speeds, list)
        or not speeds
        or not all(isinstance(s, int | float) and s > 0 for s in speeds)
    ):
        raise ValueError(f"{path}: expected a non-empty JSON list of positive numbers")
    return tuple(float(s) for s in speeds)


class PacedClient(Client):
    """A client whose ``fit`` lasts at least ``samples / samples_per_s`` seconds.

    ``clock`` and ``sleep`` are the time functions used (injectable for tests).
    """

    def __init__(
        self,
        inner: Client,
        samples_per_s: float,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not samples_per_s > 0:
            raise ValueError(f"samples_per_s must be positive, got {samples_per_s}")
        self.inner = inner
        self.samples_per_s = samples_per_s
        self._clock = clock
        self._sleep = sleep

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Train, then sleep out the rest of the modelled compute time."""
        started = self._clock()
        weights, num_examples, metrics = self.inner.fit(parameters, config)
        samples = trained_samples(num_examples, metrics, dict(config))
        remaining = samples / self.samples_per_s - (self._clock() - started)
        if remaining > 0:
            self._sleep(remaining)
        return weights, num_examples, metrics

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Evaluate unpaced (the benchmark's runs evaluate on the server only)."""
        return self.inner.evaluate(parameters, config)


def paced_client_app(context: ClientContext) -> Client:
    """The CNN client of ``partition-id``, paced when ``compute-speeds-file`` is set."""
    inner = client_app(context)
    setting = context.node_config.get(SPEEDS_KEY)
    if setting is None:
        return inner
    path = str(setting)
    speeds = read_speeds(path)
    index = int(str(context.node_config["partition-id"]))
    if not 0 <= index < len(speeds):
        raise ValueError(f"partition-id {index} has no speed in {path} ({len(speeds)} clients)")
    return PacedClient(inner, speeds[index])
