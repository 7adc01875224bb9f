"""The layers' own catalogues of failures, as data (one module per layer, each an ENTRIES tuple of
entry.Entry), and the lookup the rules use. `python -m flashfleet.classify.catalogues` prints each
catalogue's size and what its entries prove (docs/diagnosis.md keeps the table).

Order matters where two catalogues could read one line: the specific libraries (NCCL, CUDA,
Triton, Python's exception classes, HTTP/S3) are searched before errno, whose messages ("Connection
refused") also appear inside theirs."""

from __future__ import annotations

from collections import Counter

from . import cuda, errno, http, kernel, nccl, python_exc, signals, systemd, triton, xid
from .entry import Entry

# In lookup order (where each one's lines are read is its entries' `where`).
CATALOGUES = {module.__name__.rsplit(".", 1)[-1]: tuple(module.ENTRIES)
              for module in (nccl, cuda, triton, python_exc, http, errno, signals, systemd, kernel, xid)}
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
    def kind(verdict: str) -> str:
        return "gpu-xid-<n>" if verdict.startswith("gpu-xid-") else verdict
    return [(name, len(entries), Counter(kind(e.verdict) for e in entries)) for name, entries in CATALOGUES.items()]


def main() -> int:
    total = 0
    print(f"{'catalogue':<12} {'entries':>7}  verdicts")
    for name, n, verdicts in sizes():
        total += n
        print(f"{name:<12} {n:>7}  " + ", ".join(f"{v} {c}" for v, c in verdicts.most_common()))
    print(f"{'all':<12} {total:>7}")
    return 0
