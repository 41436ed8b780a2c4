"""The torch backend and the iterable form under torch DataLoader workers."""

import subprocess
import sys

import pytest
from loader_util import make_dataset

from sftdata.loader import LoaderConfig, make_loader

LENGTHS = [3, 5, 1, 12, 4, 7, 2, 9, 6, 10, 3, 8]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("d") / "ds", LENGTHS, shard_tokens=15)


def test_import_loader_needs_numpy_only():
    code = ("import sys, sftdata.loader, sftdata.order, sftdata.config, sftdata.audit; "
            "print(sorted(m for m in ('torch', 'typer', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_numpy_iterable_equals_get_batch(ds):
    cfg = LoaderConfig(batch_size=3, block_size=6, use_loss_mask=True, epoch_drop_last=False)
    ref = make_loader(cfg, ds, backend="numpy")
    expected = [ref.get_batch("train") for _ in range(7)]
    loader = make_loader(cfg, ds, backend="numpy")
    loader.get_batch("train")
    got = list(loader.iterable("train", num_steps=6))  # starts at the loader's current step (1)
    assert len(got) == 6
    for g, e in zip(got, expected[1:]):
        assert all(a.tolist() == b.tolist() for a, b in zip(g, e))


def test_torch_backend_dtypes_and_values(ds):
    torch = pytest.importorskip("torch")
    cfg = LoaderConfig(batch_size=3, block_size=6, use_loss_mask=True)
    t = make_loader(cfg, ds, backend="torch")
    n = make_loader(cfg, ds, backend="numpy")
    auto = make_loader(cfg, ds)  # auto = torch when installed
    for _ in range(3):
        x, y, m = t.get_batch("train")
        nx, ny, nm = n.get_batch("train")
        ax, _, _ = auto.get_batch("train")
        assert (x.dtype, y.dtype, m.dtype) == (torch.int64, torch.int64, torch.float32)
        assert x.device.type == "cpu" and isinstance(ax, torch.Tensor)
        assert x.tolist() == nx.tolist() and y.tolist() == ny.tolist() and m.tolist() == nm.tolist()


def test_torch_dataloader_with_two_workers_gives_the_same_batches_in_order(ds, tmp_path):
    torch = pytest.importorskip("torch")
    cfg = LoaderConfig(batch_size=2, block_size=6, use_loss_mask=True, epoch_drop_last=False)
    ref = make_loader(cfg, ds, backend="numpy")
    expected = [ref.get_batch("train") for _ in range(9)]
    loader = make_loader(cfg, ds, backend="numpy", audit_dir=tmp_path / "audit")
    it = loader.iterable("train", start_step=2, num_steps=7, torch=True)
    dl = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    got = list(dl)
    assert len(got) == 7
    for g, e in zip(got, expected[2:]):
        assert all(isinstance(a, torch.Tensor) and a.tolist() == b.tolist() for a, b in zip(g, e))
