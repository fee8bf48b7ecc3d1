"""Configuration: the YAML file + environment + CLI flags -> frozen dataclasses.

settings.py holds the dataclasses (stdlib only, the bottom of the import graph); env.py is the only
reader of os.environ; checker.py and parse.py turn the YAML into settings; load.py applies the
overrides; sampling.py names the sampling knobs and their ranges for the request parsers and profiles.
Importing this package has no side effects: the entry points prepare the process (gmlx_server/startup.py).
Every name is re-exported here for `from gmlx_server.config import X`.
"""

from gmlx_server.config.env import hf_hub_cache_dir, read_env
from gmlx_server.config.load import (
    default_model_path,
    load_config,
    load_config_from_env,
    merge_overrides,
    reload_config,
)
from gmlx_server.config.parse import discover_models
from gmlx_server.config.sampling import SAMPLING_KNOBS, Knob
from gmlx_server.config.settings import (
    BLAS_OFF,
    BUILTIN_INTENTS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MODEL_FILE,
    DEFAULT_MODEL_ID,
    PRIORITIES,
    PRIORITY_LIMIT,
    SECRET_KEYS,
    ApiKey,
    ConfigError,
    Draft,
    FairShare,
    KeyScope,
    KVQuant,
    ModelEntry,
    Profile,
    RuntimeEnv,
    ServerConfig,
    ServerSettings,
    ServiceEntry,
    WeightsLayout,
)

__all__ = [
    "BLAS_OFF",
    "BUILTIN_INTENTS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_ID",
    "PRIORITIES",
    "PRIORITY_LIMIT",
    "SAMPLING_KNOBS",
    "SECRET_KEYS",
    "ApiKey",
    "ConfigError",
    "Draft",
    "FairShare",
    "KVQuant",
    "KeyScope",
    "Knob",
    "ModelEntry",
    "Profile",
    "RuntimeEnv",
    "ServerConfig",
    "ServerSettings",
    "ServiceEntry",
    "WeightsLayout",
    "default_model_path",
    "discover_models",
    "hf_hub_cache_dir",
    "load_config",
    "load_config_from_env",
    "merge_overrides",
    "read_env",
    "reload_config",
]
