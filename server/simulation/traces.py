"""Client traces in FedScale's content, read from JSON or CSV (geofl never unpickles).

What FedScale publishes (SymbioticLab/FedScale; facts, as read in its repository):

- ``benchmark/dataset/data/device_info/README.md``: two traces, ``client_device_capacity``
  (client id -> ``{'computation': FP32, 'communication': FP32}``) and
  ``client_behave_trace`` (client id -> ``{'duration': INT, 'inactive': [INT],
  'finish_time': INT, 'active': [INT], 'model': STRING}``), both dicts serialized with
  ``pickle``.
- ``fedscale/cloud/internal/client_metadata.py``: ``computation`` is the inference latency
  in ms per sample, and a training step costs ``augmentation_factor`` (3.0) times that,
  "backward-pass takes around 2x the latency"; communication time is
  ``(upload_size + download_size) / communication``. A client is active at time ``t`` if
  ``active[i] <= t % finish_time <= inactive[i]`` (seconds).
- ``fedscale/cloud/aggregation/aggregator.py``: sizes are in kbits computed as
  ``bytes / 1024 * 8``, so ``communication`` counts units of 1024 bit/s; the capacity file
  is ``--device_conf_file`` and the behaviour file ``--device_avail_file``
  (``fedscale/cloud/client_manager.py``). Both files are read with ``pickle.load``.
  FedScale gives its client ``k`` (counted from 1) the capacity with key
  ``k % len(capacities)`` (``computation`` and ``communication`` 1.0 if there is none)
  and the ``k % len(behaviours)``-th behaviour entry.

geofl reads the same content as JSON::

    {"format": "geofl-client-trace", "version": 1,
     "device_capacity": {"<id>": {"computation": 162.0, "communication": 5648.1}, ...},
     "behave_trace": {"<id>": {"active": [0, 7200], "inactive": [3600, 9000],
                               "finish_time": 86400, "duration": 86400, "model": "..."}}}

(either table may be left out), or as CSV with a ``client_id`` column plus
``computation,communication`` and/or ``active,inactive,finish_time`` columns, the two time
lists written as space-separated seconds in one cell; an empty cell means "not given".
``duration`` and ``model`` are accepted and not used.

To convert FedScale's pickles, once, for files you trust (unpickling runs whatever code
the file names)::

    python -m geofl.server.simulation.traces convert \\
        client_device_capacity client_behave_trace trace.json --trust-pickle

Replay in geofl: simulated client ``i`` (from 0) gets the ``i mod n``-th capacity entry
and the ``i mod m``-th behaviour entry, both in file order. Its training speed is
``1000 / (3 * computation)`` samples/s, its bandwidth ``communication * 1024`` bit/s in
both directions (FedScale has one figure), and its availability the windows
``[active[i], inactive[i])``, repeating every ``finish_time`` seconds (no repetition when
``finish_time`` is absent); parts of a window beyond ``finish_time`` can never be reached
under FedScale's rule and are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from geofl.server.simulation.trace_format import (
    BEHAVIOUR_FIELDS,
    CAPACITY_FIELDS,
    FORMAT,
    TRAINING_COST_FACTOR,
    VERSION,
    Availability,
    ClientTrace,
    DeviceCapacity,
    TraceError,
    TraceSet,
    load_trace,
    parse_trace,
)
from geofl.server.simulation.trace_format import (
    BITS_PER_KBIT as BITS_PER_KBIT,
)

__all__ = [
    "BEHAVIOUR_FIELDS",
    "CAPACITY_FIELDS",
    "FORMAT",
    "TRAINING_COST_FACTOR",
    "VERSION",
    "Availability",
    "ClientTrace",
    "DeviceCapacity",
    "TraceError",
    "TraceSet",
    "load_trace",
    "main",
    "parse_trace",
]


def main(argv: Sequence[str] | None = None) -> int:
    """``convert IN.pkl [IN.pkl] OUT.json --trust-pickle``; returns the exit code.

    The converter lives in :mod:`geofl.server.simulation.fedscale`, imported only here,
    so that reading traces never so much as imports ``pickle``.
    """
    from geofl.server.simulation.fedscale import main as convert_main

    return convert_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
