"""A ready-made :class:`~geofl.client.app.Client` for PyTorch models.

Most federated training is "load the global weights, run SGD for a few epochs, send the
weights back". :class:`TorchClient` does exactly that for any ``nn.Module`` and data loader,
including the FedProx proximal term, so users write a model and a loader, not a loop.
Weights cross the boundary as NumPy arrays named by ``model.state_dict()`` keys, so
buffers (e.g. BatchNorm statistics) travel too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn as nn

from geofl.client.app import Client
from geofl.protocols.partial_sync import SEGMENT_KEY
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

Tensor = torch.Tensor

__all__ = ["OptimizerFactory", "TorchClient", "load_weights", "weights_of"]

#: Builds an optimizer over the model's parameters (called once per ``fit``).
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
Batch = tuple[Tensor, Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]

_NO_NUMPY = (torch.bfloat16,)


def weights_of(model: nn.Module) -> Weights:
    """Return a copy of ``model.state_dict()`` as NumPy arrays, in state-dict order.

    Raises
    ------
    TypeError
        If a tensor's dtype has no NumPy equivalent (e.g. bfloat16); cast the model first.
    """
    weights: Weights = {}
    for name, tensor in model.state_dict().items():
        if tensor.dtype in _NO_NUMPY:
            raise TypeError(
                f"tensor {name!r} has dtype {tensor.dtype}, which NumPy cannot hold; "
                "cast the model (e.g. model.float()) before federated training"
            )
        weights[name] = tensor.detach().cpu().numpy().copy()
    return weights


def _as_tensor(name: str, array: npt.NDArray[np.generic]) -> Tensor:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"weight {name!r} is a {type(array).__name__}, expected a NumPy array")
    # torch.from_numpy shares memory, warns on read-only arrays (e.g. decoded from bytes) and
    # rejects negative strides: hand it a private C-ordered copy unless the array already fits.
    if not (array.flags.writeable and array.flags.c_contiguous):
        array = np.array(array, order="C", copy=True)
    return torch.from_numpy(array)


def load_weights(model: nn.Module, weights: WeightsView) -> None:
    """Copy ``weights`` into ``model`` in place, checking names and shapes first.

    Values are cast to each tensor's dtype and device by ``load_state_dict``.

    Raises
    ------
    ValueError
        Naming the missing, unexpected or mis-shaped tensors.
    """
    state = model.state_dict()
    missing = [name for name in state if name not in weights]
    unexpected = [name for name in weights if name not in state]
    if missing or unexpected:
        raise ValueError(
            f"weights do not match the model: missing {missing}, unexpected {unexpected}"
        )
    tensors: dict[str, Tensor] = {}
    for name, target in state.items():
        tensor = _as_tensor(name, weights[name])
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(target.shape)}"
            )
        tensors[name] = tensor
    model.load_state_dict(tensors, strict=True)


def _config_number(config: Mapping[str, Scalar], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"config[{key!r}] must be a number, got {value!r}")
    return float(value)


def _config_count(config: Mapping[str, Scalar], key: str, default: int | None) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config[{key!r}] must be a positive integer, got {value!r}")
    return value


@dataclass
class _Segment:
    """What the segments of one partially synchronized round share."""

    optimizer: torch.optim.Optimizer
    anchor: list[Tensor]
    batches: Iterator[Batch]

    def take(self, steps: int) -> Iterator[Batch]:
        """The next ``steps`` batches of the round's data order."""
        return itertools.islice(self.batches, steps)


def _unpack(batch: object) -> Batch:
    if isinstance(batch, tuple | list) and len(batch) == 2:
        inputs, targets = batch
        if isinstance(inputs, Tensor) and isinstance(targets, Tensor):
            return inputs, targets
    raise TypeError(
        f"a data loader yielded {type(batch).__name__}; expected (inputs, targets) tensors"
    )


@dataclass
class _Tally:
    """Running sums over batches: loss weighted by batch size, correct predictions."""

    loss: float = 0.0
    correct: int = 0
    examples: int = 0
    classified: bool = True

    def add(self, loss: Tensor, outputs: Tensor, targets: Tensor) -> None:
        size = int(targets.shape[0])
        self.loss += float(loss.detach()) * size
        self.examples += size
        if outputs.ndim == 2 and targets.ndim == 1 and not targets.is_floating_point():
            self.correct += int((outputs.detach().argmax(dim=1) == targets).sum())
        else:
            self.classified = False

    def mean_loss(self) -> float:
        return self.loss / self.examples

    def accuracy(self) -> float | None:
        return self.correct / self.examples if self.classified else None


def _proximal_term(params: list[nn.Parameter], anchor: list[Tensor], mu: float) -> Tensor:
    """FedProx: ``mu / 2 * ||w - w_global||^2``, pulling local training toward the global model."""
    total = torch.zeros((), device=anchor[0].device)
    for param, start in zip(params, anchor, strict=True):
        total = total + (param - start).pow(2).sum()
    return total * (mu / 2.0)


class TorchClient(Client):
    """Local SGD on a PyTorch model, with optional FedProx regularisation.

    Parameters
    ----------
    model
        The network; its ``state_dict()`` keys name the weights on the wire.
    train_loader
        Re-iterable source of ``(inputs, targets)`` batches, e.g. a ``DataLoader``.
    test_loader
        Batches for :meth:`evaluate`; without it, evaluation is not offered.
    optimizer
        Factory over ``model.parameters()``; by default SGD with ``lr`` from the round's
        config (0.01 if absent) and momentum 0.9. A new optimizer is built each round.
    loss_fn
        Mean-reduced loss; cross-entropy by default.
    local_epochs
        Epochs per round unless the round config sets ``local_epochs``.
    local_steps
        If set (here or as config ``local_steps``), train this many batches instead of
        whole epochs, cycling through the loader; fixes compute per round across clients.
    device
        Where to train.

    Notes
    -----
    Round config keys read: ``lr``, ``local_epochs``, ``local_steps``, ``proximal_mu``
    (FedProx, off when 0 or absent) and ``seed`` (seeds torch's global generator, which
    also drives ``DataLoader`` shuffling, so a round is reproducible).

    In a partially synchronized round (:mod:`geofl.client.partial_sync`) ``fit`` is
    called once per segment with ``sync_segment`` 0, 1, ...; segments after the first
    continue the first one's optimizer (momentum), data order and proximal anchor, so
    the segments together train exactly as one ``fit`` of all the steps would.
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader: Iterable[Batch],
        test_loader: Iterable[Batch] | None = None,
        *,
        optimizer: OptimizerFactory | None = None,
        loss_fn: LossFn | None = None,
        local_epochs: int = 1,
        local_steps: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
        if local_steps is not None and local_steps < 1:
            raise ValueError(f"local_steps must be >= 1 or None, got {local_steps}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.train_loader = train_loader
        self.test_loader = test_loader
        self.optimizer_factory = optimizer
        self.loss_fn: LossFn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self._segment: _Segment | None = None

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Train from ``parameters``; return new weights, examples seen, loss and accuracy.

        ``num_examples`` counts every example trained on, over all epochs or steps.
        """
        continuing = self._segment is not None and _config_number(config, SEGMENT_KEY, 0.0) > 0
        if "seed" in config and not continuing:
            torch.manual_seed(int(_config_number(config, "seed", 0)))
        load_weights(self.model, parameters)
        mu = _config_number(config, "proximal_mu", 0.0)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if continuing and self._segment is not None:
            optimizer, anchor = self._segment.optimizer, self._segment.anchor
            batches = self._segment.take(_config_count(config, "local_steps", None) or 1)
        else:
            optimizer = self._make_optimizer(config)
            anchor = [p.detach().clone() for p in trainable] if mu > 0 and trainable else []
            batches = self._first_batches(config, optimizer, anchor)
        self.model.train()
        tally = _Tally()
        for inputs, targets in batches:
            optimizer.zero_grad()
            outputs = self.model(inputs)
            loss = self.loss_fn(outputs, targets)
            objective = loss + _proximal_term(trainable, anchor, mu) if anchor else loss
            torch.autograd.backward(objective)
            optimizer.step()
            tally.add(loss, outputs, targets)
        if tally.examples == 0:
            raise ValueError("train_loader yielded no batches; this client has no data")
        metrics: Metrics = {"train_loss": tally.mean_loss()}
        accuracy = tally.accuracy()
        if accuracy is not None:
            metrics["train_accuracy"] = accuracy
        return weights_of(self.model), tally.examples, metrics

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Mean loss and accuracy of ``parameters`` on the test loader."""
        if self.test_loader is None:
            raise NotImplementedError("this TorchClient was built without a test_loader")
        load_weights(self.model, parameters)
        self.model.eval()
        tally = _Tally()
        with torch.no_grad():
            for inputs, targets in self._batches(self.test_loader):
                outputs = self.model(inputs)
                tally.add(self.loss_fn(outputs, targets), outputs, targets)
        if tally.examples == 0:
            raise ValueError("test_loader yielded no batches; nothing to evaluate")
        accuracy = tally.accuracy()
        metrics: Metrics = {} if accuracy is None else {"accuracy": accuracy}
        return tally.mean_loss(), tally.examples, metrics

    def _make_optimizer(self, config: Config) -> torch.optim.Optimizer:
        if self.optimizer_factory is not None:
            return self.optimizer_factory(self.model.parameters())
        lr = _config_number(config, "lr", 0.01)
        return torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)

    def _first_batches(
        self, config: Config, optimizer: torch.optim.Optimizer, anchor: list[Tensor]
    ) -> Iterator[Batch]:
        """This fit's batches; in a segmented round, also the continuation for the rest."""
        if SEGMENT_KEY not in config:
            self._segment = None
            return self._train_batches(config)
        self._segment = _Segment(optimizer, anchor, self._cycled_batches())
        return self._segment.take(_config_count(config, "local_steps", None) or 1)

    def _cycled_batches(self) -> Iterator[Batch]:
        """The loader's batches over and over (as ``local_steps`` training draws them)."""
        while True:
            empty = True
            for batch in self._batches(self.train_loader):
                empty = False
                yield batch
            if empty:
                return

    def _batches(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        for batch in loader:
            inputs, targets = _unpack(batch)
            yield inputs.to(self.device), targets.to(self.device)

    def _train_batches(self, config: Config) -> Iterator[Batch]:
        steps = _config_count(config, "local_steps", self.local_steps)
        if steps is None:
            epochs = _config_count(config, "local_epochs", self.local_epochs) or 1
            for _ in range(epochs):
                yield from self._batches(self.train_loader)
            return
        done = 0
        while done < steps:
            before = done
            for batch in self._batches(self.train_loader):
                yield batch
                done += 1
                if done == steps:
                    return
            if done == before:  # an empty loader would otherwise loop forever
                return
