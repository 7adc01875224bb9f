"""The target's load, watched: EXTEND_TIMEOUT_USEC on a real AF_UNIX datagram socket (NOTIFY_SOCKET)
while the load makes progress, none while it is stuck, and the progress in status.json.

The tiny target loads in milliseconds, so a slow disk is simulated: before the real loader runs,
the shard file is mapped (as safetensors maps it) and its pages are touched a few at a time with
pauses; the watcher measures those pages through /proc/self/smaps as it does in a real load. The
slow disk reads its next pages only once the watcher has published what was read so far, so the
progress seen does not depend on how busy the machine is."""

import json
import mmap
import socket
import sys
import threading
import time

import pytest
from flashfleet.contract import layout
from flashfleet.contract import status as contract
from flashfleet_trainer import target as target_mod
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.launch import run
from flashfleet_trainer.loadwatch import LoadWatch, mapped_bytes, shard_files, stall_seconds
from flashfleet_trainer.metrics import Status
from flashfleet_trainer.notify import Notifier

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
PAGE = mmap.PAGESIZE


class Listener:
    """A systemd stand-in: every datagram on the socket, with the time it arrived."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.got, self._stop = [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            try:
                self.got.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                if self._stop.is_set():  # every datagram sent before close() has been received
                    return

    def close(self):
        self._stop.set()
        self.thread.join()
        self.sock.close()

    def extends(self):
        return [(t, m) for t, m in self.got if m.startswith("EXTEND_TIMEOUT_USEC=")]


def _touch(mm, start, end, pause, chunks, between=None):
    step = max(PAGE, (end - start) // chunks // PAGE * PAGE)
    for off in range(start, end, step):
        for p in range(off, min(end, off + step), PAGE):
            mm[p]  # noqa: B018 - reading the byte faults the page in
        if between:
            between()
        time.sleep(pause)


def _caught_up(watch, timeout=10.0):
    """Wait until the watcher has sampled every byte read so far."""
    deadline = time.monotonic() + timeout
    while any(watch.read[p] < n for p, n in mapped_bytes(watch.sizes, watch.before).items()) and time.monotonic() < deadline:
        time.sleep(0.01)


def _published(watch, status_file, timeout=30.0):
    """Wait until the watcher has sent and written (status.json) every byte read so far: the
    handshake that lets a slow disk go on only once its progress has been seen."""
    def behind():
        read = sum(min(n, watch.sizes[p]) for p, n in mapped_bytes(watch.sizes, watch.before).items())
        try:
            return json.loads(status_file.read_text())[contract.LOAD]["bytes_loaded"] < read
        except (OSError, ValueError, KeyError):
            return True
    deadline = time.monotonic() + timeout
    while behind() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_slow_load_of_the_tiny_target_extends_and_reports(trainer_argv, trainer_tiny, tmp_path, monkeypatch):
    out = tmp_path / "run"
    listener = Listener(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv(contract.LOAD_STALL_ENV, "7")
    monkeypatch.setattr(contract, "LOAD_TICK_S", 0.02)
    (shard,) = shard_files(trainer_tiny / "model")
    seen = []  # status.json as a reader sees it while the load goes on
    real = target_mod.load_target_model
    watches = []  # the LoadWatch that run() starts
    enter = LoadWatch.__enter__
    monkeypatch.setattr(LoadWatch, "__enter__", lambda self: watches.append(self) or enter(self))

    def look():  # each pause: once the watcher has published the pages read so far (sent, written)
        _published(watches[0], out / layout.STATUS)
        seen.append(json.loads((out / layout.STATUS).read_text()))

    def slow_disk(model_dir, device, dtype):
        with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as mm:
            _touch(mm, 0, len(mm), 0.15, 6, look)
            return real(model_dir, device, dtype)

    monkeypatch.setattr(target_mod, "load_target_model", slow_disk)
    try:
        assert run(parse_args(trainer_argv("--max-steps", "1", out=out)), log=lambda s: None) == 0
    finally:
        listener.close()
    ext = listener.extends()
    assert {m for _t, m in ext} == {"EXTEND_TIMEOUT_USEC=7000000"}
    # the first when the load starts, the last when it returned, and the progress in between
    assert len(ext) >= 4, listener.got
    progress = [m for _t, m in listener.got if m.startswith("STATUS=loading target: ")]
    loaded = [float(m.split(", ")[1].split("/")[0]) for m in progress]
    assert len(progress) >= 3 and loaded == sorted(loaded) and loaded[-1] > loaded[0], progress
    assert progress[-1].endswith("(loaded)") and progress[-1].startswith("STATUS=loading target: 1/1 shards")
    ready = next(i for i, (_t, m) in enumerate(listener.got) if m.startswith("READY=1"))
    assert ext[-1][0] <= listener.got[ready][0]
    during = [s[contract.LOAD]["bytes_loaded"] for s in seen if s["phase"] == "loading"]
    # (the kernel maps a file's pages in folios of up to a few hundred KiB: coarse on a tiny shard)
    assert len(during) == len(seen) >= 5 and during == sorted(during) and during[-1] > during[0], during
    assert all(s[contract.LOAD]["bytes_total"] == shard.stat().st_size and not s[contract.LOAD]["done"] for s in seen)
    final = json.loads((out / layout.STATUS).read_text())
    assert final["phase"] == "completed"
    assert final[contract.LOAD] | {"elapsed_s": 0} == {"shards_loaded": 1, "shards_total": 1, "done": True, "elapsed_s": 0,
                                                      "bytes_loaded": shard.stat().st_size,
                                                      "bytes_total": shard.stat().st_size}
    assert final[contract.LOAD]["elapsed_s"] >= 0.5


def test_a_stuck_load_gets_no_more_extensions(trainer_tiny, tmp_path, monkeypatch):
    listener = Listener(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    (shard,) = shard_files(trainer_tiny / "model")
    status = Status(tmp_path)
    try:
        with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as mm:
            with LoadWatch(trainer_tiny / "model", Notifier(), status, stall_s=0.5, tick_s=0.02) as watch:
                half = len(mm) // 2 // PAGE * PAGE
                _touch(mm, 0, half, 0.1, 3)
                _caught_up(watch)  # a watcher thread late on a busy machine saw the last read after this
                stuck = time.monotonic()
                time.sleep(1.5)  # reads nothing: stuck
                resumed = time.monotonic()
                _touch(mm, half, len(mm), 0.1, 3)
    finally:
        listener.close()
    times = [t for t, _m in listener.extends()]
    assert times[0] < stuck and any(t < stuck for t in times[1:]), "extended while it progressed"
    # Nothing is read for 1.5 s: a watcher that extended on a timer, or on every look, would send
    # several in that window (a look every 20 ms, stall_s 0.5). One is let through: on a busy machine
    # one extension once arrived in it (a thread late by more than 0.3 s with the last progress's
    # datagram, or the kernel mapping more of the file on its own: the run did not tell which).
    late = [t - stuck for t in times if stuck + 0.3 < t < resumed]
    assert len(late) <= 1, f"extended while nothing is read: {late} s after the reads stopped"
    assert len([t for t in times if t > resumed]) >= 2, "extended again once it moved (and at the end)"
    assert json.loads((tmp_path / layout.STATUS).read_text())[contract.LOAD]["done"]


def test_a_mapping_read_before_the_load_is_not_its_progress(trainer_tiny, tmp_path):
    """A mapping of the shard left from an earlier load (a model not yet freed) is resident in full;
    the load that starts now has read nothing of it."""
    (shard,) = shard_files(trainer_tiny / "model")
    size = shard.stat().st_size
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as old:
        _touch(old, 0, len(old), 0, 1)
        held = mapped_bytes([shard])[str(shard)]
        assert held >= size - 2 * PAGE  # resident in full, as the watcher sees it
        with LoadWatch(trainer_tiny / "model", Notifier(), Status(tmp_path), stall_s=5, tick_s=0.02) as watch:
            time.sleep(0.1)
            assert watch.record()["bytes_loaded"] == 0 and watch.record()["shards_loaded"] == 0
            with open(shard, "rb") as g, mmap.mmap(g.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as new:
                new[0]  # noqa: B018 - the load's first page (and the folio around it)
                _caught_up(watch)
                gained = mapped_bytes([shard])[str(shard)] - held  # the new mapping's pages only
                assert 0 < watch.record()["bytes_loaded"] == gained, (watch.record(), gained)


def test_stall_override_is_checked(monkeypatch):
    monkeypatch.setenv(contract.LOAD_STALL_ENV, "900")
    assert stall_seconds() == 900
    for bad in ("soon", "0", "-5", "inf", "nan"):
        monkeypatch.setenv(contract.LOAD_STALL_ENV, bad)
        with pytest.raises(ConfigError, match=contract.LOAD_STALL_ENV):
            stall_seconds()
