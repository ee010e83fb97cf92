"""Error feedback: remember what compression dropped and send it next time.

The rule (EF-SGD, Karimireddy et al. 2019): with ``e`` the residual of a tensor,
``c = delta + e`` is compressed, ``d = decode(encode(c))`` is what the server
receives, and the new residual is ``e = c - d``.  Over rounds, everything a biased
compressor (top-k, sign) drops is eventually transmitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.api import decode_tensor, encode_tensor
from geofl.protocols.codecs.base import Chain, CodecState
from geofl.protocols.errors import NonFiniteError, TensorError

NDArray = npt.NDArray[Any]


class ErrorFeedback:
    """Per-tensor residuals (float arrays keyed by tensor name).

    The state is arrays only (:meth:`state_dict`), so a client can save it with
    safetensors and reload it after a restart; :meth:`reset` drops it deliberately
    (e.g. when the client missed rounds and its residual is stale).
    Non-float tensors never carry a residual.
    """

    def __init__(self) -> None:
        self._residuals: dict[str, NDArray] = {}

    def __len__(self) -> int:
        return len(self._residuals)

    def __contains__(self, name: object) -> bool:
        return name in self._residuals

    def residual(self, name: str) -> NDArray | None:
        """A copy of the residual of ``name``, or ``None``."""
        residual = self._residuals.get(name)
        return None if residual is None else residual.copy()

    def compensate(self, name: str, delta: npt.ArrayLike) -> NDArray:
        """``delta + residual`` (a new array of ``delta``'s dtype and shape)."""
        values = np.asarray(delta)
        residual = self._residuals.get(name)
        if residual is None or values.dtype.kind != "f":
            return values.copy()
        if residual.shape != values.shape:
            raise TensorError(
                f"error feedback: residual of {name!r} has shape {residual.shape}, "
                f"the update {values.shape}; reset() after a model change"
            )
        corrected: NDArray = (values + residual).astype(values.dtype, copy=False)
        return corrected

    def update(self, name: str, corrected: npt.ArrayLike, decoded: npt.ArrayLike) -> None:
        """Set the residual of ``name`` to ``corrected - decoded``."""
        before, after = np.asarray(corrected), np.asarray(decoded)
        if before.dtype.kind != "f":
            return
        if before.shape != after.shape:
            raise TensorError(
                f"error feedback: {name!r} corrected {before.shape} vs decoded {after.shape}"
            )
        self._residuals[name] = (before - after).astype(before.dtype, copy=False)

    def state_dict(self) -> dict[str, NDArray]:
        """Copies of the residuals, contiguous (safetensors-ready)."""
        return {name: np.array(r, order="C") for name, r in self._residuals.items()}

    def load_state_dict(self, state: Mapping[str, npt.ArrayLike]) -> None:
        """Replace all residuals; they must be finite float arrays."""
        loaded: dict[str, NDArray] = {}
        for name, value in state.items():
            array = np.array(value)
            if array.dtype.kind != "f":
                raise TensorError(f"error feedback: residual {name!r} is {array.dtype}, not float")
            if not np.isfinite(array).all():
                raise NonFiniteError(f"error feedback: residual {name!r} holds NaN or Inf")
            loaded[name] = array
        self._residuals = loaded

    def reset(self, names: Iterable[str] | None = None) -> None:
        """Forget the residuals of ``names`` (all when ``None``)."""
        if names is None:
            self._residuals.clear()
            return
        for name in names:
            self._residuals.pop(name, None)

    def residual_norm(self) -> float:
        """Euclidean norm of all residuals together (a health metric)."""
        total = sum(float(np.square(r, dtype=np.float64).sum()) for r in self._residuals.values())
        return float(np.sqrt(total))


def encode_with_feedback(
    feedback: ErrorFeedback,
    name: str,
    delta: npt.ArrayLike,
    chain: Chain,
    *,
    seed: int,
    state: CodecState | None = None,
) -> bytes:
    """Compress ``delta`` plus its residual and keep what the receiver will miss.

    Decodes its own output to learn exactly what the server will see, so the
    residual is exact (including quantization error), at the cost of one decode.
    """
    values = np.asarray(delta)
    corrected = feedback.compensate(name, values)
    payload = encode_tensor(corrected, chain, seed=seed, state=state)
    decoded = decode_tensor(payload, chain, values.dtype.name, values.shape)
    feedback.update(name, corrected, decoded)
    return payload
