"""``--allow-task-import`` on ``sat train`` itself (not only ``sat --allow-task-import``),
and Ray agent actors take the driver's permission as an argument, not from the cluster's
environment (issue 26)."""

from __future__ import annotations

import os

import pytest

from sat_theory.cli import build_parser, main
from sat_theory.errors import InputError
from tests.llm.helpers import LOWERCASE_TASK, llm_cfg


def test_sat_train_takes_allow_task_import_with_resume(tmp_path, capsys):
    """The flag is accepted by ``sat train`` and with ``--resume`` (it changes nothing of the
    saved run); the refusal without it names the flag."""
    pytest.importorskip("peft")
    run = tmp_path / "run"
    task = LOWERCASE_TASK  # a task class: typed here, so allowed
    base = ["train", "--backend", "llm", "--device", "cpu", "--model", "tiny-random", "--task",
            task, "--agents", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "2",
            "--n-train", "4", "--n-eval", "2", "--threads", "1", "--quiet"]
    assert main([*base, "--stages", "1", "--out", str(run)]) == 0
    assert main(["train", "--resume", str(run), "--stages", "2", "--quiet"]) == 2
    assert "--allow-task-import" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--stages", "2", "--allow-task-import",
                 "--quiet"]) == 0
    assert "--allow-task-import" in build_parser(only="train").commands["train"].format_help()


@pytest.mark.parametrize("given, refused", [("*", False), ("", True),
                                            (LOWERCASE_TASK, False)])
def test_an_agent_actor_follows_the_permission_it_is_given_not_its_environment(
        monkeypatch, given, refused):
    """A worker whose environment says the opposite (a cluster started by another command)."""
    pytest.importorskip("peft")
    from sat_llm.ray_team import AgentWorker
    from sat_llm.tasks import TASK_IMPORT_ENV

    monkeypatch.setenv(TASK_IMPORT_ENV, "*" if refused else "")
    cfg = llm_cfg(task=LOWERCASE_TASK, agents=1).to_dict()
    if refused:
        with pytest.raises(InputError, match="allow-task-import"):
            AgentWorker(cfg, 0, None, allow_task_import=given)
    else:
        assert AgentWorker(cfg, 0, None, allow_task_import=given).agent == 0
    assert os.environ[TASK_IMPORT_ENV] == given


def test_the_ray_team_passes_the_drivers_permission_to_every_actor(monkeypatch):
    """``RayTeam`` hands ``$SAT_ALLOW_TASK_IMPORT`` of the driver to each actor's constructor
    (a stand-in for ``ray.remote`` records the arguments)."""
    pytest.importorskip("peft")
    import sat_llm.ray_team as rt
    from sat_llm.tasks import TASK_IMPORT_ENV

    seen = []

    class Stop(Exception):
        pass

    class FakeRay:
        def cluster_resources(self):
            return {"CPU": 8}

        def remote(self, cls):
            class Options:
                def options(self, **kw):
                    return self

                def remote(self, *args):
                    seen.append(args)
                    raise Stop

            return Options()

    monkeypatch.setattr("sat_theory.executor._ray", lambda address: FakeRay())
    monkeypatch.setattr(rt.RayTeam, "_check_resources", lambda self, res: None)
    monkeypatch.setenv(TASK_IMPORT_ENV, "pkg:Task")
    with pytest.raises(Stop):
        rt.RayTeam(llm_cfg(task="copy", agents=1), rt.RayOptions(checkpoint_dir="unused"))
    assert seen and seen[0][-1] == "pkg:Task"
