"""``sat train --config FILE``: settings from a file, command-line flags overriding it.

Two kinds of file:

- **TOML** (``.toml``, read with the standard library's ``tomllib``): keys are ``sat train``
  flags without the dashes (``group-size = 4`` or ``group_size = 4``); tables only group
  keys (``[algorithm]``, ``[llm]``: their names are ignored). ``true`` turns a switch such as
  ``save-policies`` on; lists become comma-separated values (``agent-models = ["a", "b"]``);
  ``task-option = {lo = 0, hi = 9}`` gives task options.
- **A run's ``config.json``** (what every ``sat train`` writes): the saved algorithm and
  backend settings are turned back into the flags that produce them, so ``sat train
  --config OLD/config.json --out NEW`` repeats the run (same seed, same records but for wall
  seconds).

Either way the file becomes a list of flags placed *before* the command line's own, so a flag
typed on the command line wins (a switch a file turns on cannot be turned off there), and
every value goes through the same checks as a typed flag. An unknown key is an error, not
ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError

__all__ = ["config_argv", "read_config_file", "values_to_argv"]


def _flatten(d: dict, out: dict) -> dict:
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("task-option", "task_option"):
            _flatten(v, out)
        else:
            key = k.replace("-", "_")
            if key in out:
                raise InputError(f"config file: key {k!r} appears twice")
            out[key] = v
    return out


def read_config_file(path) -> dict:
    """``{flag dest: value}`` of a TOML file or a run's ``config.json`` (module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"config file not found: {path}")
    data = p.read_bytes()
    if p.suffix == ".toml":
        import tomllib

        try:
            doc = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise InputError(f"{path} is not valid TOML ({str(e).splitlines()[0][:120]})") from None
        return _flatten(doc, {})
    if p.suffix == ".json":
        try:
            conf = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{path} is not valid JSON ({type(e).__name__})") from None
        if not isinstance(conf, dict) or "algorithm" not in conf or "backend" not in conf:
            raise InputError(f"{path} is not a run's config.json (needs 'algorithm' and 'backend')")
        return run_config_values(conf)
    raise InputError(f"config file {path} must be .toml or a run's config.json")


def run_config_values(conf: dict) -> dict:
    """The flag values that reproduce a saved run configuration: the algorithm's
    (:func:`sat_theory.commands.train.algorithm_values`) and the backend's
    (``backend.flag_values``)."""
    from .commands.train import algorithm_values
    from .runner import load_backend

    b = conf["backend"]
    name = b.get("backend") if isinstance(b, dict) else None
    if name is None:
        raise InputError("config.json: the backend has no name")
    backend = load_backend(name)
    values = dict(backend=name)
    values.update(backend.flag_values(conf))
    values.update(algorithm_values(conf["algorithm"], sampled=backend.sampled(conf)))
    if (conf.get("run") or {}).get("save_policies"):
        values["save_policies"] = True
    return values


def _text(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return repr(v)
    return str(v)


def values_to_argv(parser, values: dict) -> list[str]:
    """``--flag value`` tokens for ``{dest: value}`` (switches: the flag alone when true)."""
    import argparse

    by_dest = {}
    for a in parser._actions:
        if a.option_strings and a.dest not in by_dest:
            by_dest[a.dest] = a
    argv: list[str] = []
    for dest, v in values.items():
        a = by_dest.get(dest)
        if a is None or dest in ("config", "resume", "out", "help"):
            raise InputError(f"config file: {dest.replace('_', '-')!r} is not a setting of "
                             "sat train" + (" (give it on the command line)"
                                            if dest in ("out", "resume") else ""))
        flag = a.option_strings[-1] if a.option_strings[-1].startswith("--") else a.option_strings[0]
        if v is None:
            continue
        if isinstance(a, argparse._StoreTrueAction):
            if not isinstance(v, bool):
                raise InputError(f"config file: {dest.replace('_', '-')} is a switch (true/false)")
            argv += [flag] if v else []
        elif isinstance(a, argparse._AppendAction):
            items = v.items() if isinstance(v, dict) else None
            if items is None:
                raise InputError(f"config file: {dest.replace('_', '-')} needs a table "
                                 "like {key = value}")
            for k, x in items:
                argv += [flag, f"{k}={json.dumps(x)}"]
        elif isinstance(v, (list, tuple)):
            argv += [flag, ",".join(_text(x) for x in v)]
        elif isinstance(v, dict):
            raise InputError(f"config file: {dest.replace('_', '-')} takes a value, not a table")
        else:
            argv += [flag, _text(v)]
    return argv


def config_argv(parser, argv: list[str]) -> list[str]:
    """``argv`` of a ``sat train`` command with the ``--config FILE`` settings inserted
    before the command line's own flags (so those override the file)."""
    for i, a in enumerate(argv):
        if a == "--config" or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else None)
            if not path:
                raise InputError("--config needs a FILE")
            break
    else:
        return argv
    if "--resume" in argv or any(x.startswith("--resume=") for x in argv):
        raise InputError("--config starts a run; --resume continues a saved one (use one)")
    at = argv.index("train") + 1
    return argv[:at] + values_to_argv(parser, read_config_file(path)) + argv[at:]
