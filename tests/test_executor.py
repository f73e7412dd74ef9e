"""Every executor returns exactly the serial results, in order."""

import numpy as np
import pytest

from sat_theory import TeamPolicy, evaluate, random_mdp
from sat_theory.errors import InputError
from sat_theory.executor import map_tasks


def exact_J(seed: int) -> float:
    """A small independent case: J of a random policy on a random MDP, both from ``seed``."""
    mdp = random_mdp(8, 2, 3, layout="masked", seed=seed)
    return evaluate(mdp, TeamPolicy.random(mdp, seed + 1)).J


def test_process_equals_serial():
    seeds = list(range(6))
    serial = map_tasks(exact_J, seeds)
    assert serial == [exact_J(s) for s in seeds]
    assert map_tasks(exact_J, seeds, executor="process", workers=2) == serial


def test_ray_equals_serial():
    ray = pytest.importorskip("ray")
    import sys

    # the workers cannot import this test module: ship exact_J by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seeds = list(range(6))
    try:
        got = map_tasks(exact_J, seeds, executor="ray")
    finally:
        ray.shutdown()
    np.testing.assert_array_equal(got, map_tasks(exact_J, seeds))


def test_unknown_executor_is_input_error():
    with pytest.raises(InputError, match="unknown executor"):
        map_tasks(exact_J, [0], executor="threads")
