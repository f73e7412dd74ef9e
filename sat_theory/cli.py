"""The ``sat`` command line. Each subcommand lives in ``sat_theory/commands/<name>.py`` (or
another module listed in :data:`COMMANDS`) and provides ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so ``sat --help``
stays fast and heavy optional dependencies load only where needed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import InputError

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "eval": ("sat_theory.commands.eval", "exact evaluation (J, V, d) of a team policy"),
    "certify": ("sat_theory.commands.certify", "exact stage certificate for current -> target"),
    "verify": ("sat_theory.commands.verify", "check every theorem of both papers exactly"),
    "train": ("sat_theory.commands.train", "train a team (tabular or LLM backend)"),
    "figures": ("sat_theory.commands.figures", "reproduce the papers' diagnostic figures"),
    "plot": ("sat_theory.commands.plot", "draw the figures of one run directory"),
    "bench": ("sat_theory.commands.bench", "performance benchmarks against peers"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage too; keep it short)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="sat", description="Sequential Agent Tuning (SAT) and TeamTR: exact "
                     "certificates on tabular team MDPs, training, figures.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if only == name:  # `sat --help` lists commands without importing them
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # import only the chosen subcommand's module
    chosen = next((a for a in argv if a in COMMANDS), None)
    parser = build_parser(only=chosen)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (InputError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        if args.debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"sat {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sat {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not bad input: still one line unless --debug
        if args.debug:
            raise
        print(f"sat {args.command}: internal error: {type(e).__name__}: {e} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
