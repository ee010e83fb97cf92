"""A fragment-only update seen as a whole-model one (Streaming DiLoCo).

A streaming round's upload carries one fragment of the model. The round's running mean,
its checks and robust rules work on whole-model updates, so the server reads the other
tensors as zeros (no change): the mean of those tensors stays zero and the strategy's
outer step leaves them alone (:class:`geofl.server.strategies.diloco.DiLoCo`). The zeros
are made when read, one tensor at a time, never stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import numpy.typing as npt

from geofl.protocols.tensors import ModelSpec

__all__ = ["ZeroPadded", "pad_to_model"]


class ZeroPadded(Mapping[str, npt.NDArray[np.generic]]):
    """``update``'s tensors, and zeros of the model's shape and dtype for the rest."""

    def __init__(self, update: Mapping[str, npt.NDArray[np.generic]], spec: ModelSpec) -> None:
        self._update = update
        self._spec = {tensor.name: tensor for tensor in spec}

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        if name in self._update:
            return self._update[name]
        tensor = self._spec[name]
        return np.zeros(tensor.shape, dtype=tensor.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._spec)

    def __len__(self) -> int:
        return len(self._spec)


def pad_to_model(
    update: Mapping[str, npt.NDArray[np.generic]], spec: ModelSpec
) -> Mapping[str, npt.NDArray[np.generic]]:
    """``update`` itself when it has every tensor of ``spec``, else :class:`ZeroPadded`."""
    if len(update) == len(spec):
        return update
    return ZeroPadded(update, spec)
