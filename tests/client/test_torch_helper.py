"""TorchClient and the weights helpers on tiny models and toy data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from geofl.client.torch import TorchClient, load_weights, weights_of
from geofl.protocols.types import Config, Weights

N_SAMPLES = 64


def _toy_data(seed: int = 0) -> TensorDataset:
    """Two well-separated Gaussian blobs in 4-D, labels 0/1."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(N_SAMPLES) % 2
    centers = (labels.float() * 2 - 1).unsqueeze(1) * 3.0
    inputs = centers + torch.randn(N_SAMPLES, 4, generator=gen)
    return TensorDataset(inputs, labels)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


def _client(batch_size: int = 16, **kwargs: object) -> TorchClient:
    data = _toy_data()
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    test = DataLoader(data, batch_size=batch_size)
    return TorchClient(_model(), loader, test, **kwargs)  # type: ignore[arg-type]


def _distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    keys = [k for k in a if np.issubdtype(a[k].dtype, np.floating) and "running" not in k]
    return float(np.sqrt(sum(np.sum((a[k] - b[k]) ** 2) for k in keys)))


def test_fit_changes_weights_and_keeps_the_specification() -> None:
    client = _client()
    start = weights_of(_model(seed=1))
    before = {k: v.copy() for k, v in start.items()}
    new, num_examples, metrics = client.fit(start, {"lr": 0.1, "local_epochs": 2})
    assert list(new) == list(start)
    for name, array in new.items():
        assert array.shape == start[name].shape and array.dtype == start[name].dtype
    assert new["3.weight"].dtype == np.float32
    assert new["1.num_batches_tracked"].dtype == np.int64
    assert _distance(dict(new), start) > 1e-3
    assert num_examples == 2 * N_SAMPLES
    assert set(metrics) == {"train_loss", "train_accuracy"}
    assert 0.0 <= float(metrics["train_accuracy"]) <= 1.0
    for name in start:  # the caller's arrays are not mutated
        np.testing.assert_array_equal(start[name], before[name])


def test_returned_weights_are_copies() -> None:
    client = _client()
    new, _, _ = client.fit(weights_of(_model()), {})
    new["3.bias"][...] = 123.0
    assert not torch.any(client.model.state_dict()["3.bias"] == 123.0)


def test_local_steps_counts_examples() -> None:
    client = _client(batch_size=16, local_steps=6)  # 6 steps cycle over 4 batches per epoch
    _, num_examples, _ = client.fit(weights_of(_model()), {})
    assert num_examples == 6 * 16
    _, num_examples, _ = client.fit(weights_of(_model()), {"local_steps": 2})
    assert num_examples == 2 * 16


def test_fit_is_deterministic_with_a_seed() -> None:
    start = weights_of(_model())
    config: Config = {"seed": 5, "lr": 0.1}
    first, _, _ = _client().fit(start, config)
    second, _, _ = _client().fit(start, config)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    other, _, _ = _client().fit(start, {"seed": 6, "lr": 0.1})
    assert _distance(dict(other), dict(first)) > 0


def test_proximal_term_limits_drift() -> None:
    start = weights_of(_model(seed=3))
    base = {"seed": 1, "lr": 0.1, "local_epochs": 3}
    free, _, _ = _client().fit(start, {**base, "proximal_mu": 0.0})
    held, _, _ = _client().fit(start, {**base, "proximal_mu": 10.0})
    assert _distance(dict(held), start) < 0.5 * _distance(dict(free), start)


def test_evaluate_on_a_separable_set() -> None:
    client = _client()
    trained = weights_of(client.model)
    for _ in range(3):
        new, _, _ = client.fit(trained, {"lr": 0.1, "seed": 0})
        trained = dict(new)
    loss, num_examples, metrics = client.evaluate(trained, {})
    assert num_examples == N_SAMPLES
    assert metrics == {"accuracy": 1.0}
    assert 0.0 <= loss < 0.2


def test_evaluate_a_hand_set_classifier() -> None:
    inputs = torch.tensor([[-2.0], [-1.0], [1.0], [2.0]])
    labels = torch.tensor([0, 0, 1, 1])
    model = torch.nn.Linear(1, 2)
    client = TorchClient(model, [], [(inputs, labels)])
    weight = np.array([[-1.0], [1.0]], np.float32)
    perfect: Weights = {"weight": weight, "bias": np.zeros(2, np.float32)}
    assert client.evaluate(perfect, {})[2] == {"accuracy": 1.0}
    inverted: Weights = {"weight": -weight, "bias": perfect["bias"]}
    assert client.evaluate(inverted, {})[2] == {"accuracy": 0.0}


def test_regression_loss_reports_no_accuracy() -> None:
    inputs = torch.randn(8, 3)
    targets = torch.randn(8, 1)
    client = TorchClient(
        torch.nn.Linear(3, 1), [(inputs, targets)], [(inputs, targets)], loss_fn=torch.nn.MSELoss()
    )
    _, _, metrics = client.fit(weights_of(client.model), {})
    assert set(metrics) == {"train_loss"}
    assert client.evaluate(weights_of(client.model), {})[2] == {}


def test_custom_optimizer_factory_is_used() -> None:
    def frozen(params: object) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.0)  # type: ignore[arg-type]

    client = _client(optimizer=frozen)
    start = weights_of(_model(seed=4))
    new, _, _ = client.fit(start, {"lr": 1.0})
    np.testing.assert_array_equal(new["0.weight"], start["0.weight"])


def test_evaluate_without_test_loader() -> None:
    client = TorchClient(torch.nn.Linear(1, 2), [])
    with pytest.raises(NotImplementedError, match="without a test_loader"):
        client.evaluate(weights_of(client.model), {})


def test_empty_train_loader_is_an_error() -> None:
    client = TorchClient(torch.nn.Linear(1, 2), [], local_steps=3)
    with pytest.raises(ValueError, match="no batches"):
        client.fit(weights_of(client.model), {})


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({"lr": "fast"}, TypeError, r"config\['lr'\] must be a number"),
        ({"local_epochs": 0}, ValueError, r"config\['local_epochs'\] must be a positive"),
        ({"local_steps": 1.5}, ValueError, r"config\['local_steps'\]"),
    ],
)
def test_bad_config_values(config: dict[str, object], error: type[Exception], message: str) -> None:
    client = _client()
    with pytest.raises(error, match=message):
        client.fit(weights_of(client.model), config)  # type: ignore[arg-type]


def test_bad_batches_are_reported() -> None:
    client = TorchClient(torch.nn.Linear(1, 2), [torch.zeros(2, 1)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"expected \(inputs, targets\)"):
        client.fit(weights_of(client.model), {})


def test_load_weights_accepts_read_only_arrays() -> None:
    model = torch.nn.Linear(2, 2)
    weights = {k: np.full(v.shape, 0.5, v.dtype) for k, v in weights_of(model).items()}
    for array in weights.values():
        array.flags.writeable = False
    load_weights(model, weights)
    assert torch.all(model.weight == 0.5)


def test_load_weights_names_the_mismatch() -> None:
    model = torch.nn.Linear(2, 3)
    good = weights_of(model)
    with pytest.raises(ValueError, match=r"missing \['bias'\]"):
        load_weights(model, {"weight": good["weight"]})
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        load_weights(model, {**good, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'weight' has shape \(2, 3\).*expects \(3, 2\)"):
        load_weights(model, {**good, "weight": np.zeros((2, 3), np.float32)})
    with pytest.raises(TypeError, match="'bias' is a list"):
        load_weights(model, {**good, "bias": [0.0, 0.0, 0.0]})  # type: ignore[dict-item]


def test_weights_of_rejects_bfloat16() -> None:
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        weights_of(model)


def test_constructor_validates_counts() -> None:
    with pytest.raises(ValueError, match="local_epochs"):
        TorchClient(torch.nn.Linear(1, 1), [], local_epochs=0)
    with pytest.raises(ValueError, match="local_steps"):
        TorchClient(torch.nn.Linear(1, 1), [], local_steps=0)
