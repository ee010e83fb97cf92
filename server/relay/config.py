"""A relay's settings: one typed tree, from an optional YAML file and command-line flags.

The relay reuses the run configuration's sections where they mean the same thing here:
``server`` (the endpoint its region's clients connect to, TLS, heartbeats, wire limits),
``schedule`` (deadline and waiting of each regional round) and ``secure_aggregation`` (for
the regional rounds). Flags such as ``--region`` are applied as overrides of the mapping
before validation, so every value is checked the same way and a bad one is reported with
where it came from (file and line, or the flag).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from geofl.server.config import (
    ConfigError,
    Override,
    ScheduleConfig,
    SecureAggregationConfig,
    ServerConfig,
    apply_overrides,
    parse_override,
)
from geofl.server.config.fields import BASE_DIR_KEY, Address, ExistingFile, RelativePath, Section
from geofl.server.config.messages import validation_problems
from geofl.server.config.robust import RobustConfig, breakdown_problem
from geofl.server.config.yamlsource import duplicate_keys, line_of, parse_yaml

__all__ = [
    "RelayConfig",
    "RelaySection",
    "UpstreamConfig",
    "flag_override",
    "load_relay_config",
]

_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


def _section(description: str) -> Any:
    """A section that may be left out; validated from ``{}`` so path resolution applies."""
    return Field(default_factory=dict, validate_default=True, description=description)


class RelaySection(Section):
    """The region a relay serves and the shape of its regional rounds."""

    region: str = Field(
        min_length=1,
        max_length=64,
        pattern=_NAME_PATTERN,
        description="Region this relay serves (letters, digits, '_', '.', '-'). Required.",
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Node name at the coordinator; null = relay-<region>.",
    )
    local_rounds: int = Field(
        default=1,
        ge=1,
        description="Regional rounds per task from the coordinator (HierFAVG); 1 with FedAvg "
        "everywhere equals flat FedAvg over all clients.",
    )
    clients_per_round: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Local clients selected for each regional round; null = every local "
        "client connected when the coordinator's task arrives (at least min_clients).",
    )
    min_clients: int = Field(
        default=1,
        ge=1,
        description="Local results a regional round needs to commit; selection waits for "
        "this many connected local clients.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the relay's client sampling.")
    robust: RobustConfig | None = Field(
        default=None,
        description="A robust rule for the relay's regional rounds in place of FedAvg's mean, e.g. "
        "{name: median, byzantine: 1} (docs/robust.md); null = FedAvg.",
    )


class UpstreamConfig(Section):
    """How the relay reaches its coordinator (as a client)."""

    address: Address = Field(description="The coordinator, host:port. Required.")
    root_certificates: ExistingFile | None = Field(
        default=None,
        description="CA certificate(s) to verify the coordinator's TLS certificate; "
        "null = plaintext.",
    )
    node_key: ExistingFile | None = Field(
        default=None,
        description="Ed25519 key proving the relay's identity to a coordinator with "
        "server.auth (geofl keys new); null = none.",
    )
    tls_cert: ExistingFile | None = Field(
        default=None,
        description="Mutual TLS towards the coordinator: the relay's client certificate; "
        "null = none.",
    )
    tls_key: ExistingFile | None = Field(
        default=None, description="Mutual TLS: the key of upstream.tls_cert."
    )
    reconnect_for_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="Give up after the coordinator was unreachable this long, seconds.",
    )
    state_dir: RelativePath | None = Field(
        default=None,
        description="Where upload-compression state (error-feedback residuals) survives a "
        "relay restart; null = memory only.",
    )


class RelayConfig(Section):
    """A regional relay: a client of the coordinator and a server to its region's clients."""

    relay: RelaySection = _section("Region and regional rounds; relay.region is required.")
    upstream: UpstreamConfig = _section("The coordinator; upstream.address is required.")
    server: ServerConfig = _section(
        "The endpoint of the region's clients: address (required), TLS, heartbeats, limits."
    )
    schedule: ScheduleConfig = _section(
        "Deadline and waiting of each regional round; both are also cut to fit the "
        "coordinator's deadline."
    )
    secure_aggregation: SecureAggregationConfig = _section(
        "Secure aggregation of the regional rounds: the relay sees only its region's sum."
    )

    @field_validator("server")
    @classmethod
    def _listen_address_is_explicit(cls, server: ServerConfig) -> ServerConfig:
        """The coordinator's default address would be a surprising place for a relay."""
        if "address" not in server.model_fields_set:
            raise ValueError(
                "address is required: the host:port this relay's clients connect to (--listen)"
            )
        return server

    @model_validator(mode="after")
    def _cohort_is_consistent(self) -> RelayConfig:
        relay = self.relay
        if relay.clients_per_round is not None and relay.clients_per_round < relay.min_clients:
            raise ValueError(
                f"relay.clients_per_round ({relay.clients_per_round}) is below "
                f"relay.min_clients ({relay.min_clients})"
            )
        if relay.robust is not None:
            if self.secure_aggregation.enabled:
                raise ValueError(
                    f"relay.robust ({relay.robust.name}) cannot be combined with "
                    "secure_aggregation: the rule needs each client's update, the relay only "
                    "sees the region's sum"
                )
            cohort = f"relay.min_clients is {relay.min_clients}"
            problem = breakdown_problem(relay.robust, relay.min_clients, cohort)
            if problem is not None:
                raise ValueError(problem)
        if self.secure_aggregation.enabled and relay.min_clients < 2:
            raise ValueError(
                "secure_aggregation needs relay.min_clients >= 2: a sum of one update "
                "reveals that update"
            )
        return self

    @property
    def node_name(self) -> str:
        """The relay's name at the coordinator."""
        return self.relay.name or f"relay-{self.relay.region}"


@dataclass(frozen=True)
class _FlagOverride(Override):
    """An override that came from a dedicated flag (``--region eu``), named as such."""

    @property
    def source(self) -> str:
        return self.text


def flag_override(flag: str, path: str, value: object) -> Override:
    """``--flag value`` setting the dotted ``path``; errors name the flag."""
    text = f"{flag} {shlex.quote(str(value))}"
    return _FlagOverride(path=tuple(path.split(".")), value=value, text=text)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError.single(str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError.single(str(path), f"cannot read: {exc}") from None


def _document(path: Path | None) -> tuple[yaml.Node | None, Mapping[str, object], str, Path]:
    """The file's node tree and mapping, its name for messages, and its directory."""
    if path is None:
        return None, {}, "command line", Path.cwd()
    source = str(path)
    node, data = parse_yaml(_read(path), source)
    duplicates = duplicate_keys(node, source)
    if duplicates:
        raise ConfigError(duplicates)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError.single(source, "the top level must be a mapping of sections")
    return node, data, source, path.absolute().parent


def load_relay_config(
    path: Path | None = None,
    *,
    flags: Sequence[Override] = (),
    overrides: Sequence[str] = (),
) -> RelayConfig:
    """Validate a relay's settings: the YAML file (optional), then flags, then ``--set``.

    Relative paths in the file resolve against its directory (flag values should be made
    absolute by the caller).

    Raises
    ------
    ConfigError
        Listing every problem with its file and line, or the flag or override that set it.
    """
    node, data, source, base_dir = _document(path)
    parsed = list(flags) + [parse_override(text) for text in overrides]
    merged = apply_overrides(data, parsed)
    try:
        return RelayConfig.model_validate(merged, context={BASE_DIR_KEY: base_dir})
    except ValidationError as exc:
        problems = validation_problems(
            exc, source, lambda at: line_of(node, at), parsed, root=RelayConfig
        )
        raise ConfigError(problems) from exc
