"""One runnable script per study (a paper figure or table); see ``experiments/README`` in
each module docstring. Run one with ``python -m experiments.fig_n_scaling --quick`` or all
with ``sat figures``."""
