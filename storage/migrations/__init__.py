"""Alembic environment and revisions for geofl's schema (run via geofl.storage.database)."""

__all__: list[str] = []
