"""The test suite, grouped by package (``python3 -m pytest -q`` runs it all):

- ``tests/theory/`` — the tabular simulator: MDPs, policies, exact evaluation, certificates,
  the shared algorithm on the tabular team, ``sat verify``'s checks, sympy identities,
  mutations of the formula code, and the tabular figures;
- ``tests/llm/`` — everything LLM: ``LLMTeam``, rollouts and scoring, KL monitors, tasks and
  datasets, export, the TRL oracle, vLLM, Ray, ``SATTrainer`` and the LLM studies;
- ``tests/cli/`` — the command line: ``sat train``/``eval``/``certify``, config files, run
  folders, hostile and unsafe files, ownership, signals and exit status, quiet output, the
  README's examples, the packages' layering and the studies' loader.

Helpers shared across the groups are modules, never test modules imported by each other:
``tests/bad_files.py`` (malformed MDP and policy files), ``tests/faults.py`` (runs killed at
a point, interrupts), ``tests/llm/helpers.py`` (the tiny LLM team), and the fixtures of
``tests/conftest.py`` (``device``).
"""
