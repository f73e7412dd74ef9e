"""``LLMTeam``: a team of language-model agents behind :class:`sat_theory.team.Team`.

Agents are LoRA adapters (peft) on one shared frozen base model (default), or each on its
own base (heterogeneous teams, e.g. after a plug-and-play swap to another model). Agent
``j``'s policy is its adapted model at temperature ``τ`` (see :mod:`sat_llm.rollout`).
``LLMTeam`` is built from one part per responsibility:

- :mod:`sat_llm.episodes` (:class:`~sat_llm.episodes.EpisodeLoop`, shared with the Ray
  team): ``rollout`` — episodes of the canonical turn-taking protocol
  (:mod:`sat_llm.protocol`) on training problems, ``group_size`` per problem — and
  ``evaluate``, greedy and cached per parameter version, with the runner's record hooks;
- :mod:`sat_llm.adapters` (:class:`~sat_llm.adapters.Adapters`): the adapters on their bases,
  AdamW states and parameter versions; ``snapshot``/``restore``, ``state_dict``/
  ``load_state_dict``, plug-and-play ``new_agent``/``align``/``replace``/``reset``;
- :mod:`sat_llm.updates` (:class:`~sat_llm.updates.Updates`): ``update``, AdamW steps on
  ``−L^clip + β·KL̂_exact`` (:mod:`sat_llm.loss`) for one agent's adapter, learning rate
  ``lr·step_scale``, gradient-norm clipping, float32;
- :mod:`sat_llm.scoring` (:class:`~sat_llm.scoring.Scoring`): the passes through the
  models — generation of the speakers' messages (sampled, with the behaviour log-prob
  check, or greedy: :func:`~sat_llm.scoring.greedy_pooled`), teacher-forced scoring, the
  reference pass and the minibatch loss, and ``kl``: exact and sampled token-level KL
  (:mod:`sat_llm.kl`) from the reference snapshot to the current adapter. Tests and
  benchmarks that watch or fail the functions these passes call (``generate``,
  ``score_logits``, ``sequence_kl``, ...) replace them in :mod:`sat_llm.scoring`;
- this module: construction (devices, dtypes, bases, optimizers, counters).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sat_theory.team import Batch

from .adapters import Adapters, AgentSnapshot, load_team_file, swap_adapter
from .chunks import _rows, in_chunks  # noqa: F401  (_rows: imported from here by tests)
from .episodes import EpisodeLoop, RolloutMismatchError, _Ctx, task_setup
from .models import resolve_device, resolve_dtype
from .scoring import LOGP_TOL, Scoring, greedy_pooled, greedy_shared_prefix, stop_ids
from .updates import Updates

# imported from here too: the state types, EpisodeLoop, task_setup, the team files, the
# row helpers (_rows) and the decoding functions
__all__ = ["LLMConfig", "LLMTeam", "AgentSnapshot", "RolloutMismatchError", "LOGP_TOL",
           "EpisodeLoop", "task_setup", "load_team_file", "swap_adapter", "in_chunks",
           "stop_ids", "strict_float32", "greedy_shared_prefix", "greedy_pooled"]


# the team's settings are declared once, in sat_llm.config (re-exported here)
from .config import LLMConfig  # noqa: E402

# State files (sat_llm.checkpoint registers these types) name a type by module and class,
# and run checkpoints written before the team was split into modules name these two
# sat_llm.team.AgentSnapshot and sat_llm.team._Ctx: they keep those names
AgentSnapshot.__module__ = _Ctx.__module__ = __name__


def strict_float32() -> None:
    """Switch TF32 off explicitly: float32 matrix products and convolutions in full IEEE
    precision on every device (the exact-KL monitor is a certificate input)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


class LLMTeam(Scoring, EpisodeLoop, Adapters, Updates):
    """See module docstring. ``model``/``tokenizer`` may be passed in (tests) to skip loading."""

    def __init__(self, cfg: LLMConfig, model=None, tokenizer=None):
        self.cfg = cfg
        self.n_agents = cfg.agents
        self.gamma = float(cfg.gamma)
        self.advantage_bound = 1.0  # scores lie in [0, 1], so |A| <= 1
        self.task, self.protocol, self.train_pool, self.eval_set = task_setup(cfg)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        strict_float32()
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self._start_counters()
        self.devices = [resolve_device(d) for d in cfg.agent_devices or (cfg.device,) * cfg.agents]
        self.dtypes = [resolve_dtype(cfg.dtype, d) for d in self.devices]
        self._record_placement()
        self._open_bases(model, tokenizer)
        self._init_weights = [self._get_weights(j) for j in range(self.n_agents)]
        if cfg.init_from:  # after _init_weights: those stay the fresh adapters
            self._start_from(cfg.init_from)
        self._opt = [self._make_opt(j) for j in range(self.n_agents)]
        self._version = [0] * self.n_agents
        self._micro = [cfg.micro_batch or cfg.minibatch] * self.n_agents
        self._gen_cap = [math.inf] * self.n_agents
        self._logp_stats = [0.0, 0, 0.0]  # Σ|Δ|, tokens, max|Δ| of the behaviour log-prob check
        self._rescored = 0
        self._engine = None
        #: ``agent -> transformers streamer`` (or None): single-episode generation streams
        #: its tokens there (``sat team`` on a terminal)
        self.streamer_for = None
        if cfg.engine == "vllm":
            from .vllm_engine import VLLMEngine  # lazily: only where vLLM is installed

            self._engine = VLLMEngine(self)

    def _start_counters(self) -> None:
        """Rollout and version counters, caches and the latest results, all empty."""
        self._rollouts = 0
        self._version_counter = 0
        self._eval_cache: dict = {}
        self._ref_cache: tuple | None = None
        self.last_kl: dict[int, dict] = {}
        self.last_update: dict[int, dict] = {}
        self.last_batch: Batch | None = None

    def _record_placement(self) -> None:
        """Write the resolved devices and dtype into the config (``config.json`` then says
        what ran, and a resumed run uses the same): ``auto`` becomes what it meant here."""
        cfg = self.cfg
        names = [str(d) for d in self.devices]
        if cfg.agent_devices is None:
            cfg.device = names[0]
        else:
            cfg.agent_devices = tuple(names)
        kinds = {str(t).removeprefix("torch.") for t in self.dtypes}
        if len(kinds) == 1:
            cfg.dtype = kinds.pop()
