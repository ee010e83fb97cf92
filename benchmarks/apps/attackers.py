"""Malicious Fashion-MNIST clients: the attacks of the robustness benchmark, run client-side.

Every attack here is a :class:`~geofl.client.app.Client` that a real deployment could run
as its ``--app``: it receives the global model like any client and returns weights, a
claimed ``num_examples`` and metrics, so the server sees exactly what it would over the
wire and checks it with the same rules (a finite, well-shaped update passes every check).
Nothing is tampered with on the server.

The honest client is :func:`examples.fashion_mnist.task.mlp_client_app` (784-64-10 MLP,
``local_steps`` seeded SGD steps). Node config chooses the behaviour, the same mapping
for every client of a simulation (``simulation.node_config``):

========================  =============================================================
``attack``                ``none`` (default), ``scaled``, ``sign_flip``, ``label_flip``,
                          ``alie`` or ``free_rider``
``malicious-ids``         comma-separated partition ids that attack; the others are honest
``attack-scale``          ``scaled``: the factor on the honest delta (default 10);
                          ``sign_flip``: the factor on the negated delta (default 1)
``attack-z``              ``alie``: ``z`` in mean + z * std (required; :func:`baruch_z`
                          gives the paper's z_max)
``attack-claim-factor``   ``free_rider``: claimed examples as a multiple of its share (1)
========================  =============================================================

* ``scaled``: global + s * (honest - global), the honest update blown up.
* ``sign_flip``: global - s * (honest - global), the honest update pointing backwards.
* ``label_flip``: trains honestly on labels ``9 - y`` (data poisoning: the update looks
  like any other client's).
* ``alie``, "a little is enough" (Baruch et al., NeurIPS 2019): the colluders pool their
  data, each computes every colluder's honest update for the round, and all send
  global + mean + z * std of those deltas per coordinate, the same vector, inside the
  spread of honest updates so that coordinate-wise rules keep it. The colluders are the
  ``malicious-ids`` (all of them, selected this round or not), as in the paper where the
  attackers estimate the statistics from their own benign gradients.
* ``free_rider``: does no work and sends the global model back (a zero update) while
  claiming its share of examples (times ``attack-claim-factor``) and the samples an honest
  client would have trained.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import torch

from examples.fashion_mnist.task import MLPClient, mlp_client_app
from geofl.client.app import Client, ClientContext
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = [
    "ATTACKS",
    "AlieClient",
    "AttackSettings",
    "FreeRiderClient",
    "LabelFlipClient",
    "ModelPoisoningClient",
    "alie_update",
    "baruch_z",
    "client_app",
    "flip_labels",
    "free_ride",
    "scaled_update",
]

ATTACKS = ("none", "scaled", "sign_flip", "label_flip", "alie", "free_rider")
NUM_CLASSES = 10
DEFAULT_SCALE = {"scaled": 10.0, "sign_flip": 1.0}
#: Crafted ALIE updates kept per process: one per (round, global model) seen.
ALIE_CACHE_SIZE = 4

Batch = tuple[torch.Tensor, torch.Tensor]
FloatArray = npt.NDArray[np.floating]


class AttackConfigError(ValueError):
    """A node config names an unknown attack or gives it a bad setting."""


def _float(node_config: Mapping[str, Scalar], key: str, default: float) -> float:
    value = node_config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise AttackConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise AttackConfigError(f"{key} must be a number, got {value!r}") from None
    if not np.isfinite(number):
        raise AttackConfigError(f"{key} must be finite, got {value!r}")
    return number


def _ids(node_config: Mapping[str, Scalar]) -> frozenset[int]:
    raw = str(node_config.get("malicious-ids", "")).strip()
    try:
        return frozenset(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise AttackConfigError(
            f"malicious-ids must be comma-separated partition ids, got {raw!r}"
        ) from None


def baruch_z(n: int, malicious: int) -> float:
    """Baruch et al.'s z_max: the largest z whose crafted value a majority still 'needs'.

    ``s = floor(n / 2 + 1) - malicious`` honest workers must look further from the mean
    than the attackers for a coordinate-wise rule to prefer them; ``z`` is the normal
    quantile of ``(n - s) / n``.
    """
    if not 0 < malicious < n:
        raise AttackConfigError(f"alie needs 0 < malicious < n, got {malicious} of {n}")
    supporters = n // 2 + 1 - malicious
    return NormalDist().inv_cdf((n - supporters) / n)


@dataclass(frozen=True)
class AttackSettings:
    """One client's attack, read from its node config."""

    name: str
    malicious: frozenset[int]
    scale: float
    z: float
    claim_factor: float

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Scalar]) -> AttackSettings:
        """Parse and check the ``attack*`` keys; see the module docstring.

        Raises
        ------
        AttackConfigError
            Naming the key that is unknown or out of range.
        """
        name = str(node_config.get("attack", "none"))
        if name not in ATTACKS:
            raise AttackConfigError(f"attack must be one of {', '.join(ATTACKS)}, got {name!r}")
        malicious = _ids(node_config)
        if name != "none" and not malicious:
            raise AttackConfigError(f"attack {name!r} needs malicious-ids")
        scale = _float(node_config, "attack-scale", DEFAULT_SCALE.get(name, 1.0))
        claim = _float(node_config, "attack-claim-factor", 1.0)
        if claim <= 0:
            raise AttackConfigError(f"attack-claim-factor must be > 0, got {claim}")
        if name == "alie" and "attack-z" not in node_config:
            raise AttackConfigError("attack 'alie' needs attack-z (e.g. baruch_z(n, m))")
        z = _float(node_config, "attack-z", 0.0)
        return cls(name, malicious, scale, z, claim)


# ---------------------------------------------------------------- the transformations


def _is_float(array: npt.NDArray[np.generic]) -> bool:
    return np.issubdtype(array.dtype, np.floating)


def scaled_update(global_w: WeightsView, honest: WeightsView, factor: float) -> Weights:
    """``global + factor * (honest - global)`` for float tensors; others as trained.

    ``factor = -1`` is the sign flip: the honest delta negated.
    """
    out: Weights = {}
    for name, start in global_w.items():
        trained = np.asarray(honest[name])
        if not _is_float(trained):
            out[name] = trained.copy()
            continue
        base = np.asarray(start, dtype=np.float64)
        out[name] = (base + factor * (trained.astype(np.float64) - base)).astype(trained.dtype)
    return out


def alie_update(global_w: WeightsView, colluders: Sequence[WeightsView], z: float) -> Weights:
    """``global + mean + z * std`` of the colluders' deltas, per coordinate.

    ``std`` is the population standard deviation over the colluders. Integer tensors
    are the first colluder's (they are counters, not attack surface).
    """
    if not colluders:
        raise AttackConfigError("alie needs the honest updates of at least one colluder")
    out: Weights = {}
    for name, start in global_w.items():
        first = np.asarray(colluders[0][name])
        if not _is_float(first):
            out[name] = first.copy()
            continue
        base = np.asarray(start, dtype=np.float64)
        deltas = np.stack([np.asarray(c[name], dtype=np.float64) - base for c in colluders])
        crafted = base + deltas.mean(axis=0) + z * deltas.std(axis=0)
        out[name] = crafted.astype(first.dtype)
    return out


def free_ride(global_w: WeightsView) -> Weights:
    """The global model itself, copied: a zero update."""
    return {name: np.array(array, copy=True) for name, array in global_w.items()}


def flip_labels(labels: torch.Tensor, num_classes: int = NUM_CLASSES) -> torch.Tensor:
    """Label ``y`` becomes ``num_classes - 1 - y`` (for Fashion-MNIST: T-shirt <-> boot)."""
    return (num_classes - 1) - labels


# ---------------------------------------------------------------- the clients


class ModelPoisoningClient(Client):
    """Trains honestly, then sends ``global + factor * delta`` (scaled or sign-flipped)."""

    def __init__(self, honest: Client, factor: float) -> None:
        self.honest = honest
        self.factor = factor

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """The honest fit, its delta multiplied by ``factor``; examples and metrics kept."""
        weights, examples, metrics = self.honest.fit(parameters, config)
        return scaled_update(parameters, weights, self.factor), examples, metrics

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Honest evaluation (the attack is on training)."""
        return self.honest.evaluate(parameters, config)


class _FlippedBatches:
    """An iterable of ``(x, y)`` batches with every label flipped, re-iterable."""

    def __init__(self, batches: Iterable[Batch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Batch]:
        for inputs, labels in self.batches:
            yield inputs, flip_labels(labels)


class LabelFlipClient(MLPClient):
    """The honest MLP client, except every training label ``y`` is ``9 - y``.

    The flip happens where the training batches are installed, so the whole honest
    training loop (seeded draws, optimizer, metrics) runs unchanged on poisoned labels.
    """

    @property
    def train_loader(self) -> Iterable[Batch]:
        """The batches the next fit trains on, labels flipped."""
        return self._flipped

    @train_loader.setter
    def train_loader(self, batches: Iterable[Batch]) -> None:
        self._flipped = _FlippedBatches(batches)


class FreeRiderClient(Client):
    """Sends the global model back untouched while claiming examples and training samples."""

    def __init__(self, honest: MLPClient, claim_factor: float) -> None:
        self.honest = honest
        self.claim_factor = claim_factor

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """A zero update, ``claim_factor`` times its share claimed, honest-looking metrics."""
        share = self.honest.train_indices.numel()
        steps = int(config.get("local_steps", 5))
        batch = int(config.get("batch_size", 16))
        claimed = max(1, round(share * self.claim_factor))
        return free_ride(parameters), claimed, {"samples_trained": steps * batch}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Honest evaluation."""
        return self.honest.evaluate(parameters, config)


def _digest(parameters: WeightsView) -> str:
    hasher = hashlib.blake2b(digest_size=16)
    for name, array in parameters.items():
        hasher.update(name.encode())
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()


#: (round, digest of the global model, z) -> crafted weights, shared by a process's colluders.
_ALIE_CACHE: OrderedDict[tuple[object, str, float], Weights] = OrderedDict()


class AlieClient(Client):
    """A colluder of "a little is enough": every colluder sends the same crafted update.

    ``colluder_clients`` builds the honest client of each colluding partition (pooled
    data); the crafted update is computed once per round and global model in a process
    and shared by the colluders that run there (each process computes the same value:
    the honest training is seeded by partition and round).
    """

    def __init__(
        self,
        honest: MLPClient,
        colluder_clients: Callable[[], Sequence[Client]],
        z: float,
    ) -> None:
        self.honest = honest
        self.colluder_clients = colluder_clients
        self.z = z

    def crafted(self, parameters: Weights, config: Config) -> Weights:
        """global + mean + z * std of the colluders' honest deltas for this round."""
        key = (config.get("server_round"), _digest(parameters), self.z)
        if key not in _ALIE_CACHE:
            updates = [
                dict(client.fit(parameters, config)[0]) for client in self.colluder_clients()
            ]
            _ALIE_CACHE[key] = alie_update(parameters, updates, self.z)
            while len(_ALIE_CACHE) > ALIE_CACHE_SIZE:
                _ALIE_CACHE.popitem(last=False)
        return {name: array.copy() for name, array in _ALIE_CACHE[key].items()}

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """The crafted update, claiming this client's own share (as an honest one would)."""
        steps = int(config.get("local_steps", 5))
        batch = int(config.get("batch_size", 16))
        share = self.honest.train_indices.numel()
        return self.crafted(parameters, config), share, {"samples_trained": steps * batch}

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Honest evaluation."""
        return self.honest.evaluate(parameters, config)


def _partition_id(context: ClientContext) -> int:
    return int(context.node_config.get("partition-id", 0))


def _colluders(context: ClientContext, ids: Iterable[int]) -> Callable[[], list[Client]]:
    contexts = [
        replace(context, node_config={**context.node_config, "partition-id": i}, state={})
        for i in sorted(ids)
    ]
    return lambda: [mlp_client_app(c) for c in contexts]


def _label_flip_client(context: ClientContext) -> LabelFlipClient:
    honest = mlp_client_app(context)
    flipped = LabelFlipClient(
        honest.partition_id, honest.train_indices.numpy(), np.zeros(1, dtype=np.int64)
    )
    flipped.test_loader = honest.test_loader
    return flipped


def client_app(context: ClientContext) -> Client:
    """The honest MLP client, or the attack its node config names for its partition.

    Raises
    ------
    AttackConfigError
        If the ``attack*`` node config is invalid (for every client, honest or not).
    """
    settings = AttackSettings.from_node_config(context.node_config)
    if settings.name == "none" or _partition_id(context) not in settings.malicious:
        return mlp_client_app(context)
    if settings.name == "label_flip":
        return _label_flip_client(context)
    honest = mlp_client_app(context)
    if settings.name in ("scaled", "sign_flip"):
        sign = -1.0 if settings.name == "sign_flip" else 1.0
        return ModelPoisoningClient(honest, sign * settings.scale)
    if settings.name == "free_rider":
        return FreeRiderClient(honest, settings.claim_factor)
    return AlieClient(honest, _colluders(context, settings.malicious), settings.z)
