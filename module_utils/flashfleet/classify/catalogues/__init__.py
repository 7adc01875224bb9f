"""The layers' own catalogues of failures, as data (one module per layer, each an ENTRIES tuple of
entry.Entry), and the lookup the rules use. `python -m flashfleet.classify.catalogues` prints each
catalogue's size and what its entries prove (docs/diagnosis.md keeps the table).

Order matters where two catalogues could read one line: the specific libraries (NCCL, CUDA,
Triton, Python's exception classes, HTTP/S3) are searched before errno, whose messages ("Connection
refused") also appear inside theirs."""

from __future__ import annotations

import importlib
from collections import Counter

from .entry import Entry

# (module, where its lines are read), in lookup order; a module not written yet is skipped.
_MODULES = ("nccl", "cuda", "triton", "python_exc", "http", "errno", "signals", "systemd", "kernel", "xid")


def _load() -> dict[str, tuple[Entry, ...]]:
    out = {}
    for name in _MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            continue
        out[name] = tuple(module.ENTRIES)
    return out


CATALOGUES = _load()
ALL = tuple(e for entries in CATALOGUES.values() for e in entries)
_BY_WHERE = {where: tuple(e for e in ALL if e.where == where) for where in ("journal", "kernel", "systemd")}


def lookup(text: str, where: str = "journal", verdicts: set[str] | None = None) -> Entry | None:
    """The first entry (in catalogue order) whose pattern finds `text`, among those read in `where`
    (and proving one of `verdicts`, when given)."""
    for entry in _BY_WHERE.get(where, ()):
        if (verdicts is None or entry.verdict in verdicts) and entry.pattern.search(text):
            return entry
    return None


def sizes() -> list[tuple[str, int, Counter]]:
    """Each catalogue: its name, its size, and how many entries prove each verdict."""
    return [(name, len(entries), Counter(e.verdict for e in entries)) for name, entries in CATALOGUES.items()]


def main() -> int:
    total = 0
    print(f"{'catalogue':<12} {'entries':>7}  verdicts")
    for name, n, verdicts in sizes():
        total += n
        print(f"{name:<12} {n:>7}  " + ", ".join(f"{v} {c}" for v, c in verdicts.most_common()))
    print(f"{'all':<12} {total:>7}")
    return 0
