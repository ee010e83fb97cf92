"""A site's AdamW state, kept across rounds and across restarts of the client.

DiLoCo's inner optimizer lives on the site: its moments and step count must survive the
end of a round (the next round continues them) and a restart of the client process. The
state is kept in memory (the client context's ``state``, which outlives rebuilt client
objects) and, when the node has a ``state-dir``, in ``<state-dir>/site-<id>.adamw.safetensors``
written atomically after every fit. The file holds only tensors (safetensors: no pickle)
and two strings of metadata: the run's ``state_tag`` and the round it was written after.

A state written for another tag, or after a later round than the one starting (the file
is from an earlier run that had progressed further), is not used: the optimizer starts
fresh, as it must for a different run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

__all__ = ["AdamWState", "StateStore", "capture", "restore"]

_SLOTS = ("exp_avg", "exp_avg_sq", "step")
_CONTEXT_KEY = "geo_lm.adamw"


@dataclass
class AdamWState:
    """Per-parameter moments and step counts, with what run and round they belong to."""

    tag: str
    server_round: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def usable_for(self, tag: str, server_round: int) -> bool:
        """Whether a fit of ``server_round`` of the run tagged ``tag`` may continue it."""
        return self.tag == tag and self.server_round <= server_round


def capture(
    model: nn.Module, optimizer: torch.optim.Optimizer, tag: str, server_round: int
) -> AdamWState:
    """A copy of the optimizer's state keyed by parameter name (``<name>.<slot>``)."""
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        state = optimizer.state.get(param)
        if not state:
            continue
        for slot in _SLOTS:
            value = state[slot]
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
            # The step count is stored as shape (1,): a 0-d tensor is awkward in safetensors.
            shape = (1,) if slot == "step" else tuple(tensor.shape)
            tensors[f"{name}.{slot}"] = tensor.detach().clone().reshape(shape)
    return AdamWState(tag, server_round, tensors)


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, saved: AdamWState) -> int:
    """Put ``saved`` into ``optimizer`` (built over ``model``'s parameters); return how many
    parameters got state.

    Raises
    ------
    ValueError
        If a saved moment's shape differs from its parameter's (another model's state).
    """
    restored = 0
    for name, param in model.named_parameters():
        keys = [f"{name}.{slot}" for slot in _SLOTS]
        if not all(key in saved.tensors for key in keys):
            continue
        avg, avg_sq, step = (saved.tensors[key] for key in keys)
        if avg.shape != param.shape or avg_sq.shape != param.shape:
            raise ValueError(
                f"saved AdamW state of {name!r} has shape {tuple(avg.shape)}, the parameter "
                f"{tuple(param.shape)}: the state is another model's"
            )
        optimizer.state[param] = {
            "step": step.reshape(()).clone().to(torch.float32),
            "exp_avg": avg.clone(),
            "exp_avg_sq": avg_sq.clone(),
        }
        restored += 1
    return restored


class StateStore:
    """Where one site's AdamW state is kept: the context's memory and, optionally, a file."""

    def __init__(self, memory: dict[str, object], path: Path | None) -> None:
        self._memory = memory
        self.path = path

    def load(self, tag: str, server_round: int) -> AdamWState | None:
        """The usable state: from the file when there is a path (it is authoritative: it is
        what a restarted client finds), else from memory; None to start fresh."""
        if self.path is None:
            kept = self._memory.get(_CONTEXT_KEY)
            usable = isinstance(kept, AdamWState) and kept.usable_for(tag, server_round)
            return kept if usable and isinstance(kept, AdamWState) else None
        if not self.path.exists():
            return None
        from safetensors import safe_open

        with safe_open(str(self.path), framework="pt") as handle:
            meta: Mapping[str, str] = handle.metadata() or {}
        try:
            saved = AdamWState(meta["tag"], int(meta["round"]), load_file(str(self.path)))
        except (KeyError, ValueError):
            return None
        return saved if saved.usable_for(tag, server_round) else None

    def save(self, state: AdamWState) -> None:
        """Keep ``state`` in memory and, with a path, write it atomically to the file."""
        self._memory[_CONTEXT_KEY] = state
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        tensors = {key: value.contiguous() for key, value in state.tensors.items()}
        save_file(
            tensors, str(partial), metadata={"tag": state.tag, "round": str(state.server_round)}
        )
        os.replace(partial, self.path)
