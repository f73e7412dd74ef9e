"""The datasets, sizes and reward function of the ``SATTrainer`` tests
(tests/llm/test_sat_trainer.py, tests/llm/test_sat_trainer_models.py): one-digit sums, a
one-agent tiny-random team, two stages."""

from __future__ import annotations

import json

from datasets import Dataset

from sat_llm.tasks import exact_equal, extract_answer


def exact_answer(prompts, completions, answer, **kw):
    """The dataset task's ``exact`` checker as a TRL-style reward function."""
    return [float(exact_equal(extract_answer(c), a)) for c, a in zip(completions, answer, strict=True)]


TRAIN = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a in range(3) for b in range(3)],
                           "answer": [str(a + b) for a in range(3) for b in range(3)]})
EVAL = Dataset.from_dict({"prompt": ["5+1=", "4+4="], "answer": ["6", "8"]})
SIZES = dict(agents=1, stages=2, n_groups=2, group_size=2, n_train=4, n_eval=2,
             max_new_tokens=4, threads=1, model="tiny-random", report_to="none", progress=False)


def records(run):
    """The run's records without the machine's measurements (wall time, peak memory)."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds", None)
        r.pop("peak_memory_bytes", None)
        out.append(r)
    return out
