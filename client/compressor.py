"""The client's side of upload compression: codec state and error feedback, kept on disk.

Error-feedback rule (documented in docs/compression.md): the residual a client keeps
is what compression dropped from its last upload.  It is added to the next update of
the same run, unless that update is for a round more than ``max_staleness`` rounds
after the client's previous fit (the residual then belongs to a model long gone) or
the run changed; in those cases it is reset to zero.  The residuals and the codec
state (PowerSGD's warm-start factors) are saved after every fit, so a restarted
client continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load_file, save_file

from geofl.protocols.codecs import (
    CodecState,
    ErrorFeedback,
    chain_for,
    encode_tensor,
    encode_with_feedback,
)
from geofl.protocols.compression import UploadPlan
from geofl.protocols.tensors import Difference, EncodedTensor, Tensorish

log = logging.getLogger(__name__)

_RESIDUAL = "residual/"
_STATE = "state/"


class UploadCompressor:
    """Encodes a client's updates under the server's plan, with persistent state."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.feedback = ErrorFeedback()
        self.codec_state: dict[str, CodecState] = {}
        self.run_id: int | None = None
        self.last_round: int | None = None
        if path is not None and path.exists():
            self._load(path)

    def encode(
        self,
        delta: Mapping[str, Difference | npt.NDArray[np.generic]],
        plan: UploadPlan,
        *,
        run_id: int,
        round_number: int,
        seed: int,
    ) -> tuple[dict[str, Tensorish], int]:
        """The tensors to upload and their payload size in bytes."""
        self._maybe_reset(plan, run_id, round_number)
        rules = plan.rules
        out: dict[str, Tensorish] = {}
        payload_bytes = 0
        for index, (name, item) in enumerate(delta.items()):
            chain = chain_for(name, item.nbytes, rules, dtype=item.dtype.name)
            if not chain:
                out[name] = item
                payload_bytes += item.nbytes
                continue
            values = item.materialize() if isinstance(item, Difference) else item
            state = self.codec_state.setdefault(name, {})
            tensor_seed = (seed * 65_537 + index) % 2**64
            if plan.error_feedback:
                payload = encode_with_feedback(
                    self.feedback, name, values, chain, seed=tensor_seed, state=state
                )
            else:
                payload = encode_tensor(values, chain, seed=tensor_seed, state=state)
            out[name] = EncodedTensor(payload, chain, values.dtype.name, tuple(values.shape))
            payload_bytes += len(payload)
        self.run_id, self.last_round = run_id, round_number
        self.save()
        return out, payload_bytes

    def _maybe_reset(self, plan: UploadPlan, run_id: int, round_number: int) -> None:
        stale = self.last_round is None or round_number - self.last_round > plan.max_staleness
        if self.run_id != run_id or stale or not plan.error_feedback:
            if len(self.feedback):
                log.info(
                    "error-feedback residual reset (run %s, round %d, previous %s)",
                    run_id,
                    round_number,
                    self.last_round,
                )
            self.feedback.reset()
        if self.run_id != run_id:
            self.codec_state.clear()

    # ------------------------------------------------------------ persistence

    def save(self) -> None:
        """Write residuals and codec state atomically (no-op without a path)."""
        if self.path is None:
            return
        tensors = {
            _RESIDUAL + k: np.ascontiguousarray(v) for k, v in self.feedback.state_dict().items()
        }
        for name, state in self.codec_state.items():
            for key, value in state.items():
                tensors[f"{_STATE}{name}\x00{key}"] = np.ascontiguousarray(value)
        meta = {"run_id": json.dumps(self.run_id), "last_round": json.dumps(self.last_round)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        save_file(tensors, str(temporary), metadata=meta)
        os.replace(temporary, self.path)

    def _load(self, path: Path) -> None:
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="np") as handle:
                meta = handle.metadata() or {}
            tensors = load_file(str(path))
            self.run_id = json.loads(meta.get("run_id", "null"))
            self.last_round = json.loads(meta.get("last_round", "null"))
        except Exception as exc:  # safetensors raises its own types; a bad file costs the residual
            log.warning("ignoring unreadable compression state %s: %s", path, exc)
            return
        residuals = {k[len(_RESIDUAL) :]: v for k, v in tensors.items() if k.startswith(_RESIDUAL)}
        self.feedback.load_state_dict(residuals)
        for key, value in tensors.items():
            if key.startswith(_STATE):
                name, _, state_key = key[len(_STATE) :].partition("\x00")
                self.codec_state.setdefault(name, {})[state_key] = value


__all__ = ["UploadCompressor"]
