"""Alembic revisions, one file per schema change, named ``NNNN_<slug>.py``."""

__all__: list[str] = []
