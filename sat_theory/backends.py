"""Backends: what builds a team for the runner (:mod:`sat_theory.runner`).

A backend turns settings into a :class:`~sat_theory.algorithm.TrainConfig` plus a
JSON-able ``config`` (saved as ``config.json``), and rebuilds the team from that saved
``config`` (a fresh run and ``--resume`` alike). The registry maps a name to
``"module:attribute"``, imported only when used; the tabular backend is built in, other
packages register theirs (:func:`register`; ``sat train`` registers ``sat_llm``'s), so
``sat_theory`` never imports ``sat_llm``.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from .errors import InputError

__all__ = ["Backend", "BACKENDS", "register", "load_backend"]


@runtime_checkable
class Backend(Protocol):
    """One kind of team (tabular MDP world, LLM team, ...).

    ``settings``: the dataclasses whose fields are the backend's own settings (``sat train``
    makes their flags, :mod:`sat_theory.config_file`); ``algorithm_defaults``: where the
    backend's defaults of :class:`TrainConfig` fields differ from the field defaults."""

    name: str
    settings: tuple
    algorithm_defaults: dict

    def configure(self, args) -> tuple:
        """``(TrainConfig, config)`` from parsed settings ``args`` (anything with the flag
        names as attributes): every setting and cross-setting rule checked before any work;
        ``config`` holds ``{"backend": {"backend": name, ...}, ...}``, everything
        :meth:`make_team` needs."""

    def make_team(self, config: dict, cfg, out):
        """The team of a saved ``config`` (``out``: the run folder)."""

    def flag_values(self, config: dict) -> dict:
        """The backend's flag values (``{dest: value}``) that reproduce a saved ``config``
        (``sat train --config RUN/config.json``)."""

    def unused_algorithm_settings(self, config: dict) -> tuple:
        """TrainConfig fields the saved run did not use (left out of ``--config`` replays)."""

    def report(self, summary: dict, cfg, out) -> int:
        """Print the one-line summary; the exit status."""


#: backend name -> "module:attribute" of its backend class (imported on use)
BACKENDS: dict[str, str] = {"tabular": "sat_theory.tabular_team:TabularBackend"}

#: how to install a registered backend that fails to import
_INSTALL: dict[str, str] = {}


def register(name: str, target: str, install: str = "") -> None:
    """Register backend ``name`` as ``"module:attribute"`` (``install``: the hint shown when
    its module is missing)."""
    BACKENDS[name] = target
    if install:
        _INSTALL[name] = install


def load_backend(name: str):
    """A new backend object registered as ``name`` (one-line error if it is not installed)."""
    if name not in BACKENDS:
        raise InputError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module, attr = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), attr)()
    except ImportError as e:
        raise InputError(f"the {name} backend is not installed ({e.name}): "
                         f"{_INSTALL.get(name, '')}") from None
