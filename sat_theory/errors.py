"""Errors raised for bad input.

Every problem with user-supplied data (files, shapes, probabilities, CLI arguments) raises
:class:`InputError` with a one-line message naming the problem; the CLI turns it into
``sat: error: <message>`` on stderr and exit status 2, never a traceback.
"""


class InputError(ValueError):
    """Bad user input: malformed MDP/policy file, wrong shape, invalid argument."""


# Absolute tolerance for "sums to 1" and "is a distribution" checks: a row p passes when
# |sum(p) - 1| <= SUM_TOL and min(p) >= -SUM_TOL. Files written in float32 pass (their rows
# sum to 1 within ~1e-7 only after renormalisation), so loaders renormalise rows that pass.
SUM_TOL = 1e-6
