"""Flower messages from a server that runs a Flower ServerApp (``TASK_KIND_MESSAGE``).

When the server runs a ServerApp (:mod:`geofl.server.flower`), every message the app
sends arrives as a task: its ``FlowerContent`` and the arrays downloaded as the task's
model version rebuild the Flower ``Message`` here (:mod:`geofl.protocols.flower`), the
loaded ClientApp answers it, and the reply goes back as ``FlowerContent`` plus its
arrays (``UPDATE_KIND_FULL``).  The ClientApp is reached through the client adapter's
``handle_message(message) -> Message``, so its Context, lifespan and mods apply.
Imported only when such a task arrives, so clients of geofl apps never import ``flwr``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from flwr.app import Error, Message, Metadata
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from geofl.client.app import Client
from geofl.protocols.flower import (
    arrays_to_tensors,
    error_to_wire,
    layout_to_wire,
    records_from_wire,
)
from geofl.protocols.types import Weights
from geofl.protocols.v1 import geofl_pb2 as pb

__all__ = ["answer", "failure", "message_from_task"]

#: The shortest TTL a rebuilt message gets, so a task near its deadline still runs.
_MIN_TTL_S = 1.0


def message_from_task(task: pb.Task, arrays: Weights, node_id: int) -> Message:
    """The Flower message a ``TASK_KIND_MESSAGE`` task carries, arrays included."""
    flower = task.flower
    now = time.time()
    metadata = Metadata(
        run_id=int(task.run_id),
        message_id=str(task.task_id),
        src_node_id=SUPERLINK_NODE_ID,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id=flower.group_id,
        created_at=now,
        ttl=max(_MIN_TTL_S, task.deadline_unix_s - now) if task.deadline_unix_s else 43_200.0,
        message_type=flower.message_type,
    )
    content = records_from_wire(flower, arrays)
    # Flower's typed overloads leave out the metadata argument it uses to inflate
    # received messages; its public constructor would read a Flower process's identity.
    message: Message = Message(content=content, metadata=metadata)  # type: ignore[call-overload]
    return message


def _handler(client: Client) -> Callable[[Message], Any]:
    """The client adapter's ``handle_message`` (see :mod:`geofl.client.flower.adapter`)."""
    handle = getattr(client, "handle_message", None)
    if not callable(handle):
        raise TypeError(
            f"the client app ({type(client).__name__}) is not a Flower ClientApp, but the "
            "server runs a Flower ServerApp: start the client with --app naming a flwr ClientApp"
        )
    return handle  # type: ignore[no-any-return]


def answer(
    client: Client, task: pb.Task, arrays: Weights, node_id: int
) -> tuple[pb.FlowerContent, Weights]:
    """Run the task's message through the client app; its reply as wire content and tensors.

    A reply that carries a Flower error comes back as content with ``error`` set.

    Raises
    ------
    Exception
        Whatever the client app raised, or ``TypeError`` / ``TensorError`` if its reply
        is not a message or holds arrays geofl cannot carry.
    """
    flower = task.flower
    reply = _handler(client)(message_from_task(task, arrays, node_id))
    if not isinstance(reply, Message):
        raise TypeError(
            f"the ClientApp returned {type(reply).__name__} for a {flower.message_type!r} "
            "message, expected a flwr.app.Message"
        )
    if reply.has_error():
        return error_to_wire(reply.error, flower.message_type, flower.group_id), {}
    content = reply.content
    return layout_to_wire(content, flower.message_type, flower.group_id), arrays_to_tensors(content)


def failure(task: pb.Task, exc: BaseException) -> pb.FlowerContent:
    """The reply content for a message the client app failed on."""
    error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(exc).__name__}: {exc}")
    return error_to_wire(error, task.flower.message_type, task.flower.group_id)
