"""A background sender: one upload streamed from a thread while the client trains on.

A partially synchronized fit (:mod:`geofl.client.partial_sync`) produces its update
layer group by layer group. :class:`BackgroundUpload` opens the upload as soon as it is
created: the header goes first (with ``trailer_follows``), each group's tensors go out
when :meth:`~BackgroundUpload.send` hands them over, and :meth:`~BackgroundUpload.finish`
sends the trailer (status, examples, loss, metrics) and waits for the server's answer.
The training thread never waits for the network except in ``finish``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping

from geofl.protocols import streams
from geofl.protocols.tensors import Tensorish
from geofl.protocols.v1 import geofl_pb2 as pb

__all__ = ["BackgroundUpload"]

#: Streams serialized upload messages to the server; returns the bytes sent.
Submitter = Callable[[Iterator[bytes]], int]
_Item = Mapping[str, Tensorish] | pb.UploadHeader


class BackgroundUpload:
    """Streams ``header``, then each group handed to :meth:`send`, then the trailer.

    Parameters
    ----------
    submit
        Sends the message stream (``Connection.submit_messages`` with its timeout).
    header
        The upload's header; ``trailer_follows`` is set here.
    chunk_bytes
        Size of the tensor chunks.
    """

    def __init__(self, submit: Submitter, header: pb.UploadHeader, chunk_bytes: int) -> None:
        header.trailer_follows = True
        self._header = header
        self._chunk_bytes = chunk_bytes
        self._items: queue.Queue[_Item] = queue.Queue()
        self._submit = submit
        self._error: BaseException | None = None
        self.bytes_sent = 0
        self._thread = threading.Thread(target=self._run, name="geofl-upload", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> BaseException | None:
        """Why the upload failed, once it has (the server refused it, the link broke)."""
        return self._error

    def send(self, tensors: Mapping[str, Tensorish]) -> None:
        """Queue one group's tensors (they must not change afterwards)."""
        self._items.put(tensors)

    def finish(self, trailer: pb.UploadHeader, timeout: float | None = None) -> int:
        """Send the trailer, wait for the server's answer; the bytes sent.

        Raises
        ------
        Exception
            Whatever made the upload fail (the server's refusal, a broken connection).
        TimeoutError
            If the upload is still running after ``timeout`` seconds.
        """
        self._items.put(trailer)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the background upload did not finish in time")
        if self._error is not None:
            raise self._error
        return self.bytes_sent

    def _run(self) -> None:
        try:
            self.bytes_sent = self._submit(self._messages())
        except BaseException as exc:  # handed to the training thread in finish()
            self._error = exc

    def _messages(self) -> Iterator[bytes]:
        yield pb.UploadMessage(header=self._header).SerializeToString()
        while True:
            item = self._items.get()
            if isinstance(item, pb.UploadHeader):
                yield pb.UploadMessage(trailer=item).SerializeToString()
                return
            yield from streams.encode_upload_chunks(item, self._chunk_bytes)
