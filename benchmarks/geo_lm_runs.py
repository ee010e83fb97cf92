"""The runs of :mod:`benchmarks.geo_lm`: one method's ``geofl simulate`` file, and its curve.

A :class:`Method` is a name, a label and the configuration sections it adds to the shared
base (:func:`base_config`); the base fixes the workload (model, sites, regions, data,
AdamW hyperparameters, evaluation at equal token counts). Curves are read back from the
run's database: per round the simulated time since the run began, the server's validation
bits per byte, the bytes on the wire both ways, and each site's charged compute seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from benchmarks.wan_schedule import deep_merge
from geofl.storage import open_database
from geofl.storage.models import Participation, Round, Run

__all__ = [
    "INT4",
    "INT8",
    "LM",
    "Curve",
    "GeoSpec",
    "Method",
    "base_config",
    "diloco_method",
    "read_curve",
    "regions",
    "streaming_method",
]

LM = "examples.geo_lm.task"
#: Outer pseudo-gradients (and the broadcast differences) in 8 and 4 bits, with error
#: feedback on the upload (the downlink keeps its own, see docs/compression.md).
INT8: dict[str, Any] = {
    "up": [{"qsgd": {"bits": 8}}],
    "down": [{"qsgd": {"bits": 8}}],
    "error_feedback": True,
}
INT4: dict[str, Any] = {
    "up": [{"qsgd": {"bits": 4}}],
    "down": [{"qsgd": {"bits": 4}}],
    "error_feedback": True,
}
#: Round-trip times of the three regions; two of the four sites are in ``near``.
RTT_MS = {"near": 20, "mid": 80, "far": 220}
SHARES = {"near": 0.5, "mid": 0.25, "far": 0.25}


@dataclass(frozen=True)
class GeoSpec:
    """The workload every method shares (see :mod:`benchmarks.geo_lm`)."""

    sites: int = 4
    #: Inner steps per site over the whole run (synchronous data parallel: steps).
    steps: int = 200
    #: DiLoCo's H: inner steps per round.
    local_steps: int = 20
    batch: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.01
    #: The inner (and data parallel's) learning rate: linear warmup over ``warmup_steps``,
    #: then, with ``cosine``, decay to ``final_lr_ratio`` of ``lr`` at the last step.
    warmup_steps: int = 0
    cosine: bool = False
    final_lr_ratio: float = 0.1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    sync_points: int = 4
    #: Streaming DiLoCo: P fragments (one synced per round of H / P steps), overlap tau.
    fragments: int = 4
    overlap_steps: int = 2
    mixing_alpha: float = 0.5
    seed: int = 7
    workers: int = 2
    #: Tokens per second of one site (``samples_per_s``): from the measured step time.
    tokens_per_s: float = 5700.0
    timeout_s: float = 3000.0

    def __post_init__(self) -> None:
        if self.steps % self.local_steps:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of local_steps ({self.local_steps}) "
                "so that every method trains the same tokens"
            )
        if self.local_steps % self.fragments or self.overlap_steps >= self.round_steps:
            raise ValueError(
                f"local_steps ({self.local_steps}) must be a multiple of fragments "
                f"({self.fragments}) and overlap_steps ({self.overlap_steps}) below H / P"
            )

    @property
    def lr_schedule(self) -> dict[str, Any]:
        """The schedule's settings, as the sites' round config and the ``adamw`` strategy
        take them (:mod:`geofl.protocols.lr_schedule`; step = a site's step count)."""
        return {
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.steps if self.cosine else 0,
            "final_lr_ratio": self.final_lr_ratio,
        }

    @property
    def round_steps(self) -> int:
        """Inner steps of one Streaming DiLoCo round (H / P)."""
        return self.local_steps // self.fragments

    @property
    def tokens_per_step(self) -> int:
        """Tokens all sites together train in one step (context 128)."""
        return self.sites * self.batch * 128


def regions(mbps: float) -> dict[str, dict[str, float]]:
    """The WAN model: three regions, ``mbps`` each way between every site and the coordinator."""
    return {
        name: {"share": SHARES[name], "rtt_ms": rtt, "up_mbps": mbps, "down_mbps": mbps}
        for name, rtt in RTT_MS.items()
    }


@dataclass(frozen=True)
class Method:
    """One row: ``sections(spec)`` merged into the base, ``rounds(spec)`` rounds.

    The server evaluates after every round; the report keeps every ``eval_every(spec)``-th
    point, so that every method's curve has points at the same token counts (every H steps).
    ``period(spec)`` rounds repeat the same traffic (Streaming DiLoCo: P, one per fragment);
    ``reusable`` says whether a short probe can stand for the traffic of later rounds at
    another bandwidth (partial sync re-plans its groups every round: not reusable).
    """

    name: str
    label: str
    sections: Callable[[GeoSpec], dict[str, Any]]
    rounds: Callable[[GeoSpec], int]
    eval_every: Callable[[GeoSpec], int]
    tokens_per_round: Callable[[GeoSpec], int]
    #: ``virtual`` methods run on the virtual clock; ``wall`` ones only on the wall clock
    #: (secure aggregation's key exchange is not simulated on the virtual clock).
    clock: str = "virtual"
    period: Callable[[GeoSpec], int] = lambda spec: 1
    reusable: bool = True


def diloco_method(
    name: str,
    label: str,
    schedule: Mapping[str, Any] | None = None,
    compression: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    reusable: bool = True,
) -> Method:
    """A DiLoCo-family method: inner AdamW for H steps, outer Nesterov each round.

    ``schedule`` is merged into ``schedule`` (e.g. ``{"partial_sync": {...}}``, or a
    streaming schedule), ``compression`` becomes the ``compression`` section, ``extra`` is
    merged last (any other section).
    """

    def sections(spec: GeoSpec) -> dict[str, Any]:
        base: dict[str, Any] = {
            "schedule": deep_merge(
                {
                    "mode": "diloco",
                    "diloco": {
                        "local_steps": spec.local_steps,
                        "outer_lr": spec.outer_lr,
                        "outer_momentum": spec.outer_momentum,
                    },
                },
                schedule or {},
            ),
            "round_config": {"mode": "adamw"},
        }
        if compression is not None:
            base["compression"] = dict(compression)
        return deep_merge(base, extra or {})

    return Method(
        name,
        label,
        sections,
        rounds=lambda spec: spec.steps // spec.local_steps,
        eval_every=lambda spec: 1,
        tokens_per_round=lambda spec: spec.local_steps * spec.tokens_per_step,
        reusable=reusable,
    )


def streaming_method(name: str, label: str, compression: Mapping[str, Any] | None = None) -> Method:
    """Streaming DiLoCo: P fragments synced in turn (a round = one fragment, H / P steps),
    each fragment's upload overlapped with the round's last ``overlap_steps`` steps.

    Its curve keeps every P-th point, at the same token counts as DiLoCo's (every H steps).
    """
    inner = diloco_method(name, label, compression=compression)

    def sections(spec: GeoSpec) -> dict[str, Any]:
        streaming = {
            "fragments": spec.fragments,
            "overlap_steps": spec.overlap_steps,
            "mixing_alpha": spec.mixing_alpha,
        }
        return deep_merge(inner.sections(spec), {"schedule": {"streaming": streaming}})

    return Method(
        name,
        label,
        sections,
        rounds=lambda spec: spec.steps // spec.round_steps,
        eval_every=lambda spec: spec.fragments,
        tokens_per_round=lambda spec: spec.round_steps * spec.tokens_per_step,
        period=lambda spec: spec.fragments,
    )


def base_config(spec: GeoSpec, method: Method, mbps: float, workdir: Path) -> dict[str, Any]:
    """The ``geofl simulate`` file of ``method`` at ``mbps`` (a mapping to dump as YAML)."""
    base = {
        "run": {"name": f"geo-lm-{method.name}", "rounds": method.rounds(spec), "seed": spec.seed},
        "model": f"{LM}:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": spec.sites, "min_clients": spec.sites},
        # Every site is waited for (synchronous rounds; nothing is late on this WAN).
        "schedule": {"deadline_s": 3600, "wait_for_clients_s": 600},
        "round_config": {
            "lr": spec.lr,
            "weight_decay": spec.weight_decay,
            "batch_size": spec.batch,
            "state_tag": f"{method.name}-{spec.seed}",
            **spec.lr_schedule,
        },
        "evaluation": {
            "every": method.eval_every(spec),
            "clients": 0,
            "server": f"{LM}:server_evaluate",
        },
        "storage": {
            "url": f"sqlite:///{workdir / 'run.db'}",
            "checkpoints": str(workdir / "checkpoints"),
            "keep_checkpoints": 1,
        },
        "server": {"address": "127.0.0.1:0"},
        "simulation": {
            "clock": method.clock,
            "clients": spec.sites,
            "workers": spec.workers,
            "app": f"{LM}:client_app",
            "regions": regions(mbps),
            "compute": {"samples_per_s": spec.tokens_per_s},
            "node_config": {"torch-threads": 1, "state-dir": str(workdir / "state")},
        },
    }
    return deep_merge(base, method.sections(spec))


@dataclass
class Curve:
    """One run, round by round (lists of equal length, in round order)."""

    rounds: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    bpb: list[float | None] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    #: Charged compute seconds of each site in the round, by site name.
    compute_s: list[dict[str, float]] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        """The curve :meth:`as_dict` wrote."""
        return cls(**{key: list(data[key]) for key in cls.__dataclass_fields__})


def read_curve(url: str) -> Curve:
    """The curve of the (only) run in the database at ``url``."""
    db = open_database(url)
    try:
        with db.session() as session:
            run = session.scalars(select(Run)).one()
            rows = list(
                session.scalars(select(Round).where(Round.run_id == run.id).order_by(Round.number))
            )
            curve = Curve()
            for row in rows:
                if row.finished_at is None:
                    continue
                parts = list(
                    session.scalars(select(Participation).where(Participation.round_id == row.id))
                )
                bpb = row.server_eval_metrics.get("bpb")
                curve.rounds.append(row.number)
                curve.times.append((row.finished_at - run.created_at).total_seconds())
                curve.bpb.append(float(bpb) if isinstance(bpb, int | float) else None)
                curve.bytes_up.append(sum(p.bytes_up for p in parts))
                curve.bytes_down.append(sum(p.bytes_down for p in parts))
                curve.compute_s.append(
                    {str(p.node_id): float(p.compute_s or 0.0) for p in parts if p.kind == "fit"}
                )
                curve.durations.append(float(row.duration_s or 0.0))
                curve.status.append(row.status)
            return curve
    finally:
        db.close()
