"""Connecting to Ray (engine/cluster.py): a malformed address or one nobody answers at is one
line naming the address, where it came from and the fix, before Ray is asked (Ray itself
retries for minutes, printing its log lines, deaf to SIGTERM); Ray's SIGTERM handler never
replaces the command's. No cluster is started: Ray is replaced by a stand-in that fails the
test if it is asked to connect where it should not be."""

import signal
import socket
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine import cluster
from sftdata.errors import ConfigError
from sftdata.tasks import get_result
from tests.helpers.paths import ROOT

runner = CliRunner()
FIX = ("Start the cluster there (`ray start --head`), give its head's HOST:PORT (ray start prints it), or drop "
       "--ray-address and unset RAY_ADDRESS for a local cluster")


def closed_port() -> int:
    """A port of this host nobody listens at (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandInRay:
    """What ``connect`` uses of the ``ray`` module. ``init`` does what Ray's does to the
    process's SIGTERM handler (replaces it with one that exits), and records its calls."""

    def __init__(self):
        self.inits = []

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.inits.append(kw["address"])
        signal.signal(signal.SIGTERM, lambda *_: exit(15))

    def cluster_resources(self):
        return {"CPU": 3.0}


@pytest.fixture
def ray(monkeypatch):
    stand_in = StandInRay()
    monkeypatch.setattr(cluster, "import_ray", lambda: stand_in)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return stand_in


@pytest.mark.parametrize("address", ["not-an-address", "host:port", "10.0.0.5:99999", "10.0.0.5:0", "ray://",
                                     ":6379", "http://10.0.0.5:6379/x"])
def test_a_malformed_address_is_one_error_naming_it_and_ray_is_not_asked(ray, address):
    with pytest.raises(ConfigError) as e:
        cluster.connect(address)
    assert str(e.value) == (f"--ray-address {address!r} is not a Ray address: give the HOST:PORT of the cluster's "
                            f"head (e.g. 10.0.0.5:6379), ray://HOST:PORT or auto, or drop --ray-address and unset "
                            f"RAY_ADDRESS for a local cluster")
    assert ray.inits == []


def test_an_address_nobody_answers_at_fails_at_once_naming_it(ray):
    port = closed_port()
    with pytest.raises(ConfigError) as e:
        cluster.connect(f"127.0.0.1:{port}")
    assert str(e.value) == f"cannot reach the Ray cluster at 127.0.0.1:{port} (--ray-address): connection refused. {FIX}"
    assert ray.inits == []


def test_a_bad_ray_address_variable_is_named_as_the_variable(ray, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "not-an-address")
    with pytest.raises(ConfigError, match=r"^RAY_ADDRESS 'not-an-address' is not a Ray address: "):
        cluster.connect(None)
    assert ray.inits == []


class Terminated(KeyboardInterrupt):
    """What the command's SIGTERM handler raises (cli/app.py's)."""


def ours(signum, frame):
    raise Terminated(signum)


def test_auto_and_a_reachable_head_are_given_to_ray_and_its_sigterm_handler_is_not_kept(ray):
    """Ray's init replaces the SIGTERM handler with one that exits; the command's comes
    back, keeping what it raises (Ray turns an exception raised in its wait into a plain
    KeyboardInterrupt: ``get_result`` gives the SIGTERM's own back, exit 143, not 130)."""
    with socket.socket() as head:  # a head that accepts connections
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        old = signal.signal(signal.SIGTERM, ours)
        try:
            assert cluster.connect(address) == cluster.RayCluster(ray, 3, address)
            assert cluster.connect("auto").address == "auto"
            handler = signal.getsignal(signal.SIGTERM)
            assert handler.keeps_raised
            with pytest.raises(Terminated):
                handler(signal.SIGTERM, None)

            def ray_get(ref):  # Ray's wait: the handler runs inside it, its exception becomes Ctrl-C's
                try:
                    handler(signal.SIGTERM, None)
                except KeyboardInterrupt:
                    raise KeyboardInterrupt from None

            stand_in = SimpleNamespace(get=ray_get, exceptions=SimpleNamespace(RayTaskError=OSError,
                                                                             RayError=OSError))
            with pytest.raises(Terminated):
                get_result(stand_in, "ref")
            stand_in.get = lambda ref: (_ for _ in ()).throw(KeyboardInterrupt())  # a Ctrl-C stays one
            with pytest.raises(KeyboardInterrupt) as e:
                get_result(stand_in, "ref")
            assert type(e.value) is KeyboardInterrupt
        finally:
            signal.signal(signal.SIGTERM, old)
    assert ray.inits == [address, "auto"]


@pytest.mark.parametrize("how", ["option", "variable"])
def test_the_command_says_one_line_and_writes_nothing(ray, tmp_path, monkeypatch, how):
    pytest.importorskip("ray", reason="the ray extra is not installed: the command asks for it before any address")
    port = closed_port()
    out = tmp_path / "out"
    args = ["prepare-chat", str(ROOT / "sample_data" / "chat.jsonl"), "-o", str(out / "ds"), "--engine", "ray"]
    if how == "option":
        args += ["--ray-address", f"127.0.0.1:{port}"]
    else:
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    out.mkdir()
    r = runner.invoke(app, args)
    source = "--ray-address" if how == "option" else "RAY_ADDRESS"
    assert (r.exit_code, r.output) == (1, f"error: cannot reach the Ray cluster at 127.0.0.1:{port} ({source}): "
                                          f"connection refused. {FIX}\n")
    assert list(out.iterdir()) == [] and ray.inits == []


def test_a_cluster_already_connected_is_used_as_it_is(monkeypatch):
    connected = SimpleNamespace(is_initialized=lambda: True, cluster_resources=lambda: {"CPU": 8.0})
    monkeypatch.setattr(cluster, "import_ray", lambda: connected)
    assert cluster.connect("not-even-checked") == cluster.RayCluster(connected, 8, "not-even-checked")
