"""Subcommands of the ``sat`` CLI (see :mod:`sat_theory.cli`)."""
