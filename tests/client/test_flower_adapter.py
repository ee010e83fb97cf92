"""Flower ClientApps as geofl clients: records in, results out, context, mods, detection."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.client.app import ClientAppError, ClientContext, load_client_app
from geofl.client.flower import is_flower_client, is_flower_object

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("flwr.clientapp")
    from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.client import Client as FlowerLegacyClient
    from flwr.client import NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.clientapp.mod import LocalDpMod

from geofl.client.flower.adapter import FlowerClient, FlowerReplyError, flower_factory
from geofl.client.flower.mods import unwrap_chain
from geofl.client.flower.records import instruction
from geofl.client.flower_messages import message_from_task
from geofl.protocols.flower import layout_to_wire
from geofl.protocols.v1 import geofl_pb2 as pb


def _context(node_id: int = 7, **node: Any) -> ClientContext:
    return ClientContext(
        node_id=node_id,
        node_name="n",
        node_config={"partition-id": 1, **node},
        run_config={"local-epochs": 2, "lr": 0.5},
    )


def _weights() -> dict[str, np.ndarray]:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "steps": np.array(3, np.int64)}


def _client(target: object, context: ClientContext | None = None) -> FlowerClient:
    client = flower_factory(target, "test:app")(context or _context())
    assert isinstance(client, FlowerClient)
    return client


def _reply(msg: Message, arrays: dict[str, np.ndarray] | None, **metrics: Any) -> Message:
    records: dict[str, Any] = {"metrics": MetricRecord(metrics)}
    if arrays is not None:
        records["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return Message(RecordDict(records), reply_to=msg)


def _plus_one(msg: Message) -> dict[str, np.ndarray]:
    return {k: np.asarray(v.numpy() + 1) for k, v in msg.content["arrays"].items()}


# ------------------------------------------------------------------ message API


def test_fit_sends_named_arrays_and_config_and_reads_the_reply() -> None:
    seen: list[Message] = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        seen.append(msg)
        return _reply(msg, _plus_one(msg), **{"num-examples": 12, "train_loss": 0.5, "h": [1.0]})

    new, n, metrics = _client(app).fit(_weights(), {"lr": 0.1, "server_round": 2})
    msg = seen[0]
    assert (msg.metadata.message_type, msg.metadata.dst_node_id) == ("train", 7)
    assert msg.metadata.group_id == "2"
    assert list(msg.content["arrays"]) == ["w", "steps"]
    assert msg.content["arrays"]["steps"].numpy().dtype == np.int64
    assert dict(msg.content["config"]) == {"lr": 0.1, "server_round": 2, "server-round": 2}
    np.testing.assert_array_equal(new["w"], _weights()["w"] + 1)
    assert new["steps"].dtype == np.int64 and int(new["steps"]) == 4
    assert (n, metrics) == (12, {"train_loss": 0.5})  # num-examples consumed, list dropped


def test_context_is_built_once_and_its_state_persists_across_rounds() -> None:
    contexts: list[Context] = []
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        contexts.append(context)
        calls = int(context.state.get("calls", MetricRecord({"n": 0}))["n"]) + 1
        context.state["calls"] = MetricRecord({"n": calls})
        return _reply(msg, _plus_one(msg), **{"num-examples": 1, "calls": calls})

    node = _context(node_id=7)
    client = _client(app, node)
    assert [client.fit(_weights(), {})[2]["calls"] for _ in range(3)] == [1, 2, 3]
    node.node_id = 9  # the node rejoined a restarted server under another id
    client.fit(_weights(), {})
    assert all(c is contexts[0] for c in contexts)
    assert contexts[0].node_id == 9
    assert contexts[0].node_config == {"partition-id": 1}
    assert contexts[0].run_config == {"local-epochs": 2, "lr": 0.5}


@pytest.mark.parametrize(
    ("metrics", "loss"),
    [
        ({"eval_loss": 0.25, "loss": 9.0}, 0.25),
        ({"loss": 0.5}, 0.5),
        ({"test_loss": 0.75}, 0.75),
        ({"eval_acc": 0.9}, math.nan),
    ],
)
def test_evaluate_reads_the_loss_from_flowers_keys(metrics: dict[str, float], loss: float) -> None:
    app = ClientApp()

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _reply(msg, None, **{"num-examples": 4, **metrics})

    got, n, out = _client(app).evaluate(_weights(), {})
    assert n == 4 and out == metrics
    assert got == loss or (math.isnan(loss) and math.isnan(got))


def test_evaluate_without_a_handler_is_not_implemented() -> None:
    app = ClientApp()
    app.train()(lambda msg, context: _reply(msg, _plus_one(msg), **{"num-examples": 1}))
    with pytest.raises(NotImplementedError, match=r"no @app\.evaluate"):
        _client(app).evaluate(_weights(), {})


@pytest.mark.parametrize(
    ("arrays", "metrics", "match"),
    [
        ({"w": np.zeros((2, 3), np.float32)}, {"num-examples": 1}, r"missing \['steps'\]"),
        (None, {"num-examples": 1}, "one ArrayRecord"),
        ("original", {"count": 1}, "needs 'num-examples'"),
    ],
)
def test_replies_off_flowers_conventions_are_named(
    arrays: Any, metrics: dict[str, int], match: str
) -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return _reply(msg, _plus_one(msg) if arrays == "original" else arrays, **metrics)

    with pytest.raises(FlowerReplyError, match=match):
        _client(app).fit(_weights(), {})


def test_a_wider_float_reply_is_cast_back_to_the_models_dtype() -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        wide = {
            k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in _plus_one(msg).items()
        }
        return _reply(msg, wide, **{"num-examples": 1})

    new, _, _ = _client(app).fit(_weights(), {})
    assert new["w"].dtype == np.float32


def test_an_error_reply_carries_flowers_text() -> None:
    """LocalDpMod answers an evaluate reply without arrays with a Flower error message."""
    app = ClientApp(mods=[LocalDpMod(clipping_norm=1.0, sensitivity=0.0, epsilon=1.0, delta=0.1)])

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _reply(msg, None, **{"num-examples": 1, "eval_loss": 0.1})

    with pytest.raises(FlowerReplyError) as info:
        _client(app).evaluate(_weights(), {})
    assert "MOD_FAILED_PRECONDITION" in str(info.value)
    assert "LocalDpMod expects exactly one ArrayRecord" in str(info.value)


def test_a_raising_handler_raises_to_the_runtime() -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        raise ValueError("broken handler")

    with pytest.raises(ValueError, match="broken handler"):
        _client(app).fit(_weights(), {})


def test_app_and_handler_mods_run_in_flowers_order() -> None:
    order: list[str] = []

    def recording(name: str) -> Any:
        def mod(msg: Message, context: Context, call_next: Any) -> Message:
            order.append(name)
            return call_next(msg, context)

        return mod

    app = ClientApp(mods=[recording("app")])

    @app.train(mods=[recording("handler")])
    def train(msg: Message, context: Context) -> Message:
        order.append("train")
        return _reply(msg, _plus_one(msg), **{"num-examples": 1})

    _client(app).fit(_weights(), {})
    assert order == ["app", "handler", "train"]


def test_local_dp_mod_clips_and_noises_the_update() -> None:
    clip, sensitivity, epsilon, delta = 1.0, 0.01, 1.0, 1e-5
    std = sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    app = ClientApp()

    @app.train(mods=[LocalDpMod(clip, sensitivity, epsilon, delta)])
    def train(msg: Message, context: Context) -> Message:
        moved = {k: v.numpy() + 10.0 for k, v in msg.content["arrays"].items()}
        return _reply(msg, moved, **{"num-examples": 1})

    start = {"v": np.zeros(20_000, np.float32)}
    new, _, _ = _client(app).fit(start, {})
    clipped = np.full(20_000, clip / math.sqrt(20_000))  # +10 everywhere, scaled to norm 1
    noise = new["v"] - clipped
    assert np.std(noise) == pytest.approx(std, rel=0.05)
    assert abs(np.mean(noise)) < 5 * std / math.sqrt(20_000)


def test_handle_message_routes_any_message_with_the_same_context() -> None:
    """For servers that send Flower messages themselves (e.g. a ``query``)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        context.state["seen"] = MetricRecord({"train": 1})
        return _reply(msg, _plus_one(msg), **{"num-examples": 1})

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return _reply(msg, None, **dict(context.state.get("seen", MetricRecord({"train": 0}))))

    client = _client(app)
    client.fit(_weights(), {})
    reply = client.handle_message(instruction(RecordDict(), "query", 7, {}))
    assert reply.content["metrics"]["train"] == 1


def test_the_context_carries_the_run_id_of_the_servers_messages() -> None:
    """Under a ServerApp, the ClientApp's ``context.run_id`` is that run's, as in Flower."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return _reply(msg, None, **{"run-id": context.run_id})

    client = _client(app)
    native = instruction(RecordDict(), "query", 7, {})
    assert client.handle_message(native).content["metrics"]["run-id"] == 0  # no Flower run
    task = pb.Task(task_id=1, run_id=12, flower=layout_to_wire(RecordDict(), "query", ""))
    reply = client.handle_message(message_from_task(task, {}, 7))  # as a ServerApp sends it
    assert reply.content["metrics"]["run-id"] == 12
    assert client.flower_context.run_id == 12


# ------------------------------------------------------------------ legacy client_fn


class _Shift(NumPyClient):
    def __init__(self, seen: list[dict[str, Any]] | None = None) -> None:
        self.seen = seen if seen is not None else []

    def fit(self, parameters: Any, config: Any) -> Any:
        self.seen.append(dict(config))
        return [p + i + 1 for i, p in enumerate(parameters)], 8, {"train_loss": 0.25}

    def evaluate(self, parameters: Any, config: Any) -> Any:
        return 1.5, 3, {"accuracy": 0.75}


class _FitOnly(NumPyClient):
    def fit(self, parameters: Any, config: Any) -> Any:
        return parameters, 1, {}


def test_legacy_client_fn_gets_the_tensors_as_a_list_in_dict_order() -> None:
    seen: list[dict[str, Any]] = []
    contexts: list[Context] = []

    def client_fn(context: Context) -> FlowerLegacyClient:
        contexts.append(context)
        return _Shift(seen).to_client()

    client = _client(ClientApp(client_fn=client_fn))
    new, n, metrics = client.fit(_weights(), {"lr": 0.1, "server_round": 1})
    np.testing.assert_array_equal(new["w"], _weights()["w"] + 1)
    assert int(new["steps"]) == 3 + 2
    assert (n, metrics) == (8, {"train_loss": 0.25})
    assert seen == [{"lr": 0.1, "server_round": 1}]
    assert client.evaluate(_weights(), {}) == (1.5, 3, {"accuracy": 0.75})
    assert contexts[0] is contexts[1] is client.flower_context  # Flower calls client_fn per message


def test_a_bare_client_fn_returning_a_numpy_client_works() -> None:
    def client_fn(context: Context) -> NumPyClient:
        return _Shift()

    new, n, _ = _client(client_fn).fit(_weights(), {})
    assert n == 8 and int(new["steps"]) == 5


def test_legacy_client_without_evaluate_is_not_implemented() -> None:
    client = _client(ClientApp(client_fn=lambda context: _FitOnly().to_client()))
    with pytest.raises(NotImplementedError, match="does not implement `evaluate`"):
        client.evaluate(_weights(), {})


def test_legacy_reply_with_a_different_number_of_arrays_is_refused() -> None:
    class Drops(NumPyClient):
        def fit(self, parameters: Any, config: Any) -> Any:
            return parameters[:1], 1, {}

    client = _client(ClientApp(client_fn=lambda context: Drops().to_client()))
    with pytest.raises(FlowerReplyError, match="1 arrays for a model of 2 tensors"):
        client.fit(_weights(), {})


# ------------------------------------------------------------------ secure aggregation


def test_secaggplus_mod_is_taken_out_of_a_legacy_app_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = ClientApp(client_fn=lambda context: _Shift().to_client(), mods=[secaggplus_mod])
    with caplog.at_level(logging.WARNING, logger="geofl.client.flower"):
        client = _client(app)
    assert "secure_aggregation.enabled" in caplog.text
    assert client.fit(_weights(), {})[1] == 8  # secaggplus_mod would raise KeyError here
    assert secaggplus_mod in unwrap_chain(app._call)[1]  # the user's app is left alone


def test_secaggplus_mod_is_taken_out_of_message_handlers_keeping_other_mods() -> None:
    order: list[str] = []

    def kept(msg: Message, context: Context, call_next: Any) -> Message:
        order.append("kept")
        return call_next(msg, context)

    app = ClientApp(mods=[secaggplus_mod, kept])

    @app.train(mods=[secaggplus_mod])
    def train(msg: Message, context: Context) -> Message:
        return _reply(msg, _plus_one(msg), **{"num-examples": 1})

    assert _client(app).fit(_weights(), {})[1] == 1
    assert order == ["kept"]


# ------------------------------------------------------------------ detection

USER_MODULE = """
from __future__ import annotations

from flwr.app import Context
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from geofl.client.app import Client as GeoflClient


class Shift(NumPyClient):
    def fit(self, parameters, config):
        return [p + 1 for p in parameters], 2, {}


def client_fn(context: Context) -> Client:
    return Shift().to_client()


def unannotated(context):
    return Shift().to_client()


def geofl_factory(context):
    return Echo()


class Echo(GeoflClient):
    def fit(self, parameters, config):
        return parameters, 1, {}


app = ClientApp(client_fn=client_fn)
server_app = ServerApp()
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"geofl_flower_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("attr", ["app", "client_fn", "unannotated"])
def test_load_client_app_recognises_flower_apps(user_module: str, attr: str) -> None:
    client = load_client_app(f"{user_module}:{attr}")(_context())
    assert isinstance(client, FlowerClient)
    assert int(client.fit(_weights(), {})[0]["steps"]) == 4


def test_load_client_app_leaves_geofl_factories_alone(user_module: str) -> None:
    assert not isinstance(load_client_app(f"{user_module}:geofl_factory")(_context()), FlowerClient)


@pytest.mark.parametrize("attr", ["Shift", "server_app"])
def test_other_flower_objects_are_refused_with_a_hint(user_module: str, attr: str) -> None:
    with pytest.raises(ClientAppError, match=r"flwr\.clientapp\.ClientApp, or a client_fn"):
        load_client_app(f"{user_module}:{attr}")


def test_detection_reads_names_only() -> None:
    def annotated_by_string(context: "flwr.app.Context") -> None:  # type: ignore[name-defined]  # noqa: F821, UP037
        return None

    def plain(context: ClientContext) -> None:
        return None

    assert is_flower_object(annotated_by_string)
    assert not is_flower_object(plain)
    assert is_flower_object(ClientApp()) and is_flower_object(NumPyClient)
    assert is_flower_client(_Shift()) and not is_flower_client(object())


def test_a_geofl_app_does_not_import_flower(tmp_path: Path) -> None:
    (tmp_path / "plain_geofl_app.py").write_text(
        "from geofl.client.app import Client\n"
        "class Echo(Client):\n"
        "    def fit(self, parameters, config):\n"
        "        return parameters, 1, {}\n"
        "def factory(context):\n"
        "    return Echo()\n"
    )
    code = (
        "import sys\n"
        "from geofl.client import ClientContext, load_client_app\n"
        "load_client_app('plain_geofl_app:factory')(ClientContext(node_id=1, node_name='n'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
