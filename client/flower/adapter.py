"""A Flower ClientApp served as a geofl :class:`~geofl.client.app.Client`.

The runtime sees an ordinary geofl client; each ``fit``/``evaluate`` becomes one Flower
``train``/``evaluate`` message, run through the ClientApp's own ``__call__`` so its
lifespan, routing and mods (``LocalDpMod`` ...) apply as under Flower. Unlike Flower's
deployment runtime, which starts a process per message, the app stays loaded for the whole
run, and one Flower ``Context`` per process carries ``state`` from round to round.
"""

from __future__ import annotations

import inspect
import logging

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from geofl.client.app import Client, ClientAppError, ClientContext, ClientFactory
from geofl.client.flower.mods import strip_secure_aggregation, uses_client_fn
from geofl.client.flower.records import (
    UNKNOWN_RUN_ID,
    FlowerReplyError,
    LegacyFormat,
    MessageFormat,
    RecordFormat,
    error_text,
    instruction,
    user_config,
)
from geofl.protocols.types import Config, Metrics, Weights, WeightsView

__all__ = ["FlowerClient", "FlowerReplyError", "flower_factory"]

_EVALUATE_HANDLER = f"{MessageType.EVALUATE}.default"
_FLOWER_LOGGER = "flwr"


class FlowerClient(Client):
    """Runs a Flower ClientApp for one node of a geofl run.

    Parameters
    ----------
    app
        The ClientApp (already stripped of SecAgg mods by :func:`flower_factory`).
    context
        geofl's context of this node; its node id is re-read before every message, since a
        node that rejoins a restarted server may be renumbered.

    Attributes
    ----------
    flower_context
        The Flower ``Context`` handed to every message of this process; its ``state``
        persists across rounds.
    """

    def __init__(self, app: ClientApp, context: ClientContext) -> None:
        self._app = app
        self._node = context
        self._format: RecordFormat = LegacyFormat() if uses_client_fn(app) else MessageFormat()
        self._evaluates = uses_client_fn(app) or _EVALUATE_HANDLER in app._registered_funcs
        self.flower_context = Context(
            run_id=UNKNOWN_RUN_ID,
            node_id=context.node_id,
            node_config=user_config(context.node_config),
            state=RecordDict(),
            run_config=user_config(context.run_config),
        )

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        content = self._format.train_content(parameters, config)
        reply = self._send(content, MessageType.TRAIN, config)
        return self._format.read_train(reply.content, parameters)

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        if not self._evaluates:
            raise NotImplementedError("the Flower ClientApp registers no @app.evaluate() handler")
        content = self._format.evaluate_content(parameters, config)
        reply = self._send(content, MessageType.EVALUATE, config)
        return self._format.read_evaluate(reply.content)

    def handle_message(self, message: Message) -> Message:
        """Run any Flower message through the ClientApp, with this process's Context.

        The reply is returned as the app made it (error replies included); for a server
        that speaks Flower messages itself rather than geofl's fit/evaluate tasks.  Such a
        server's messages carry its run id, which the Context then carries too, as under
        Flower, where the ServerApp and every ClientApp of a run see one ``run_id``.
        """
        self.flower_context.node_id = self._node.node_id
        if message.metadata.run_id != UNKNOWN_RUN_ID:
            self.flower_context.run_id = message.metadata.run_id
        return self._app(message, self.flower_context)

    def _send(self, content: RecordDict, message_type: str, config: Config) -> Message:
        message = instruction(content, message_type, self._node.node_id, config)
        reply: object = self.handle_message(message)
        if not isinstance(reply, Message):
            raise FlowerReplyError(
                f"the ClientApp's {message_type} handler returned {type(reply).__name__}, "
                "expected a flwr.app.Message"
            )
        if reply.has_error():
            raise FlowerReplyError(error_text(reply))
        if not reply.has_content():
            raise FlowerReplyError(f"the ClientApp's {message_type} reply has no content")
        return reply


def _as_client_app(target: object, spec: str) -> ClientApp:
    """A ClientApp as is; a ``client_fn(context)`` wrapped the way Flower wraps it."""
    if isinstance(target, ClientApp):
        return target
    if inspect.isfunction(target) or inspect.ismethod(target):
        try:
            return ClientApp(client_fn=target)
        except ValueError as exc:  # Flower's check of the client_fn signature
            raise ClientAppError(f"client app {spec!r}: {exc}") from exc
    raise ClientAppError(
        f"client app {spec!r} is the Flower object {type(target).__name__}; geofl runs a "
        "flwr.clientapp.ClientApp, or a client_fn(context) returning a flwr Client or "
        "NumPyClient"
    )


def flower_factory(target: object, spec: str) -> ClientFactory:
    """A geofl client factory for a Flower ClientApp or legacy ``client_fn``.

    SecAgg mods are taken out once, here (logging why); each process then builds one
    :class:`FlowerClient`.

    Raises
    ------
    ClientAppError
        If ``target`` is a Flower object other than a ClientApp or a ``client_fn``.
    """
    try:
        app = strip_secure_aggregation(_as_client_app(target, spec))
    except RuntimeError as exc:
        raise ClientAppError(f"client app {spec!r}: {exc}") from exc
    # Flower's logger prints with its own handler; passed on to the root logger's as well
    # (geofl client configures one), each of the app's log lines showed twice.
    logging.getLogger(_FLOWER_LOGGER).propagate = False
    return lambda context: FlowerClient(app, context)
