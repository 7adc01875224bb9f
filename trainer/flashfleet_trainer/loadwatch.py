"""The target's load, watched: progress in status.json and systemd's start timeout extended
while (and only while) the load makes progress.

Progress is measured, not assumed: safetensors maps each shard file into the process and the
loader touches its pages as it copies the tensors out, so the resident size of the mappings of
the target's shard files (/proc/self/smaps), less what they held when the load started, is how
much of each shard has been read, whatever does the reading (transformers' loader, its thread
pool, our lazy slices). A watcher thread looks every `tick_s`; each time more has been read it
sends EXTEND_TIMEOUT_USEC=<stall_s> and writes `load` into status.json (contract.status.LOAD_KEYS).
A load that reads nothing for `stall_s` gets no more extensions, so systemd fails the start (a
stuck load still fails). When the load returns, every shard counts as read, and one last
extension covers the way to READY (data, the first step). A checkpoint without safetensors shows
no byte progress: it gets the first and the last extension only, and otherwise TimeoutStartSec.
"""

import os
import threading
import time
from pathlib import Path

from flashfleet.contract import status as contract

from .errors import ConfigError

GIB = 2**30


def stall_seconds() -> float:
    """LOAD_STALL_S, or the unit's LOAD_STALL_ENV override."""
    text = os.environ.get(contract.LOAD_STALL_ENV, "")
    if not text:
        return float(contract.LOAD_STALL_S)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{contract.LOAD_STALL_ENV}={text!r} is not a positive number of seconds",
                          f"set it to e.g. {contract.LOAD_STALL_S} or unset it")
    return value


def shard_files(model_dir) -> list[Path]:
    """The target's safetensors shards that its load reads (a wrapped checkpoint's language model only)."""
    from .target import checkpoint_tensors, is_wrapped, text_tensor_files

    names = checkpoint_tensors(model_dir)
    files = text_tensor_files(names) if is_wrapped(names) else set(names.values())
    return sorted(Path(model_dir, f).resolve() for f in files)


def mappings(paths) -> dict[tuple[str, str], int]:
    """{(path, address range): resident bytes} for each of this process's mappings of those files,
    from /proc/self/smaps ({} elsewhere)."""
    want, out, current = {str(p) for p in paths}, {}, None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
                    current = (head[5].strip(), head[0]) if len(head) == 6 and head[5].strip() in want else None
                elif current is not None and head and head[0] == "Rss:":
                    out[current] = int(head[1]) * 1024
    except OSError:
        return {}
    return out


def mapped_bytes(paths, since=None) -> dict[str, int]:
    """{path: resident bytes of this process's mappings of it}; with `since` (an earlier `mappings`),
    only what each mapping gained since then."""
    since = since or {}
    out = {}
    for key, n in mappings(paths).items():
        out[key[0]] = out.get(key[0], 0) + max(0, n - since.get(key, 0))
    return out


class LoadWatch:
    """`with LoadWatch(model_dir, notifier, status): <load the target>`."""

    def __init__(self, model_dir, notifier, status, stall_s: float | None = None, tick_s: float | None = None):
        self.notifier, self.status = notifier, status
        self.tick_s = contract.LOAD_TICK_S if tick_s is None else tick_s
        self.stall_s = stall_seconds() if stall_s is None else stall_s
        self.files = shard_files(model_dir)
        self.sizes = {str(p): p.stat().st_size for p in self.files}
        self.read = dict.fromkeys(self.sizes, 0)  # the most of each shard seen resident
        # What the shards' mappings held when the load started (a model of an earlier load not yet
        # freed): read before this load, so only what they gain since counts.
        self.before: dict = {}
        self.t0 = self.last_progress = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="load-watch", daemon=True)

    def record(self, done: bool = False) -> dict:
        loaded = sum(min(self.read[p], n) for p, n in self.sizes.items())
        # a shard counts once all its pages but the header's were seen (or the load returned)
        full = sum(1 for p, n in self.sizes.items() if done or self.read[p] >= n - 2 * 4096 - 1)
        return dict(zip(contract.LOAD_KEYS, (full, len(self.sizes), sum(self.sizes.values()) if done else loaded,
                                             sum(self.sizes.values()), round(time.monotonic() - self.t0, 1), done),
                        strict=True))

    def line(self, rec: dict) -> str:
        unit, div = ("GiB", GIB) if rec["bytes_total"] >= GIB else ("MiB", 2**20)
        return (f"loading target: {rec['shards_loaded']}/{rec['shards_total']} shards, "
                f"{rec['bytes_loaded'] / div:.2f}/{rec['bytes_total'] / div:.2f} {unit}, {rec['elapsed_s']:.0f} s")

    def sample(self) -> bool:
        """Look once; True if more of the shards has been read since the last look."""
        more = False
        for path, n in mapped_bytes(self.sizes, self.before).items():
            if n > self.read[path]:
                self.read[path], more = n, True
        return more

    def _watch(self):
        while not self._stop.wait(self.tick_s):
            if self.sample():
                self.last_progress = time.monotonic()
                self.notifier.extend_timeout(self.stall_s)
                rec = self.record()
                self.notifier.status(self.line(rec))
                self.status.update(**{contract.LOAD: rec})

    def __enter__(self) -> "LoadWatch":
        self.t0 = self.last_progress = time.monotonic()
        self.before = mappings(self.sizes)
        self.notifier.extend_timeout(self.stall_s)
        self.status.update(phase="loading", **{contract.LOAD: self.record()})
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            rec = self.record(done=True)
            self.status.update(**{contract.LOAD: rec})
            self.notifier.status(self.line(rec) + " (loaded)")
            self.notifier.extend_timeout(self.stall_s)  # the way to READY: data, the first step
