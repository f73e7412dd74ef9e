"""Where ``sat figures`` and ``sat bench`` find the study scripts, and how they load them.

The studies (``experiments/``: one script per figure or table, ``experiments/benchmarks/``:
the benchmark scripts) are not part of the installed packages: they live in the source
checkout. Their folder is, in this order:

1. ``--experiments DIR``, typed on the command line;
2. ``$SAT_EXPERIMENTS``;
3. the ``experiments/`` folder of the checkout that holds the running ``sat_theory`` (a
   source tree or an editable install, ``pip install -e .``).

Nothing else is searched: not the current folder, not ``sys.path`` — loading a study runs its
code, so it runs only from the checkout the package itself came from or from a folder the
user named. A wheel install has no checkout, so there the commands stop with one line
asking for ``--experiments DIR``.

Loading: the folder is imported as the package ``experiments`` from its own
``__init__.py`` (an import spec whose search location is that folder; the studies import
each other as ``experiments.NAME``), the benchmark scripts as their top-level names
(``_common``, ``bench_NAME``: they import ``_common`` so). ``sys.path`` is never edited.
``tests/cli/test_layering.py`` checks that this is the only module of the packages that loads
code from a file path.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from ..errors import InputError

#: the environment variable naming the studies folder (below ``--experiments``)
ENV = "SAT_EXPERIMENTS"
#: the package name the studies import each other by
PACKAGE = "experiments"


def checkout_experiments() -> Path:
    """``experiments/`` next to the running ``sat_theory`` (exists only in a source checkout)."""
    return Path(__file__).resolve().parents[2] / PACKAGE


def experiments_dir(given: str | None = None) -> Path:
    """The studies folder: ``given`` (``--experiments``), else ``$SAT_EXPERIMENTS``, else
    :func:`checkout_experiments`; it must hold ``__init__.py``, else one InputError line
    that says where it looked and what to pass."""
    env = os.environ.get(ENV) or None
    folder, source = ((Path(given), "--experiments") if given else
                      (Path(env), f"${ENV}") if env else (checkout_experiments(), None))
    if (folder / "__init__.py").is_file():
        return folder.resolve()
    if source is not None:
        raise InputError(f"{source} {folder}: not a studies folder (no __init__.py); give the "
                         "experiments/ folder of a sat-teamtr checkout")
    raise InputError(f"the study scripts are not installed with the package (no {folder}); "
                     f"pass --experiments DIR (or set {ENV}=DIR) with DIR the experiments/ "
                     "folder of a sat-teamtr checkout")


def add_experiments_argument(p) -> None:
    """``--experiments DIR`` of ``sat figures`` and ``sat bench``."""
    p.add_argument("--experiments", default=None, metavar="DIR",
                   help="the studies folder (experiments/ of a sat-teamtr checkout; its code "
                        f"runs). Default: ${ENV}, else experiments/ next to the "
                        "installed sat_theory (a source checkout or pip install -e .)")


def _load_file(name: str, path: Path, package_dir: Path | None = None) -> ModuleType:
    """Module ``name`` from the file ``path`` (a package searching ``package_dir`` when
    given), registered in ``sys.modules``; one already loaded from that same file is reused,
    one loaded from another file is an InputError (two checkouts' studies in one process)."""
    old = sys.modules.get(name)
    if old is not None:
        where = getattr(old, "__file__", None)
        if where is not None and Path(where).resolve() == path.resolve():
            return old
        raise InputError(f"a module {name!r} from {where} is already loaded; cannot load "
                         f"{path} in the same process")
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=None if package_dir is None else [str(package_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_study(name: str, given: str | None = None) -> ModuleType:
    """The study module ``experiments.<name>`` of :func:`experiments_dir` (``report`` and
    ``common`` included)."""
    folder = experiments_dir(given)
    _load_file(PACKAGE, folder / "__init__.py", package_dir=folder)
    return importlib.import_module(f"{PACKAGE}.{name}")


def bench_dir(given: str | None = None) -> Path:
    """``benchmarks/`` of :func:`experiments_dir` (the scripts of ``sat bench``)."""
    folder = experiments_dir(given) / "benchmarks"
    if not (folder / "_common.py").is_file():
        raise InputError(f"benchmark scripts not found in {folder} (no _common.py)")
    return folder


def import_bench(name: str, given: str | None = None) -> ModuleType:
    """The benchmark script ``benchmarks/<name>.py`` (``_common`` or ``bench_X``), loaded
    under its own top-level name after ``_common``, which every script imports."""
    folder = bench_dir(given)
    _load_file(PACKAGE, folder.parent / "__init__.py", package_dir=folder.parent)
    common = _load_file("_common", folder / "_common.py")
    if name == "_common":
        return common
    return _load_file(name, folder / f"{name}.py")
