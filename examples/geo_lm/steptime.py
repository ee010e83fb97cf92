"""Measure one AdamW step of the geo_lm model on one CPU core (what the virtual clock charges).

    python -m examples.geo_lm.steptime            # median of 12 steps after 3 warm-up steps
    python -m examples.geo_lm.steptime --json     # {"step_s": ..., "tokens_per_s": ...}

Set ``simulation.compute.samples_per_s`` to the printed tokens per second: sites report
the tokens they trained as ``samples_trained``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from examples.geo_lm.data import site_bytes
from examples.geo_lm.model import ByteLM, lm_loss
from examples.geo_lm.task import DEFAULT_BATCH, draw_batches

__all__ = ["main", "measure"]


def measure(steps: int = 12, warmup: int = 3, batch: int = DEFAULT_BATCH) -> dict[str, float]:
    """Median seconds of one AdamW step (forward, backward, update) on one thread."""
    torch.set_num_threads(1)
    model = ByteLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    windows = draw_batches(site_bytes(0, 4), 0, 1, 0, steps + warmup, batch)
    times = []
    for index, step_windows in enumerate(windows):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(lm_loss(model, step_windows))
        optimizer.step()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    step_s = statistics.median(times)
    tokens = batch * model.shape.context
    params = sum(p.numel() for p in model.parameters())
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "params": params, "batch": batch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.steps)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['params']:,} parameters: {result['step_s']:.3f} s per AdamW step of "
            f"{result['batch']} x 128 bytes = {result['tokens_per_s']:.0f} tokens/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
