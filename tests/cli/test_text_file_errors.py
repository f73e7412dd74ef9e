"""Files that are not the text they should be: a non-UTF-8 byte in a run's files or in a
prompts file, a ``config.json`` that is not JSON — each is one input-error line and exit 2;
the streamed UTF-8 check agrees with reading the whole file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _tabular_run(out: Path) -> Path:
    from sat_theory import cli

    assert cli.main(["train", "--env", "bandit", "--stages", "2", "--quiet",
                     "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json"])
def test_non_utf8_run_files_are_one_input_error_line(tmp_path, capsys, name):
    from sat_theory import cli

    run = _tabular_run(tmp_path / "r")
    path = run / name
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"', b'"\xff', 1))  # one Latin-1 byte after the first quote
    line = data[:data.index(b'"')].count(b"\n") + 1
    capsys.readouterr()
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sat plot: error:")
    assert f"{name}: line {line} is not UTF-8 text (byte 0xff" in err[0]


def test_a_config_json_that_is_not_json_is_an_input_error(tmp_path, capsys):
    from sat_theory import cli

    run = _tabular_run(tmp_path / "r")
    (run / "config.json").write_text('{"algorithm": ')
    capsys.readouterr()
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "config.json: not valid JSON" in err[0]


@settings(max_examples=60)
@given(text=st.text(max_size=40), bad=st.integers(0, 40), chunk=st.integers(1, 8),
       byte=st.sampled_from([0xFF, 0x80, 0xC3]))
def test_streamed_utf8_check_agrees_with_reading_the_whole_file(tmp_path_factory, text, bad,
                                                                 chunk, byte):
    """Any text passes in any chunk size (characters cut at a chunk boundary are carried);
    one invalid byte anywhere is reported at the same line and offset as read_utf8."""
    from sat_theory.errors import InputError
    from sat_theory.fileio import check_utf8, read_utf8

    path = tmp_path_factory.mktemp("u") / "f.jsonl"
    data = text.encode()
    path.write_bytes(data)
    check_utf8(path, chunk=chunk)
    assert read_utf8(path) == text
    k = min(bad, len(data))
    while k < len(data) and (data[k] & 0xC0) == 0x80:  # not inside a character
        k += 1
    path.write_bytes(data[:k] + bytes([byte]) + b"\n" + data[k:])
    with pytest.raises(InputError) as whole:
        read_utf8(path)
    with pytest.raises(InputError) as streamed:
        check_utf8(path, chunk=chunk)
    assert str(streamed.value) == str(whole.value)
    line = data[:k].count(b"\n") + 1
    assert f"line {line} is not UTF-8 text (byte 0x{byte:02x} at offset {k})" in str(whole.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_non_utf8_prompts_file_is_one_input_error_line(tmp_path, capsys, monkeypatch, suffix):
    """``sat train --backend llm --jsonl FILE`` (the dataset reader): exit 2, one line, before
    any model loads (the model named does not exist: reaching it would fail differently)."""
    pytest.importorskip("datasets")
    from sat_theory import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = tmp_path / f"prompts{suffix}"
    rows = ([b'{"prompt": "1+1", "answer": "2"}', b'{"prompt": "caf\xe9", "answer": "3"}']
            if suffix == ".jsonl" else [b"prompt,answer", b"1+1,2", b"caf\xe9,3"])
    path.write_bytes(b"\n".join(rows) + b"\n")
    argv = ["train", "--backend", "llm", "--model", str(tmp_path / "no-model"), "--jsonl",
            str(path), "--stages", "1", "--quiet", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sat train: error:")
    line = 2 if suffix == ".jsonl" else 3
    assert f"line {line} is not UTF-8 text (byte 0xe9" in err[0]
