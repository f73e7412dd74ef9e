"""Shared test settings: a hypothesis profile sized for the 2-core CI machine.

``deadline=None`` because the first call of an example may pay for imports/BLAS warm-up;
``max_examples`` is kept modest so that the whole suite stays fast. Override with
``HYPOTHESIS_PROFILE=thorough`` for a longer local run.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

# the shared helper modules assert too: rewrite their asserts as in the test modules
pytest.register_assert_rewrite("tests.bad_files", "tests.faults", "tests.llm.helpers",
                               "tests.llm.trainer_data")

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """Model caches (the tiny-random HF folder, the GGUF conversion) go to a temporary folder
    for the session, not the user's home — unless the user points ``SAT_LLM_CACHE`` elsewhere;
    ``--device auto`` is the CPU unless ``SAT_LLM_DEVICE`` says otherwise."""
    # --device auto means the CPU in the tests (also in the CLI's subprocesses): CPU tests
    # stay CPU tests on a GPU machine; the gpu-marked twins ask for cuda by name
    config._sat_device = "SAT_LLM_DEVICE" not in os.environ
    if config._sat_device:
        os.environ["SAT_LLM_DEVICE"] = "cpu"
    if "SAT_LLM_CACHE" not in os.environ:
        import tempfile

        config._sat_cache = tempfile.TemporaryDirectory(prefix="sat_llm_test_cache_")
        os.environ["SAT_LLM_CACHE"] = config._sat_cache.name


def pytest_unconfigure(config):
    if getattr(config, "_sat_device", False):
        os.environ.pop("SAT_LLM_DEVICE", None)
    cache = getattr(config, "_sat_cache", None)
    if cache is not None:
        os.environ.pop("SAT_LLM_CACHE", None)
        cache.cleanup()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """The device of an LLM test that runs anywhere: every such test runs on the CPU and, as
    its ``gpu``-marked twin, on CUDA (skipped without a GPU; ``pytest -m gpu`` selects)."""
    if request.param == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
    return request.param


@pytest.fixture(autouse=True, scope="session")
def _sigint_raises_keyboardinterrupt():
    """The interrupt tests send SIGINT to this process and expect KeyboardInterrupt. A shell
    that starts pytest in the background (``cmd &``, nohup) hands it SIGINT ignored, and then
    Python installs no handler: restore Python's own for the session."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
