"""``sat export RUN_DIR --out DIR``: a trained LLM team as files other tools open.

Layout of an export folder::

    DIR/team.json          format tag, base model reference, agents, the team protocol
                           (turn order, system/review prompts, chat template, stop tokens,
                           generation settings), the task, the run's LLM config and where
                           the weights came from
    DIR/README.md          model card: base, method, settings, measured held-out accuracy
    DIR/agent{j}/          agent j's LoRA adapter as a peft folder (adapter_config.json +
                           adapter_model.safetensors): ``PeftModel.from_pretrained(base,
                           DIR/agent{j})`` loads it, vLLM serves it with
                           ``LoRARequest("agent{j}", j + 1, DIR/agent{j})``
    DIR/agent{j}/merged/   (``--merged``) the base with the adapter merged in, a full
                           Hugging Face model folder with its tokenizer
    DIR/base/              the base model as a Hugging Face folder, when it has no other
                           home (``tiny-random``) or with ``--include-base``
    DIR/.sat-export        the marker that makes DIR an export (:mod:`sat_theory.ownership`):
                           ``--overwrite`` replaces only a marked export holding nothing but
                           the entries it lists, atomically (the old export stays whole
                           until the new one is renamed in)

The weights come from the run's checkpoint (its latest state; a finished run's checkpoint is
its final team) or, when the run kept no checkpoint, from its last saved policy
(``policies/stage{K}.safetensors``); ``--stage K`` picks ``policies/stage{K}`` explicitly.
Nothing is unpickled: checkpoints and team files are safetensors + JSON. Every adapter
tensor read is checked against the team's layout (name, shape) and for finite values
(:func:`checked_weights`); a ``team.json`` or run ``config.json`` naming a task class to
import is refused unless ``--allow-task-import`` (:func:`check_task_import`).

:func:`load_team` rebuilds a team from a run folder or an export folder (``sat team``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sat_theory.errors import InputError
from sat_theory.ownership import EXPORT_MARKER, check_out, read_marker, replace_folder, write_marker

__all__ = ["export_team", "load_team", "add_arguments", "run", "FORMAT", "HUB_IDS"]

FORMAT = "sat-team-export/1"

#: Hugging Face hub ids of the named base models (a reference only; nothing is downloaded)
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


# ------------------------------------------------------------------ reading a run
def _run_config(run_dir: Path, verb: str = "exported") -> dict:
    """The run's ``config.json`` (an LLM run's); ``verb``: what the command does with it, for
    the error line (``sat team`` plays, ``sat export`` exports)."""
    from sat_theory.runner import RunFolder

    conf = RunFolder(run_dir).config()
    backend = conf["backend"]
    if not isinstance(backend, dict) or backend.get("backend") != "llm":
        raise InputError(f"{run_dir} is not an LLM run (backend "
                         f"{backend.get('backend') if isinstance(backend, dict) else '?'!r}); "
                         f"only LLM teams can be {verb}")
    if not isinstance(backend.get("llm"), dict):
        raise InputError(f"{run_dir}/config.json has no LLM settings")
    return conf


def _policy_files(run_dir: Path) -> dict[int, Path]:
    out = {}
    for p in (run_dir / "policies").glob("stage*.safetensors"):
        if p.stem[5:].isdigit():
            out[int(p.stem[5:])] = p
    return out


def run_weights(run_dir: Path, stage: int | None = None) -> tuple[dict[int, dict], str]:
    """``({agent: adapter weights}, description of the source)`` of a run folder: ``stage``
    → ``policies/stage{stage}.safetensors``; else the checkpoint's team; else the last
    saved policy."""
    from sat_theory.runner import CHECKPOINT, RunFolder

    from .team import load_team_file

    policies = _policy_files(run_dir)
    if stage is not None:
        if stage not in policies:
            raise InputError(f"{run_dir} has no policies/stage{stage}.safetensors (saved: "
                             f"{sorted(policies) or 'none; run with --save-policies'})")
        return load_team_file(str(policies[stage])), f"policies/stage{stage}.safetensors"
    if (run_dir / CHECKPOINT).is_file():
        ck = RunFolder(run_dir).checkpoint()
        try:  # the tensors themselves are checked against the team (checked_weights)
            st, position = ck["run_state"], ck.get("position")
            weights = dict(enumerate(ck["team"]["weights"]))
            stage_done = int(st["stage"]) if isinstance(st, dict) and "stage" in st else None
            step = position["step"] if position else None
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InputError(f"{run_dir}/{CHECKPOINT} is not an LLM team checkpoint") from None
        where = (f"{CHECKPOINT} (after {_plural(stage_done, 'stage')})" if stage_done is not None
                 else CHECKPOINT)
        if step is not None:
            where += f", mid-stage (step {step})"
        return weights, where
    if policies:
        k = max(policies)
        return load_team_file(str(policies[k])), f"policies/stage{k}.safetensors"
    raise InputError(f"{run_dir} holds no trained weights (no {CHECKPOINT}, no "
                     "policies/stage*.safetensors)")


def _final_metrics(run_dir: Path) -> dict:
    """Held-out accuracy before the first and after the last stage, from metrics.jsonl."""
    from sat_theory.metrics import read_metrics

    if not (run_dir / "metrics.jsonl").is_file():
        return {}
    stages = [r for r in read_metrics(str(run_dir)) if r["kind"] == "stage"]
    if not stages:
        return {}
    return dict(stages=len(stages), eval_accuracy_start=stages[0].get("J_before"),
                eval_accuracy_end=stages[-1].get("J_after"))


# ------------------------------------------------------------------ writing an export
def _protocol_record(team) -> dict:
    from dataclasses import asdict

    from .team import stop_ids

    tok = team.tokenizer(0)
    stops = stop_ids(tok)
    return dict(**asdict(team.protocol), n_turns=team.protocol.n_turns,
                order=("agent t mod n speaks at turn t" if team.protocol.router == "round-robin"
                       else "a seeded uniform random agent speaks at each turn"),
                chat_template=tok.chat_template,
                stop_tokens=[dict(id=int(i), text=tok.convert_ids_to_tokens(int(i))) for i in stops],
                generation=dict(max_new_tokens=team.cfg.max_new_tokens,
                                temperature=team.cfg.temperature, evaluation="greedy"))


def _plural(n, word: str) -> str:
    """``1 stage``, ``2 stages``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _model_card(info: dict, conf: dict) -> str:
    alg, llm, m = conf["algorithm"], info["llm_config"], info["metrics"]
    acc = ""
    if m.get("eval_accuracy_start") is not None and m.get("eval_accuracy_end") is not None:
        acc = (f"Held-out accuracy (greedy, {llm['n_eval']} problems): "
               f"{m['eval_accuracy_start']:.3f} before training → {m['eval_accuracy_end']:.3f} "
               f"after {_plural(m['stages'], 'stage')}.\n\n")
    base = info["base_model"]
    ref = base.get("hub_id") or base["name"]
    rows = "\n".join(f"| {k} | {v} |" for k, v in (
        ("method", alg["method"]), ("stages", alg["stages"]), ("δ (KL radius)", alg["delta"]),
        ("prompts × group size", f"{alg.get('n_groups')} × {alg.get('group_size')}"),
        ("task", f"{llm['task']} {llm.get('task_options') or ''}".strip()),
        ("LoRA", f"r={llm['lora_r']} α={llm['lora_alpha']} on {', '.join(llm['lora_targets'])}"),
        ("learning rate", llm["lr"]), ("max new tokens", llm["max_new_tokens"]),
        ("temperature", llm["temperature"]), ("seed", alg["seed"]),
        ("weights from", info["source"]["weights"])))
    agents = "\n".join(f"- `agent{j}/`: agent {j + 1}" for j in range(info["n_agents"]))
    return f"""# A {info['n_agents']}-agent team trained with Sequential Agent Tuning

Base model: `{ref}` (`{base['name']}` in sat-teamtr). Each agent is a LoRA adapter on it:

{agents}

The agents take turns on a shared context (see `team.json`, key `protocol`: router
`{info['protocol']['router']}`, {info['protocol']['n_turns']} turns, one fixed system prompt and review
instruction, the chat template and stop tokens); the last agent's message is the team's answer.

{acc}| setting | value |
|---|---|
{rows}

## Use

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM
base = AutoModelForCausalLM.from_pretrained("{'base' if base.get('path') else ref}", trust_remote_code=False)
agent = PeftModel.from_pretrained(base, "agent0")
```

or run the whole team: `sat team . --prompt "What is 3 + 4?"`. vLLM serves an agent with
`LoRARequest("agent0", 1, "agent0")` on the same base.

Exported by `sat export` from the run `{info['source']['run_dir']}`.
"""


def export_team(run_dir, out, *, stage: int | None = None, merged: bool = False,
                include_base: bool | None = None, overwrite: bool = False) -> dict:
    """Write the export folder ``out`` (module docstring) of the LLM run in ``run_dir``;
    returns the ``team.json`` record. The folder is assembled next to ``out`` and renamed
    into place, so a killed export leaves no half folder behind."""
    run_dir, out = Path(run_dir), Path(out)
    conf = _run_config(run_dir)
    if conf["backend"]["llm"].get("agent_models") is not None:
        raise InputError("exporting a team of different base models is not supported yet")
    _check_export_out(run_dir, out, overwrite)
    team, source = _run_team(run_dir, conf, stage)
    cfg = team.cfg
    if include_base is None:
        include_base = cfg.model == "tiny-random"  # no other home for its weights
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")  # ours: this process's name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        base_ref = _write_weights(team, tmp, include_base)
        info = _team_record(team, conf, run_dir, base_ref, source)
        if merged:
            for j in range(cfg.agents):
                _write_merged(team, j, tmp / f"agent{j}" / "merged")
            info["merged"] = [f"agent{j}/merged" for j in range(cfg.agents)]
        (tmp / "team.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(_model_card(info, conf), encoding="utf-8")
        write_marker(tmp, "export", os.listdir(tmp))
        replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def _write_weights(team, tmp: Path, include_base: bool) -> dict:
    """The base model's folder ``base`` (when ``include_base``) and one peft adapter folder
    ``agent{j}`` per agent in ``tmp``, each naming that base; returns team.json's
    ``base_model`` record."""
    from .models import hf_dir

    cfg = team.cfg
    base_ref = dict(name=cfg.model, hub_id=HUB_IDS.get(cfg.model), path=None)
    if include_base:
        shutil.copytree(hf_dir(cfg.model, seed=cfg.seed), tmp / "base")
        base_ref["path"] = "base"
    pm = team._model(0)
    for j in range(cfg.agents):
        pm.save_pretrained(tmp / "_peft", selected_adapters=[f"agent{j}"])
        (tmp / "_peft" / f"agent{j}").rename(tmp / f"agent{j}")
        _fix_base_reference(tmp / f"agent{j}", base_ref)
    shutil.rmtree(tmp / "_peft", ignore_errors=True)
    return base_ref


def _team_record(team, conf: dict, run_dir: Path, base_ref: dict, source) -> dict:
    """team.json (module docstring): the agents, protocol, views, task, settings, final
    metrics and where the weights came from."""
    from .protocol import views_record

    cfg = team.cfg
    return dict(format=FORMAT, n_agents=cfg.agents, base_model=base_ref,
                agents=[dict(index=j, adapter=f"agent{j}") for j in range(cfg.agents)],
                protocol=_protocol_record(team),
                views=views_record(team.task, team.protocol, team.eval_set),
                task=dict(name=cfg.task, options=cfg.task_options),
                llm_config=cfg.to_dict(), algorithm=conf["algorithm"],
                metrics=_final_metrics(run_dir),
                source=dict(run_dir=str(run_dir.resolve()), weights=source))


def _check_export_out(run_dir: Path, out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that is, holds or lies inside the run or any run/export, and an
    existing folder unless ``--overwrite`` and it is a marked export of nothing but its
    listed entries (an empty folder may be replaced too)."""
    check_out(out, kind="export", sources=[run_dir])
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise InputError(f"{out} exists; choose another --out or pass --overwrite")
    if out.is_symlink() or not out.is_dir():
        raise InputError(f"--out {out} is not a folder; --overwrite replaces only an export")
    present = set(os.listdir(out))
    if not present:
        return
    if read_marker(out) != "export":
        raise InputError(f"--out {out} is not an export written by sat export (no "
                         f"{EXPORT_MARKER}); nothing was deleted; choose another --out")
    listed = set(_marker_entries(out)) | {EXPORT_MARKER}
    foreign = sorted(present - listed)
    if foreign:
        raise InputError(f"--out {out} holds files sat export did not write "
                         f"({', '.join(foreign[:4])}); nothing was deleted; move them or "
                         "choose another --out")


def _marker_entries(folder: Path) -> list[str]:
    try:
        entries = json.loads((folder / EXPORT_MARKER).read_text(encoding="utf-8"))["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []


def check_task_import(task, where: str) -> None:
    """A task named in a file (``where``) that is a ``module:Class`` to import is refused
    unless the user opted in (``--allow-task-import``: ``$SAT_ALLOW_TASK_IMPORT`` is ``*`` or
    names it): importing it would run code shipped with the file."""
    if not isinstance(task, str):
        raise InputError(f"{where}: the task must be a name, got {type(task).__name__}")
    from .tasks import TASK_IMPORT_ENV

    allowed = os.environ.get(TASK_IMPORT_ENV, "")
    if ":" in task and allowed != "*" and task not in allowed.split(","):
        raise InputError(f"{where} names the task class {task!r}: importing it would run its "
                         "module's code; sat does that only when asked (sat team/export "
                         "--allow-task-import, for a file you trust)")


def checked_weights(team, agent: int, weights, where: str) -> dict:
    """``weights`` as float32 tensors after checking them against agent ``agent``'s adapter
    layout: the same tensor names, each of the same shape (a shape that would broadcast is
    refused), a floating dtype, every value finite (an all-NaN adapter plays nonsense)."""
    import torch

    params = team._params(agent)
    if not isinstance(weights, dict) or set(weights) != set(params):
        names = sorted(set(weights) ^ set(params)) if isinstance(weights, dict) else []
        raise InputError(f"{where}: agent {agent}'s adapter tensors do not match the team's "
                         f"LoRA layout (differ: {', '.join(names[:2]) or '?'})")
    out = {}
    for k, p in params.items():
        t = weights[k]
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise InputError(f"{where}: agent {agent} tensor {k} is not a floating tensor")
        if tuple(t.shape) != tuple(p.shape):
            raise InputError(f"{where}: agent {agent} tensor {k} has shape {tuple(t.shape)}, "
                             f"the team's adapter needs {tuple(p.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise InputError(f"{where}: agent {agent} tensor {k} holds NaN or infinite values")
        out[k] = t.float()
    return out


def _fix_base_reference(adapter_dir: Path, base_ref: dict) -> None:
    """peft records the local cache path of the base; point it at something a reader can
    resolve: the export's own ``base/`` folder, else the hub id, else our model name."""
    path = adapter_dir / "adapter_config.json"
    c = json.loads(path.read_text())
    c["base_model_name_or_path"] = ("../base" if base_ref["path"] else
                                    base_ref["hub_id"] or base_ref["name"])
    path.write_text(json.dumps(c, indent=2) + "\n")


def _write_merged(team, agent: int, target: Path) -> None:
    """The base with agent ``agent``'s adapter merged in (a copy; the team is untouched)."""
    import copy

    pm = copy.deepcopy(team._model(agent))
    pm.set_adapter(f"agent{agent}")
    for name in list(pm.peft_config):
        if name != f"agent{agent}":
            pm.delete_adapter(name)
    merged = pm.merge_and_unload()
    merged.save_pretrained(target)
    team.tokenizer(agent).save_pretrained(target)


# ------------------------------------------------------------------ reading a team back
def load_team(path, *, stage: int | None = None):
    """``(team, info)``: the trained team of a run folder or an export folder, ready to
    play (:class:`~sat_llm.team.LLMTeam`); ``info`` describes where it came from. Every
    field of ``team.json`` is checked before use (one :class:`InputError` line)."""
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{path} is not a folder (give a run folder or an export folder)")
    if (p / "team.json").exists():
        return _export_team(p)
    team, source = _run_team(p, _run_config(p, "played"), stage)
    return team, dict(source=dict(run_dir=str(p), weights=source))


def _export_team(p: Path):
    from safetensors.torch import load_file

    from sat_theory.ownership import read_json_file, regular_file

    from .team import LLMConfig, LLMTeam

    where = f"{p}/team.json"
    info = read_json_file(p / "team.json", "an export's team.json")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise InputError(f"{where} is not a {FORMAT} export")
    kw, base = info.get("llm_config"), info.get("base_model")
    if not isinstance(kw, dict) or not isinstance(base, dict):
        raise InputError(f"{where}: 'llm_config' and 'base_model' must be objects")
    kw = dict(kw)
    check_task_import(kw.get("task", ""), where)
    if base.get("path"):
        rel = base["path"]
        target = (p / rel).resolve() if isinstance(rel, str) else None
        if target is None or not (target == p.resolve() / rel and p.resolve() in target.parents):
            raise InputError(f"{where}: base_model.path must name a folder inside the export, "
                             f"got {rel!r}")
        kw["model"] = str(p / rel)
    try:
        team = LLMTeam(LLMConfig(**kw))
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: bad llm_config ({_first_line(e)})") from None
    for j in range(team.n_agents):
        f = p / f"agent{j}" / "adapter_model.safetensors"
        if not f.is_file():
            raise InputError(f"{f} is missing")
        try:
            weights = load_file(str(regular_file(f)))
        except Exception as e:  # noqa: BLE001 - safetensors has its own error types
            raise InputError(f"{f} is not a safetensors file ({type(e).__name__})") from None
        team._set_weights(j, checked_weights(team, j, weights, str(f)))
    return team, info


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _run_team(run_dir: Path, conf: dict, stage: int | None):
    """``(team, weights source)``: the run's team with its trained adapters loaded."""
    from .team import LLMConfig, LLMTeam

    check_task_import(conf["backend"]["llm"].get("task", ""), f"{run_dir}/config.json")
    weights, source = run_weights(run_dir, stage)
    try:
        cfg = LLMConfig(**conf["backend"]["llm"])
    except (TypeError, ValueError) as e:
        raise InputError(f"{run_dir}/config.json: bad LLM settings ({_first_line(e)})") from None
    if set(weights) != set(range(cfg.agents)):
        raise InputError(f"the weights hold agents {sorted(weights)}, the run has {cfg.agents}")
    team = LLMTeam(cfg)
    for j in range(cfg.agents):
        team._set_weights(j, checked_weights(team, j, weights[j], f"{run_dir} ({source})"))
    return team, source


# ------------------------------------------------------------------ sat export
def output_arguments(p) -> None:
    """``--quiet`` / ``--verbose`` of the LLM commands (:func:`sat_theory.progress.configure`)."""
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars (nor transformers' loading/saving bars)")
    p.add_argument("--verbose", action="store_true",
                   help="progress bars even when stderr is not a terminal")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="an LLM run folder (sat train --backend llm)")
    p.add_argument("--out", required=True, metavar="DIR", help="export folder to write")
    p.add_argument("--stage", type=int, default=None, metavar="K",
                   help="export policies/stage{K}.safetensors (default: the run's checkpoint, "
                        "else its last saved policy)")
    p.add_argument("--merged", action="store_true",
                   help="also write each agent's base with the adapter merged in (agent{j}/merged)")
    p.add_argument("--include-base", action="store_true",
                   help="copy the base model into DIR/base (always for tiny-random)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing export in --out (only a folder sat export wrote; "
                        "atomically)")
    output_arguments(p)
    trust_arguments(p)


def trust_arguments(p) -> None:
    """``--allow-task-import`` of the commands that read a run's or an export's files."""
    p.add_argument("--allow-task-import", dest="allow_task_import_cmd", action="store_true",
                   help="let the folder's config.json/team.json name a task class "
                        "(module:Class) to import; its code runs, so only for files you trust")


def run(args) -> int:
    from sat_theory.progress import configure

    configure(quiet=args.quiet, verbose=args.verbose)
    if args.stage is not None and args.stage < 0:
        raise InputError(f"--stage must be >= 0, got {args.stage}")
    info = export_team(args.run_dir, args.out, stage=args.stage, merged=args.merged,
                       include_base=True if args.include_base else None,
                       overwrite=args.overwrite)
    print(f"exported {info['n_agents']} agents ({info['source']['weights']}) -> {args.out}")
    return 0
