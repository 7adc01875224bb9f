"""The wait for READY says how the start goes: progress lines in train.yml's output while a slow
start loads its target (roles/train_unit/tasks/start.yml and start_poll.yml).

systemd is not reachable here, so `systemctl` and `journalctl` on the play's PATH are fakes (a
fixture): `systemctl start` does what a Type=notify start does for the play, it blocks while a
fake trainer writes status.json (phase loading, the contract's `load` record growing shard by
shard) and returns at READY, or fails as systemctl does when the trainer dies. The fake loads its
next shard only once the play has shown the last (tests/conftest.py's wait_for_report), so what
the lines show does not depend on how busy the machine is; `systemctl show`
reports the unit's state and `journalctl` this invocation's journal. The real unit is exercised by
the Molecule `launch` scenario. The role's own task files run unchanged, on this machine (local
connection).
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

from tests.conftest import ROOT, failure_messages, local_inventory

FAKE_SYSTEMCTL = '''\
#!{python}
"""A fake systemctl for one Type=notify unit; its state is {state} (JSON)."""
import json, os, sys, time

STATE, STATUS, JOURNAL, PDD = {state!r}, {status!r}, {journal!r}, {pdd!r}
SHARDS_SHOWN, FAIL = {shards_shown!r}, {fail!r}
sys.path.insert(0, {root!r})
from tests.conftest import wait_for_report
GIB = 2 ** 30


def save(**props):
    state = json.load(open(STATE)) if os.path.exists(STATE) else {{}}
    state.update(props)
    json.dump(state, open(STATE + ".tmp", "w"))
    os.replace(STATE + ".tmp", STATE)


def write_status(**rec):
    rec["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    json.dump(rec, open(STATUS + ".tmp", "w"))
    os.replace(STATUS + ".tmp", STATUS)


args = sys.argv[1:]
cmd = args[0] if args else ""
if cmd == "show":
    state = {{"LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead", "Result": "success",
              "ExecMainStatus": "0", "ExecMainCode": "0", "NRestarts": "0", "InvocationID": ""}}
    if os.path.exists(STATE):
        state.update(json.load(open(STATE)))
    props = [args[i + 1] for i, a in enumerate(args) if a == "-p"] or list(state)
    for p in props:
        print(state.get(p, "") if "--value" in args else f"{{p}}={{state.get(p, '')}}")
elif cmd in ("start", "restart"):
    save(ActiveState="activating", SubState="start", InvocationID="0123abcd", Result="success")
    shards, size = 4, 3 * GIB
    # one shard more only once the play has shown the last: the load goes at the poll's pace
    for k in range(1, SHARDS_SHOWN + 1):
        write_status(phase="loading", step=0, ready=False, load={{
            "shards_loaded": k, "shards_total": shards, "bytes_loaded": k * size, "bytes_total": shards * size,
            "elapsed_s": float(k), "done": False}})
        if not wait_for_report(PDD, "Say how the start goes", f"; target {{k}}/4 shards"):
            FAIL = True  # the play never showed this shard: fail the start, and so the test
            break
    if FAIL:
        open(JOURNAL, "a").write("loading the target\\nsafetensors_rust.SafetensorError: "
                                 "Error while deserializing header: HeaderTooLarge\\n")
        write_status(phase="failed", step=0, ready=False, last_error="SafetensorError")
        save(ActiveState="failed", SubState="failed", Result="exit-code", ExecMainStatus="1", ExecMainCode="1")
        print(f"Job for {{args[-1]}} failed because the control process exited with error code.", file=sys.stderr)
        sys.exit(1)
    write_status(phase="training", step=1, ready=True)
    save(ActiveState="active", SubState="running")
sys.exit(0)
'''

FAKE_JOURNALCTL = '''\
#!/bin/sh
cat {journal}
'''


def _start(tmp_path, run_playbook, shards_shown: int, fail: bool):
    runs, fake = tmp_path / "runs", tmp_path / "bin"
    (runs / "v2").mkdir(parents=True)
    fake.mkdir()
    status, journal = runs / "v2" / "status.json", tmp_path / "journal.txt"
    # what the previous start left: it must not be shown as this start's progress
    status.write_text(json.dumps({"phase": "stopped", "step": 40, "updated": "2026-01-01T00:00:00Z"}))
    journal.write_text("")
    (fake / "systemctl").write_text(FAKE_SYSTEMCTL.format(
        python=sys.executable, state=str(tmp_path / "unit.json"), status=str(status), journal=str(journal),
        pdd=str(run_playbook.private_data_dir), root=str(ROOT), shards_shown=shards_shown, fail=fail))
    (fake / "journalctl").write_text(FAKE_JOURNALCTL.format(journal=journal))
    for f in fake.iterdir():
        f.chmod(0o755)
    inventory = local_inventory(tmp_path)
    playbook = tmp_path / "start.yml"
    # main.yml reads the previous status.json before it imports start.yml (hence not role_play)
    playbook.write_text(textwrap.dedent(f"""
        - hosts: all
          gather_facts: false
          tasks:
            - ansible.builtin.slurp:
                src: {status}
              register: train_unit_previous_status
            - ansible.builtin.include_role:
                name: train_unit
                tasks_from: start
    """))
    return run_playbook(playbook, inventory, envvars={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
                        train_unit_run="v2", train_unit_runs_root=str(runs), train_unit_active=False,
                        train_unit_start_progress_s=2)


def _progress(runner) -> list[str]:
    return [ev["event_data"]["res"]["msg"] for ev in runner.events if ev.get("event") == "runner_on_ok"
            and ev["event_data"].get("task") == "Say how the start goes"]


def test_a_slow_start_reports_elapsed_time_and_the_load_until_ready(tmp_path, run_playbook):
    r = _start(tmp_path, run_playbook, shards_shown=3, fail=False)
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = _progress(r)
    got = [re.match(r"run v2: starting, (\d+)m(\d\d)s elapsed; unit (activating/start|active/running); ", x) for x in lines]
    # the unit's own state (a look that slept through READY may see active/running)
    assert all(got), lines
    elapsed = [int(m.group(1)) * 60 + int(m.group(2)) for m in got]
    # a look waits at least a second while the start runs: time grows between the first line and the last
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0], lines
    loading = [x for x in lines if "phase loading; target " in x]
    shards = [int(re.search(r"target (\d)/4 shards, ", x).group(1)) for x in loading]
    gib = [float(re.search(r"target \d/4 shards, ([\d.]+)/12\.00 GiB \(\d+%\)", x).group(1)) for x in loading]
    # each shard shown as the load went (the fake waited for each), in order, while still activating
    assert shards == sorted(shards) and set(shards) == {1, 2, 3} and gib == sorted(gib), loading
    assert all("; unit activating/start; " in x for x in loading), loading
    # the previous start's status.json (phase stopped) is never passed off as this start's
    assert not any("phase stopped" in x for x in lines), lines
    assert re.search(r"run v2: starting, \d+m\d\ds elapsed", r.stdout.read())  # in the play's own output


def test_a_failing_start_fails_with_the_exception_and_the_units_result(tmp_path, run_playbook):
    r = _start(tmp_path, run_playbook, shards_shown=1, fail=True)
    assert r.rc != 0
    fatal = [m for m in failure_messages(r) if "did not start" in m]
    assert fatal == [
        "here: run v2 did not start: safetensors_rust.SafetensorError: Error while deserializing header: "
        "HeaderTooLarge | unit flashfleet-train@v2.service: Result=exit-code, exit status 1, restarts 0, "
        "now failed/failed | full log: journalctl -u flashfleet-train@v2.service -b --no-pager; "
        "why: ansible-playbook diagnose.yml -e run=v2"], failure_messages(r)
    assert any("; target 1/4 shards, " in x for x in _progress(r)), _progress(r)  # shown before it failed
