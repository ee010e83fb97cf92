"""The ``server.dashboard`` section: where the coordinator serves its live dashboard."""

from __future__ import annotations

from pydantic import Field

from geofl.server.config.fields import Address, Section, split_address

__all__ = ["DashboardConfig"]


class DashboardConfig(Section):
    """A live web dashboard of the run (docs/dashboard.md)."""

    address: Address = Field(
        description="Listen address of the dashboard, host:port (port 0: any free port). "
        "With server.control set, the page needs an admin's one-time login link "
        "(geofl runs dashboard --server ... --key K); without it, only a loopback address "
        "is allowed and the page asks for no login. Plain HTTP: beyond loopback, put it "
        "behind a TLS proxy."
    )

    @property
    def host(self) -> str:
        """Host part of :attr:`address` (IPv6 without brackets)."""
        return split_address(self.address)[0]

    @property
    def port(self) -> int:
        """Port part of :attr:`address`."""
        return split_address(self.address)[1]
