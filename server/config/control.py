"""The ``server.control`` section: the control API's address and its administrators."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from geofl.server.config.fields import Address, RelativePath, Section, split_address

__all__ = ["ControlConfig"]


class ControlConfig(Section):
    """The control API (``geofl runs ... --server``): its own port, admins only."""

    address: Address = Field(
        default="127.0.0.1:8444",
        description="Listen address of the control API, host:port; a port of its own, apart "
        "from the nodes' (server.address). Uses server.tls when that is set; beyond loopback "
        "it needs TLS unless server.insecure is set.",
    )
    admins: RelativePath = Field(
        description="The administrators' public keys (made with `geofl keys new NAME`): a "
        "YAML file, or a directory of them, in the format of server.auth.nodes. Re-read "
        "when a file changes; a removed admin's sessions end. Relative to the YAML file.",
    )
    session_ttl_s: float = Field(
        default=8 * 3600.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an admin's login (and a dashboard session) stays valid.",
    )

    @field_validator("admins")
    @classmethod
    def _exists(cls, value: Path) -> Path:
        if not value.exists():
            raise ValueError(f"file or directory not found: {value}")
        return value

    @property
    def host(self) -> str:
        """Host part of :attr:`address` (IPv6 without brackets)."""
        return split_address(self.address)[0]
