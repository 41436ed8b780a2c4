"""scripts/train.py as a user runs it: one-line errors, never a traceback."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import train  # noqa: E402

from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.util import memory  # noqa: E402
from tests.helpers.train import train_config  # noqa: E402


def test_ctrl_c_is_one_line_with_the_checkpoint_to_resume(byte_ds, tmp_path, capsys, monkeypatch):
    cfg = train_config(tmp_path / "c.json")

    def interrupted(args, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "run", interrupted)
    out = tmp_path / "out"
    assert train.main(["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir", str(out)]) == 130
    assert capsys.readouterr().err == "error: interrupted; no checkpoint was written yet\n"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"x")
    assert train.main(["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir", str(out)]) == 130
    assert capsys.readouterr().err == (f"error: interrupted; the last checkpoint is {out / 'ckpt.pt'}: continue "
                                       f"with --resume {out / 'ckpt.pt'}\n")


def test_an_out_dir_under_a_file_is_one_line(byte_ds, tmp_path, capsys):
    cfg = train_config(tmp_path / "c.json", max_iters=1)
    (tmp_path / "afile").write_text("x")
    argv = ["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir", str(tmp_path / "afile" / "run"),
            "--no-audit", "--quiet"]
    assert train.main(argv) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'afile' / 'run'}: Not a directory\n"


def test_a_file_that_is_not_a_checkpoint(byte_ds, tmp_path, capsys):
    cfg = train_config(tmp_path / "c.json")
    (tmp_path / "chat.jsonl").write_text('{"messages": []}\n')
    argv = ["--dataset", str(byte_ds), "--config", str(cfg), "--resume", str(tmp_path / "chat.jsonl")]
    assert train.main(argv) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'chat.jsonl'} is not a readable training checkpoint: "
                                       f"torch cannot load it (UnpicklingError); give the ckpt.pt a run wrote (in its "
                                       f"--out-dir)\n")
    assert train.main(["--dataset", str(byte_ds), "--config", str(cfg), "--resume", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path} is a folder; give the ckpt.pt file a run wrote (in "
                                       f"its --out-dir)\n")


def test_an_empty_val_split_means_no_evaluation_with_a_note(byte_ds, tmp_path, caplog):
    src = byte_ds.parent / "chat.jsonl"
    ds = tmp_path / "ds"
    prepare([src], ds, PrepareOptions(val_split=0.001, tokenizer=str(byte_ds.parent / "bytes.tiktoken"),
                                      workers=1))
    assert (ds / "val").is_dir()
    cfg = train_config(tmp_path / "c.json", max_iters=2, eval_interval=1)
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        res = train.run(train.parse_args(["--dataset", str(ds), "--config", str(cfg), "--out-dir",
                                          str(tmp_path / "out"), "--no-audit"]), env={}, log=lines.append)
    assert res.val_losses == {}
    assert f"note: the val split of {ds} is empty, so there is no evaluation (prepare with a larger --val-split " \
           f"to evaluate)" in lines


def test_the_evaluation_loader_logs_nothing(byte_ds, tmp_path, caplog):
    cfg = train_config(tmp_path / "c.json", max_iters=2, eval_interval=1, eval_iters=3)
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        res = train.run(train.parse_args(["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir",
                                          str(tmp_path / "out"), "--no-audit"]), env={}, log=lambda *_: None)
    assert sorted(res.val_losses) == [1, 2]
    val_lines = [r.getMessage() for r in caplog.records if "split=val" in r.getMessage()]
    # the training loader's own init line for val, and nothing from the evaluation loader's epochs
    assert len(val_lines) == 1 and " init " in val_lines[0]


def test_a_batch_size_that_cannot_fit_in_memory_is_one_line_not_an_oom_kill(byte_ds, tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 24 << 30)
    cfg = train_config(tmp_path / "c.json", batch_size=2**62)
    argv = ["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir", str(tmp_path / "run"), "--no-audit",
            "--quiet"]
    assert train.main(argv) == 1
    assert capsys.readouterr().err == ("error: a batch of batch_size 4,611,686,018,427,387,904 x block_size 32 "
                                       "(sft_episode) needs about 3,072.0 EiB of memory, but this machine has "
                                       "24.0 GiB available: lower batch_size or block_size in the config (gradient "
                                       "accumulation gives a larger effective batch)\n")
    assert not (tmp_path / "run").exists()


def test_tokenizer_refuses_a_dataset_made_with_another_and_trains_with_its_own(byte_ds, tmp_path, capsys):
    cfg = train_config(tmp_path / "c.json", max_iters=1)
    argv = ["--dataset", str(byte_ds), "--config", str(cfg), "--out-dir", str(tmp_path / "out"), "--no-audit",
            "--quiet"]
    assert train.main([*argv, "--tokenizer", "cl100k_base"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {byte_ds} was made with another tokenizer than cl100k_base: the vocabulary differs "
                          f"(sha256 ") and "Its tokenizer is sha256 " in err and "cl100k_base's is sha256 " in err
    assert not (tmp_path / "out" / "ckpt.pt").exists()
    assert train.main([*argv, "--tokenizer", str(byte_ds.parent / "bytes.tiktoken")]) == 0
