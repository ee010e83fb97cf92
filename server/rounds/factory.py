"""One factory for every engine: the coordinator, relay processes and simulated relays.

``schedule.mode`` picks the engine:

* ``sync`` -- :class:`~geofl.server.rounds.sync.SyncEngine`, a cohort per round;
* ``diloco`` -- the same engine: DiLoCo is a strategy (the outer optimizer over the
  pseudo-gradients, :class:`geofl.server.strategies.diloco.DiLoCo`) and a round
  configuration (H local steps), not a different way of running rounds;
* ``async`` -- :class:`~geofl.server.rounds.fedbuff.FedBuffEngine`, buffered asynchronous
  versions.

A relay's regional rounds are synchronous whatever the coordinator runs (it hands the
relay one task at a time), so relays pass no schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geofl.server.rounds.fedbuff import FedBuffEngine
from geofl.server.rounds.parts import Engine, EngineParts
from geofl.server.rounds.records import EngineSettings
from geofl.server.rounds.sync import SyncEngine

if TYPE_CHECKING:
    from geofl.server.config import ScheduleConfig


def make_engine(
    settings: EngineSettings, parts: EngineParts, schedule: ScheduleConfig | None = None
) -> Engine:
    """The engine ``schedule.mode`` asks for (synchronous without a schedule).

    Raises
    ------
    ValueError
        If the parts cannot run together (e.g. secure aggregation over a FedBuff buffer
        too small to hide an update).
    """
    if schedule is not None and schedule.mode == "async":
        return FedBuffEngine(settings, parts, schedule.fedbuff)
    return SyncEngine(settings, parts)


__all__ = ["make_engine"]
