"""A round's model out of the checkpoint store: what ``geofl runs pull`` writes.

A checkpoint file also holds the server's resume state (``__state__/`` tensors); the
exported file holds the model only, as safetensors with the model's tensor order in its
metadata, and converts to a PyTorch ``state_dict`` on the admin's machine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import safetensors.numpy
from sqlalchemy.orm import Session

from geofl.storage import CheckpointRecord, CheckpointStore, RecordNotFoundError, queries

__all__ = ["ExportedModel", "checkpoint_for", "export_model", "write_model_files"]

_ORDER_KEY = "geofl.order"


@dataclass(frozen=True)
class ExportedModel:
    """One round's model as a safetensors file's bytes."""

    run_id: int
    round: int
    data: bytes
    num_tensors: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def checkpoint_for(
    session: Session, run_id: int, round: int | None
) -> tuple[int, CheckpointRecord]:
    """The round and checkpoint of ``round`` (``None``: the newest) of a run.

    Raises
    ------
    RunNotFoundError
        No such run.
    RecordNotFoundError
        The round has no checkpoint (not committed, or pruned by
        ``storage.keep_checkpoints``); the message lists the rounds that have one.
    """
    queries.get_run(session, run_id)
    rows = queries.checkpoints_of(session, run_id)
    if not rows:
        raise RecordNotFoundError(f"run {run_id} has no checkpoint (no round committed)")
    if round is None:
        return rows[0].round, CheckpointRecord.from_row(rows[0])
    for row in rows:
        if row.round == round:
            return row.round, CheckpointRecord.from_row(row)
    kept = ", ".join(str(row.round) for row in reversed(rows))
    raise RecordNotFoundError(
        f"run {run_id} has no checkpoint of round {round}; rounds with one: {kept}"
    )


def export_model(
    store: CheckpointStore, run_id: int, round: int, record: CheckpointRecord
) -> ExportedModel:
    """The model of ``record`` (digest verified), without the server's resume state.

    Raises
    ------
    CheckpointCorruptError
        The checkpoint file is missing or does not match its recorded digest.
    """
    weights, _ = store.load(record)
    metadata = {
        _ORDER_KEY: json.dumps(list(weights)),
        "geofl.run_id": str(run_id),
        "geofl.round": str(round),
    }
    data = safetensors.numpy.save(dict(weights), metadata=metadata)
    return ExportedModel(run_id, round, data, len(weights))


def write_model_files(data: bytes, stem: Path) -> tuple[Path, Path]:
    """Write ``STEM.safetensors`` (``data`` as is) and ``STEM.pt`` (a PyTorch
    ``state_dict`` of the same tensors, in the model's order); their paths.

    ``STEM.pt`` is written with ``torch.save``; load it with
    ``torch.load(path, weights_only=True)``.

    Raises
    ------
    ModuleNotFoundError
        If PyTorch is not installed (``pip install 'geofl[torch]'``); the safetensors
        file is written first.
    """
    stem.parent.mkdir(parents=True, exist_ok=True)
    tensors_path = stem.with_name(stem.name + ".safetensors")
    tensors_path.write_bytes(data)
    import torch  # optional: only for the state_dict file
    from safetensors import safe_open
    from safetensors.torch import load as load_torch

    tensors = load_torch(data)
    with safe_open(tensors_path, framework="pt") as handle:
        metadata = handle.metadata() or {}
    order = json.loads(metadata.get(_ORDER_KEY, "[]")) or sorted(tensors)
    state_dict = {name: tensors[name] for name in order}
    torch_path = stem.with_name(stem.name + ".pt")
    torch.save(state_dict, torch_path)
    return tensors_path, torch_path
