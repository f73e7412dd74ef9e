"""Shared test settings: a hypothesis profile sized for the 2-core CI machine.

``deadline=None`` because the first call of an example may pay for imports/BLAS warm-up;
``max_examples`` is kept modest so that the whole suite stays fast. Override with
``HYPOTHESIS_PROFILE=thorough`` for a longer local run.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
