"""The run configuration: one typed tree, one model per YAML section.

Models are frozen and strict (``rounds: "3"`` is an error, not a coercion), and unknown keys
are errors, so a typo never silently falls back to a default. Relative paths resolve against
the YAML file's directory while loading (see :mod:`geofl.server.config.fields`), so every
path a consumer reads from a loaded :class:`RunConfig` is absolute.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from geofl.server.config.compression import CompressionConfig
from geofl.server.config.control import ControlConfig
from geofl.server.config.dashboard import DashboardConfig
from geofl.server.config.fields import (
    Address,
    DatabaseUrl,
    ExistingFile,
    ImportPath,
    RelativePath,
    ScalarMap,
    Section,
    redact_url,
    split_address,
)
from geofl.server.config.metrics import MetricsConfig
from geofl.server.config.privacy import PrivacyConfig, budget_problem, distributed_problem
from geofl.server.config.robust import RobustConfig, breakdown_problem
from geofl.server.config.schedule import (
    AsyncConfig,
    DilocoConfig,
    PartialSyncConfig,
    SelectionConfig,
    StreamingConfig,
)
from geofl.server.config.secure import SecureAggregationConfig
from geofl.server.config.simulation import (
    ComputeConfig,
    Heterogeneity,
    PartitionConfig,
    RegionModel,
    check_region_names,
    check_shares,
    trace_suffix_problem,
)
from geofl.server.config.strategy import FlowerStrategyConfig, StrategyConfig
from geofl.server.config.tracking import TrackingConfig
from geofl.server.privacy import load_dp_accounting

__all__ = [
    "AuthConfig",
    "EvaluationConfig",
    "RunConfig",
    "RunSection",
    "ScheduleConfig",
    "ServerConfig",
    "SimulationConfig",
    "StorageConfig",
    "TlsConfig",
    "privacy_composition_problem",
]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
#: Keys every simulated client receives in its node config; users may not set them.
RESERVED_NODE_KEYS = ("partition-id", "num-partitions")
#: What only watches or steers a run, left out of its resume identity
#: (:meth:`RunConfig.config_sha256`): (section, key), or (section, None) for all of it.
OPERATIONAL_KEYS: tuple[tuple[str, str | None], ...] = (
    ("server", "control"),
    ("server", "metrics"),
    ("server", "dashboard"),
    ("tracking", None),
)
#: Top-level keys whose ``null`` (an empty ``section:`` line in YAML) means "all defaults".
_OPTIONAL_SECTIONS = frozenset(
    {
        "strategy",
        "schedule",
        "round_config",
        "evaluation",
        "storage",
        "server",
        "simulation",
        "compression",
        "secure_aggregation",
        "tracking",
    }
)


def _section(description: str) -> Any:
    """A section that may be left out; validated from ``{}`` so path resolution applies."""
    return Field(default_factory=dict, validate_default=True, description=description)


class RunSection(Section):
    """Identity and length of the run."""

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Run name: letters, digits, '_', '.' and '-'. Required.",
    )
    rounds: int = Field(default=3, ge=1, description="Number of federated rounds.")
    seed: int = Field(default=0, ge=0, description="Seed for every random choice the server makes.")


class ScheduleConfig(Section):
    """When rounds start and end."""

    mode: Literal["sync", "async", "diloco"] = Field(
        default="sync",
        description="'sync': synchronous rounds. 'async': buffered asynchronous aggregation "
        "(FedBuff; see schedule.fedbuff). 'diloco': synchronous rounds of H local steps with "
        "an outer Nesterov optimizer on the averaged pseudo-gradient (see schedule.diloco).",
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="How each round's cohort is chosen."
    )
    fedbuff: AsyncConfig = Field(
        default_factory=AsyncConfig,
        description="mode: async — buffer size, concurrency, staleness discount (FedBuff).",
    )
    diloco: DilocoConfig = Field(
        default_factory=DilocoConfig, description="mode: diloco — local steps, outer optimizer."
    )
    partial_sync: PartialSyncConfig = Field(
        default_factory=PartialSyncConfig,
        description="mode: diloco — layer-wise partial synchronization with uploads "
        "overlapped with the remaining local steps.",
    )
    streaming: StreamingConfig = Field(
        default_factory=StreamingConfig,
        description="mode: diloco — Streaming DiLoCo: fragments of the model synchronized "
        "in turn, each upload overlapped with the next inner steps (docs/streaming-diloco.md).",
    )
    deadline_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="Deadline of a round's fit phase, seconds.",
    )
    wait_for_clients_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "How long selection waits for min_clients connected nodes before the run fails."
        ),
    )
    over_select: float = Field(
        default=1.0,
        ge=1,
        allow_inf_nan=False,
        description="Select this many times clients_per_round, to absorb dropouts.",
    )


class EvaluationConfig(Section):
    """Federated and server-side evaluation of the global model."""

    every: int = Field(
        default=1, ge=0, description="Evaluate on clients every N rounds; 0 = never."
    )
    clients: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="Clients asked to evaluate; null = strategy.clients_per_round."
    )
    server: ImportPath | None = Field(
        default=None, description="Optional server-side evaluation callable, 'module:attr'."
    )
    config: ScalarMap = Field(
        default_factory=dict, description="Sent to clients with every evaluation task."
    )


class StorageConfig(Section):
    """Where run records and checkpoints live."""

    url: DatabaseUrl = Field(
        default="sqlite:///runs/geofl.db",
        validate_default=True,
        description="SQLAlchemy database URL; a relative SQLite path is relative to the YAML file.",
    )
    checkpoints: RelativePath = Field(
        default=Path("runs/checkpoints"),
        validate_default=True,
        description="Checkpoint directory; relative to the YAML file.",
    )
    keep_checkpoints: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Keep only the files of the newest N checkpoints (their database rows "
        "stay); null = keep all.",
    )
    stage_uploads: bool = Field(
        default=True,
        description="Write every accepted fit update to <checkpoints>/staged and the "
        "database before acknowledging it, so a restarted coordinator finishes the "
        "interrupted round without those clients training again: synchronous, DiLoCo "
        "(partial sync too) and FedBuff rounds; not secure aggregation, whose round "
        "restarts from its key stage (docs/architecture.md).",
    )
    retry_s: float = Field(
        default=120.0,
        ge=0,
        allow_inf_nan=False,
        description="How long a database that cannot be reached (PostgreSQL down, SQLite "
        "locked) is retried before the coordinator gives up (exit 3); clients wait.",
    )


class TlsConfig(Section):
    """Server certificate and key (PEM); both must exist when the file loads."""

    cert: ExistingFile = Field(description="Certificate chain file; relative to the YAML file.")
    key: ExistingFile = Field(description="Private key file; relative to the YAML file.")
    client_ca: ExistingFile | None = Field(
        default=None,
        description="Mutual TLS: CA certificate(s) that sign the nodes' certificates; every "
        "client must present one, and its common name is the node's name (organizational "
        "unit: its region). null = clients need no certificate. See docs/security.md.",
    )
    crl: ExistingFile | None = Field(
        default=None,
        description="Mutual TLS: certificate revocation list(s), PEM or DER, signed by a CA "
        "of client_ca (geofl certs revoke writes one). A revoked certificate cannot join; "
        "re-read on SIGHUP and when the file changes, ending revoked nodes' sessions.",
    )

    @model_validator(mode="after")
    def _crl_needs_client_ca(self) -> TlsConfig:
        if self.crl is not None and self.client_ca is None:
            raise ValueError("crl: a CRL revokes client certificates; set client_ca too")
        return self


class AuthConfig(Section):
    """Node authentication by Ed25519 keys (``geofl keys new``)."""

    nodes: RelativePath = Field(
        description="The authorized nodes: a YAML file, or a directory of them (every "
        "*.yaml inside), each holding one entry {name, public_key, region (optional)} or "
        "a list of them under nodes:. Re-read on SIGHUP and when a file changes; a node "
        "whose key is gone is refused and its session ends. Relative to the YAML file."
    )

    @field_validator("nodes")
    @classmethod
    def _exists(cls, value: Path) -> Path:
        if not value.exists():
            raise ValueError(f"file or directory not found: {value}")
        return value


class ServerConfig(Section):
    """The coordinator's endpoint and wire limits."""

    address: Address = Field(
        default="127.0.0.1:8443", description="Listen address, host:port (IPv6 as [::1]:8443)."
    )
    tls: TlsConfig | None = Field(
        default=None, description="TLS certificate and key; null = plaintext."
    )
    auth: AuthConfig | None = Field(
        default=None,
        description="Node authentication by key: the authorized nodes' public keys; null = "
        "any client may join under any name (unless tls.client_ca is set).",
    )
    insecure: bool = Field(
        default=False,
        description="Allow listening beyond loopback without TLS and node authentication "
        "(anyone who reaches the port can join and submit updates). Without it such a "
        "server refuses to start.",
    )
    heartbeat_interval_s: float = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds between client heartbeats; a node is offline after 3 missed. "
        "A node waiting in a long poll sends none: the open poll counts.",
    )
    chunk_bytes: int = Field(
        default=MIB,
        ge=64 * KIB,
        le=4 * MIB - 64 * KIB,
        description="Tensor chunk size on the wire, bytes (below gRPC's 4 MiB message limit).",
    )
    max_model_bytes: int = Field(
        default=8 * GIB, ge=1, description="Largest model or update accepted, bytes."
    )
    upload_buffer_bytes: int = Field(
        default=256 * MIB,
        ge=0,
        description="Memory for staging uploads until they are complete and checked, shared "
        "by all clients; beyond it uploads are staged in temporary files.",
    )
    regions: list[str] = Field(
        default_factory=list,
        description="The regions this run serves; a client or relay that joins naming "
        "another region is refused with an error that lists them. [] = any region.",
    )
    control: ControlConfig | None = Field(
        default=None,
        description="The control API for administrators (geofl runs list|show|stop|logs|pull "
        "--server); null = none.",
    )
    metrics: MetricsConfig | None = Field(
        default=None, description="Prometheus metrics endpoint (docs/metrics.md); null = off."
    )
    dashboard: DashboardConfig | None = Field(
        default=None, description="Live web dashboard (docs/dashboard.md); null = off."
    )

    @property
    def authenticates(self) -> bool:
        """Whether nodes must prove an identity (a key, or a certificate)."""
        return self.auth is not None or (self.tls is not None and self.tls.client_ca is not None)

    @property
    def host(self) -> str:
        """Host part of :attr:`address` (IPv6 without brackets)."""
        return split_address(self.address)[0]

    @property
    def port(self) -> int:
        """Port part of :attr:`address`."""
        return split_address(self.address)[1]


class SimulatedRelays(Section):
    """How the virtual clock models each region's relay (``simulation.relays``)."""

    rtt_ms: float = Field(
        default=10.0,
        ge=0,
        allow_inf_nan=False,
        description="Round-trip time between a client and its region's relay, ms (the "
        "clients keep their own access bandwidth; the region's rtt_ms is the relay's to "
        "the coordinator).",
    )
    mbps: float = Field(
        default=100.0,
        gt=0,
        allow_inf_nan=False,
        description="The relay's bandwidth to the coordinator, each way, Mbit/s.",
    )
    local_rounds: int = Field(
        default=1, ge=1, description="Regional rounds per coordinator task (HierFAVG)."
    )
    cohort: int | None = Field(
        default=None,
        ge=1,
        description="Clients per global round over all relays, split among the regions in "
        "proportion to their clients; null = every client of the region.",
    )
    min_clients: int = Field(
        default=1, ge=1, description="A regional round fails below this many results."
    )
    robust: RobustConfig | None = Field(
        default=None,
        description="A robust rule for the regional rounds in place of FedAvg's mean, e.g. "
        "{name: median, byzantine: 1} (docs/robust.md); null = FedAvg. On the wall clock it "
        "is passed, with min_clients, to each geofl relay process (relay.robust).",
    )

    @model_validator(mode="after")
    def _within_breakdown(self) -> SimulatedRelays:
        if self.robust is not None:
            problem = breakdown_problem(
                self.robust, self.min_clients, f"simulation.relay.min_clients is {self.min_clients}"
            )
            if problem is not None:
                raise ValueError(problem)
        return self


class SimulationConfig(Section):
    """Clients simulated on this machine by ``geofl simulate``."""

    clients: int = Field(default=2, ge=1, description="Number of simulated clients.")
    app: ImportPath | None = Field(
        default=None, description="Client app each simulated client runs, 'module:attr'."
    )
    node_config: ScalarMap = Field(
        default_factory=dict,
        description=(
            "Node config for every simulated client; each also gets partition-id and "
            "num-partitions."
        ),
    )
    relays: bool = Field(
        default=False,
        description="One relay per region of simulation.regions (on the wall clock a "
        "`geofl relay` process, on the virtual clock a simulated one); each region's "
        "clients connect to their relay, which aggregates them and takes part in the run "
        "as one node (hierarchical aggregation).",
    )
    relay: SimulatedRelays = _section("Simulated relays (virtual clock, relays: true).")

    regions: dict[str, RegionModel] = Field(
        default_factory=dict,
        description="WAN model, by region name: share (of the clients; shares sum to 1), "
        "rtt_ms, up_mbps, down_mbps, jitter_ms (default 0) and loss (default 0, in [0, 1)) "
        "per region; {} = no WAN model.",
    )
    heterogeneity: Heterogeneity = _section(
        "Per-client multipliers of compute speed and bandwidth."
    )
    compute: ComputeConfig = _section("Compute speed of a typical client.")
    trace: ExistingFile | None = Field(
        default=None,
        description="Client trace in FedScale's content as JSON or CSV (per-client compute "
        "and communication speed, availability windows); relative to the YAML file; null = "
        "none.",
    )
    partition: PartitionConfig | None = Field(
        default=None,
        description="Data split the simulator makes (seeded by run.seed); null = the app "
        "partitions itself from partition-id and num-partitions.",
    )
    clock: Literal["wall", "virtual"] = Field(
        default="wall",
        description="Time base. 'wall': real time, clients in real processes on real gRPC "
        "(simulation.pooled; the regions' links emulated by geofl's shaper). 'virtual': "
        "clients multiplexed in workers, the server on a simulated clock; transfer and "
        "compute times come from the link model and each client's speed, and the run goes "
        "as fast as the CPU allows.",
    )
    backend: Literal["process", "ray"] = Field(
        default="process",
        description="Where virtual clients' work runs: 'process' (simulation.workers local "
        "processes) or 'ray' (Ray actors; needs the ray extra and clock: virtual).",
    )
    workers: int | None = Field(
        default=None,
        ge=0,
        description="Worker processes (or Ray actors), each multiplexing many clients; null = "
        "one per CPU core (at most one per client). clock: virtual: 0 runs the clients in "
        "the server process. clock: wall with pooled: long-lived client processes (0 = 1).",
    )
    pooled: bool = Field(
        default=True,
        description="clock: wall: run the clients in simulation.workers long-lived processes, "
        "each holding many clients (every client keeps its own gRPC connection, context "
        "state and error feedback); false = one geofl client process per client, as a "
        "deployment runs them.",
    )
    client_threads: int = Field(
        default=1,
        ge=0,
        description="clock: wall: math-library threads (torch, OpenMP, MKL, OpenBLAS) per "
        "client process, set before they initialise; 0 = the libraries' defaults (one per "
        "core in every process, which oversubscribes a machine running many).",
    )
    labels: ImportPath | None = Field(
        default=None,
        description="Callable returning one label per training sample, 'module:attr'; with "
        "simulation.partition the simulator splits those indices among the clients (and "
        "shows the label histogram); each client reads its share with "
        "geofl.client.partition.assigned_indices.",
    )
    shaper: bool = Field(
        default=True,
        description="clock: wall with simulation.regions: route each client through geofl's "
        "user-space link shaper (its region's delay, rates, jitter and loss).",
    )
    target_accuracy: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="The summary reports the (simulated) time the run first reached this "
        "value of target_metric; null = report only the best value.",
    )
    target_metric: str = Field(
        default="accuracy",
        min_length=1,
        description="Metric the progress display and the time-to-accuracy summary follow "
        "(server-side evaluation if configured, else federated evaluation).",
    )
    client_cache: int = Field(
        default=64,
        ge=1,
        description="Client objects each worker keeps built between tasks (clock: virtual); "
        "contexts and compression state are kept for every client regardless.",
    )

    @field_validator("node_config")
    @classmethod
    def _no_reserved_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = [key for key in RESERVED_NODE_KEYS if key in value]
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the simulator for each client")
        return value

    @field_validator("regions")
    @classmethod
    def _regions_well_formed(cls, value: dict[str, RegionModel]) -> dict[str, RegionModel]:
        check_region_names(value)
        check_shares({name: region.share for name, region in value.items()})
        return value

    @field_validator("trace")
    @classmethod
    def _trace_readable(cls, value: Path | None) -> Path | None:
        problem = None if value is None else trace_suffix_problem(value.suffix)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _regions_exist_where_named(self) -> SimulationConfig:
        if self.partition is not None and self.partition.by_region is not None and not self.regions:
            raise ValueError(
                "partition.by_region splits the data by region, but simulation.regions is "
                "empty; define the regions or choose iid, dirichlet or shards"
            )
        return self

    @model_validator(mode="after")
    def _relays_need_regions(self) -> SimulationConfig:
        if self.relays and not self.regions:
            raise ValueError("relays: true needs simulation.regions (one relay per region)")
        return self

    @model_validator(mode="after")
    def _backend_fits_clock(self) -> SimulationConfig:
        if self.clock == "wall" and self.backend == "ray":
            raise ValueError(
                "backend: ray runs virtual clients; set clock: virtual (on the wall clock "
                "every client is its own process on real gRPC)"
            )
        return self


class RunConfig(Section):
    """A whole run: what to train, how to aggregate, where to record it."""

    run: RunSection = Field(description="Run identity and length.")
    model: ImportPath = Field(
        description="Callable returning the initial weights (dict of arrays or torch module)."
    )
    strategy: StrategyConfig = _section("Aggregation strategy and cohort size.")
    schedule: ScheduleConfig = _section("Round timing.")
    round_config: ScalarMap = Field(
        default_factory=dict, description="Sent to clients with every fit task, e.g. {lr: 0.05}."
    )
    evaluation: EvaluationConfig = _section("Evaluation of the global model.")
    storage: StorageConfig = _section("Database and checkpoint locations.")
    server: ServerConfig = _section("Coordinator endpoint, TLS and wire limits.")
    simulation: SimulationConfig = _section("Simulated clients for geofl simulate.")
    compression: CompressionConfig = _section("Compression of updates and broadcasts.")
    secure_aggregation: SecureAggregationConfig = _section(
        "Secure aggregation (SecAgg+): the server sees only the cohort's sum."
    )
    tracking: TrackingConfig = _section("Experiment tracking: MLflow, TensorBoard.")
    privacy: PrivacyConfig | None = Field(
        default=None,
        description="Client-level differential privacy, ε accounted per round "
        "(docs/privacy.md): central (the server clips and noises the aggregate) or, with "
        "secure_aggregation, distributed (clients noise in the ring); null = off.",
    )

    @model_validator(mode="after")
    def _secure_aggregation_composes(self) -> RunConfig:
        """Per-client codecs would be applied before masking and cannot be summed masked."""
        if not self.secure_aggregation.enabled:
            return self
        if isinstance(self.strategy, FlowerStrategyConfig):
            raise ValueError(
                "secure_aggregation cannot be combined with a Flower strategy: Flower's "
                "aggregate_train needs every client's update, the server only sees their sum; "
                "use a geofl strategy (fedavg, fedavgm, fedadam, fedyogi, fedadagrad)"
            )
        if self.strategy.min_clients < 2:
            raise ValueError(
                "secure_aggregation needs strategy.min_clients >= 2: a sum of one update "
                "reveals that update"
            )
        if self.schedule.mode == "async" and self.schedule.fedbuff.buffer_size < 2:
            raise ValueError(
                "secure_aggregation with schedule.mode async masks each buffer as one group: "
                "schedule.fedbuff.buffer_size must be >= 2 (a sum of one update reveals it)"
            )
        chains = [self.compression.up] + [r.up for r in self.compression.regions.values() if r.up]
        if any(chains) or self.compression.adaptive:
            raise ValueError(
                "compression.up cannot be combined with secure_aggregation: masked updates are "
                "summed in a ring, so a codec must be the same linear map for every client; "
                "set secure_aggregation.ring_bits (e.g. 16) to quantize under masking instead "
                "(see docs/secure-aggregation.md)"
            )
        return self

    @model_validator(mode="after")
    def _robust_rule_composes(self) -> RunConfig:
        """A robust rule judges individual updates in a synchronous round."""
        robust = self.strategy.robust
        if robust is None:
            return self
        if self.secure_aggregation.enabled:
            raise ValueError(
                f"strategy.robust ({robust.name}) cannot be combined with secure_aggregation: "
                "the rule needs each client's update (its norm, its coordinates), and under "
                "secure aggregation the server only ever sees the cohort's sum"
            )
        if self.schedule.mode != "sync":
            raise ValueError(
                f"strategy.robust ({robust.name}) needs schedule.mode sync, not "
                f"{self.schedule.mode!r}: FedBuff's staleness-discounted buffer and DiLoCo's "
                "outer step are not wired to robust rules"
            )
        return self

    @model_validator(mode="after")
    def _privacy_composes(self) -> RunConfig:
        """Central DP is accounted for synchronous rounds of one geofl strategy."""
        privacy = self.privacy
        if privacy is None:
            return self
        load_dp_accounting()  # a missing extra is an error now, not at the first round's end
        problem = privacy_composition_problem(self)
        if problem is None:
            problem = budget_problem(privacy, self.strategy.clients_per_round, self.planned_rounds)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _diloco_owns_the_server_step(self) -> RunConfig:
        """DiLoCo's outer optimizer is the server step; another strategy would be ignored."""
        if self.schedule.mode == "diloco" and self.strategy.name != "fedavg":
            raise ValueError(
                f"schedule.mode diloco uses its own outer optimizer (schedule.diloco); "
                f"strategy.name {self.strategy.name!r} would be ignored: leave it fedavg"
            )
        return self

    @property
    def local_steps(self) -> int:
        """Local steps of a DiLoCo round: round_config's ``local_steps`` wins if it is set."""
        steps = self.round_config.get("local_steps")
        if isinstance(steps, int) and not isinstance(steps, bool):
            return steps
        return self.schedule.diloco.local_steps

    @model_validator(mode="after")
    def _partial_sync_composes(self) -> RunConfig:
        """Partial sync cuts DiLoCo's H steps into segments of separately sent layers."""
        partial = self.schedule.partial_sync
        if not partial.enabled:
            return self
        if self.schedule.mode != "diloco":
            raise ValueError(
                "schedule.partial_sync needs schedule.mode diloco: it splits the H local "
                f"steps of a DiLoCo round (mode is {self.schedule.mode!r})"
            )
        steps = self.local_steps
        if partial.points > steps:
            raise ValueError(
                f"schedule.partial_sync has {partial.points} sync points but rounds have "
                f"{steps} local steps (schedule.diloco.local_steps, or round_config's "
                "local_steps): every segment needs a step"
            )
        tail = partial.tail_for(steps)
        if (partial.points - 1) * tail >= steps:
            raise ValueError(
                f"schedule.partial_sync.tail_steps {tail} x {partial.points - 1} later "
                f"segments leaves none of the round's {steps} local steps for the first "
                "segment"
            )
        if self.secure_aggregation.enabled:
            raise ValueError(
                "schedule.partial_sync cannot be combined with secure_aggregation: a masked "
                "update is one vector, it cannot be sent layer group by layer group"
            )
        if self.simulation.relays:
            raise ValueError(
                "schedule.partial_sync cannot be combined with simulation.relays: relays "
                "forward one regional update after every client has finished"
            )
        return self

    @model_validator(mode="after")
    def _streaming_composes(self) -> RunConfig:
        """Streaming DiLoCo splits H into P rounds of H / P steps, one fragment each."""
        problem = streaming_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_are_defaults(cls, data: Any) -> Any:
        """``evaluation:`` with every key commented out parses as null: use the defaults."""
        if not isinstance(data, dict):
            return data
        return {
            key: {} if value is None and key in _OPTIONAL_SECTIONS else value
            for key, value in data.items()
        }

    @property
    def planned_rounds(self) -> int:
        """Rounds the run records: ``run.rounds``, or FedBuff's ``updates`` (model versions)."""
        if self.schedule.mode == "async" and self.schedule.fedbuff.updates is not None:
            return self.schedule.fedbuff.updates
        return self.run.rounds

    @property
    def evaluation_clients(self) -> int:
        """Clients asked to evaluate each time: ``evaluation.clients`` or the fit cohort."""
        if self.evaluation.clients is None:
            return self.strategy.clients_per_round
        return self.evaluation.clients

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, fully defaulted copy for storing with the run (passwords redacted)."""
        data = self.model_dump(mode="json")
        data["storage"]["url"] = redact_url(self.storage.url)
        if self.tracking.mlflow is not None:
            data["tracking"]["mlflow"]["tracking_uri"] = redact_url(
                self.tracking.mlflow.tracking_uri
            )
        return data

    def config_sha256(self) -> str:
        """The run's identity for resuming: SHA-256 of :meth:`to_dict` as canonical JSON
        (sorted keys, no spaces), leaving out :data:`OPERATIONAL_KEYS`.

        How a run is watched is not what it computes: turning the metrics or the
        dashboard on for a restart must not make it a different run.
        """
        data = self.to_dict()
        if data.get("privacy") is None:  # runs from before the section keep their identity
            data.pop("privacy", None)
        for section, key in OPERATIONAL_KEYS:
            if key is None:
                data.pop(section, None)
            else:
                data[section].pop(key, None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def privacy_composition_problem(config: RunConfig) -> str | None:
    """Why ``config.privacy`` would not be accounted correctly with the rest, or None."""
    privacy = config.privacy
    assert privacy is not None
    secure = config.secure_aggregation
    if privacy.is_distributed(secure.enabled):
        if not secure.enabled:
            return (
                "privacy.mechanism distributed needs secure_aggregation.enabled: the clients "
                "noise in the secure-aggregation ring; use mechanism central without it"
            )
        if secure.low_rank is not None:
            return (
                "privacy.mechanism distributed cannot be combined with "
                "secure_aggregation.low_rank: the projection's error feedback is not clipped "
                "with the update, so the sensitivity would not be bounded"
            )
        problem = distributed_problem(privacy, config.strategy.clients_per_round, secure.ring_bits)
        if problem is not None:
            return problem
    elif secure.enabled:
        return (
            "privacy.mechanism central cannot be combined with secure_aggregation: the server "
            "clips and noises each update, which it never sees under masking; use mechanism "
            "distributed (or auto), where clients noise in the ring"
        )
    if config.schedule.mode != "sync":
        return (
            f"privacy needs schedule.mode sync, not {config.schedule.mode!r}: FedBuff's "
            "buffers and DiLoCo's outer step are not accounted yet"
        )
    if isinstance(config.strategy, FlowerStrategyConfig):
        return "privacy needs a geofl strategy: a Flower strategy aggregates un-noised"
    if config.simulation.relays:
        return (
            "privacy cannot be combined with simulation.relays: a relay's regional mean is "
            "not noised, and clipping it as one update would protect regions, not clients"
        )
    if config.strategy.robust is not None:
        return (
            f"privacy cannot be combined with strategy.robust ({config.strategy.robust.name}): "
            "central DP clips each update itself, and a rule that picks or reorders updates "
            "(median, Krum) has a sensitivity the Gaussian mechanism does not bound"
        )
    if privacy.sampling == "uniform":
        return _uniform_sampling_problem(config, privacy.population or 0)
    return None


def _uniform_sampling_problem(config: RunConfig, population: int) -> str | None:
    """Amplification holds only if the cohort is a uniform sample without replacement."""
    selection, cohort = config.schedule.selection, config.strategy.clients_per_round
    reasons = []
    if selection.policy != "uniform":
        reasons.append(f"schedule.selection.policy is {selection.policy!r}")
    if selection.fairness != "none" or selection.utility or selection.node_config:
        reasons.append("schedule.selection has fairness, utility or a node_config filter")
    if config.schedule.over_select != 1:
        reasons.append("schedule.over_select is not 1 (the fastest of a larger sample)")
    if cohort > population:
        reasons.append(f"clients_per_round {cohort} exceeds privacy.population {population}")
    if not reasons:
        return None
    return (
        "privacy.sampling uniform amplifies ε only for a uniform sample without replacement "
        f"of clients_per_round out of privacy.population, but {'; '.join(reasons)}: fix "
        "that, or set privacy.sampling: none"
    )


def streaming_problem(config: RunConfig) -> str | None:
    """Why ``schedule.streaming`` cannot run with the rest of ``config``, or None."""
    streaming = config.schedule.streaming
    if not streaming.enabled:
        return None
    if config.schedule.mode != "diloco":
        return (
            "schedule.streaming needs schedule.mode diloco: it is DiLoCo's outer step taken "
            f"one fragment at a time (mode is {config.schedule.mode!r})"
        )
    if config.schedule.partial_sync.enabled:
        return (
            "schedule.streaming cannot be combined with schedule.partial_sync: both decide "
            "which tensors a round sends and when; use one"
        )
    steps, fragments = config.local_steps, streaming.count
    if steps % fragments:
        return (
            f"schedule.streaming.fragments {fragments} must divide the local steps H = "
            f"{steps} (schedule.diloco.local_steps, or round_config's local_steps): each "
            "round trains H / P steps"
        )
    if streaming.overlap_steps >= steps // fragments:
        return (
            f"schedule.streaming.overlap_steps {streaming.overlap_steps} must be less than "
            f"the {steps // fragments} inner steps of a round (H / P = {steps} / {fragments}): "
            "a fragment is sent tau steps before the round's steps end"
        )
    if config.secure_aggregation.enabled:
        return (
            "schedule.streaming cannot be combined with secure_aggregation: a masked update "
            "is one vector of the whole model, a streaming upload one fragment"
        )
    if config.simulation.relays:
        return (
            "schedule.streaming cannot be combined with simulation.relays: relays forward "
            "whole-model regional updates"
        )
    return None
