"""TensorBoard: each round's figures as scalars, the configuration as text, in event files.

Written with TensorBoard's own event-file writer (the ``tensorboard`` package, no
TensorFlow or torch needed), which queues events for a thread of its own: logging a
round costs the event loop a few protobuf messages. A run writes to
``<log_dir>/<run name>-<run id>``; a resumed run adds an event file beside the first,
and TensorBoard shows them as one run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from geofl.server.config.tracking import TensorBoardConfig
from geofl.server.tracking.figures import RunIdentity

__all__ = ["CONFIG_TAG", "TensorBoardTracker", "run_directory"]

#: Tag of the text summary holding the run's configuration.
CONFIG_TAG = "config"
#: TensorProto's dtype of strings (``DT_STRING``).
_DT_STRING = 7


def run_directory(config: TensorBoardConfig, run: RunIdentity) -> Path:
    """Where ``run``'s event files go."""
    return Path(config.log_dir) / f"{run.run_name}-{run.run_id}"


def _text_event(tag: str, text: str, unix_s: float) -> Event:
    """A text summary, as TensorBoard's text plugin reads it (Markdown)."""
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(
        dtype=_DT_STRING,
        string_val=[text.encode("utf-8")],
        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
    )
    value = Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
    return Event(wall_time=unix_s, step=0, summary=Summary(value=[value]))


class TensorBoardTracker:
    """Writes one geofl run's event file; open with :meth:`start`."""

    def __init__(self, config: TensorBoardConfig, run: RunIdentity) -> None:
        self._config = config
        self._run = run
        self._writer: EventFileWriter | None = None
        self.directory = run_directory(config, run)

    def __repr__(self) -> str:
        return f"TensorBoardTracker({str(self.directory)!r})"

    def start(self, unix_s: float) -> Path:
        """Open the event file and write the configuration (as JSON in a Markdown block)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.directory))
        shown = json.dumps(self._run.config, indent=2, sort_keys=True, default=str)
        self._writer.add_event(_text_event(CONFIG_TAG, f"```json\n{shown}\n```", unix_s))
        return self.directory

    def log_round(self, number: int, figures: Mapping[str, float], unix_s: float) -> None:
        """Round ``number``'s figures as scalars at step ``number``."""
        if self._writer is None:
            return
        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in figures.items()]
        self._writer.add_event(Event(wall_time=unix_s, step=number, summary=Summary(value=values)))

    def finish(self, status: str) -> None:
        """Write the run's end (its status, as text) and close the file, every event flushed."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.add_event(_text_event("status", status, time.time()))
        writer.close()
