"""``sat verify [--quick] [--seed S] [--only NAME[,NAME]] [--json] [--executor serial|process|ray
[--workers N] [--ray-address ADDR]]``.

Runs every registered check of :mod:`sat_theory.verify` (the results stated in
``docs/theory.md``, each checked exactly on many toy MDPs), shows a progress bar on stderr and
prints a table grouped by section of ``docs/theory.md``: cases, violations, min slack
(true − bound; negative = violated) and tightness (median bound/true; 1 = tight), then each
check's findings. ``--json`` prints
``{"checks": [...], "passed": bool}`` instead. Exit status 0 iff every check passed, 1 if
one failed, 2 on bad input (e.g. an unknown ``--only`` name). ``--executor`` runs the
independent checks in a process pool or as Ray tasks (:mod:`sat_theory.executor`); the
results are those of the serial run but for the timings.
"""

from __future__ import annotations

import re
import sys
import time

from ..config_file import arg_type, with_range
from ..executor import add_executor_arguments
from ..fileio import dumps
from ._io import pick_names, table

#: the project's theory document: every check's statement, under the section its table shows
THEORY_DOC = "docs/theory.md"


def add_arguments(p):
    p.epilog = (f"Each check evaluates a result stated in {THEORY_DOC} (with its paper "
                "reference), under the section its table shows. Exit status 0 iff every check "
                "passed, 1 if one failed, 2 on bad input.")
    p.add_argument("--quick", action="store_true",
                   help="fewer cases per check (CI mode; all checks in well under a minute)")
    seed = ("int", 0, None, True, False)
    p.add_argument("--seed", type=arg_type(seed), default=0,
                   help=with_range("seed of every check's case generator", seed))
    p.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help="run only these checks (comma-separated names)")
    p.add_argument("--json", action="store_true",
                   help='print {"checks": [...], "passed": bool} on stdout')
    add_executor_arguments(p)


def _section_key(section: str):
    m = re.search(r"§\s*(\d+)", section)
    return (int(m.group(1)) if m else 99, section)


def _fmt(x, spec="{:.3g}"):
    return "-" if x is None else spec.format(x)


def render(results) -> str:
    """The readable report: one table per section, then findings."""
    lines = []
    by_section: dict[str, list] = {}
    for r in results:
        by_section.setdefault(r.section, []).append(r)
    for section in sorted(by_section, key=_section_key):
        rows = by_section[section]
        lines.append(f"== {section} ==")
        lines.append(table([dict(check=r.name, ok="PASS" if r.passed else "FAIL", cases=r.cases,
                                 violations=r.violations, min_slack=_fmt(r.min_slack),
                                 tightness=_fmt(r.tightness), seconds=_fmt(r.seconds, "{:.2f}"))
                            for r in rows],
                           ["check", "ok", "cases", "violations", "min_slack", "tightness",
                            "seconds"]))
        for r in rows:
            lines.append(f"  {r.name} [{r.reference}]")
            for f in r.findings:
                lines.append(f"    - {f}")
        lines.append("")
    n_ok = sum(r.passed for r in results)
    lines.append(f"{n_ok}/{len(results)} checks passed; "
                 f"{sum(r.seconds for r in results):.1f} s in checks")
    return "\n".join(lines)


def run(args) -> int:
    from ..verify import load_checks, run_checks

    checks = load_checks()
    names = pick_names(args.only, checks, "check")
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(names), file=sys.stderr, unit="check", leave=False,
                   disable=None)  # None: no bar when stderr is not a terminal
    except ImportError:  # tqdm is a dependency; degrade to no bar rather than fail
        bar = None

    def progress(res):
        if bar is not None:
            bar.set_postfix_str(f"{res.name} {'ok' if res.passed else 'FAIL'}")
            bar.update(1)

    t0 = time.perf_counter()
    results = run_checks(names, quick=args.quick, seed=args.seed, progress=progress,
                         executor=args.executor, workers=args.workers,
                         ray_address=args.ray_address)
    if bar is not None:
        bar.close()
    passed = all(r.passed for r in results)
    if args.json:
        print(dumps({"checks": [r.to_dict() for r in results], "passed": passed}))
    else:
        print(render(results))
        print(f"total wall time {time.perf_counter() - t0:.1f} s; "
              f"{'ALL PASSED' if passed else 'SOME CHECKS FAILED'}")
    return 0 if passed else 1
