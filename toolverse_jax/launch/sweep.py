"""Sweeps: a list of config-override dicts, loaded from a `sweeps/*.py` file's `get_sweep()`.

An override dict maps a dotted config path to a value, `{"rl.advantage": "grpo", "seed": 1}`;
each dict is one work unit. `product` and `chain` build grids without hand-written loops.
"""

from __future__ import annotations

import difflib
import importlib.util
import itertools
import os
from typing import Any, Iterable, Sequence

from ml_collections import ConfigDict


def product(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Returns the Cartesian grid of `axes` (dotted key -> values), first key varying slowest."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def chain(*sweeps: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns the concatenation of several sweeps (e.g. two grids with different fixed keys)."""
    return [dict(o) for s in sweeps for o in s]


def _load_module(path: str, what: str):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file {path!r} does not exist; pass a path such as "
                                f"{'sweeps/quickstart_smoke.py' if what == 'sweep' else 'configs/quickstart.py'}")
    name = "_toolverse_" + what + "_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_config(path: str) -> ConfigDict:
    """Returns `get_config()` of the config file at `path`."""
    module = _load_module(path, "config")
    if not hasattr(module, "get_config"):
        raise AttributeError(f"config file {path!r} has no get_config(); define one returning a "
                             "ConfigDict")
    return module.get_config()


def load_sweep(path: str) -> list[dict[str, Any]]:
    """Returns the override dicts of the sweep file at `path` (its `get_sweep()`)."""
    module = _load_module(path, "sweep")
    if not hasattr(module, "get_sweep"):
        raise AttributeError(f"sweep file {path!r} has no get_sweep(); define one returning a "
                             "list of override dicts, e.g. [{'rl.advantage': 'grpo'}]")
    sweep = list(module.get_sweep())
    if not sweep:
        raise ValueError(f"sweep file {path!r}: get_sweep() returned no work units")
    for i, o in enumerate(sweep):
        if not isinstance(o, dict):
            raise TypeError(f"sweep file {path!r}: entry {i} is {type(o).__name__}, not a dict "
                            "of dotted config keys to values")
    return sweep


def _leaf_paths(config: ConfigDict, prefix: str = "") -> list[str]:
    out = []
    for k, v in config.items():
        p = f"{prefix}{k}"
        out.append(p)
        if isinstance(v, ConfigDict):
            out += _leaf_paths(v, p + ".")
    return out


def check_overrides(config: ConfigDict, overrides: dict[str, Any]) -> None:
    """Raises KeyError naming the first dotted key that `config` does not have (with the
    closest existing keys), so a typo fails before any process starts."""
    for key in overrides:
        node = config
        for part in key.split("."):
            if not isinstance(node, ConfigDict) or part not in node:
                close = difflib.get_close_matches(key, _leaf_paths(config), n=3)
                raise KeyError(f"override {key!r} is not a config key"
                               + (f"; did you mean {close}?" if close else ""))
            node = node[part]
        if isinstance(node, ConfigDict):
            raise KeyError(f"override {key!r} names a config section, not a value; set one of "
                           f"its keys ({', '.join(sorted(node.keys())[:5])}...)")


def format_value(value: Any) -> str:
    """Returns `value` as ml_collections' config_flags parses it on the command line."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(format_value(v) if not isinstance(v, str) else repr(v)
                               for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def to_flags(overrides: dict[str, Any]) -> list[str]:
    """Returns the `--config.KEY=VALUE` flags for an override dict."""
    return [f"--config.{k}={format_value(v)}" for k, v in overrides.items()]


def short_name(overrides: dict[str, Any], width: int = 48) -> str:
    """Returns a compact `key=value,...` label (last key component only) for tables."""
    text = ",".join(f"{k.split('.')[-1]}={format_value(v)}" for k, v in overrides.items())
    return text if len(text) <= width else text[:width - 1] + "…"
