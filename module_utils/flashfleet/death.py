"""Word at death: record one death of a run's unit on the host, at the moment it happens.

flashfleet-verdict@<run>.service (roles/train_unit) runs this as root from the host's venv:

    python -m flashfleet.death --run v2 --output-dir /var/lib/flashfleet/runs/v2 \\
        --config-dir /etc/flashfleet/runs --venv /opt/flashfleet/venv --lock /opt/flashfleet/venv/flashfleet.lock

It is started twice per final death and once per restarted one: by the trainer unit's
ExecStopPost= for every non-success result (before Restart= starts the next invocation, so the
journal and the cgroup are still those of the death), and by its OnFailure= when the unit enters
the failed state (the only trigger of a start limit hit, where nothing runs). A death already
recorded (same invocation, result and verdict) is not recorded twice.

Each death becomes <output-dir>/deaths/<UTC time>-<invocation>/ (contract/layout.py): the
evidence (flashfleet.evidence.gather), the verdict (flashfleet.classify.classify, plus `death`:
when, what triggered it, the record) and, when the run names a webhook, webhook.json (how the
POST went). The directory is written under a dot-name and renamed into place, never overwritten.
The verdict is printed to the journal first; a failed POST is logged and changes nothing else.
The webhook's URL and token come from the environment (the unit's root-only EnvironmentFile),
never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from . import classify, evidence
from .contract import layout

SCHEMA = 1
DEFAULT_WEBHOOK_TIMEOUT_S = 5.0
# Results of a unit that are not a death (a clean exit, or a stop asked for).
NOT_A_DEATH = {"", "success"}


class DeathError(ValueError):
    """A parameter the recorder cannot work with."""


def record_name(now: float, invocation: str | None) -> str:
    """deaths/<name>: UTC time to the microsecond (sorts in time order), then the invocation."""
    whole = int(now)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(whole))
    return f"{stamp}.{int((now - whole) * 1e6):06d}Z-{(invocation or 'none')[:12]}"


def death_of(props: dict) -> tuple[bool, str]:
    """Whether the unit's state (systemctl show) is a death, and why (or why not)."""
    result = props.get("Result", "")
    active = props.get("ActiveState", "")
    if result not in NOT_A_DEATH:
        return True, f"Result={result}"
    if active == "failed":
        return True, "ActiveState=failed"
    return False, f"nothing died: Result={result or '?'}, ActiveState={active or '?'}"


def already_recorded(records: list[dict], props: dict, verdict: str) -> str | None:
    """The name of the record of this very death (same invocation, result and verdict), if any.
    The verdict is part of it: systemd 252 keeps the last death's Result when the start limit
    refuses the restart, and only the journal ("Start request repeated too quickly") tells."""
    inv, result = props.get("InvocationID", ""), props.get("Result", "")
    for rec in reversed(records):
        v = rec.get("verdict") or {}
        death = v.get("death") or {}
        if death.get("invocation_id") == inv and death.get("result") == result and v.get("verdict") == verdict:
            return rec["name"]
    return None


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_record(deaths_dir: str, name: str, ev: dict, verdict: dict) -> str:
    """deaths_dir/name/ with evidence.json and verdict.json, appearing whole (rename of a dot-dir)."""
    os.makedirs(deaths_dir, mode=0o755, exist_ok=True)
    final = os.path.join(deaths_dir, name)
    if os.path.exists(final):  # never overwrite a death: a second one in the same microsecond
        final += f"-{os.getpid()}"
    tmp = os.path.join(deaths_dir, f".{os.path.basename(final)}.tmp")
    os.mkdir(tmp, 0o755)
    _write_json(os.path.join(tmp, layout.DEATH_EVIDENCE), ev)
    _write_json(os.path.join(tmp, layout.DEATH_VERDICT), verdict)
    os.rename(tmp, final)
    return final


def safe_url(url: str) -> str:
    """scheme://host[:port] only: a webhook's path or query may itself be a secret (Slack-style)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")


def check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeathError(f"webhook URL {safe_url(url)!r} is not http(s)://host/...: fix the run's webhook.url")


def post(url: str, token: str | None, body: dict, timeout: float) -> dict:
    """POST body as JSON; the outcome, never raising (the token is sent, never returned or logged)."""
    data = json.dumps(body, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "flashfleet-verdict/1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    out = {"url": safe_url(url), "at": time.time(), "ok": False, "status": None, "error": None}
    try:
        req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http(s) checked)
            out.update(status=resp.status, ok=200 <= resp.status < 300)
    except urllib.error.HTTPError as exc:
        out.update(status=exc.code, error=f"HTTP {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out["error"] = str(getattr(exc, "reason", exc))
    return out


def webhook_settings(environ) -> dict | None:
    """{url, token, timeout} from the environment (the verdict unit's EnvironmentFile), or None."""
    url = (environ.get(layout.WEBHOOK_URL_ENV) or "").strip()
    if not url:
        return None
    check_url(url)
    try:
        timeout = float(environ.get(layout.WEBHOOK_TIMEOUT_ENV) or DEFAULT_WEBHOOK_TIMEOUT_S)
    except ValueError:
        raise DeathError(f"{layout.WEBHOOK_TIMEOUT_ENV} is not a number of seconds") from None
    return {"url": url, "token": environ.get(layout.WEBHOOK_TOKEN_ENV) or None, "timeout": timeout}


def _sync_journal(timeout: float) -> None:
    # What the trainer printed last reaches the journal asynchronously: flush it before reading.
    try:
        subprocess.run(["journalctl", "--sync"], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def record(params: dict, environ=None, now: float | None = None, log=print) -> dict:
    """Gather, classify, write the record, then POST it when a webhook is set. Returns
    {"recorded": path or None, "skipped": why or None, "verdict": dict or None, "webhook": dict or None}."""
    environ = os.environ if environ is None else environ
    try:
        hook = webhook_settings(environ)
    except DeathError as exc:  # the role checks the settings; here a bad one only loses the POST
        log(f"webhook not used: {exc}")
        hook = None
    _sync_journal(float(params.get("command_timeout") or 5))
    ev = evidence.gather(params)
    props = (ev.get("unit_props") or {}).get("properties") or {}
    deaths_dir = os.path.join(params["output_dir"], layout.DEATHS)
    dead, why = death_of(props)
    if not dead:
        log(f"{ev['unit']}: {why}; no record")
        return {"recorded": None, "skipped": why, "verdict": None, "webhook": None}
    verdict = classify.classify(ev)
    same = already_recorded((ev.get("deaths") or {}).get("records") or [], props, verdict["verdict"])
    if same:
        why = (f"this death (invocation {props.get('InvocationID')}, {why}, {verdict['verdict']}) is already "
               f"recorded in {same}")
        log(f"{ev['unit']}: {why}")
        return {"recorded": None, "skipped": why, "verdict": None, "webhook": None}

    now = time.time() if now is None else now
    name = record_name(now, props.get("InvocationID"))
    verdict["death"] = {"schema": SCHEMA, "recorded_at": now, "record": name, "trigger": why,
                        "invocation_id": props.get("InvocationID", ""), "result": props.get("Result", ""),
                        "active_state": props.get("ActiveState", ""), "sub_state": props.get("SubState", ""),
                        "nrestarts": classify.as_int(props.get("NRestarts"), 0),
                        "webhook": safe_url(hook["url"]) if hook else None}
    # The verdict first, in the journal, whatever happens to the record or the POST.
    log(f"{ev['unit']} died: {verdict['verdict']} (action {verdict.get('action')}): {verdict.get('reason')}")
    path = None
    try:
        path = write_record(deaths_dir, name, ev, verdict)
        log(f"recorded in {path}")
    except OSError as exc:
        log(f"could not write the record under {deaths_dir}: {exc}")
    sent = None
    if hook:
        sent = post(hook["url"], hook["token"], verdict, hook["timeout"])
        log(f"webhook {sent['url']}: " + (f"HTTP {sent['status']}" if sent["ok"] else f"failed: {sent['error']}"))
        if path:
            try:
                _write_json(os.path.join(path, layout.DEATH_WEBHOOK), sent)
            except OSError as exc:
                log(f"could not write {layout.DEATH_WEBHOOK}: {exc}")
    return {"recorded": path, "skipped": None, "verdict": verdict, "webhook": sent}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m flashfleet.death", description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--lock", required=True)
    ap.add_argument("--unit", default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    params = {"run": args.run, "output_dir": args.output_dir, "config_dir": args.config_dir,
              "venv": args.venv, "lock": args.lock, "unit": args.unit}
    if not os.path.isdir(args.output_dir):
        print(f"{args.output_dir}: no such run directory (fix: --output-dir is the run's directory)", file=sys.stderr)
        return 2
    try:
        record(params, log=lambda line: print(line, flush=True))
    except evidence.EvidenceError as exc:
        print(f"flashfleet-verdict: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
