"""A Flower app directory, read the way ``flwr run`` reads it.

From ``DIR/pyproject.toml``: ``[project]`` name and version; ``[tool.flwr.app]``
publisher, ``components.serverapp`` and ``components.clientapp`` (``module:attr``,
importable with ``DIR`` on ``sys.path``) and ``[tool.flwr.app.config]`` (the run
config; nested tables become dotted keys, as in Flower); and, for ``geofl simulate``,
``options.num-supernodes`` of a federation in ``[tool.flwr.federations]`` (the
pyproject form of Flower's local simulation settings).  ``--run-config`` overrides
take Flower's syntax: ``"key=value key2=value2"`` with TOML values (strings quoted), or
one ``.toml`` file.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.serverapp import ServerApp
from flwr.supercore import object_ref

from geofl.server.flower.errors import FlowerAppError

__all__ = [
    "ConfigValue",
    "FlowerApp",
    "check_components",
    "fuse_run_config",
    "load_app_dir",
    "load_server_app",
    "parse_run_config",
]

#: A run-config value (Flower's ``UserConfigValue``).
ConfigValue = bool | int | float | str

#: ``key=value`` where value is quoted (may hold spaces) or runs to the next space.
_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
_COMPONENT = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


@dataclass(frozen=True)
class FlowerApp:
    """What geofl needs of a Flower app directory."""

    root: Path
    name: str
    version: str
    publisher: str
    serverapp: str
    clientapp: str
    #: ``[tool.flwr.app.config]`` flattened to dotted keys.
    config: dict[str, ConfigValue]
    #: ``options.num-supernodes`` of the chosen federation, if the pyproject sets one.
    num_supernodes: int | None

    @property
    def fab_id(self) -> str:
        """``publisher/name``, Flower's identifier of an app."""
        return f"{self.publisher}/{self.name}"

    @property
    def pyproject(self) -> Path:
        """The app's ``pyproject.toml``."""
        return self.root / "pyproject.toml"


def _read_pyproject(root: Path) -> dict[str, Any]:
    path = root / "pyproject.toml"
    if not root.is_dir():
        raise FlowerAppError(f"Flower app directory {root} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlowerAppError(
            f"{path} not found: a Flower app directory holds a pyproject.toml with "
            "[tool.flwr.app] (as `flwr new` creates)"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FlowerAppError(f"{path} is not valid TOML: {exc}") from exc


def _table(data: Mapping[str, Any], dotted: str, path: Path) -> dict[str, Any]:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return {}
    if not isinstance(node, dict):
        raise FlowerAppError(f"{path}: [{dotted}] must be a table")
    return node


def _flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, ConfigValue]:
    flat: dict[str, ConfigValue] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, where, dotted + "."))
        elif isinstance(value, bool | int | float | str):
            flat[dotted] = value
        else:
            raise FlowerAppError(
                f"{where}: {dotted} = {value!r}: run-config values are bool, int, float or "
                "string (or tables of those)"
            )
    return flat


def _required(table: Mapping[str, Any], key: str, where: str, example: str) -> str:
    """A string Flower requires (``flwr run`` refuses an app without it)."""
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise FlowerAppError(f"{where} has no {key} (Flower requires it, e.g. {key} = {example})")
    return value


def _component(components: Mapping[str, Any], name: str, path: Path) -> str:
    value = components.get(name)
    if value is None:
        raise FlowerAppError(
            f"{path}: [tool.flwr.app.components] has no {name}; set it to the "
            f'"module:attr" of the app\'s {name}, e.g. {name} = "mypkg.{name[:-3]}_app:app"'
        )
    if not isinstance(value, str) or not _COMPONENT.fullmatch(value):
        raise FlowerAppError(
            f'{path}: components.{name} = {value!r} is not "module:attr" '
            f'(e.g. "mypkg.{name[:-3]}_app:app")'
        )
    return value


def _num_supernodes(data: Mapping[str, Any], path: Path, federation: str | None) -> int | None:
    federations = _table(data, "tool.flwr.federations", path)
    name = federation or federations.get("default")
    if name is None:
        return None
    chosen = federations.get(name)
    if not isinstance(chosen, Mapping):
        known = sorted(k for k, v in federations.items() if isinstance(v, Mapping))
        raise FlowerAppError(
            f"{path}: federation {name!r} is not in [tool.flwr.federations] (found: {known})"
        )
    options = chosen.get("options", {})
    value = options.get("num-supernodes") if isinstance(options, Mapping) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FlowerAppError(
            f"{path}: federations.{name}.options.num-supernodes = {value!r} is not a count >= 1"
        )
    return value


def load_app_dir(directory: Path, federation: str | None = None) -> FlowerApp:
    """Read ``directory/pyproject.toml`` of a Flower app.

    ``federation`` picks the ``[tool.flwr.federations]`` entry whose
    ``options.num-supernodes`` sizes a simulation (default: the ``default`` entry).

    Raises
    ------
    FlowerAppError
        If the file is missing or invalid, or a required key is missing or malformed.
    """
    root = directory.resolve()
    data = _read_pyproject(root)
    path = root / "pyproject.toml"
    app = _table(data, "tool.flwr.app", path)
    if not app:
        raise FlowerAppError(f"{path} has no [tool.flwr.app] table: is this a Flower app?")
    project = _table(data, "project", path)
    components = _table(data, "tool.flwr.app.components", path)
    return FlowerApp(
        root=root,
        name=_required(project, "name", f"{path}: [project]", '"myapp"'),
        version=_required(project, "version", f"{path}: [project]", '"1.0.0"'),
        publisher=_required(app, "publisher", f"{path}: [tool.flwr.app]", '"myorg"'),
        serverapp=_component(components, "serverapp", path),
        clientapp=_component(components, "clientapp", path),
        config=_flatten(_table(data, "tool.flwr.app.config", path), f"{path}"),
        num_supernodes=_num_supernodes(data, path, federation),
    )


def _parse_pair(key: str, value: str) -> dict[str, ConfigValue]:
    try:
        parsed = tomllib.loads(f"{key} = {value}")
    except tomllib.TOMLDecodeError:
        raise FlowerAppError(
            f"--run-config: {key}={value} does not parse: values are TOML, so strings "
            f'need quotes (e.g. {key}="{value}"), numbers and true/false do not'
        ) from None
    return _flatten(parsed, "--run-config")


def parse_run_config(items: Sequence[str]) -> dict[str, ConfigValue]:
    """Flower's ``--run-config`` syntax: ``"k=v k2=v2"`` (TOML values) or one ``.toml`` file.

    Raises
    ------
    FlowerAppError
        If an item is not ``key=value``, a value is not TOML, or a file does not load.
    """
    if len(items) == 1 and items[0].endswith(".toml"):
        file = Path(items[0]).expanduser()
        try:
            return _flatten(tomllib.loads(file.read_text(encoding="utf-8")), str(file))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise FlowerAppError(f"--run-config {file}: {exc}") from exc
    overrides: dict[str, ConfigValue] = {}
    for item in items:
        if item.endswith(".toml"):
            raise FlowerAppError("--run-config: a .toml file cannot be mixed with key=value pairs")
        pairs = _PAIR.findall(item)
        leftover = _PAIR.sub("", item).strip()
        if leftover or (item.strip() and not pairs):
            raise FlowerAppError(f"--run-config: {leftover or item!r} is not key=value")
        for key, value in pairs:
            overrides.update(_parse_pair(key, value))
    return overrides


def fuse_run_config(app: FlowerApp, overrides: Mapping[str, ConfigValue]) -> dict[str, ConfigValue]:
    """The app's config with ``overrides`` applied; unknown keys are errors (as in Flower).

    Raises
    ------
    FlowerAppError
        If an override names a key that ``[tool.flwr.app.config]`` does not define.
    """
    unknown = sorted(set(overrides) - set(app.config))
    if unknown:
        known = ", ".join(sorted(app.config)) or "none"
        raise FlowerAppError(
            f"--run-config: {', '.join(unknown)} not in [tool.flwr.app.config] of "
            f"{app.pyproject} (known keys: {known})"
        )
    return {**app.config, **overrides}


def _import_component(app: FlowerApp, which: str) -> Any:
    spec = app.serverapp if which == "serverapp" else app.clientapp
    module_name, _, attr = spec.partition(":")
    if str(app.root) not in sys.path:
        sys.path.insert(0, str(app.root))
    try:
        target: Any = importlib.import_module(module_name)
    # The app's own module runs here: any exception it raises is the app's error.
    except Exception as exc:
        raise FlowerAppError(
            f"components.{which} = {spec!r}: importing {module_name!r} from {app.root} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise FlowerAppError(f"components.{which} = {spec!r}: {module_name} has no {attr!r}")
        target = getattr(target, part)
    return target


def check_components(app: FlowerApp) -> None:
    """Check that both components exist before anything starts, as ``flwr run`` does.

    Flower's own check (``object_ref.validate``): the module is found on the app's path
    and defines the attribute, read from its source without running it, so a typo in
    either component is one error at once rather than a failure of every client later.

    Raises
    ------
    FlowerAppError
        Naming the component, its value and what is missing.
    """
    for which, spec in (("serverapp", app.serverapp), ("clientapp", app.clientapp)):
        try:
            valid, reason = object_ref.validate(spec, check_module=True, project_dir=app.root)
        except ImportError as exc:  # a missing parent package of a dotted module
            valid, reason = False, f"Unable to load module {spec.partition(':')[0]} ({exc})"
        if not valid:
            first_line = (reason or "not found").strip().splitlines()[0]
            raise FlowerAppError(
                f"{app.pyproject}: [tool.flwr.app.components] {which} = {spec!r}: "
                f"{first_line} (looked in {app.root})"
            )


def load_server_app(app: FlowerApp) -> ServerApp:
    """Import the app's ``components.serverapp`` with the app directory on ``sys.path``.

    Raises
    ------
    FlowerAppError
        If the module does not import, the attribute is missing, or it is not a
        ``flwr.serverapp.ServerApp``.
    """
    target = _import_component(app, "serverapp")
    if not isinstance(target, ServerApp):
        raise FlowerAppError(
            f"components.serverapp = {app.serverapp!r} is a {type(target).__name__}, not a "
            "flwr.serverapp.ServerApp"
        )
    return target
