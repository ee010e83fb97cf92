"""Segmented fits: sent groups, kept progress, TorchClient continuation, background upload."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from geofl.client.app import Client
from geofl.client.background_upload import BackgroundUpload
from geofl.client.partial_sync import GroupUpdate, LocalProgress, fit_in_segments
from geofl.client.torch import TorchClient, weights_of
from geofl.protocols import partial_sync, serde, streams
from geofl.protocols.errors import ProtocolError
from geofl.protocols.partial_sync import encode_groups, segment_steps
from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb

RATE = 0.5


class StepCounter(Client):
    """Adds ``RATE * local_steps`` to every float tensor; reports the segment as its loss."""

    def __init__(self, fail_at_segment: int | None = None) -> None:
        self.configs: list[Config] = []
        self.fail_at_segment = fail_at_segment

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        self.configs.append(dict(config))
        segment = config.get(partial_sync.SEGMENT_KEY)
        if segment == self.fail_at_segment:
            raise RuntimeError(f"boom in segment {segment}")
        steps = config["local_steps"]
        assert isinstance(steps, int) and isinstance(segment, int)
        new = {
            name: (
                value.astype(np.float64) + RATE * steps if value.dtype.kind == "f" else value + 1
            ).astype(value.dtype)
            for name, value in parameters.items()
        }
        return new, 10 * steps, {"train_loss": float(segment), "last": segment}


class Sent:
    """Records what fit_in_segments hands to its sender."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, GroupUpdate]] = []

    def __call__(self, index: int, update: GroupUpdate) -> None:
        self.groups.append((index, {name: value.copy() for name, value in update.items()}))

    def merged(self) -> GroupUpdate:
        return {name: value for _, update in self.groups for name, value in update.items()}


def _floats(array: npt.NDArray[np.generic]) -> npt.NDArray[np.float64]:
    """``array`` as float64, for numeric comparisons."""
    return np.asarray(array, dtype=np.float64)


def _numpy_model() -> Weights:
    return {
        "a": np.zeros(3, np.float32),
        "b": np.full((2, 2), 1.0, np.float64),
        "c": np.zeros(2, np.float32),
        "count": np.zeros(1, np.int64),
    }


GROUPS = [["b"], ["count", "c"], ["a"]]


def _config(local_steps: Scalar = 7, groups: list[list[str]] = GROUPS) -> Config:
    return {"local_steps": local_steps, partial_sync.CONFIG_KEY: encode_groups(groups)}


# ----------------------------------------------------------------- fit_in_segments


def test_each_group_carries_the_steps_done_before_it_was_sent() -> None:
    client, sent, progress = StepCounter(), Sent(), LocalProgress()
    result = fit_in_segments(client, _numpy_model(), _config(), sent, progress.for_run(1))
    steps = segment_steps(7, 3)  # [3, 2, 2]
    assert [c["local_steps"] for c in client.configs] == steps
    assert [c[partial_sync.SEGMENT_KEY] for c in client.configs] == [0, 1, 2]
    assert [index for index, _ in sent.groups] == [0, 1, 2]
    assert [list(update) for _, update in sent.groups] == GROUPS
    update = sent.merged()
    np.testing.assert_allclose(_floats(update["b"]), np.full((2, 2), RATE * 3))
    np.testing.assert_allclose(_floats(update["c"]), np.full(2, RATE * 5))
    np.testing.assert_allclose(_floats(update["a"]), np.full(3, RATE * 7))
    assert update["b"].dtype == np.float64 and update["a"].dtype == np.float32
    np.testing.assert_array_equal(update["count"], [2])  # int delta when its group was sent
    # What b and c learned after being sent stays on the client; a (sent last) has nothing.
    assert set(progress.residual) == {"b", "c"}
    np.testing.assert_allclose(_floats(progress.residual["b"]), np.full((2, 2), RATE * 4))
    np.testing.assert_allclose(_floats(progress.residual["c"]), np.full(2, RATE * 2))
    assert result.num_examples == 70
    assert result.metrics["last"] == 2
    # train_loss averaged over the segments by examples: (0*30 + 1*20 + 2*20) / 70.
    assert result.metrics["train_loss"] == pytest.approx(60 / 70)
    assert [n for n, _, _ in result.segments] == [30, 20, 20]


def test_kept_progress_joins_the_next_upload_of_its_layer() -> None:
    progress = LocalProgress().for_run(1)
    fit_in_segments(StepCounter(), _numpy_model(), _config(), Sent(), progress)
    sent = Sent()
    fit_in_segments(StepCounter(), _numpy_model(), _config(), sent, progress.for_run(1))
    update = sent.merged()
    np.testing.assert_allclose(_floats(update["b"]), np.full((2, 2), RATE * (3 + 4)))
    np.testing.assert_allclose(_floats(update["c"]), np.full(2, RATE * (5 + 2)))
    np.testing.assert_allclose(_floats(update["a"]), np.full(3, RATE * 7))
    # The residual was spent and replaced by this round's.
    np.testing.assert_allclose(_floats(progress.residual["b"]), np.full((2, 2), RATE * 4))


def test_without_local_progress_the_late_steps_are_dropped() -> None:
    fit_in_segments(StepCounter(), _numpy_model(), _config(), Sent(), None)
    sent = Sent()
    fit_in_segments(StepCounter(), _numpy_model(), _config(), sent, None)
    np.testing.assert_allclose(_floats(sent.merged()["b"]), np.full((2, 2), RATE * 3))


def test_progress_of_another_run_is_forgotten() -> None:
    progress = LocalProgress()
    fit_in_segments(StepCounter(), _numpy_model(), _config(), Sent(), progress.for_run(1))
    assert progress.for_run(1).residual  # same run: kept
    sent = Sent()
    fit_in_segments(StepCounter(), _numpy_model(), _config(), sent, progress.for_run(2))
    assert progress.run_id == 2
    np.testing.assert_allclose(_floats(sent.merged()["b"]), np.full((2, 2), RATE * 3))


def test_a_failing_segment_raises_after_the_earlier_groups_were_sent() -> None:
    sent = Sent()
    with pytest.raises(RuntimeError, match="boom in segment 1"):
        fit_in_segments(StepCounter(fail_at_segment=1), _numpy_model(), _config(), sent, None)
    assert [index for index, _ in sent.groups] == [0]


@pytest.mark.parametrize("steps", [None, "7", 7.0, True])
def test_local_steps_must_be_an_integer(steps: Scalar | None) -> None:
    config = _config()
    if steps is None:
        del config["local_steps"]
    else:
        config["local_steps"] = steps
    with pytest.raises(ValueError, match="needs an integer 'local_steps'"):
        fit_in_segments(StepCounter(), _numpy_model(), config, Sent(), None)


def test_fewer_steps_than_groups_is_an_error() -> None:
    with pytest.raises(ValueError, match="2 local steps cannot be split into 3 sync segments"):
        fit_in_segments(StepCounter(), _numpy_model(), _config(local_steps=2), Sent(), None)


def test_a_round_without_groups_or_with_bad_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="not a partial-sync round"):
        fit_in_segments(StepCounter(), _numpy_model(), {"local_steps": 7}, Sent(), None)
    with pytest.raises(ProtocolError, match=r"never synchronize tensors \['a'\]"):
        fit_in_segments(
            StepCounter(), _numpy_model(), _config(groups=[["b", "c"], ["count"]]), Sent(), None
        )


# ----------------------------------------------------------------- TorchClient continuation


def _torch_client() -> TorchClient:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(10, 4, generator=generator)
    targets = torch.randint(0, 2, (10,), generator=generator)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=3, shuffle=True)
    return TorchClient(model, loader)


class Recording(Client):
    """Passes fits through to ``inner``, keeping the last weights it returned."""

    def __init__(self, inner: Client) -> None:
        self.inner = inner
        self.last: Weights = {}

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        new, examples, metrics = self.inner.fit(parameters, config)
        self.last = {name: np.array(value) for name, value in new.items()}
        return new, examples, metrics


class Unsegmented(Client):
    """Hides the segment index from ``inner``: every segment starts a fresh fit."""

    def __init__(self, inner: Client) -> None:
        self.inner = inner

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        plain = {k: v for k, v in config.items() if k != partial_sync.SEGMENT_KEY}
        return self.inner.fit(parameters, plain)


def _segmented(groups: list[list[str]], mu: float, *, continued: bool = True) -> Weights:
    """Final weights of a segmented fit, after checking sent + kept rebuilds them."""
    client = _torch_client()
    start = weights_of(client.model)
    config: Config = {**_config(7, groups), "seed": 3, "lr": 0.1, "proximal_mu": mu}
    recording = Recording(client if continued else Unsegmented(client))
    sent, progress = Sent(), LocalProgress().for_run(1)
    fit_in_segments(recording, start, config, sent, progress)
    update = sent.merged()
    for name in start:
        kept = progress.residual.get(name, np.zeros_like(start[name]))
        rebuilt = _floats(start[name]) + _floats(update[name]) + _floats(kept)
        np.testing.assert_allclose(rebuilt, _floats(recording.last[name]), rtol=0, atol=1e-6)
    return recording.last


def _one_fit(mu: float) -> Weights:
    client = _torch_client()
    config: Config = {"local_steps": 7, "seed": 3, "lr": 0.1, "proximal_mu": mu}
    new, examples, _ = client.fit(weights_of(client.model), config)
    assert examples == 19  # batches of 3, 3, 3, 1 per epoch: 3 + 3 + 3 + 1 + 3 + 3 + 3
    return {name: np.array(value) for name, value in new.items()}


TORCH_GROUPS = [
    [["2.weight", "2.bias"], ["0.weight", "0.bias"]],
    [["0.bias"], ["2.bias", "0.weight"], ["2.weight"]],
]


@pytest.mark.parametrize("groups", TORCH_GROUPS)
@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_segments_train_exactly_as_one_fit(groups: list[list[str]], mu: float) -> None:
    whole = _one_fit(mu)
    segmented = _segmented(groups, mu)
    assert list(segmented) == list(whole)
    for name in whole:
        np.testing.assert_array_equal(segmented[name], whole[name])


def test_restarting_each_segment_would_train_differently() -> None:
    # The check above can tell: losing momentum and data order changes the result.
    whole = _one_fit(0.0)
    restarted = _segmented(TORCH_GROUPS[0], 0.0, continued=False)
    assert any(not np.allclose(restarted[name], whole[name]) for name in whole)


# ----------------------------------------------------------------- background upload


class FakeServer:
    """A submit function: reads the whole message stream in the upload's thread."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.messages: list[pb.UploadMessage] = []
        self.fail_after = fail_after
        self.thread: threading.Thread | None = None
        self.error = ConnectionError("link broke")

    def __call__(self, messages: Iterator[bytes]) -> int:
        self.thread = threading.current_thread()
        total = 0
        for raw in messages:
            if self.fail_after is not None and len(self.messages) >= self.fail_after:
                raise self.error
            self.messages.append(serde.decode_upload(raw))
            total += len(raw)
        return total


def _group_tensors() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [
        {"l2.weight": rng.standard_normal((2, 3)).astype(np.float32)},
        {"l1.weight": rng.standard_normal((3, 4)), "l1.bias": np.arange(3, dtype=np.int64)},
    ]


def test_background_upload_streams_header_groups_then_trailer() -> None:
    server = FakeServer()
    header = pb.UploadHeader(task_id=9, round=2, attempt=1, update_kind=pb.UPDATE_KIND_DELTA)
    upload = BackgroundUpload(server, header, chunk_bytes=16)
    groups = _group_tensors()
    for group in groups:
        upload.send(group)
    trailer = pb.UploadHeader(task_id=9, round=2, num_examples=70, status=pb.RESULT_STATUS_OK)
    sent = upload.finish(trailer, timeout=30)

    assert server.thread is not None and server.thread is not threading.current_thread()
    kinds = [message.WhichOneof("body") for message in server.messages]
    assert kinds[0] == "header" and kinds[-1] == "trailer"
    assert set(kinds[1:-1]) == {"chunk"}
    first = server.messages[0].header
    assert first.trailer_follows and first.task_id == 9
    assert server.messages[-1].trailer.num_examples == 70
    chunks = [message.chunk for message in server.messages[1:-1]]
    names = [chunk.name for chunk in chunks if chunk.first]
    assert names == ["l2.weight", "l1.weight", "l1.bias"]
    assert len(chunks) > len(names)  # 16-byte chunks: tensors span several
    assert sent == sum(len(message.SerializeToString()) for message in server.messages)

    sink = streams.ArraySink()
    merged = {name: value for group in groups for name, value in group.items()}
    assembler = streams.Assembler(sink, spec_of(merged))
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish()
    for name, value in merged.items():
        np.testing.assert_array_equal(sink.weights[name], value)
        assert sink.weights[name].dtype == value.dtype


def test_a_failed_upload_raises_its_error_in_finish() -> None:
    server = FakeServer(fail_after=2)
    upload = BackgroundUpload(server, pb.UploadHeader(task_id=1), chunk_bytes=16)
    for group in _group_tensors():
        upload.send(group)
    with pytest.raises(ConnectionError, match="link broke") as raised:
        upload.finish(pb.UploadHeader(task_id=1), timeout=30)
    assert raised.value is server.error
    assert upload.failed is server.error


def test_a_failed_fit_keeps_the_progress_it_had_kept() -> None:
    """The failed fit's upload is discarded by the server, so its residual must survive."""
    names = ["a", "b"]
    weights = {name: np.zeros(3, np.float32) for name in names}
    config: Config = {"local_steps": 2, partial_sync.CONFIG_KEY: encode_groups([["a"], ["b"]])}
    progress = LocalProgress()
    progress.residual["a"] = np.full(3, 5.0, np.float32)

    class FailsInSecondSegment(Client):
        def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
            if config.get(partial_sync.SEGMENT_KEY) == 1:
                raise RuntimeError("boom")
            return {k: v + 1 for k, v in parameters.items()}, 1, {}

        def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
            raise NotImplementedError

    sent: list[dict[str, np.ndarray]] = []
    with pytest.raises(RuntimeError, match="boom"):
        fit_in_segments(
            FailsInSecondSegment(), weights, config, lambda k, u: sent.append(u), progress
        )
    np.testing.assert_array_equal(sent[0]["a"], np.full(3, 6.0, np.float32))
    np.testing.assert_array_equal(progress.residual["a"], np.full(3, 5.0, np.float32))
