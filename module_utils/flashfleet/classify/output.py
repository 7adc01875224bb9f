"""Reader of the trainer's own output (the app lines of an invocation's journal): host signatures
it printed, its last exception kept whole, NCCL's error with its `Last error:`, native crashes,
what a line means (HINTS)."""

from __future__ import annotations

import re

from .journal import jline
from .signatures import (
    CRASH_SIGNALS,
    FAULT_TIME_TIE_S,
    HINTS,
    HOST_SIGNATURES,
    NCCL_LAST_ERROR_ACTIONS,
    RE_BACKTRACE_LIB,
    RE_CHILD_SIGNAL,
    RE_COREDUMP,
    RE_EXCEPTION,
    RE_EXCEPTION_ANY,
    RE_FATAL,
    RE_FRAME_LIB,
    RE_GLIBC,
    RE_LINE_PREFIX,
    RE_LOG_RECORD,
    RE_NCCL_ERROR,
    RE_SMASHING,
    RE_SPECIFIC,
    RE_STACK_LIB,
    RE_TERMINATE,
    RE_WHAT,
    SIGNAL_NAMES,
)


def strip_prefix(line: str) -> str:
    """A rank's line without its launcher prefix (`[rank3]: `, `10: `)."""
    return RE_LINE_PREFIX.sub("", line)


def app_signatures(app) -> list[dict]:
    """Host, driver and toolchain signatures in the trainer's output, in order."""
    out = []
    for ts, line in app:
        body = strip_prefix(line).strip()
        if body.startswith(("raise ", "File ", "warnings.warn(")):  # a traceback's source lines, not its message
            continue
        for kind, rx, action, what in HOST_SIGNATURES:
            if rx.search(line):
                out.append({"kind": kind, "action": action, "line": jline(ts, line), "what": what, "ts": ts,
                            "source": "trainer", "text": body})
                break
    return out


def exception_block(app) -> dict | None:
    """The final exception of the last traceback (or the last exception-looking line), kept whole:
    its continuation lines (a pydantic error's fields, NCCL's `Last error:` and the cause after it)."""
    n = len(app)
    last_tb = None
    for i, (_, line) in enumerate(app):
        if "Traceback (most recent call last)" in line:
            last_tb = i
    found = None
    if last_tb is not None:
        for i in range(last_tb + 1, n):
            body = strip_prefix(app[i][1])
            if not body.strip() or body[:1].isspace():
                continue
            if RE_EXCEPTION.match(body.strip()):
                found = (i, body.strip())
                break
        if found is None:  # lines with an unknown prefix (timestamps, host names)
            for i in range(last_tb + 1, n):
                m = RE_EXCEPTION_ANY.search(app[i][1].strip())
                if m and not app[i][1].lstrip().startswith(("File ", "raise ", "except ")):
                    found = (i, app[i][1].strip()[m.start("name"):])
                    break
    else:
        for i, (_, line) in enumerate(app):
            body = strip_prefix(line).strip()
            m = RE_EXCEPTION.match(body)
            if m and m.group("text") is not None:
                found = (i, body)
    if found is None:
        return None
    i, head = found
    ts0 = app[i][0]
    # Its message goes on until a new log record, a pause, or two blank lines: a library's message can
    # hold one blank line between its explanation and its fix (transformers', huggingface_hub's).
    cont, blanks = [], 0
    for j in range(i + 1, min(n, i + 24)):
        ts, raw = app[j]
        body = strip_prefix(raw)
        if not body.strip():
            blanks += 1
            if blanks == 2:
                break
            continue
        blanks = 0
        if RE_LOG_RECORD.match(body.strip()) or RE_TERMINATE.search(body):
            break
        if ts is not None and ts0 is not None and ts - ts0 > 2.0:
            break
        cont.append((j, body.rstrip()))
        if sum(len(c) for _, c in cont) > 1600:
            break
    name = RE_EXCEPTION.match(head)
    lines = ([jline(app[last_tb][0], app[last_tb][1])] if last_tb is not None else []) + [jline(ts0, app[i][1])]
    lines += [jline(app[j][0], app[j][1]) for j, _ in cont]
    text = " / ".join([head] + [c.strip() for _, c in cont if c.strip()])
    return {"head": head, "name": name.group("name") if name else head.split(":", 1)[0], "index": i, "ts": ts0,
            "text": text, "lines": lines, "traceback": last_tb is not None}


def nccl_block(app) -> dict | None:
    """NCCL's error (DistBackendError, ncclSystemError...) with its `Last error:` text."""
    hit = None
    for i, (_, line) in enumerate(app):
        if RE_NCCL_ERROR.search(line):
            hit = i
            break
    if hit is None:
        return None
    block, last_error, code = [], None, None
    for j in range(hit, min(len(app), hit + 12)):
        ts, raw = app[j]
        body = strip_prefix(raw).strip()
        if j > hit and (not body or body.startswith(("Exception raised from", "frame #", "Traceback"))):
            break
        m = RE_NCCL_ERROR.search(body)
        if m and m.group("code"):
            code = code or m.group("code")
        block.append((ts, raw))
        if body.rstrip(":").strip().endswith("Last error"):
            nxt = strip_prefix(app[j + 1][1]).strip() if j + 1 < len(app) else ""
            last_error = nxt if nxt and not nxt.startswith(("Exception raised from", "frame #")) else ""
            if last_error:
                block.append(app[j + 1])
            break
    action = "investigate"
    for rx, act in NCCL_LAST_ERROR_ACTIONS:
        if last_error and rx.search(last_error):
            action = act
            break
    text = " / ".join(strip_prefix(raw).strip() for _, raw in block if strip_prefix(raw).strip())
    return {"index": hit, "ts": app[hit][0], "code": code, "last_error": last_error, "action": action,
            "text": text, "lines": [jline(ts, raw) for ts, raw in block]}


def native_crash(app, faults, facts, run_pids) -> dict | None:
    """A native crash: C++ terminate (with its what()), a glibc abort, stack smashing, Python's
    fatal error, systemd-coredump's report, or a kernel segfault/trap line of the run's process;
    with the library that faulted where the evidence names one."""
    found = None
    for i, (ts, raw) in enumerate(app):
        line = strip_prefix(raw)
        m = RE_TERMINATE.search(line)
        if m:
            msg = f"terminate called after throwing an instance of '{m.group('type')}'" if m.group("type") else \
                f"terminate called {m.group('other')}"
            what = []
            for j in range(i + 1, min(len(app), i + 4)):
                w = RE_WHAT.match(strip_prefix(app[j][1]))
                if w:
                    what.append(w.group("what").strip())
                    nxt = strip_prefix(app[j + 1][1]).strip() if j + 1 < len(app) else ""
                    if nxt and not RE_LOG_RECORD.match(nxt):
                        what.append(nxt)
                    break
            found = {"index": i, "ts": ts, "message": msg + (f": what(): {' / '.join(what)}" if what else ""),
                     "what": " ".join(what), "lines": [jline(ts, raw)] + [jline(*app[k]) for k in range(i + 1, min(len(app), i + 1 + len(what)))]}
            break
        m = RE_GLIBC.search(line.strip()) or RE_SMASHING.search(line)
        if m:
            found = {"index": i, "ts": ts, "message": f"glibc abort: {m.group('msg')}", "what": "", "lines": [jline(ts, raw)]}
            break
        m = RE_FATAL.match(line.strip())
        if m:
            found = {"index": i, "ts": ts, "message": f"Fatal {'glibc' if m.group('glibc') else 'Python'} error: "
                                                       f"{m.group('glibc') or m.group('python')}", "what": "",
                     "lines": [jline(ts, raw)]}
            break
        m = RE_COREDUMP.search(line)
        if m:
            found = {"index": i, "ts": ts, "message": f"process {m.group('pid')} ({m.group('comm')}) dumped core",
                     "what": "", "lines": [jline(ts, raw)]}
            break
        m = RE_CHILD_SIGNAL.search(line)
        if m and int(m.group("sig")) in CRASH_SIGNALS:
            sig = int(m.group("sig"))
            found = {"index": i, "ts": ts, "message": f"a rank died of signal {sig}/{SIGNAL_NAMES[sig]} (its launcher: "
                                                       f"{line.strip()[-160:]})", "what": "", "lines": [jline(ts, raw)]}
            break
    lib = None
    if found is not None:
        for ts, raw in app[found["index"]:found["index"] + 40]:
            line = strip_prefix(raw).strip()
            m = RE_BACKTRACE_LIB.match(line) or RE_STACK_LIB.search(line) or RE_FRAME_LIB.match(line)
            if m:
                name = m.group("lib").rsplit("/", 1)[-1]
                if not re.match(r"lib(?:c|pthread|stdc\+\+|gcc_s|c10)[.-]", name) and name != "python":
                    lib = lib or name
                    found["lines"].append(jline(ts, raw))
                    break
    # kernel: a segfault/trap of one of the run's processes, or at the unit's crash-signal exit
    fault = None
    for f in faults:
        tied = f["pid"] in run_pids or (
            facts.get("code") in ("killed", "dumped") and facts.get("status") in CRASH_SIGNALS
            and f.get("ts") is not None and facts.get("ts") is not None
            and -FAULT_TIME_TIE_S <= f["ts"] - facts["ts"] <= 2.0)
        if tied:
            fault = f
            break
    if fault is not None:
        kernel_lib = fault.get("lib")
        msg = f"{fault['comm']}[{fault['pid']}]: {fault['what']}" + (f" in {kernel_lib}" if kernel_lib else "")
        if found is None:
            found = {"index": len(app), "ts": fault["ts"], "message": msg, "what": "", "lines": [fault["line"]]}
        else:
            found["lines"].append(fault["line"])
            found["message"] += f"; kernel: {msg}"
        lib = kernel_lib or lib
        found["trap"] = "invalid opcode" in fault["what"]
    if found is None:
        return None
    found["lib"] = lib
    return found



def last_exception(app: list[tuple[float | None, str]]) -> tuple[str | None, list[str]]:
    """The final exception line of the last traceback (or the last exception-looking line), with
    its continuation lines joined into the text."""
    block = exception_block(app)
    if not block:
        return None, []
    return block["text"], block["lines"]


def grep(app, pattern: re.Pattern | str) -> tuple[float | None, str] | None:
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    hit = None
    for ts, line in app:
        if rx.search(line):
            hit = (ts, line)
    return hit



def specific_lines(app, most: int = 3) -> list[tuple[float | None, str]]:
    """The last lines of the output that say most about a failure no rule knows (else the last line)."""
    said = [(ts, line) for ts, line in app if line.strip()]
    specific = [(ts, line) for ts, line in said if RE_SPECIFIC.search(line)
                and not strip_prefix(line).lstrip().startswith(("File ", "raise "))]
    return (specific or said[-1:])[-most:]


def hint_action(text: str) -> tuple[str | None, str | None]:
    for rx, hint, action in HINTS:
        if rx.search(text):
            return hint, action
    for _kind, rx, action, what in HOST_SIGNATURES:
        if rx.search(text):
            return what, action
    return None, None

