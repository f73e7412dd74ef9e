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

**One declaration per setting.** Every setting is one dataclass field built with
:func:`setting` (default, valid range, help, flag name); :func:`add_flags` makes the
argparse flags of a settings class, :func:`from_args` reads them back (a flag not given
leaves the field's default, or a backend's), :func:`to_values` turns a saved configuration
back into flag values (``--config RUN/config.json``) and :func:`resume_dests` lists the flags
``--resume`` accepts. Adding a setting is adding one field.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import Field, field, fields
from pathlib import Path

from .errors import InputError, check_range, range_text

__all__ = ["config_argv", "read_config_file", "values_to_argv", "setting", "add_flags",
           "from_args", "to_values", "resume_dests", "arg_type", "with_range", "flag_of"]


# ------------------------------------------------------------------ one field per setting
def setting(default, help: str, *, range: tuple | None = None, flag: str | None = None,
            cli: bool = True, negate: str | None = None, none_flag: str | None = None,
            choices: tuple | None = None, resume: bool = False, item: type | None = None,
            type=None, metavar: str | None = None, aliases: tuple = (),
            options: bool = False) -> Field:
    """A dataclass field that is one setting: ``default``, ``help``, the valid ``range``
    (:func:`sat_theory.errors.range_text`; checked while parsing and shown in ``--help``)
    and how the command line spells it: ``flag`` (default: the field name with dashes),
    ``cli=False`` (no flag of its own: another section's flag gives it), ``negate`` (a
    switch that sets a true-by-default field false, e.g. ``no-std-norm``), ``none_flag``
    (a switch that sets the field to ``None``), ``choices``, ``item`` (a tuple field given as
    a comma-separated list of this type), ``options`` (a dict given as repeated
    ``KEY=VALUE``), ``resume`` (``--resume`` may change it), ``type``/``metavar``/``aliases``
    (argparse's)."""
    meta = dict(help=help, range=range, flag=flag, cli=cli, negate=negate, none_flag=none_flag,
                choices=choices, resume=resume, item=item, type=type, metavar=metavar,
                aliases=aliases, options=options)
    return field(default=default, metadata=meta)


def flag_of(f: Field) -> str:
    """The flag name (no dashes) of a field."""
    return f.metadata.get("flag") or f.name.replace("_", "-")


def _dest(flag: str) -> str:
    return flag.replace("-", "_")


def arg_type(spec: tuple):
    """An argparse ``type`` for a number in ``spec`` (:func:`sat_theory.errors.range_text`):
    NaN, infinities, non-integers for integer flags and values out of range are refused
    while the arguments are parsed, before any work."""
    def parse(text: str):
        try:
            value = int(text) if spec[0] == "int" else float(text)
            return check_range("value", value, spec)
        except (ValueError, InputError):
            raise argparse.ArgumentTypeError(f"must be {range_text(spec)}, got {text!r}") from None

    parse.__name__ = spec[0]
    return parse


def with_range(help_: str, spec: tuple) -> str:
    """``help_`` with the valid range appended (shown by ``--help``)."""
    return f"{help_} [{range_text(spec)}]"


def _default_text(f: Field, defaults: dict) -> str:
    d = f.default
    text = "none" if d is None else ",".join(map(str, d)) if isinstance(d, tuple) else str(d)
    extra = "".join(f"; {where}: {v[f.name]}" for where, v in defaults.items() if f.name in v)
    return f" (default {text}{extra})"


def add_flags(group, cls, *, skip=(), defaults: dict | None = None) -> None:
    """Add a flag for every :func:`setting` field of ``cls`` (not in ``skip``, not
    ``cli=False``) to the argparse ``group``, its default the field's. ``defaults``:
    ``{where: {field: value}}``, another default of a field somewhere (a backend's): such a
    flag's own default is ``None`` ("not given", :func:`from_args` then takes the backend's)
    and the help names both."""
    defaults = defaults or {}
    overridden = {k for v in defaults.values() for k in v}
    for f in fields(cls):
        if "help" in f.metadata and f.metadata.get("cli", True) and f.name not in skip:
            _add_flag(group, f, _default_text(f, defaults), f.name in overridden)


def _add_flag(group, f: Field, default_text: str, overridden: bool) -> None:
    """The flag(s) of one field: a ``negate`` switch (``--no-x`` sets it false), a switch for
    a bool, a repeated ``KEY=VALUE`` for ``options``, else a value flag typed by its
    ``range`` (:func:`arg_type`, the range appended to the help) or ``type``, plus its
    ``none_flag`` switch. The default is the field's (a tuple as its comma-separated text),
    ``None`` when ``overridden`` (a backend has its own)."""
    m = f.metadata
    help_ = m["help"] + default_text
    names = ["--" + flag_of(f), *("--" + a for a in m.get("aliases", ()))]
    kw: dict = dict(default=None if overridden else f.default, dest=_dest(flag_of(f)))
    if isinstance(kw["default"], tuple):
        kw["default"] = ",".join(map(str, kw["default"]))
    if m.get("metavar"):
        kw["metavar"] = m["metavar"]
    if m.get("negate"):
        group.add_argument("--" + m["negate"], action="store_true",
                           help=f"{m['help']} (this switch turns it off)")
        return
    if f.type in (bool, "bool") or m.get("options"):
        kw["default"] = False if not m.get("options") else []
        action = "append" if m.get("options") else "store_true"
        group.add_argument(*names, action=action, help=help_, **kw)
        return
    if m.get("range") is not None:
        kw["type"], help_ = arg_type(m["range"]), with_range(help_, m["range"])
    elif m.get("type") is not None:
        kw["type"] = m["type"]
    if m.get("choices"):
        kw["choices"] = m["choices"]
    group.add_argument(*names, help=help_.replace("%", "%%"), **kw)
    if m.get("none_flag"):
        group.add_argument("--" + m["none_flag"], action="store_true",
                           help=f"{m['help']}: none (ablation: no --{flag_of(f)})")


def _options(items) -> dict:
    opts = {}
    for it in items or []:
        if "=" not in it:
            raise InputError(f"--task-option must look like KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        try:
            opts[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            opts[k.strip()] = v
    return opts


def from_args(cls, args, *, defaults: dict | None = None) -> dict:
    """``{field: value}`` of ``cls`` from the parsed flags: every field whose flag (its own,
    or with ``cli=False`` a flag of that name from elsewhere) was given, else ``defaults``
    (a backend's), else nothing (the field's default applies)."""
    kw = dict(defaults or {})
    for f in fields(cls):
        m, dest = f.metadata, _dest(flag_of(f))
        if m.get("negate"):
            if getattr(args, _dest(m["negate"]), None):
                kw[f.name] = False
            continue
        if m.get("none_flag") and getattr(args, _dest(m["none_flag"]), None):
            kw[f.name] = None
            continue
        v = getattr(args, dest, None)
        if v is None or (m.get("options") and not v):
            continue
        if m.get("options"):
            v = _options(v)
        elif m.get("item") is not None and isinstance(v, str):
            try:
                v = tuple(m["item"](x.strip()) for x in v.split(","))
            except ValueError:
                raise InputError(f"--{flag_of(f)} must be a comma-separated list of "
                                 f"{m['item'].__name__}s, got {v!r}") from None
        kw[f.name] = v
    return kw


def to_values(cls, saved: dict, *, skip=()) -> dict:
    """The flag values (``{dest: value}``, for :func:`values_to_argv`) that make
    :func:`from_args` give back the saved ``cls`` settings ``saved`` (a config.json
    section); fields without a flag of their own and those in ``skip`` are left out."""
    out = {}
    for f in fields(cls):
        m = f.metadata
        if "help" not in m or not m.get("cli", True) or f.name in skip or f.name not in saved:
            continue
        v = saved[f.name]
        if m.get("negate"):
            out[_dest(m["negate"])] = v is False
        elif m.get("none_flag") and v is None:
            out[_dest(m["none_flag"])] = True
        elif m.get("options"):
            out[_dest(flag_of(f))] = dict(v or {})
        elif v is not None:
            out[_dest(flag_of(f))] = v
    return out


def resume_dests(*classes) -> set[str]:
    """The flag ``dest``s of the fields that ``--resume`` may change (``resume=True``)."""
    return {_dest(flag_of(f)) for cls in classes for f in fields(cls)
            if f.metadata.get("resume")}


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


def read_config_file(path, replay=None) -> dict:
    """``{flag dest: value}`` of a TOML file or a run's ``config.json`` (module docstring);
    ``replay(conf)``: the flag values of a saved run configuration (``sat train``'s
    :func:`sat_theory.commands.train.replay_config`, which knows the backends)."""
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
        if replay is None:
            raise InputError(f"{path}: this command cannot repeat a saved run")
        return replay(conf)
    raise InputError(f"config file {path} must be .toml or a run's config.json")


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
    values = read_config_file(path, getattr(parser, "replay_config", None))
    return argv[:at] + values_to_argv(parser, values) + argv[at:]
