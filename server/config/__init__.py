"""The run configuration: one YAML file drives ``geofl server`` and ``geofl simulate``.

Load it with :func:`load_config` (``--set KEY.PATH=VALUE`` overrides included); a bad file
raises :class:`ConfigError` listing every problem with its file, line and key path.
``docs/configuration.md`` is generated from these models by
``python -m geofl.server.config.docs``.
"""

from geofl.server.config.compression import CompressionConfig, RegionCompression
from geofl.server.config.errors import ConfigError, ConfigProblem
from geofl.server.config.fields import redact_url, split_address
from geofl.server.config.loader import load_config, parse_config
from geofl.server.config.models import (
    AuthConfig,
    EvaluationConfig,
    RunConfig,
    RunSection,
    ScheduleConfig,
    ServerConfig,
    SimulationConfig,
    StorageConfig,
    TlsConfig,
)
from geofl.server.config.overrides import (
    Override,
    apply_overrides,
    format_override,
    parse_override,
)
from geofl.server.config.secure import SecureAggregationConfig
from geofl.server.config.strategy import (
    STRATEGY_CONFIGS,
    FedAdagradConfig,
    FedAdamConfig,
    FedAvgConfig,
    FedAvgMConfig,
    FedProxConfig,
    FedYogiConfig,
    StrategyBase,
    StrategyConfig,
)

__all__ = [
    "STRATEGY_CONFIGS",
    "AuthConfig",
    "CompressionConfig",
    "ConfigError",
    "ConfigProblem",
    "EvaluationConfig",
    "FedAdagradConfig",
    "FedAdamConfig",
    "FedAvgConfig",
    "FedAvgMConfig",
    "FedProxConfig",
    "FedYogiConfig",
    "Override",
    "RegionCompression",
    "RunConfig",
    "RunSection",
    "ScheduleConfig",
    "SecureAggregationConfig",
    "ServerConfig",
    "SimulationConfig",
    "StorageConfig",
    "StrategyBase",
    "StrategyConfig",
    "TlsConfig",
    "apply_overrides",
    "format_override",
    "load_config",
    "parse_config",
    "parse_override",
    "redact_url",
    "split_address",
]
