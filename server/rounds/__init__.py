"""The round core: engines that run a run's rounds, composed of small parts.

* :mod:`~geofl.server.rounds.records` -- phases and their clock, the round's record, the
  engine's settings, how a round fails;
* :mod:`~geofl.server.rounds.observers` -- what the engines tell the recorder, displays
  and relays;
* :mod:`~geofl.server.rounds.tasks` -- the task runner: dispatch, wait, settle, record;
* :mod:`~geofl.server.rounds.secure` -- the SecAgg+ stage driver;
* :mod:`~geofl.server.rounds.evaluation` -- federated and server-side evaluation;
* :mod:`~geofl.server.rounds.sync`, :mod:`~geofl.server.rounds.fedbuff` -- the engines;
* :mod:`~geofl.server.rounds.factory` -- :func:`make_engine`, the one way to get one;
* :mod:`~geofl.server.rounds.recorder` -- the observer that writes the database.

See docs/architecture.md for who owns what state and how a settled task flows.
"""

from geofl.server.rounds.factory import make_engine
from geofl.server.rounds.observers import Observers, RoundEndCallback, RoundObserver
from geofl.server.rounds.parts import Engine, EngineParts
from geofl.server.rounds.records import (
    EngineSettings,
    NoClientsError,
    Phase,
    RoundFailedError,
    RoundRecord,
)

__all__ = [
    "Engine",
    "EngineParts",
    "EngineSettings",
    "NoClientsError",
    "Observers",
    "Phase",
    "RoundEndCallback",
    "RoundFailedError",
    "RoundObserver",
    "RoundRecord",
    "make_engine",
]
