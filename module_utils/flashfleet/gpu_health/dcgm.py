"""`dcgmi diag -r N`: NVIDIA DCGM's diagnostic, its table read into one result per test and GPU.

dcgmi prints a two-column table (`| Diagnostic | Result |`) after "Successfully ran diagnostic for
group.": metadata rows (DCGM Version, Driver Version Detected), section bars (`|----- Deployment`),
then one row per test with Pass, Fail, Warn, Skip or Not Run (dcgmi's DcgmiResult names). DCGM 3
writes a failed test's GPUs in the result (`Fail - GPU 3`) or in its Warning/Error rows ("...for
GPU 0 is..."); DCGM 4 writes one continuation row per GPU (`GPU0: Fail`). Both are read; a failed
test that names no GPU fails every GPU of the diagnostic (a deployment problem of the host).
Anything else (the host engine not running: "Error: Unable to connect...") is `error`, not a
GPU's failure: the check then says DCGM could not judge.
"""

from __future__ import annotations

import re

RESULTS = ("Pass", "Fail", "Warn", "Skip", "Not Run")
HEADER = "Successfully ran diagnostic for group."


def command(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(int(level))]


_RESULT = re.compile(r"^(?P<r>Pass|Fail|Warn|Skip|Not Run)\b(?:\s*-\s*(?P<who>.*))?$")
_ENTITY = re.compile(r"\bGPU\s?(?P<i>\d+)\s*:\s*(?P<r>Pass|Fail|Warn|Skip|Not Run)\b")
_NOTE = re.compile(r"^(?:Warning|Error|Info)\b")  # a message row's label (not a test: "Inforom" is one)
_GPU_NAMED = re.compile(r"\bGPU(?:s|\s+Id)?:?\s?(?P<i>\d+)\b")


def parse(text: str) -> dict:
    """{"ran": bool, "error": str|None, "version": str|None, "tests": [{"name", "result", "gpus":
    {index: result}, "named": [indices the result or messages name], "message"}]}."""
    if HEADER not in text:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
        return {"ran": False, "error": first, "version": None, "tests": []}
    tests, version, current = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|") or s.startswith("|-----") or s.startswith("|====="):
            continue
        cells = s[1:-1].split("|") if s.endswith("|") else s[1:].split("|")
        if len(cells) < 2:
            continue
        # the result column's text after its one space of padding: a message wrapped at the
        # column's width continues on the next row exactly as printed (a leading space is a space)
        raw = "|".join(cells[1:])
        piece = (raw[1:] if raw.startswith(" ") else raw).rstrip()
        left, right = cells[0].strip(), piece.strip()
        if (left, right) == ("Diagnostic", "Result"):
            continue
        if left == "DCGM Version":
            version = right
        m = _RESULT.match(right)
        if left and m and not _NOTE.match(left):
            current = {"name": left, "result": m.group("r"), "gpus": {}, "named": [], "message": ""}
            who = m.group("who") or ""
            current["named"] = [int(i) for i in re.findall(r"\d+", who)] if "GPU" in who else []
            tests.append(current)
            continue
        if left and not _NOTE.match(left) and not left.startswith("GPU"):
            current = None  # a metadata row (versions, device ids) and its continuation rows
            continue
        if current is None:
            continue
        for e in _ENTITY.finditer(right):
            current["gpus"][int(e.group("i"))] = e.group("r")
        if not _ENTITY.search(right):
            if (_NOTE.match(left) or left.startswith("GPU")) and current["message"]:
                current["message"] += "; "  # a new message row, not a wrapped piece
            current["message"] += (f"{left}: " if left.startswith("GPU") else "") + piece
    for t in tests:
        t["message"] = re.sub(r"\s+", " ", t["message"]).strip()
        t["named"] = sorted(set(t["named"]) | {int(i) for i in _GPU_NAMED.findall(t["message"])})
    return {"ran": True, "error": None, "version": version, "tests": tests}


def failures(parsed: dict, indices: list[int]) -> dict[int, list[str]]:
    """{GPU index: ["<test>: <message>", ...]} of the failed tests among `indices` (the GPUs the
    diagnostic ran on)."""
    out: dict[int, list[str]] = {}
    for t in parsed.get("tests", []):
        if t["result"] != "Fail" and "Fail" not in t["gpus"].values():
            continue
        if t["gpus"]:
            who = [i for i, r in t["gpus"].items() if r == "Fail"]
        else:
            who = t["named"] or list(indices)
        for i in who:
            if i in indices:
                out.setdefault(i, []).append(f"{t['name']}: {t['message'] or 'Fail'}"[:300])
    return out
