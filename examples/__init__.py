"""Runnable geofl examples; imported from the repository root as ``examples.<name>``."""
