"""Value types both sides agree on: named tensors, configs and metrics."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

#: A model's weights or an update: tensor name -> array, in a fixed order.
Weights = dict[str, npt.NDArray[np.generic]]
#: Read-only view of weights (arguments are never mutated).
WeightsView = Mapping[str, npt.NDArray[np.generic]]
#: A configuration or metric value as it travels on the wire.
Scalar = bool | int | float | str | bytes
#: Per-round configuration sent to clients, and metrics they send back.
Config = dict[str, Scalar]
Metrics = dict[str, Scalar]

__all__ = ["Config", "Metrics", "Scalar", "Weights", "WeightsView"]
