"""Flower app for the framework-overhead benchmark (no training, framework cost only)."""

__all__: list[str] = []
