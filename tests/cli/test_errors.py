"""Errors every command shares: a wrong dataset path, an output path blocked by a file,
a system error mid-run, an interruption. One red line each, the right exit code, never
a traceback."""

import errno

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app, inspect_cmd, pack_cmd, prepare_cmd
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    src = write_jsonl(root / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(6)])
    return prepare([src], root / "ds", PrepareOptions(workers=1))


def _error(r) -> str:
    assert "Traceback" not in r.output
    return r.output.strip()


@pytest.mark.parametrize("argv", [["inspect"], ["verify"], ["pack", "-o", "OUT"], ["replay-order"]])
def test_a_file_given_as_the_dataset_says_what_to_give(tmp_path, argv):
    src = write_jsonl(tmp_path / "chats.jsonl", [chat("q", "a")])
    args = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    r = runner.invoke(app, [args[0], str(src), *args[1:]])
    assert r.exit_code == 1
    assert _error(r) == (f"error: {src} is a file, not a dataset folder: give the folder that `sftdata "
                         f"prepare-chat` / `prepare-tool` wrote (its --output-dir); to make one from this file: "
                         f"sftdata prepare-chat {src} --output-dir DIR")


@pytest.mark.parametrize("command", ["inspect", "verify", "replay-order"])
def test_a_missing_dataset_says_how_to_make_it(tmp_path, command):
    r = runner.invoke(app, [command, str(tmp_path / "nope")])
    assert r.exit_code == 1
    assert _error(r) == (f"error: dataset folder {tmp_path / 'nope'} does not exist; check the path, or make "
                         f"the dataset with `sftdata prepare-chat INPUT --output-dir {tmp_path / 'nope'}`")


def test_an_output_dir_under_a_file_is_an_error_not_a_traceback(tmp_path, dataset):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(blocker / "ds"), "-j", "1"])
    assert r.exit_code == 1
    assert _error(r) == f"error: {blocker} is a file, where a folder is needed; remove it or choose another path"
    r = runner.invoke(app, ["pack", str(dataset.output_dir), "-o", str(blocker / "sub" / "packed"), "-q"])
    assert r.exit_code == 1
    assert _error(r) == f"error: {blocker} is a file, where a folder is needed; remove it or choose another path"
    assert blocker.read_text() == "x"


def test_a_system_error_mid_run_is_one_line_with_a_hint(tmp_path, monkeypatch):
    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "ds/train/shard_00000/tokens.bin")

    monkeypatch.setattr(prepare_cmd, "prepare", full_disk)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds")])
    assert r.exit_code == 1
    assert _error(r) == ("error: ds/train/shard_00000/tokens.bin: No space left on device; the disk is full: "
                         "free some space, or choose another path")


def test_permission_denied_names_the_path(tmp_path, monkeypatch, dataset):
    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/packed")

    monkeypatch.setattr(pack_cmd, "pack", denied)
    r = runner.invoke(app, ["pack", str(dataset.output_dir), "-o", "/data/packed", "-q"])
    assert r.exit_code == 1
    assert _error(r) == ("error: /data/packed: Permission denied; check the permissions of that path, or choose "
                         "another one")


def test_ctrl_c_is_exit_130_with_one_line(tmp_path, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_cmd, "prepare", interrupted)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds")])
    assert r.exit_code == 130
    assert _error(r) == "error: interrupted; nothing was written to the output"


def test_an_error_before_any_work_is_printed_alone(tmp_path, dataset):
    """No empty progress bar, no blank line above the message."""
    r = runner.invoke(app, ["prepare-chat", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "ds")])
    assert (r.exit_code, r.output) == (1, f"error: input file {tmp_path / 'missing.jsonl'} does not exist\n")
    r = runner.invoke(app, ["pack", str(dataset.output_dir), "-o", str(tmp_path / "p"), "--block-size", "0"])
    assert (r.exit_code, r.output) == (2, "error: --block-size must be at least 3 (a row of 4 tokens, <|USER|> <|END|> "
                                          "<|ASSISTANT|> <|END|>, is the smallest that can train a reply), got 0\n")
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["verify", str(tmp_path / "empty")])
    assert (r.exit_code, r.output) == (1, f"error: {tmp_path / 'empty'} holds no dataset: expected train/shard_*/ "
                                          f"folders or train/tokens.bin\n")


def test_an_empty_input_says_it_is_empty(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    r = runner.invoke(app, ["prepare-chat", str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "ds"), "-j", "1"])
    assert (r.exit_code, r.output) == (1, f"error: no records in {tmp_path / 'empty.jsonl'} (an empty file, only "
                                          f"blank lines, or []); nothing to write. Give JSONL (one conversation per "
                                          f"line) or a JSON array of conversations\n")
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_token_dtype_numpy_does_not_know_is_a_usage_error(dataset, command):
    r = runner.invoke(app, [command, str(dataset.output_dir), "--token-dtype", "foo"])
    assert (r.exit_code, r.output) == (2, "error: --token-dtype must be uint16 or uint32, got 'foo'\n")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_truncated_sources_idx_is_named_not_an_index_error(tmp_path, dataset):
    ds = _copy(dataset.output_dir, tmp_path / "ds")
    sources = ds / "train" / "shard_00000" / "sources.idx"
    sources.write_bytes(sources.read_bytes()[:8])
    message = (f"error: {ds}: train/shard_00000/sources.idx: 1 record numbers for 6 episodes: there must be exactly "
               f"one per episode. To fix: re-create the dataset with `sftdata prepare-chat` / `sftdata prepare-tool` "
               f"(1 more problem(s)). Run `sftdata verify {ds}` for the full report\n")
    for argv in (["replay-order", str(ds), "--batch-size", "2"], ["pack", str(ds), "-o", str(tmp_path / "p"), "-q"],
                 ["inspect", str(ds), "--record", "1"]):
        r = runner.invoke(app, argv)
        assert (r.exit_code, r.output) == (1, message), argv


def test_inspect_refuses_a_packed_dataset_with_a_damaged_segment_index(tmp_path, dataset):
    packed = tmp_path / "packed"
    pack(dataset.output_dir, packed, PackOptions(block_size=15))
    seg = packed / "train" / "shard_00000" / "segments.idx"
    seg.write_bytes(b"\xff" * seg.stat().st_size)  # every field 2**64 - 1
    r = runner.invoke(app, ["inspect", str(packed)])
    assert r.exit_code == 1
    assert r.output.startswith(f"error: {packed}: train/shard_00000/segments.idx")
    assert r.output.endswith(f"Run `sftdata verify {packed}` for the full report\n")


def test_an_unexpected_exception_is_one_line_unless_debugging(tmp_path, dataset, monkeypatch):
    def broken(*a, **k):
        raise ValueError("boom")

    monkeypatch.setattr(inspect_cmd, "overview", broken)
    r = runner.invoke(app, ["inspect", str(dataset.output_dir)])
    assert (r.exit_code, r.output) == (1, "error: internal error (ValueError: boom). This is a bug in sftdata: please "
                                          "report it with the command line. If a dataset is involved, `sftdata "
                                          "verify DATASET` may say what is wrong with it. SFTDATA_DEBUG=1 shows the "
                                          "traceback\n")
    monkeypatch.setenv("SFTDATA_DEBUG", "1")
    r = runner.invoke(app, ["inspect", str(dataset.output_dir)])
    assert isinstance(r.exception, ValueError) and str(r.exception) == "boom"


def test_overwrite_never_deletes_a_folder_that_is_not_a_dataset(tmp_path, dataset):
    """`-o ~ --overwrite` (or the inputs' own folder) must not delete the user's files."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.txt").write_text("years of work")
    src = write_jsonl(home / "chats.jsonl", [chat("q", "a")])
    message = (f"error: {home} is not an sftdata dataset (no dataset_metadata.json, and not empty): --overwrite "
               f"replaces only a dataset, never other files (they would be deleted). It holds: chats.jsonl, thesis.txt. "
               f"Choose another --output-dir, or remove the folder yourself\n")
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(home), "--overwrite", "-j", "1"])
    assert (r.exit_code, r.output) == (1, message)
    r = runner.invoke(app, ["pack", str(dataset.output_dir), "-o", str(home), "--overwrite", "-q"])
    assert (r.exit_code, r.output) == (1, message)
    assert sorted(p.name for p in home.iterdir()) == ["chats.jsonl", "thesis.txt"]
    # a dataset, or an empty folder, is replaced as before
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", _copy(dataset.output_dir, tmp_path / "old_ds")):
        r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(target), "--overwrite", "-j", "1", "-q"])
        assert r.exit_code == 0, r.output
        assert (target / "dataset_metadata.json").is_file()


def test_a_bad_item_of_a_json_array_is_named_as_that_item(tmp_path):
    good = orjson.dumps(chat("q", "a")).decode()
    src = tmp_path / "chats.json"
    src.write_text(f'[{good},\n  {{"messages": [1 2]}},\n {good}]')
    out = tmp_path / "ds"
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(out), "-j", "1", "-q"])
    assert (r.exit_code, r.output) == (0, "")
    what = ("item 1 of the JSON array is not valid JSON: unexpected character, expected ',' or ']' (line 1, column 17 "
            "of the item's text); each item of the array must be one JSON object (one record): fix that item, or "
            "remove it")
    (reject,) = [orjson.loads(line) for line in (out / "rejects.jsonl").read_bytes().splitlines()]
    assert (reject["where"], reject["reason"], reject["message"]) == (f"{src}:item 1", "invalid_json", what)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "strict"), "-j", "1", "--strict"])
    assert (r.exit_code, _error(r)) == (1, f"error: {src}:item 1: {what} (--strict stops at the first bad record; "
                                           f"drop --strict to skip and count bad records)")


def test_a_bad_line_of_jsonl_is_still_named_as_a_line(tmp_path):
    src = tmp_path / "chats.jsonl"
    src.write_text(orjson.dumps(chat("q", "a")).decode() + '\n{"messages": [1 2]}\n')
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-j", "1", "--strict"])
    assert (r.exit_code, _error(r)) == (1, f"error: {src}:line 2: not valid JSON (unexpected character, expected ',' "
                                           f"or ']': line 1 column 17 (char 16)); each line must hold one JSON object "
                                           f"(--strict stops at the first bad record; drop --strict to skip and count "
                                           f"bad records)")


def test_every_tokenizer_mistake_is_one_line(tmp_path):
    """A mistyped folder, a misspelt tiktoken name: exit 1 and one line saying what was
    looked for (issue 41), never tiktoken's own text with its literal \\n."""
    src = tmp_path / "c.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}\n')
    for spec, start in ((tmp_path / "typo", f"error: no such file or folder: {tmp_path / 'typo'}; check the path."),
                        ("qwen3", "error: unknown tokenizer 'qwen3': no file or folder of that name, and not a "
                                  "tiktoken encoding")):
        r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(spec)])
        assert r.exit_code == 1 and r.output.startswith(start) and r.output.count("\n") == 1, r.output
        assert "\\n" not in r.output and "latest" not in r.output and not (tmp_path / "ds").exists()
