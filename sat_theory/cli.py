"""The ``sat`` command line. Each subcommand lives in ``sat_theory/commands/<name>.py`` (or
another module listed in :data:`COMMANDS`) and provides ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so ``sat --help``
stays fast and heavy optional dependencies load only where needed.
"""

from __future__ import annotations

import argparse
import contextlib
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
    "export": ("sat_llm.export", "write a trained LLM team as peft adapters + protocol + model card"),
    "team": ("sat_llm.play", "play a trained LLM team (run or export folder) on your prompts"),
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)  # a flag is exactly what the user typed
        super().__init__(*a, **kw)

    def error(self, message):  # one line, exit 2 (argparse prints usage too; keep it short)
        self.exit(2, f"{self.prog}: error: {_suggest(self, message)[:300]}\n")


def _suggest(parser: argparse.ArgumentParser, message: str) -> str:
    """``message`` with "did you mean --x?" for each unknown flag close to a known one (the
    chosen subcommand's flags included: argparse reports unknown ones from the top parser)."""
    import difflib

    if not message.startswith("unrecognized arguments:"):
        return message
    known = set(parser._option_string_actions)
    for sub in getattr(parser, "commands", {}).values():
        known |= set(sub._option_string_actions)
    hints = []
    for word in message.split(":", 1)[1].split():
        flag = word.split("=", 1)[0]
        if flag.startswith("-"):
            close = difflib.get_close_matches(flag, sorted(known), n=2, cutoff=0.7)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
    return message + (f" ({'; '.join(hints)})" if hints else "")


def repeated_flags(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first option that takes one value and appears twice in ``argv`` (``--stages 12
    ... --stages 1``: argparse would keep the last silently), or ``None``. Repeatable
    options (``append``) and switches may repeat. Checked for the ``sat`` command line
    (``main()`` reading ``sys.argv``); ``main(argv)`` from Python keeps argparse's "the last
    wins", for callers that build a base list plus overrides."""
    seen: dict[str, str] = {}
    for i, a in enumerate(argv):
        if a == "--":
            break
        flag, eq, value = a.partition("=")
        action = parser._option_string_actions.get(flag)
        if action is None or action.nargs == 0 or isinstance(action, argparse._AppendAction):
            continue
        value = value if eq else argv[i + 1] if i + 1 < len(argv) else ""
        if action.dest in seen:
            return f"{flag} is given twice ({seen[action.dest]} and {value}); give it once"
        seen[action.dest] = value
    return None


def _size(text: str) -> int:
    """``512M``, ``8G``, ``1.5G``, ``100000`` (bytes) → bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a size like 512M or 8G, got {text!r}")
    return int(value)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The ``dest`` of every option that appears in ``argv`` (typed by the user)."""
    out = set()
    for a in argv:
        flag = a.split("=", 1)[0]
        action = parser._option_string_actions.get(flag)
        if action is not None:
            out.add(action.dest)
    return out


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="sat", description="Sequential Agent Tuning (SAT) and TeamTR: exact "
                     "certificates on tabular team MDPs, training, figures.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    parser.add_argument("--allow-task-import", action="store_true",
                        help="let a run's config.json or an export's team.json name a task "
                             "class (module:Class) to import; its module's code runs, so only "
                             "for files you trust (a --task typed on the command line is "
                             "always allowed)")
    parser.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                        help="memory budget for what an input file may make sat allocate, "
                             "checked from the file's headers before reading (e.g. 512M, 8G; "
                             "default 4G)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.commands = {}
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        parser.commands[name] = p
        if only == name:  # `sat --help` lists commands without importing them
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``sat`` command. The process contract (README, "Files, code and signals"):
    bad input is one ``sat CMD: error:`` line and exit 2; SIGINT and SIGTERM end every
    command with exit 130 after its temporary files are removed (both arrive as
    ``KeyboardInterrupt``, so ``finally`` blocks run); a task class is imported only when
    typed as ``--task`` or with ``--allow-task-import`` (:func:`sat_llm.tasks.make_task`)."""
    from_shell = argv is None  # typed by a person (a Python caller may compose base + overrides)
    argv = sys.argv[1:] if argv is None else list(argv)
    # import only the chosen subcommand's module
    chosen = next((a for a in argv if a in COMMANDS), None)
    parser = build_parser(only=chosen)
    typed = list(argv)  # before a --config file adds its settings
    try:
        if chosen is not None and from_shell:
            twice = repeated_flags(parser.commands[chosen], typed[typed.index(chosen) + 1:])
            if twice:
                print(f"sat {chosen}: error: {twice}", file=sys.stderr)
                return 2
        if chosen == "train":  # --config FILE: its settings first, the typed flags override
            from .config_file import config_argv

            argv = config_argv(parser.commands["train"], argv)
        args = parser.parse_args(argv)
    except InputError as e:  # a bad --config file
        print(f"sat {chosen}: error: {_cap(str(e).splitlines()[0])}", file=sys.stderr)
        return 2
    except SystemExit as e:  # a refused flag (2, one line already printed) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    args.given = given_flags(parser.commands[args.command], argv)
    if args.max_memory is not None:
        from . import mdp

        mdp.MAX_MEMORY = args.max_memory
    with _process_contract(args, typed):
        return _run(args)


def _run(args) -> int:
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (InputError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        if args.debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"sat {args.command}: error: {_cap(msg)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sat {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, not bad input: still one line unless --debug
        if args.debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"sat {args.command}: internal error: {type(e).__name__}: {_cap(msg)} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _process_contract(args, typed: list[str]):
    """For the command's lifetime: SIGTERM raises ``KeyboardInterrupt`` like SIGINT (exit
    130, temp files removed on the way out), and ``$SAT_ALLOW_TASK_IMPORT`` says which task
    classes may be imported (the typed ``--task``; all with ``--allow-task-import``; none
    otherwise). Both are restored afterwards (``main`` may run in-process, e.g. in tests)."""
    import os
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old_handler = None
    try:
        old_handler = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        pass
    allow = getattr(args, "allow_task_import", False) or getattr(args, "allow_task_import_cmd", False)
    task = next((a.split("=", 1)[1] if "=" in a else typed[i + 1]
                 for i, a in enumerate(typed) if a.split("=", 1)[0] == "--task"
                 and ("=" in a or i + 1 < len(typed))), "")
    old_env = os.environ.get("SAT_ALLOW_TASK_IMPORT")
    os.environ["SAT_ALLOW_TASK_IMPORT"] = "*" if allow else task if ":" in task else ""
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop("SAT_ALLOW_TASK_IMPORT", None)
        else:
            os.environ["SAT_ALLOW_TASK_IMPORT"] = old_env
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)


def _cap(msg: str, limit: int = 300) -> str:
    """Error lines stay readable: at most ``limit`` characters."""
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
