"""Audit lines (the documented format of docs/LOADER.md) and checking a log against the
replayed order."""

import re

import numpy as np
import pytest

from sftdata.errors import InputError, UsageError
from sftdata.order.audit import AuditLog, check_audit, format_line, format_value, parse_line, read_log
from sftdata.order.batches import BatchOrder

DOCUMENTED_LINES = [
    "2026-01-03T16:44:19.628Z | TRAINING | INFO | action=dataset_load | epoch_seed=42 | epoch_shuffle=true "
    "| num_train_episodes=504",
    '2026-01-03T16:44:19.629Z | TRAINING | INFO | action=epoch_start | epoch=0 | seed=42 | '
    'first_episode_ids="[173, 274, 489, 72, 305, 76, 475, 140, 469, 498]" | num_episodes=504',
]


def test_the_documented_lines_parse():
    a, b = (parse_line(s, i + 1) for i, s in enumerate(DOCUMENTED_LINES))
    assert (a.timestamp, a.category, a.level, a.action) == ("2026-01-03T16:44:19.628Z", "TRAINING", "INFO",
                                                           "dataset_load")
    assert a.fields == {"epoch_seed": "42", "epoch_shuffle": "true", "num_train_episodes": "504"}
    assert b.action == "epoch_start" and b.line == 2
    assert b.fields["first_episode_ids"] == "[173, 274, 489, 72, 305, 76, 475, 140, 469, 498]"


def test_the_documented_example_order_checks_out(tmp_path):
    # the ids in the documented example are RandomState(42).permutation(504)[:10]
    assert np.random.RandomState(42).permutation(504)[:10].tolist() == [
        173, 274, 489, 72, 305, 76, 475, 140, 469, 498]
    log = tmp_path / "audit_x.log"
    log.write_text("\n".join(DOCUMENTED_LINES) + "\n")
    res = check_audit(log, BatchOrder(np.arange(504), batch_size=8, seed=42))
    assert res.ok and res.checked == 1 and res.epochs == [0] and res.mismatches == []


def test_format_and_round_trip():
    line = format_line("epoch_start", {"split": "train", "epoch": 3, "ok": True, "none": None,
                                       "ids": [5, 6], "path": "a b|c", "q": 'say "hi"'}, when=0)
    assert line == ('1970-01-01T00:00:00.000Z | TRAINING | INFO | action=epoch_start | split=train | epoch=3 | '
                    'ok=true | none=null | ids="[5, 6]" | path="a b|c" | q="say \\"hi\\""')
    e = parse_line(line)
    assert e.fields == {"split": "train", "epoch": "3", "ok": "true", "none": "null", "ids": "[5, 6]",
                        "path": "a b|c", "q": 'say "hi"'}
    assert format_value("") == '""' and format_value(False) == "false"


@pytest.mark.parametrize("text", ["hello", "a | b | c", "a | b | c | epoch=1", 'a | b | c | action="x',
                                  "a | b | c | epoch=1 ~ x"])
def test_non_audit_lines(text):
    assert parse_line(text) is None


def test_audit_log_appends_to_audit_star_log(tmp_path):
    log = AuditLog(tmp_path / "logs" / "audit")
    log.event("dataset_load", epoch_seed=1)
    log.event("epoch_start", split="train", epoch=0)
    assert re.fullmatch(r"audit_\d{8}T\d{6}Z_p\d+\.log", log.path.name)
    entries, bad = read_log(log.path)
    assert [e.action for e in entries] == ["dataset_load", "epoch_start"] and bad == []
    with pytest.raises(InputError, match="does not exist"):
        read_log(tmp_path / "nope.log")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="cannot create the audit folder"):
        AuditLog(blocker / "sub")


def _log(tmp_path, order: BatchOrder, epochs=(0, 1, 2)):
    log = AuditLog(tmp_path, filename="audit_t.log")
    log.event("dataset_load", epoch_seed=order.seed, epoch_shuffle=order.shuffle)
    for e in epochs:
        log.event("epoch_start", split="train", epoch=e, seed=order.seed + e, num_episodes=order.n,
                  first_episode_ids=order.epoch_order(e)[:10].tolist())
        log.event("epoch_start", split="val", epoch=e, seed=order.seed + e, num_episodes=3,
                  first_episode_ids=np.random.RandomState(order.seed + e).permutation(3).tolist())
    return log.path


def test_check_catches_a_tampered_id(tmp_path):
    o = BatchOrder(np.arange(100), batch_size=4, seed=5)
    path = _log(tmp_path, o)
    assert check_audit(path, o).ok
    lines = path.read_text().splitlines()
    ids = o.epoch_order(1)[:10].tolist()
    forged = list(ids)
    forged[4] = ids[4] + 1 if ids[4] + 1 not in ids else 999
    lines[3] = lines[3].replace(str(ids).replace(",", ","), str(forged))
    assert lines[3] != path.read_text().splitlines()[3]
    path.write_text("\n".join(lines) + "\n")
    res = check_audit(path, o)
    assert not res.ok and res.checked == 3 and len(res.mismatches) == 1
    m = res.mismatches[0]
    assert (m.line, m.epoch, m.what) == (4, 1, "first_episode_ids")
    assert m.message == (f"line 4: epoch 1: first_episode_ids differ at position 4: the log has {forged[4]}, "
                         f"the replay gives {ids[4]}")


def test_check_reports_seed_count_and_format(tmp_path):
    o = BatchOrder(np.arange(100), batch_size=4, seed=5)
    path = _log(tmp_path, o, epochs=(0,))
    text = path.read_text().replace("| seed=5 |", "| seed=6 |").replace("num_episodes=100", "num_episodes=99")
    path.write_text(text + "garbage line\n")
    res = check_audit(path, o)
    whats = sorted(m.what for m in res.mismatches)
    assert whats == ["format", "num_episodes", "seed"]
    assert any(m.message == "line 2: epoch 0: seed is 6 in the log, the replay gives 5" for m in res.mismatches)
    assert any(m.message.startswith("line 4: not an audit line") for m in res.mismatches)


def test_replaying_with_another_seed_mismatches(tmp_path):
    path = _log(tmp_path, BatchOrder(np.arange(100), batch_size=4, seed=5), epochs=(0,))
    res = check_audit(path, BatchOrder(np.arange(100), batch_size=4, seed=6))
    assert {m.what for m in res.mismatches} == {"epoch_seed", "seed", "first_episode_ids"}
    assert res.as_dict()["ok"] is False


def test_val_split_is_checked_separately(tmp_path):
    path = _log(tmp_path, BatchOrder(np.arange(100), batch_size=4, seed=5), epochs=(0, 1))
    res = check_audit(path, BatchOrder(np.arange(3), batch_size=1, seed=5), split="val")
    assert res.ok and res.checked == 2
    res = check_audit(path, BatchOrder(np.arange(3), batch_size=1, seed=5, shuffle=False), split="val")
    assert not res.ok and {m.what for m in res.mismatches} >= {"epoch_shuffle"}


def test_empty_log_is_not_ok_and_random_mode_refused(tmp_path):
    p = tmp_path / "audit_e.log"
    p.write_text("")
    res = check_audit(p, BatchOrder(np.arange(5), batch_size=1))
    assert res.checked == 0 and not res.ok
    with pytest.raises(UsageError, match="needs batch_sampling_mode=epoch"):
        check_audit(p, BatchOrder(np.arange(5), batch_size=1, sampling="random"))
