"""Reader of the unit's record and journal (evidence.py's gather_unit and gather_journal): the
journal cut into invocations, each with what systemd said about its start and its end, and the
small parsers of systemd's and status.json's times."""

from __future__ import annotations

from datetime import UTC, datetime

from .signatures import (
    MID_FAILED,
    MID_STARTED,
    MID_STOPPING,
    MID_SUCCESS,
    RE_MAIN_EXIT,
    RE_RESTART_COUNTER,
    RE_RESULT,
    RE_START_LIMIT,
    RE_START_TIMEOUT,
    SIGNAL_NAMES,
    SIGNAL_NUMBERS,
)


def message(entry: dict) -> str:
    """MESSAGE of a journal JSON entry: a string, a byte array (not valid UTF-8) or a list of values."""
    value = entry.get("MESSAGE")
    if value is None:
        return ""
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", errors="replace")
        return "\n".join(message({"MESSAGE": v}) for v in value)
    return str(value)


def field(entry: dict, name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return bytes(value).decode("utf-8", errors="replace")
        return str(value[-1]) if value else None
    return str(value)


def realtime(entry: dict) -> float | None:
    value = field(entry, "__REALTIME_TIMESTAMP")
    try:
        return int(value) / 1e6 if value is not None else None
    except ValueError:
        return None


def parse_systemd_time(value: str | None) -> float | None:
    """A systemctl show timestamp: `Thu 2023-11-30 18:10:01.123456 UTC` (--timestamp=us+utc), `@1701367801`
    (--timestamp=unix) or `Thu 2023-11-30 18:10:01 UTC`."""
    if not value or value in ("n/a", "0"):
        return None
    value = value.strip()
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    for fmt in ("%a %Y-%m-%d %H:%M:%S %Z", "%a %Y-%m-%d %H:%M:%S.%f %Z"):
        try:
            parsed = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return parsed.replace(tzinfo=UTC).timestamp()
    return None


def status_time(value) -> float | None:
    """A time from status.json: unix seconds (number or numeric string) or ISO 8601 (`...Z`)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    number = as_float(text)
    if number is not None:
        return number
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_float(value, default=None):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def as_int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------
# the journal, cut into invocations


class Invocation:
    def __init__(self, ident: str | None):
        self.id = ident
        self.entries: list[dict] = []
        self.exit_code: str | None = None     # exited | killed | dumped
        self.exit_status: int | None = None
        self.exit_name: str | None = None     # status=203/EXEC -> EXEC
        self.result: str | None = None        # success | exit-code | signal | core-dump | oom-kill | watchdog | timeout ...
        self.results: list[str] = []          # every result systemd reported, in order (start-limit-hit comes last)
        self.exit_ts: float | None = None
        self.exit_line: str | None = None
        self.result_line: str | None = None
        self.started = False                  # "Started <unit>": READY=1 for Type=notify
        self.started_line: str | None = None
        self.start_failed = False
        self.stopping = False
        self.stopping_line: str | None = None
        self.deactivated_line: str | None = None  # "Deactivated successfully.": systemd's clean end (Result=success)
        self.deactivated_ts: float | None = None
        self.watchdog_line: str | None = None
        self.oom_line: str | None = None
        self.start_limit_line: str | None = None
        self.start_limit_ts: float | None = None
        self.start_timeout_line: str | None = None
        self.restarts: int | None = None      # "restart counter is at N"

    @property
    def first_ts(self) -> float | None:
        for e in self.entries:
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    @property
    def last_ts(self) -> float | None:
        for e in reversed(self.entries):
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    def app_lines(self) -> list[tuple[float | None, str]]:
        """The trainer's own output (everything not from PID 1 about the unit)."""
        out = []
        for e in self.entries:
            if is_manager_entry(e):
                continue
            for line in message(e).splitlines() or [""]:
                out.append((realtime(e), line))
        return out


def is_manager_entry(entry: dict) -> bool:
    return field(entry, "_PID") == "1" or (entry.get("UNIT") is not None and entry.get("_SYSTEMD_UNIT") in (None, "init.scope"))


def split_invocations(entries: list[dict]) -> list[Invocation]:
    invocations: list[Invocation] = []
    by_id: dict[str, Invocation] = {}
    current: Invocation | None = None
    for entry in entries:
        ident = field(entry, "_SYSTEMD_INVOCATION_ID") or field(entry, "INVOCATION_ID")
        if ident:
            if ident not in by_id:
                by_id[ident] = Invocation(ident)
                invocations.append(by_id[ident])
            inv = by_id[ident]
            current = inv
        else:
            if current is None:
                current = Invocation(None)
                invocations.append(current)
            inv = current
        inv.entries.append(entry)
        if is_manager_entry(entry):
            _manager_event(inv, entry)
    return invocations




def _manager_event(inv: Invocation, entry: dict) -> None:
    text = message(entry)
    mid = field(entry, "MESSAGE_ID")
    code = field(entry, "EXIT_CODE")
    m = RE_MAIN_EXIT.search(text)
    if code or m:
        inv.exit_code = code or m.group("code")
        status = field(entry, "EXIT_STATUS") or (m.group("status") if m else None)
        if status is not None and not status.isdigit():
            status = str(SIGNAL_NUMBERS.get(status.upper().removeprefix("SIG"), status))
        inv.exit_status = as_int(status)
        inv.exit_name = m.group("name") if m else None
        inv.exit_ts = realtime(entry)
        inv.exit_line = text
    result = field(entry, "UNIT_RESULT")
    m = RE_RESULT.search(text)
    if result or m:
        inv.result = result or m.group("result")
        inv.results.append(inv.result)
        inv.result_line = text
        inv.exit_ts = inv.exit_ts or realtime(entry)
    if mid == MID_STARTED or text.startswith("Started "):
        inv.started = True
        inv.started_line = text
    if mid == MID_FAILED or text.startswith("Failed to start "):
        inv.start_failed = True
    if mid == MID_STOPPING or text.startswith("Stopping "):
        inv.stopping = True
        inv.stopping_line = text
    if mid == MID_SUCCESS or text.endswith(": Deactivated successfully."):
        inv.deactivated_line = text
        inv.deactivated_ts = realtime(entry)
    if "Watchdog timeout" in text:
        inv.watchdog_line = text
    if "killed by the OOM killer" in text:
        inv.oom_line = text
    if RE_START_LIMIT.search(text):
        inv.start_limit_line = text
        inv.start_limit_ts = realtime(entry)
    if RE_START_TIMEOUT.search(text):
        inv.start_timeout_line = text
    m = RE_RESTART_COUNTER.search(text)
    if m:
        inv.restarts = int(m.group("n"))



def jline(ts: float | None, text: str) -> str:
    return f"journal {fmt_time(ts)}: {text.strip()}"


def last_exit_invocation(invocations: list[Invocation], props: dict) -> Invocation:
    ident = props.get("InvocationID") or None
    for inv in invocations:
        if ident and inv.id == ident:
            return inv
    with_exit = [i for i in invocations if i.exit_code or i.result]
    if with_exit:
        return with_exit[-1]
    return invocations[-1] if invocations else Invocation(ident)


def exit_facts(props: dict, inv: Invocation, current: bool) -> dict:
    """Result / exit code / status of the invocation: systemctl's record, else the journal's."""
    facts = {"result": inv.result, "code": inv.exit_code, "status": inv.exit_status, "ts": inv.exit_ts,
             "source": "journal", "name": inv.exit_name}
    if current and props:
        main_code = as_int(props.get("ExecMainCode"), 0)
        exit_ts = parse_systemd_time(props.get("ExecMainExitTimestamp"))
        start_ts = parse_systemd_time(props.get("ExecMainStartTimestamp"))
        # systemd keeps ExecMain* of the unit's previous process until the next one exits: an exit
        # before this process's start (or before the invocation's first line) is another invocation's
        stale = exit_ts is not None and ((start_ts is not None and exit_ts < start_ts)
                                         or (inv.first_ts is not None and exit_ts < inv.first_ts - 1.0))
        if stale:
            return dict(facts, stale_record=(f"systemctl's ExecMain* record (exit {props.get('ExecMainStatus')} at "
                                             f"{fmt_time(exit_ts)}) is of the unit's previous process"))
        if main_code or exit_ts is not None:
            facts.update(code={1: "exited", 2: "killed", 3: "dumped"}.get(main_code, facts["code"]),
                         status=as_int(props.get("ExecMainStatus"), facts["status"]),
                         ts=exit_ts or facts["ts"], source="systemctl")
        if props.get("Result") and (props["Result"] != "success" or facts["result"] is None):
            facts["result"] = props["Result"]
    return facts


def invocation_pids(props: dict, status: dict, inv: Invocation) -> set[str]:
    pids = set()
    for value in (props.get("ExecMainPID"), props.get("MainPID"), status.get("pid")):
        if as_int(value):
            pids.add(str(as_int(value)))
    for e in inv.entries:
        if not is_manager_entry(e) and field(e, "_PID"):
            pids.add(field(e, "_PID"))
    return pids



def journal_is_complete(evidence: dict) -> bool:
    journal = evidence.get("journal") or {}
    return journal.get("readable", True) and not journal.get("truncated")


def describe_exit(facts: dict) -> str:
    code, status = facts.get("code"), facts.get("status")
    if code in ("killed", "dumped") and status is not None:
        return f"signal {status}/{SIGNAL_NAMES.get(status, '?')}" + (" (core dumped)" if code == "dumped" else "")
    if code == "exited":
        return f"exit status {status}"
    return f"result {facts.get('result') or 'unknown'}"

