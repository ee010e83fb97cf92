"""Flower app for the secure-aggregation benchmark (no training, protocol cost only)."""

__all__: list[str] = []
