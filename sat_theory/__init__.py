"""Exact tabular world of Sequential Agent Tuning (SAT) and TeamTR.

Public API (see docs/theory.md for every definition):

- :class:`FactorizedMDP` — finite team MDP (factored, masked or turn-taking; dense or sparse)
- :class:`TeamPolicy` — one softmax factor per agent
- :func:`evaluate`, :func:`evaluate_many` — exact V, Q, A, d, J
- :func:`stage_certificate` — every certificate term of one sequential stage
- :func:`random_mdp`, :func:`named_mdp` — generators and toy MDPs
- :class:`Team` — the backend interface; :class:`TabularTeam` — its exact/sampled tabular
  implementation; :func:`run_stage`, :func:`train`, :class:`TrainConfig` — the shared algorithm
"""

from .algorithm import METHODS, TrainConfig, run_stage
from .certificates import (
    BOUND_KEYS,
    StageCertificate,
    StepCertificate,
    intermediate_policies,
    penalty_constant,
    stage_certificate,
)
from .envs import NAMED, named_mdp, random_mdp
from .errors import SUM_TOL, InputError
from .evaluate import BatchEvaluation, ConvergenceError, Evaluation, evaluate, evaluate_many
from .mdp import FactorizedMDP
from .policy import (
    TeamPolicy,
    expected_advantage,
    factor_kl,
    factor_tv,
    joint_kl,
    joint_policy,
    joint_tv,
    kl_rows,
    marginal_advantage,
    tv_rows,
)
from .runner import train
from .tabular_team import TabularTeam
from .team import Batch, Episode, Team, Turn

__all__ = [
    "METHODS", "Batch", "Episode", "TabularTeam", "Team", "TrainConfig", "Turn", "run_stage",
    "train", "BOUND_KEYS", "NAMED", "SUM_TOL", "BatchEvaluation", "ConvergenceError", "Evaluation",
    "FactorizedMDP", "InputError", "StageCertificate", "StepCertificate", "TeamPolicy",
    "evaluate", "evaluate_many", "expected_advantage", "factor_kl", "factor_tv",
    "intermediate_policies", "joint_kl", "joint_policy", "joint_tv", "kl_rows",
    "marginal_advantage", "named_mdp", "penalty_constant", "random_mdp", "stage_certificate",
    "tv_rows",
]
__version__ = "0.1.0"
