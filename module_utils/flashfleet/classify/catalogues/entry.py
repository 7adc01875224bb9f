"""One entry of a layer's own catalogue of failures: what the layer calls it, how it is spelt in a
log, what it means for a training run, the verdict and action it proves, and where it comes from.

Catalogues are data (one module per layer: errno, signals, systemd, kernel, xid, nccl, cuda, http,
python); the rules read them through catalogues.lookup(). Every entry carries a `sample`, a line as
the layer itself prints it, from which tests/unit/test_diagnosis_catalogues.py synthesizes an
evidence document and checks the entry's verdict and key fact: a new entry is tested by being
written."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Where a layer's line is found in the evidence: the trainer's output (the unit's journal), the
# kernel log, or systemd's record of the unit (its properties: Result=, ExecMainStatus=).
WHERE = ("journal", "kernel", "systemd")


@dataclass(frozen=True)
class Entry:
    layer: str          # the catalogue: "errno", "signal", "systemd-result", "kernel", "xid", "nccl", "cuda", ...
    name: str           # the layer's own name for it: ENOSPC, SIGBUS, cudaErrorIllegalAddress, ncclRemoteError
    pattern: re.Pattern  # how a log line spells it (matched with .search on one line)
    meaning: str        # what it means for a training run, in one sentence (the reason's words)
    verdict: str        # the verdict it proves (a classify.VERDICTS name; "crash" when it only explains one)
    action: str         # classify.ACTIONS key: what to do next
    source: str         # the layer's own documentation or header this entry comes from
    sample: str         # a line as the layer prints it: the generated test's evidence
    where: str = "journal"  # WHERE: the evidence source its lines are read from
    key: str = ""       # the fact a verdict must quote (default: the name)
    number: int | None = None  # the layer's numeric code, where it has one (errno 28, signal 7, Xid 79, cudaError 700)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.where not in WHERE:
            raise ValueError(f"{self.layer}/{self.name}: where={self.where!r} is not one of {WHERE}")
        if not self.pattern.search(self.sample):
            raise ValueError(f"{self.layer}/{self.name}: its sample does not match its own pattern")

    @property
    def fact(self) -> str:
        return self.key or self.name

    @property
    def said(self) -> str:
        """The entry in a reason's words: its name, then what it means."""
        return self.meaning if self.meaning.startswith(self.name) else f"{self.name}: {self.meaning}"
