"""The geo_lm task: a byte-level transformer trained by a few sites, each on its own packages.

Two kinds of fit, chosen by the round config's ``mode``:

* ``adamw`` (DiLoCo's inner loop, also partial sync's segments): ``local_steps`` AdamW
  steps from the weights received, continuing the site's own AdamW state (moments and
  step count), which is kept across rounds and restarts (:mod:`.optimizer_state`);
* ``gradient`` (synchronous data parallel): one batch's gradient ``g`` at the weights
  received, returned as ``w - g`` so the update is ``-g``; the server's ``adamw``
  strategy averages the sites' gradients and applies the same AdamW.

Every site reports the tokens it trained as ``num_examples`` (equal for all sites, so the
server's mean is the plain mean, as DiLoCo and data parallel average) and as
``samples_trained``, which the virtual clock divides by ``simulation.compute.samples_per_s``:
set that to the tokens per second of a measured step (``python -m examples.geo_lm.steptime``).

The inner learning rate may follow a warmup and cosine decay (round config
``warmup_steps``, ``decay_steps``, ``final_lr_ratio``; :mod:`geofl.protocols.lr_schedule`)
by the site's own AdamW step count, which counts every step it took in the run: step ``t``
of a site then has the rate the server's ``adamw`` gives synchronous data parallel's step ``t``.

Batches are drawn from the site's text by a generator seeded with the site, the round
and the segment, so a run is reproducible and a rebuilt or restarted client draws the
same batches it would have.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from examples.geo_lm.data import site_bytes, validation_windows
from examples.geo_lm.model import ByteLM, bits_per_byte, lm_loss
from examples.geo_lm.optimizer_state import StateStore, capture, restore
from geofl.client.app import Client, ClientContext
from geofl.client.torch import load_weights, weights_of
from geofl.protocols.lr_schedule import check_schedule, scheduled_lr
from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView

__all__ = [
    "GeoLMClient",
    "client_app",
    "draw_batches",
    "make_model",
    "server_evaluate",
    "validation_loss",
]

MODEL_SEED = 0
DATA_SEED = 11
DEFAULT_BATCH = 8
VALIDATION_COUNT = 64
MODES = ("adamw", "gradient")


def make_model() -> Weights:
    """Initial weights, identical in every process (seeded without touching global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(MODEL_SEED)
        return weights_of(ByteLM())


def draw_batches(
    text: npt.NDArray[np.uint8], site: int, server_round: int, segment: int, steps: int, batch: int
) -> torch.Tensor:
    """``(steps, batch, context + 1)`` int64 windows of ``text``, seeded by site/round/segment."""
    span = _context() + 1
    if text.size <= span:
        raise ValueError(f"site {site} has {text.size} bytes, fewer than one window of {span}")
    rng = np.random.default_rng([DATA_SEED, site, server_round, segment])
    starts = rng.integers(0, text.size - span, size=(steps, batch))
    windows = text[starts[..., None] + np.arange(span)]
    return torch.from_numpy(windows.astype(np.int64))


@lru_cache(maxsize=1)
def _context() -> int:
    return ByteLM().shape.context


@lru_cache(maxsize=1)
def _validation() -> torch.Tensor:
    return torch.from_numpy(validation_windows(VALIDATION_COUNT, _context()).astype(np.int64))


def validation_loss(model: ByteLM) -> float:
    """Mean next-byte cross-entropy (nats) on the fixed held-out windows."""
    model.eval()
    with torch.no_grad():
        return float(lm_loss(model, _validation()))


def server_evaluate(weights: WeightsView) -> tuple[float, dict[str, Scalar]]:
    """Validation loss (nats per byte) and bits per byte of the global model."""
    model = ByteLM()
    load_weights(model, weights)
    loss = validation_loss(model)
    return loss, {"bpb": bits_per_byte(loss)}


def _int(config: Config, key: str, default: int, minimum: int = 0) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config[{key!r}] must be an integer >= {minimum}, got {value!r}")
    return value


def _float(config: Config, key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"config[{key!r}] must be a number, got {value!r}")
    return float(value)


class GeoLMClient(Client):
    """One site: its packages' text, the model, and its AdamW state store."""

    def __init__(self, site: int, num_sites: int, store: StateStore) -> None:
        self.site = site
        self.text = site_bytes(site, num_sites)
        self.model = ByteLM()
        self.store = store

    def fit(self, parameters: Weights, config: Config) -> tuple[WeightsView, int, Metrics]:
        """Train as the round's ``mode`` says (module docstring); report tokens trained."""
        mode = config.get("mode", "adamw")
        if mode not in MODES:
            raise ValueError(f"config['mode'] must be one of {MODES}, got {mode!r}")
        load_weights(self.model, parameters)
        self.model.train()
        batch = _int(config, "batch_size", DEFAULT_BATCH, minimum=1)
        steps = 1 if mode == "gradient" else _int(config, "local_steps", 1, minimum=1)
        server_round = _int(config, "server_round", 1, minimum=1)
        segment = _int(config, "sync_segment", 0)
        windows = draw_batches(self.text, self.site, server_round, segment, steps, batch)
        if mode == "gradient":
            loss = self._gradient_step(windows[0])
        else:
            loss = self._adamw_steps(windows, config, server_round)
        tokens = steps * batch * _context()
        metrics: Metrics = {"train_loss": loss, "samples_trained": tokens}
        return weights_of(self.model), tokens, metrics

    def _gradient_step(self, windows: torch.Tensor) -> float:
        """``w - g`` for this batch's gradient ``g``: the update the server averages."""
        self.model.zero_grad(set_to_none=True)
        loss = lm_loss(self.model, windows)
        torch.autograd.backward(loss)
        with torch.no_grad():
            for param in self.model.parameters():
                if param.grad is not None:
                    param.sub_(param.grad)
        return float(loss.detach())

    def _adamw_steps(self, windows: torch.Tensor, config: Config, server_round: int) -> float:
        """AdamW steps continuing the site's saved state; the state is saved afterwards."""
        optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=_float(config, "lr", 1e-3),
            betas=(_float(config, "beta_1", 0.9), _float(config, "beta_2", 0.999)),
            eps=_float(config, "eps", 1e-8),
            weight_decay=_float(config, "weight_decay", 0.01),
        )
        tag = str(config.get("state_tag", ""))
        saved = self.store.load(tag, server_round)
        if saved is not None:
            restored = restore(self.model, optimizer, saved)
            expected = sum(1 for _ in self.model.parameters())
            if restored != expected:
                raise ValueError(
                    f"the saved AdamW state covers {restored} of the model's {expected} "
                    "parameters: it is another model's; remove it or use another state_tag"
                )
        lr_of = _schedule(config)
        taken = _steps_taken(optimizer)
        losses = []
        for offset, step_windows in enumerate(windows, start=1):
            for group in optimizer.param_groups:
                group["lr"] = lr_of(taken + offset)
            optimizer.zero_grad(set_to_none=True)
            loss = lm_loss(self.model, step_windows)
            torch.autograd.backward(loss)
            optimizer.step()
            losses.append(float(loss.detach()))
        self.store.save(capture(self.model, optimizer, tag, server_round))
        return float(np.mean(losses))

    def evaluate(self, parameters: Weights, config: Config) -> tuple[float, int, Metrics]:
        """Validation loss of ``parameters`` on the held-out windows (same for every site)."""
        load_weights(self.model, parameters)
        loss = validation_loss(self.model)
        return loss, VALIDATION_COUNT * _context(), {"bpb": bits_per_byte(loss)}


def _schedule(config: Config) -> Callable[[int], float]:
    """The inner learning rate by 1-based step, from the round config."""
    lr = _float(config, "lr", 1e-3)
    warmup = _int(config, "warmup_steps", 0)
    decay = _int(config, "decay_steps", 0)
    final_ratio = _float(config, "final_lr_ratio", 0.1)
    check_schedule(warmup, decay, final_ratio)
    return lambda step: scheduled_lr(lr, step, warmup, decay, final_ratio)


def _steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """AdamW steps this site has taken (0 before its first; restored state counts)."""
    for state in optimizer.state.values():
        step = state.get("step")
        if step is not None:
            return int(step)
    return 0


def _node_int(context: ClientContext, key: str, default: int) -> int:
    value = context.node_config.get(key, context.run_config.get(key, default))
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"node config {key!r} must be an integer, got {value!r}")
    return int(value)


def client_app(context: ClientContext) -> GeoLMClient:
    """Site ``partition-id`` of ``num-partitions``.

    Node settings: ``torch-threads`` caps torch's threads; ``state-dir`` keeps the AdamW
    state in ``<state-dir>/site-<partition-id>.adamw.safetensors`` across restarts (without
    it the state lives in the client process only).
    """
    if "torch-threads" in context.node_config:
        torch.set_num_threads(_node_int(context, "torch-threads", 1))
    site = _node_int(context, "partition-id", 0)
    sites = _node_int(context, "num-partitions", 1)
    directory = context.node_config.get("state-dir")
    path = None if directory is None else Path(str(directory)) / f"site-{site}.adamw.safetensors"
    return GeoLMClient(site, sites, StateStore(context.state, path))
