"""Loading a run file: read, parse, apply ``--set`` overrides, validate, report.

Every failure is a :class:`ConfigError` that lists all problems found, with file and line,
so a user fixes a file in one pass instead of one error per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError

from geofl.server.config.errors import ConfigError, ConfigProblem
from geofl.server.config.fields import BASE_DIR_KEY
from geofl.server.config.messages import validation_problems
from geofl.server.config.models import RunConfig
from geofl.server.config.overrides import Override, apply_overrides, parse_override
from geofl.server.config.yamlsource import duplicate_keys, line_of, parse_yaml

__all__ = ["load_config", "parse_config"]


def _read_text(path: Path, source: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError.single(source, "file not found") from None
    except IsADirectoryError:
        raise ConfigError.single(source, "is a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError.single(source, f"not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError.single(source, f"cannot read: {exc.strerror or exc}") from None


def _require_mapping(data: object, source: str) -> Mapping[str, object]:
    if isinstance(data, Mapping):
        return data
    got = "an empty document" if data is None else f"a {type(data).__name__}"
    raise ConfigError.single(
        source,
        f"the top level must be a mapping of sections (run, model, strategy, ...), got {got}",
    )


def _parse_overrides(overrides: Sequence[str]) -> list[Override]:
    parsed: list[Override] = []
    problems: list[ConfigProblem] = []
    for text in overrides:
        try:
            parsed.append(parse_override(text))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return parsed


def _validate(
    data: Mapping[str, object],
    source: str,
    base_dir: Path,
    node: yaml.Node | None = None,
    overrides: Sequence[Override] = (),
) -> RunConfig:
    try:
        return RunConfig.model_validate(data, context={BASE_DIR_KEY: base_dir})
    except ValidationError as exc:
        problems = validation_problems(exc, source, lambda path: line_of(node, path), overrides)
        raise ConfigError(problems) from exc


def load_config(path: Path | str, overrides: Sequence[str] = ()) -> RunConfig:
    """Load and validate a run file, with ``KEY.PATH=VALUE`` overrides applied first.

    Relative paths in the file and in the overrides (``storage.checkpoints``, the SQLite
    file in ``storage.url``, ``server.tls`` files) resolve against the file's directory,
    so every path in the result is absolute.

    Raises
    ------
    ConfigError
        If the file cannot be read or parsed, an override is malformed, or any value is
        invalid; every problem is listed with file, line and key path.
    """
    path = Path(path)
    source = str(path)
    node, data = parse_yaml(_read_text(path, source), source)
    duplicates = duplicate_keys(node, source)
    if duplicates:
        raise ConfigError(duplicates)
    mapping = _require_mapping(data, source)
    parsed = _parse_overrides(overrides)
    merged = apply_overrides(mapping, parsed)
    return _validate(merged, source, path.absolute().parent, node, parsed)


def parse_config(
    data: Mapping[str, object], source: str = "<config>", *, base_dir: Path | None = None
) -> RunConfig:
    """Validate an in-memory configuration mapping (as ``yaml.safe_load`` returns it).

    Relative paths resolve against ``base_dir``, by default the current directory.

    Raises
    ------
    ConfigError
        If the top level is not a mapping or any value is invalid, naming ``source``.
    """
    mapping = _require_mapping(data, source)
    return _validate(mapping, source, (base_dir or Path.cwd()).absolute())
