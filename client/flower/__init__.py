"""Flower 1.42 client apps, run unchanged by geofl.

``geofl client --app pkg.module:app`` (and ``geofl simulate`` with ``simulation.app``)
accepts, besides geofl clients, and recognised automatically by
:func:`geofl.client.load_client_app`:

* a message-API ``flwr.clientapp.ClientApp`` with ``@app.train()`` / ``@app.evaluate()``
  handlers taking ``(Message, Context)``, including its mods (``LocalDpMod`` ...);
* a legacy ``ClientApp(client_fn=...)``;
* a bare ``client_fn(context)`` returning ``NumPyClient(...).to_client()`` or a
  ``NumPyClient``. It is recognised by its Flower annotations
  (``def client_fn(context: Context) -> Client``), or, without annotations, when it
  returns a Flower client; annotate it so that it is never called with geofl's context.

How geofl talks to them (:mod:`.records`):

* ``fit`` sends a ``train`` message, ``evaluate`` an ``evaluate`` message, through the
  ClientApp's own call path, so its mods run and its lifespan is entered around each
  message, as in Flower's runtime. Message-API content is
  ``{"arrays": ArrayRecord, "config": ConfigRecord}``: tensor names are the ArrayRecord
  keys; the config is the round's config plus ``"server-round"``, as Flower's strategies
  send it. Legacy apps get Flower's ``fitins``/``evaluateins`` records; the order of the
  model's tensors is the list order, both ways.
* Message-API replies hold one ArrayRecord (train; its keys must be the model's names)
  and one MetricRecord with ``"num-examples"``, the aggregation weight. The evaluate loss
  is the first of ``eval_loss`` (Flower's quickstarts), ``loss``, ``val_loss``,
  ``test_loss`` (NaN if none); a train loss is read from ``train_loss`` as for any geofl
  client. List-valued metrics are dropped (geofl metrics are scalars). Arrays returned in
  a wider dtype of the same kind (float64 for a float32 model) are cast back.
* A reply carrying an error (``Message.has_error()``), and an exception in a handler,
  fail that task as a client error with Flower's text; the node keeps serving.
* The ClientApp is loaded once per process and stays loaded between rounds. One Flower
  ``Context`` per process is built from geofl's :class:`~geofl.client.app.ClientContext`
  (node id, node config, run config = the run's ``round_config``); its ``state``
  RecordDict persists across rounds. Against a server running a Flower ServerApp,
  ``run_id`` is that run's id (the one the ServerApp sees); against a geofl strategy,
  which has no Flower run, it is 0.

Secure aggregation: Flower's ``secaggplus_mod`` / ``secagg_mod`` cannot run against a geofl
server (they expect the four SecAgg+ stages from Flower's workflow). They are recognised,
removed from the app's handlers, and a warning says that geofl's secure aggregation, enabled
on the server with ``secure_aggregation.enabled``, replaces them (:mod:`.mods`).

Only :mod:`.detect` is imported by ``geofl.client``; it never imports Flower, so clients
of geofl apps do not pay for ``flwr``. :func:`.adapter.flower_factory` is imported when an
app turns out to be a Flower one.
"""

from geofl.client.flower.detect import is_flower_client, is_flower_object

__all__ = ["is_flower_client", "is_flower_object"]
