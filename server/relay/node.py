"""A regional relay: a client of the coordinator and a server to its region's clients.

Upstream the relay is an ordinary geofl client node (a :class:`ClientRuntime`), so
everything the runtime does for any client applies unchanged: the coordinator's upload
compression plan, secure aggregation among relays, heartbeats and reconnects. Its
:class:`RelayClient` "trains" by running regional rounds over the relay's clients
(HierFAVG) and "evaluates" by forwarding the evaluation to them. Downstream the
:class:`RegionalServer` serves those clients with geofl's own server pieces. One copy
of the model per task crosses the WAN: the relay downloads it once and its clients
download it from the relay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from geofl.client.app import Client, ClientContext
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.protocols.types import Config, Metrics, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.relay.config import RelayConfig
from geofl.server.relay.regional import RegionalServer
from geofl.server.relay.rounds import UpstreamTask

__all__ = ["Relay", "RelayClient"]

log = logging.getLogger(__name__)


class _UpstreamRuntime(ClientRuntime):
    """The runtime towards the coordinator; it remembers the task in hand.

    The relay needs the task's model version (to number local versions) and its deadline
    (to fit the regional rounds before it), which the client API does not carry.
    """

    def __init__(self, options: ClientOptions, factory: Callable[[ClientContext], Client]) -> None:
        super().__init__(options, factory)
        self.task: pb.Task | None = None

    def _handle(self, task: pb.Task) -> None:
        self.task = task
        try:
            super()._handle(task)
        finally:
            self.task = None

    def upstream_task(self) -> UpstreamTask:
        """The task being handled, as the regional server needs it."""
        if self.task is None or self.session is None:
            raise RuntimeError("the relay was asked to work outside a coordinator task")
        return UpstreamTask(
            run_id=self.session.run_id,
            model_version=self.task.model_version,
            deadline_unix_s=self.task.deadline_unix_s or None,
        )


class RelayClient(Client):
    """The relay as the coordinator sees it: its training is the region's rounds."""

    def __init__(self, regional: RegionalServer, task: Callable[[], UpstreamTask]) -> None:
        self._regional = regional
        self._task = task

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Regional rounds from the global model; the region's examples and metrics."""
        result = self._regional.fit(parameters, config, self._task())
        return result.weights, result.num_examples, result.metrics

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """The region's clients evaluate the global model; weighted means over them."""
        result = self._regional.evaluate(parameters, config, self._task())
        return result.loss, result.num_examples, result.metrics


class Relay:
    """One region's relay: :meth:`start` binds its endpoint, :meth:`run` serves the run."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.regional = RegionalServer(config)
        upstream = config.upstream
        options = ClientOptions(
            server=upstream.address,
            node_name=config.node_name,
            region=config.relay.region,
            node_config={"relay": True},
            root_certificates=upstream.root_certificates,
            tls_cert=upstream.tls_cert,
            tls_key=upstream.tls_key,
            node_key=upstream.node_key,
            reconnect_for_s=upstream.reconnect_for_s,
            state_dir=upstream.state_dir,
        )
        self.runtime = _UpstreamRuntime(options, self._client)
        self.port: int | None = None

    def _client(self, context: ClientContext) -> Client:
        self.regional.set_run_config(context.run_config)
        return RelayClient(self.regional, self.runtime.upstream_task)

    def start(self) -> int:
        """Serve the region's clients on ``server.address``; returns the bound port.

        Raises
        ------
        geofl.server.coordinator.AddressInUseError
            If the address cannot be bound.
        """
        if self.port is None:
            self.port = self.regional.start()
        return self.port

    def run(self) -> None:
        """Serve the coordinator until the run is over, then tell the region's clients.

        Raises
        ------
        geofl.client.runtime.GaveUpError
            If the coordinator stayed unreachable for ``upstream.reconnect_for_s``; the
            region's clients are not told the run is over (a restarted relay serves them).
        """
        self.start()
        run_over = False
        try:
            self.runtime.run()
            run_over = True
        finally:
            self.regional.stop(run_over=run_over)

    def local_clients(self) -> int:
        """The region's clients connected now."""
        return self.regional.online_clients()
