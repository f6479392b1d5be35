"""Settings from a YAML params file's `runconfig:` section, the environment and code.

Precedence, highest first: code (`set_policy`, `set_strict`, the `policy()` context manager),
the params file (`load_config`), the environment (`AUTOGEN_POLICY`, `AUTOGEN_CACHE_DIR`,
`AUTOGEN_LOG_LEVEL`, `AUTOGEN_STRICT`), the defaults (medium, ~/.cache/autogen, WARNING, False).
"""
import logging
import os

import yaml

from . import policies
from .policies import LAYERS, from_env, normalize, parse_bool

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
log = logging.getLogger("autogen")


def _parse_level(value):
    name = str(value).strip().upper()
    if name not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return name


def _parse_dir(value):
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a directory path, got {value!r}")
    return os.path.expanduser(value)


from_env("AUTOGEN_CACHE_DIR", _parse_dir)  # checked at import; read at each use (tests and tools set it late)
_cache_layers = {"config": None, "env": None}
_level_layers = {"config": None, "env": from_env("AUTOGEN_LOG_LEVEL", _parse_level)}


def _env_cache_dir():
    raw = os.environ.get("AUTOGEN_CACHE_DIR")
    return os.path.expanduser(raw) if raw else None


def cache_dir():
    chosen = _cache_layers["config"] or _cache_layers["env"] or _env_cache_dir()
    return chosen or os.path.join(os.path.expanduser("~"), ".cache", "autogen")


def log_level():
    return next((_level_layers[k] for k in ("config", "env") if _level_layers[k]), "WARNING")


def _apply_log_level():
    log.setLevel(log_level())
    if not log.handlers and log_level() in ("DEBUG", "INFO"):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        log.addHandler(handler)


# key under runconfig -> (parser, valid choices for the message, where it goes)
KEYS = {
    "autogen_policy": (normalize, "disabled, default, medium, aggressive", policies.policy_layers),
    "autogen_cache_dir": (_parse_dir, "a directory path", _cache_layers),
    "autogen_log_level": (_parse_level, ", ".join(LOG_LEVELS), _level_layers),
    "autogen_strict": (parse_bool, "true, false", policies.strict_layers),
}


def _validate(runconfig):
    values = {}
    for key, value in runconfig.items():
        if not str(key).startswith("autogen_"):
            continue  # the caller's keys (num_steps, ...)
        if key not in KEYS:
            raise ValueError(f"unknown runconfig key {key!r} (value {value!r}); valid autogen keys: "
                             f"{', '.join(KEYS)}")
        parse, choices, _ = KEYS[key]
        try:
            values[key] = parse(value)
        except (ValueError, TypeError):
            raise ValueError(f"runconfig.{key}: invalid value {value!r}; valid: {choices}") from None
    return values


def load_config(path):
    """Read a YAML params file, apply its runconfig autogen_* settings, and return the whole file
    as a dict (the model:, train_input: ... sections are the caller's)."""
    try:
        with open(path) as f:
            params = yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"cannot read params file {path!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"params file {path!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"params file {path!r} must hold a mapping of sections, not {type(params).__name__}")
    runconfig = params.get("runconfig") or {}
    if not isinstance(runconfig, dict):
        raise ValueError(f"params file {path!r}: runconfig must be a mapping")
    values = _validate(runconfig)
    for key, value in values.items():
        KEYS[key][2]["config"] = value
    _apply_log_level()
    return params


def reset_config():
    """Forget what load_config set (the environment and code settings stay)."""
    for _, _, layers in KEYS.values():
        layers["config"] = None
    _apply_log_level()


def settings():
    """Each setting's value and the layer it comes from."""
    def source(layers):
        return next((k for k in LAYERS if layers.get(k) is not None), "default")
    return {"autogen_policy": (policies.get_policy(), source(policies.policy_layers)),
            "autogen_cache_dir": (cache_dir(), source(dict(_cache_layers, env=_cache_layers["env"] or
                                                                _env_cache_dir()))),
            "autogen_log_level": (log_level(), source(_level_layers)),
            "autogen_strict": (policies.get_strict(), source(policies.strict_layers))}


_apply_log_level()
