"""sd_notify datagrams on a real AF_UNIX socket, path and abstract; the no-op notifier."""

import os
import socket

from flashfleet_trainer.notify import Notifier, NullNotifier


def _recv_all(sock):
    out = []
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_messages_arrive_on_path_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        notify = Notifier()
        assert notify.status("target 1/1 loaded")
        assert notify.ready()
        assert notify.watchdog()
        assert notify.stopping()
        assert notify.extend_timeout(300)
        got = _recv_all(s)
    assert got[0] == "STATUS=target 1/1 loaded"
    assert got[1].split("\n")[0] == "READY=1"
    assert got[2:] == ["WATCHDOG=1", "STOPPING=1", "EXTEND_TIMEOUT_USEC=300000000"]


def test_abstract_socket(monkeypatch):
    name = f"flashfleet-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert Notifier().watchdog()
        assert _recv_all(s) == ["WATCHDOG=1"]


def test_noop_without_socket_and_never_raises(monkeypatch, tmp_path):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert Notifier().ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert Notifier().watchdog() is False


def test_null_notifier_sends_nothing(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        null = Notifier.null()
        assert isinstance(null, NullNotifier) and isinstance(null, Notifier)
        assert not any([null.status("x"), null.ready(), null.watchdog(), null.stopping(), null.extend_timeout(1)])
        assert _recv_all(s) == []
