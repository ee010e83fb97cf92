"""The ``server.metrics`` section: where the coordinator serves its Prometheus metrics."""

from __future__ import annotations

from pydantic import Field

from geofl.server.config.fields import Address, Section, split_address

__all__ = ["MetricsConfig"]


class MetricsConfig(Section):
    """A Prometheus endpoint (``/metrics``) of the run; see docs/metrics.md."""

    address: Address = Field(
        description="Listen address of the metrics endpoint, host:port (port 0: any free "
        "port). Plain HTTP without authentication: keep it on loopback or a trusted network."
    )

    @property
    def host(self) -> str:
        """Host part of :attr:`address` (IPv6 without brackets)."""
        return split_address(self.address)[0]

    @property
    def port(self) -> int:
        """Port part of :attr:`address`."""
        return split_address(self.address)[1]
