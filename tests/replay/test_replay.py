"""The replay library: the segments of a packed dataset's steps, and vectorised CSV equal
to the csv module's."""

import csv
import io

import numpy as np
import pytest

from sftdata.errors import UsageError
from sftdata.loader import LoaderConfig, make_loader
from sftdata.replay.dataset import csv_bytes, replay_order
from sftdata.store import open_dataset, split_segments
from tests.helpers.loader import PACKED_BLOCK, make_packed


@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    return make_packed(source, tmp_path_factory.mktemp("packed") / "p")


def cfg(**kw):
    return LoaderConfig(**{"batch_size": 4, "block_size": PACKED_BLOCK, "use_loss_mask": True, "epoch_seed": 7, **kw})


def test_replay_order_lists_the_episodes_and_records_of_each_row(packed, source):  # noqa: F811
    loader = make_loader(cfg(), packed, backend="numpy")
    for _ in range(3):
        loader.get_batch()
    rows = loader.last_ids["train"]
    r = replay_order(packed, cfg(), step=2)
    seg = split_segments(open_dataset(packed).split("train"))
    want = seg.of_rows(rows)
    assert r.columns["row"].tolist() == want.row.tolist()
    assert r.columns["episode"].tolist() == want.episode.tolist()
    src = open_dataset(source).split("train").sources
    assert r.columns["record"].tolist() == src[want.episode].tolist()
    slot_of_row = {int(v): i for i, v in enumerate(rows)}
    assert r.columns["slot"].tolist() == [slot_of_row[v] for v in want.row.tolist()]
    assert set(r.columns["step"].tolist()) == {2}
    within = [int(np.sum(want.row[:j] == want.row[j])) for j in range(want.row.size)]
    assert r.columns["segment"].tolist() == within
    assert r.columns["length"].tolist() == want.length.tolist()
    whole = replay_order(packed, cfg())
    assert sorted(whole.columns["episode"].tolist()) == sorted(seg.episode.tolist())
    with pytest.raises(UsageError, match="one pass .epoch 0.; there is no epoch 1"):
        replay_order(packed, cfg(), epoch=1)
    with pytest.raises(UsageError, match=r"step 999 is outside the one pass over the rows \(steps 0..22\)"):
        replay_order(packed, cfg(), step=999)


def test_the_padding_rows_of_a_packed_step_have_no_segments(packed):
    """Without drop_last the last batch of the pass is completed with padding rows: the
    replay lists the segments of its real rows only, as the loader's batch holds them."""
    loader = make_loader(cfg(batch_size=5, epoch_drop_last=False), packed, backend="numpy")
    batches = list(loader)
    last = loader.last_ids["train"]
    assert len(batches) == 19 and last.tolist()[-3:] == [-1, -1, -1]  # 92 rows = 18 x 5 + 2
    r = replay_order(packed, cfg(batch_size=5, epoch_drop_last=False), step=18)
    assert sorted(set(r.columns["row"].tolist())) == sorted(last[:2].tolist())
    assert set(r.columns["slot"].tolist()) == {0, 1}
    whole = replay_order(packed, cfg(batch_size=5, epoch_drop_last=False))
    assert set(whole.columns["step"].tolist()) == set(range(19))  # every row trained in the one pass


def reference(columns) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = []
    for c in columns:
        if isinstance(c, tuple):
            cols.append([c[1][i] for i in c[0]])
        else:
            cols.append(["" if v < 0 else v for v in np.asarray(c).tolist()])
    w.writerows(zip(*cols))
    return buf.getvalue().encode()


@pytest.mark.parametrize("seed", range(5))
def test_csv_bytes_equals_the_csv_module(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    big = rng.integers(-1, 2**40, n)
    small = rng.integers(-1, 12, n)
    zeros = np.zeros(n, dtype=np.int64)
    names = ["shard_00000", "s1", "a_much_longer_shard_name", "x"]
    text = (rng.integers(0, len(names), n), names)
    cols = [small, text, big, zeros, np.full(n, -1), rng.integers(0, 10**9, n)]
    assert csv_bytes(cols) == reference(cols)


def test_csv_bytes_edge_values():
    v = np.array([0, 9, 10, 99, 100, 2**31 - 1, 2**31, 2**62, -1])
    assert csv_bytes([v]).decode().split("\n")[:-1] == ["0", "9", "10", "99", "100", str(2**31 - 1), str(2**31),
                                                        str(2**62), ""]
    assert csv_bytes([np.empty(0, np.int64), (np.empty(0, np.int64), ["a"])]) == b""
