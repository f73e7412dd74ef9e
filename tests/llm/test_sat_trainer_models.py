"""``SATTrainer(models=[a loaded transformers model], processing_class=tokenizer)``, as TRL's
``GRPOTrainer`` takes one: the model is saved next to the run and used like ``--model DIR``,
so the run equals the one from the model's name and resumes without the object."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("datasets")

from sat_llm.models import load_model  # noqa: E402
from sat_llm.trainer import SATConfig, SATTrainer  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402
from tests.llm.trainer_data import EVAL, SIZES, TRAIN, exact_answer, records  # noqa: E402

ARGS = {k: v for k, v in SIZES.items() if k != "model"}


def _trainer(out, models, **kw):
    args = SATConfig(output_dir=str(out), **{**ARGS, **kw.pop("args", {})})
    return SATTrainer(models=models, reward_funcs=exact_answer, args=args, train_dataset=TRAIN,
                      eval_dataset=EVAL, **kw)


def test_a_loaded_model_trains_like_its_name_and_resumes_without_the_object(tmp_path):
    model, tok = load_model("tiny-random", seed=0)  # what "tiny-random" loads at seed 0
    named = tmp_path / "named"
    _trainer(named, ["tiny-random"]).train()
    loaded = tmp_path / "loaded"
    t = _trainer(loaded, model, processing_class=tok)
    t.train()
    assert records(loaded) == records(named) and len(records(named)) == 4
    saved = json.loads((loaded / "config.json").read_text())["backend"]["llm"]["model"]
    assert saved == str(t.model_dir / "model0") and (t.model_dir / "model0" / "model.safetensors").is_file()
    part = tmp_path / "part"
    _trainer(part, [model], processing_class=tok, args={"stages": 1}).train()
    _trainer(part, ["ignored-on-resume"]).train(resume_from_checkpoint=True)
    assert records(part) == records(named)


def test_a_loaded_model_needs_its_tokenizer_and_a_foreign_models_folder_is_kept(tmp_path):
    model, tok = load_model("tiny-random", seed=0)
    with pytest.raises(InputError, match="processing_class"):
        _trainer(tmp_path / "r", [model])
    (tmp_path / "r.models").mkdir()
    (tmp_path / "r.models" / "mine.txt").write_text("a user's file")
    with pytest.raises(InputError, match="not written by SATTrainer"):
        _trainer(tmp_path / "r", [model], processing_class=tok).train()
    assert (tmp_path / "r.models" / "mine.txt").read_text() == "a user's file"
