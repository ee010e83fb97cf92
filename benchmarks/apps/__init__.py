"""Client and model code that the benchmarked systems load by ``module:attr``."""

__all__: list[str] = []
