"""Configuration errors: every problem in a run file, reported together.

A user who mistypes three keys should learn about all three at once, each with the file,
line and dotted key path, so :class:`ConfigError` carries a list of :class:`ConfigProblem`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from geofl.protocols.errors import GeoflError

__all__ = ["ConfigError", "ConfigProblem"]


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    Attributes
    ----------
    source
        Where the value came from: the YAML file's path, ``"<config>"`` for an in-memory
        mapping, or ``"--set KEY=VALUE"`` for a command-line override.
    path
        Dotted key path (``"strategy.min_clients"``); empty for the document as a whole.
    message
        What is wrong, and what would be accepted.
    line
        1-based line in ``source`` when known.
    """

    source: str
    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(GeoflError):
    """A run configuration that cannot be used; ``str()`` lists one problem per line."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))

    @classmethod
    def single(
        cls, source: str, message: str, *, path: str = "", line: int | None = None
    ) -> ConfigError:
        """An error with a single problem (a convenience for early, fatal checks)."""
        return cls([ConfigProblem(source=source, path=path, message=message, line=line)])
