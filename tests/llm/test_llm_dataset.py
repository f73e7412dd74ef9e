"""The dataset task (``--dataset PATH``, ``sat_llm.data`` + ``sat_llm.tasks.DatasetTask``): a
small GSM8K-style fixture written locally in each of the four formats gives the same problems;
splits, columns and every malformed case (one clear line); a tiny-random ``sat train`` run
that records its data in config.json and refuses to resume on a changed dataset."""

import csv
import json
import math

import pytest

datasets = pytest.importorskip("datasets")
pytest.importorskip("math_verify")

from sat_llm.data import gold_answer  # noqa: E402
from sat_llm.tasks import DatasetTask, make_task  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402

FORMATS = ("jsonl", "csv", "parquet", "disk")


def gsm8k_rows(n: int = 10) -> list[dict]:
    """GSM8K-style rows: a word problem and a worked answer ending in ``#### <number>``."""
    return [{"question": f"Tom has {i} apples and buys {i + 2} more. How many apples does he have?",
             "answer": f"He has {i} + {i + 2} = {2 * i + 2} apples.\n#### {2 * i + 2}"}
            for i in range(n)]


def _quiet_save(ds, path):
    was_off = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        ds.save_to_disk(str(path))
    finally:
        if not was_off:
            datasets.enable_progress_bars()


def write(tmp_path, fmt: str, rows: list[dict], name: str = "data"):
    """``rows`` as a dataset of format ``fmt`` under ``tmp_path``; its path."""
    if fmt == "jsonl":
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        p = tmp_path / f"{name}.csv"
        with p.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp_path / f"{name}.parquet"
        schema = pa.schema([("question", pa.string()), ("answer", pa.string())]) if not rows else None
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(p))
    else:
        p = tmp_path / name
        _quiet_save(datasets.Dataset.from_list(rows), p)
    return str(p)


@pytest.fixture(scope="module")
def jsonl_task(tmp_path_factory):
    return make_task("dataset", write(tmp_path_factory.mktemp("d"), "jsonl", gsm8k_rows()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_the_same_problems(tmp_path, fmt, jsonl_task):
    t = make_task("dataset", write(tmp_path, fmt, gsm8k_rows()))
    assert t.fingerprint == jsonl_task.fingerprint  # the same rows, whatever the format
    assert t.options()["prompt_column"] == "question" and t.options()["answer_column"] == "answer"
    tr, ev = t.problems("train", 100, seed=1), t.problems("eval", 100, seed=1)
    assert (len(tr), len(ev)) == (8, 2)  # eval fraction 0.2 of 10 rows
    assert not {p.prompt for p in tr} & {p.prompt for p in ev}
    assert [p.prompt for p in tr] == [p.prompt for p in jsonl_task.problems("train", 100, seed=1)]
    assert {p.answer for p in tr + ev} == {str(2 * i + 2) for i in range(10)}  # GSM8K rule
    p = ev[0]
    assert t.score(p, f"Let me add.\nAnswer: {p.answer}") == 1.0
    assert t.score(p, f"Answer: {int(p.answer) + 1}") == 0.0


def test_seeds_and_sizes(jsonl_task):
    t = jsonl_task
    assert [p.prompt for p in t.problems("train", 3, seed=0)] == \
        [p.prompt for p in t.problems("train", 8, seed=0)][:3]
    assert [p.prompt for p in t.problems("train", 8, seed=0)] != \
        [p.prompt for p in t.problems("train", 8, seed=1)]
    rec = t.record(5, 200, 0)
    assert rec["rows"] == {"train": 8, "eval": 2} and rec["used"] == {"train": 5, "eval": 2}
    # the resolved options rebuild the very same task
    again = DatasetTask(t.path, **t.options())
    assert [p.prompt for p in again.problems("eval", 9, seed=4)] == \
        [p.prompt for p in t.problems("eval", 9, seed=4)]


def test_gold_answer_rule():
    assert gold_answer("3 + 4 = 7\n#### 7", "x") == "7"
    assert gold_answer("#### 1 ####  1,000 ", "x") == "1,000"  # the text after the last ####
    assert gold_answer(42, "x") == "42" and gold_answer(0.5, "x") == "0.5"
    for bad in (None, True, math.nan, [1], "   ", "work\n#### "):
        with pytest.raises(InputError, match="x"):
            gold_answer(bad, "x")


def test_splits_of_a_save_to_disk_folder(tmp_path):
    rows = gsm8k_rows(12)
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(rows[:9]),
                              test=datasets.Dataset.from_list(rows[9:]))
    _quiet_save(dd, tmp_path / "dd")
    t = make_task("dataset", str(tmp_path / "dd"), eval_split="test")
    assert len(t.problems("train", 100)) == 9 and len(t.problems("eval", 100)) == 3
    assert {p.answer for p in t.problems("eval", 100)} == {"20", "22", "24"}
    assert make_task("dataset", str(tmp_path / "dd")).options()["split"] == "train"
    with pytest.raises(InputError, match="has the splits train, test"):
        make_task("dataset", str(tmp_path / "dd"), eval_split="validation")
    with pytest.raises(InputError, match="has the splits"):
        make_task("dataset", str(tmp_path / "dd"), split="test", eval_split="test")
    with pytest.raises(InputError, match="not both"):
        make_task("dataset", str(tmp_path / "dd"), eval_split="test", eval_fraction=0.3)
    # no 'train' split and more than one: --split must say which
    _quiet_save(datasets.DatasetDict(dev=dd["train"], test=dd["test"]), tmp_path / "nt")
    with pytest.raises(InputError, match="choose one with --split"):
        make_task("dataset", str(tmp_path / "nt"))
    assert len(make_task("dataset", str(tmp_path / "nt"), split="dev").problems("train", 99)) == 7


def test_columns(tmp_path):
    rows = [{"id": i, "problem": f"p{i}", "question": f"q{i}", "solution": f"\\boxed{{{i}}}"}
            for i in range(5)]
    path = write(tmp_path, "jsonl", rows)
    t = make_task("dataset", path)
    assert (t.options()["prompt_column"], t.options()["answer_column"]) == ("question", "solution")
    t = make_task("dataset", path, prompt_column="problem")
    assert all(p.prompt.startswith("p") for p in t.problems("train", 9))
    p = t.problems("eval", 1)[0]
    assert t.score(p, f"Answer: {p.answer[7:-1]}") == 1.0  # gold \boxed{i}, said plainly
    with pytest.raises(InputError, match="no column 'prompt'.*columns: id, problem"):
        make_task("dataset", path, prompt_column="prompt")
    with pytest.raises(InputError, match="none of the columns answer, solution; name one with "
                                         "--answer-column"):
        make_task("dataset", write(tmp_path, "jsonl", [{"question": "q", "x": 1}] * 2, "b"))


@pytest.mark.parametrize("rows, msg", [
    ([{"question": 5, "answer": "1"}, {"question": 6, "answer": "2"}],
     r"row 0: column 'question' must hold a non-empty string prompt, got 5"),
    ([{"question": "a", "answer": "1"}, {"question": "  ", "answer": "2"}],
     "row 1: column 'question' must hold a non-empty string prompt, got an empty string"),
    ([{"question": "a", "answer": "1"}, {"question": "b"}],
     "row 1, column 'answer': the answer must be a string or a number, got None"),
    ([{"question": "a", "answer": "1"}, {"question": "b", "answer": "work\n####"}],
     "row 1, column 'answer': empty answer"),
    ([{"question": "a", "answer": [1]}, {"question": "b", "answer": [2]}],
     "the answer must be a string or a number, got list"),
    ([{"question": "a", "answer": True}, {"question": "b", "answer": False}],
     "the answer must be a string or a number, got True"),
    ([{"question": "a", "answer": "1"}], "need at least 2 rows"),
])
def test_malformed_rows(tmp_path, rows, msg):
    with pytest.raises(InputError, match=msg):
        make_task("dataset", write(tmp_path, "jsonl", rows))


def test_malformed_files_and_paths(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{"question": oops}\n')
    with pytest.raises(InputError, match="malformed JSON"):
        make_task("dataset", str(bad))
    for name in ("openai/gsm8k", str(tmp_path / "missing.parquet")):  # never a hub download
        with pytest.raises(InputError, match="no such local file or folder"):
            make_task("dataset", name)
    (tmp_path / "notes.txt").write_text("q,a\n")
    with pytest.raises(InputError, match="unknown dataset format '.txt'"):
        make_task("dataset", str(tmp_path / "notes.txt"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match="not a datasets save_to_disk folder"):
        make_task("dataset", str(tmp_path / "folder"))
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "none.csv").write_text("question,answer\n")
    (tmp_path / "none.jsonl").write_text("\n\n")
    write(tmp_path, "parquet", [], "none")
    for name in ("empty.csv", "none.csv", "none.jsonl", "none.parquet"):
        with pytest.raises(InputError, match="no rows"):
            make_task("dataset", str(tmp_path / name))
    _quiet_save(datasets.Dataset.from_dict({"question": [], "answer": []}), tmp_path / "none")
    with pytest.raises(InputError, match="cannot load this save_to_disk folder"):
        make_task("dataset", str(tmp_path / "none"))
    with pytest.raises(InputError, match="unknown checker"):
        make_task("dataset", str(tmp_path / "none"), checker="vibes")
    with pytest.raises(InputError, match=r"eval fraction must be in \(0, 1\)"):
        make_task("dataset", str(tmp_path / "none"), eval_fraction=1.0)


def test_changed_dataset_is_refused(tmp_path):
    path = write(tmp_path, "parquet", gsm8k_rows())
    opts = make_task("dataset", path).options()
    write(tmp_path, "parquet", gsm8k_rows(11))
    with pytest.raises(InputError, match="the dataset changed since this run started"):
        DatasetTask(path, **opts)


def test_checkers_are_chosen_by_name(tmp_path):
    path = write(tmp_path, "jsonl", [{"prompt": f"q{i}", "answer": "1/2"} for i in range(4)])
    msg = "Answer: 0.5"
    scores = {c: make_task("dataset", path, checker=c).score(make_task("dataset", path).problems(
        "eval", 1)[0], msg) for c in ("math-verify", "builtin", "exact")}
    assert scores == {"math-verify": 1.0, "builtin": 1.0, "exact": 0.0}


# ------------------------------------------------------------------ the command line

def _one_line_error(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert pattern in err, err


TINY = ["train", "--backend", "llm", "--model", "tiny-random", "--agents", "2", "--stages", "1",
        "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4", "--n-train", "8",
        "--n-eval", "2", "--quiet"]


@pytest.fixture
def cli(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    from sat_theory.cli import main

    return main


@pytest.mark.parametrize("extra, pattern", [
    (["--dataset", "openai/gsm8k"], "no such local file or folder"),
    (["--dataset", "DATA", "--prompt-column", "prompt"], "no column 'prompt'"),
    (["--dataset", "DATA", "--task", "copy"], "--dataset and its options go with --task dataset"),
    (["--task", "copy", "--split", "test"], "--dataset and its options go with --task dataset"),
    (["--dataset", "DATA", "--eval-fraction", "1.5"], "--eval-fraction: must be a number in (0, 1)"),
    (["--dataset", "DATA", "--eval-split", "test"], "--eval-split 'test': "),
])
def test_bad_dataset_flags_one_line(cli, tmp_path, capsys, extra, pattern):
    data = write(tmp_path, "jsonl", gsm8k_rows())
    args = TINY + [data if a == "DATA" else a for a in extra] + ["--out", str(tmp_path / "r")]
    _one_line_error(capsys, cli(args), pattern)


def test_tiny_run_on_a_dataset_records_it_and_resumes_only_on_the_same_data(cli, tmp_path, capsys):
    data = write(tmp_path, "csv", gsm8k_rows())
    out = tmp_path / "run"
    assert cli(TINY + ["--dataset", data, "--checker", "builtin", "--out", str(out)]) == 0
    conf = json.loads((out / "config.json").read_text())
    llm, rec = conf["backend"]["llm"], conf["backend"]["dataset"]
    assert llm["task"] == "dataset" and llm["prompts"] == rec["path"] == str((tmp_path / "data.csv").resolve())
    assert llm["task_options"]["checker"] == rec["checker"] == "builtin"
    assert (rec["prompt_column"], rec["answer_column"], rec["split"]) == ("question", "answer", "train")
    assert rec["rows"] == {"train": 8, "eval": 2} and rec["used"] == {"train": 8, "eval": 2}
    evals = [json.loads(x) for x in (out / "eval_0.jsonl").read_text().splitlines()]
    assert len(evals) == 2 and {e["answer"] for e in evals} <= {str(2 * i + 2) for i in range(10)}
    write(tmp_path, "csv", gsm8k_rows(11))  # the data changes under the run
    capsys.readouterr()
    _one_line_error(capsys, cli(["train", "--backend", "llm", "--resume", str(out), "--stages", "2",
                                 "--quiet"]), "the dataset changed since this run started")


def test_a_dataset_row_longer_than_the_model_context_is_refused_before_training(tmp_path, capsys):
    """A dataset prompt beyond the model's context length went into training (the tokenizer
    and the model then failed, or silently truncated); now one line naming the row, exit 2,
    and no run folder."""
    from sat_theory.cli import main

    f = tmp_path / "long.jsonl"
    f.write_text("".join(json.dumps({"question": "word " * 3000 if i == 5 else f"What is {i} + 1?",
                                     "answer": str(i + 1)}) + "\n" for i in range(20)))
    out = tmp_path / "run"
    rc = main(["train", "--backend", "llm", "--model", "tiny-random", "--dataset", str(f),
               "--stages", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4",
               "--n-train", "12", "--n-eval", "4", "--threads", "1", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "'word word" in err[0] and "context length" in err[0]
    assert not out.exists()
