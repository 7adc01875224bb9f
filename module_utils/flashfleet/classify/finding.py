"""A finding: a candidate verdict with the lines that prove it, its sentence and its action."""

from __future__ import annotations

from .signatures import ACTIONS, NEXT_STEPS, VERDICT_ACTIONS


class Finding:
    """A candidate verdict with its proof, its sentence (next_step) and its action."""

    def __init__(self, verdict: str, reason: str, lines: list[str], next_step: str | None = None,
                 action: str | None = None, **extra):
        self.verdict = verdict
        self.reason = " / ".join(part.strip() for part in reason.splitlines() if part.strip())
        self.lines = lines
        key = "gpu-xid" if verdict.startswith("gpu-xid-") else verdict
        self.action = action or VERDICT_ACTIONS.get(key, "investigate")
        self.next_step = next_step or NEXT_STEPS.get(key) or ACTIONS.get(self.action)
        self.extra = extra

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "evidence": self.lines,
                "next_step": self.next_step, "action": self.action, **self.extra}


def dedupe(lines: list[str], limit: int = 12) -> list[str]:
    out = []
    for line in lines:
        if line not in out:
            out.append(line)
    return out[:limit]

