"""A small decoder-only transformer over bytes (vocabulary 256), in plain torch.

Pre-norm blocks (LayerNorm, causal multi-head attention through
``scaled_dot_product_attention``, a 4x GELU MLP), learned position
embeddings, and an output layer tied to the byte embedding. The default size (4 layers,
width 192, context 128) has 1,853,568 parameters (7.4 MB in float32) and took 0.10-0.14 s
per AdamW step of 8 x 128 bytes on one CPU core of this project's 2-core machines
(``python -m examples.geo_lm.steptime`` measures it on yours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional

__all__ = ["ByteLM", "ModelShape", "bits_per_byte", "lm_loss"]

VOCAB = 256


@dataclass(frozen=True)
class ModelShape:
    """Size of the transformer."""

    layers: int = 4
    width: int = 192
    heads: int = 4
    context: int = 128

    def __post_init__(self) -> None:
        if min(self.layers, self.width, self.heads, self.context) < 1:
            raise ValueError(f"every model dimension must be >= 1, got {self}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")


class _Block(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.ln1 = nn.LayerNorm(shape.width)
        self.qkv = nn.Linear(shape.width, 3 * shape.width)
        self.proj = nn.Linear(shape.width, shape.width)
        self.ln2 = nn.LayerNorm(shape.width)
        self.up = nn.Linear(shape.width, 4 * shape.width)
        self.down = nn.Linear(4 * shape.width, shape.width)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        out: Tensor = x + self.down(functional.gelu(self.up(self.ln2(x))))
        return out


class ByteLM(nn.Module):
    """Next-byte prediction: ``(batch, length)`` int64 bytes to ``(batch, length, 256)`` logits."""

    def __init__(self, shape: ModelShape | None = None) -> None:
        super().__init__()
        self.shape = shape or ModelShape()
        self.embed = nn.Embedding(VOCAB, self.shape.width)
        self.position = nn.Embedding(self.shape.context, self.shape.width)
        self.blocks = nn.ModuleList(_Block(self.shape) for _ in range(self.shape.layers))
        self.ln_out = nn.LayerNorm(self.shape.width)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's: normal(0, 0.02), residual projections scaled by 1/sqrt(2 x layers)."""
        for name, param in self.named_parameters():
            if param.dim() < 2:
                continue
            std = 0.02
            if name.endswith(("proj.weight", "down.weight")):
                std /= math.sqrt(2 * self.shape.layers)
            nn.init.normal_(param, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        if length > self.shape.context:
            raise ValueError(f"input of {length} bytes exceeds the context of {self.shape.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.ln_out(x) @ self.embed.weight.T
        return logits


def lm_loss(model: ByteLM, windows: Tensor) -> Tensor:
    """Mean next-byte cross-entropy (nats) of ``(batch, length + 1)`` byte windows."""
    logits = model(windows[:, :-1])
    return functional.cross_entropy(logits.reshape(-1, VOCAB), windows[:, 1:].reshape(-1))


def bits_per_byte(nats: float) -> float:
    """Cross-entropy in nats per byte as bits per byte."""
    return nats / math.log(2)
