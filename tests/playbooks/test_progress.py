"""Long steps say how they are doing: progress lines in the play's output while a slow step runs.

A fake slow step runs as an async job on this machine (local connection), and the kernel role's
poll (roles/kernel/tasks/poll.yml, what the kernel build and the NVIDIA module build wait with)
reports on it every second. The play's output must show progress lines, with growing elapsed times
and the log's latest line, before the step ends; a failing step fails the play with its exit
status and log.

The fakes keep pace with the play, not with the clock: a fake step writes its next log line, and a
fake trainer its next step, only once the play has reported the last one (tests/conftest.py's
wait_for_report reads the play's events as they happen). So the lines a test sees do not depend on
how busy the machine is; the assertions are on what the poll promises (lines while the job runs, in
order, elapsed growing, the end reported once), not on how many looks fit in some seconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import ROOT, failure_messages, local_inventory, role_play

STEP_LINE = "Say how long it has run"
WAIT_LOOK = "Wait a little (less once the job has ended) and read the log's last line"

# A slow step that goes on only as fast as the poll reports it: it writes "step k of 3" to its log,
# waits until the play has shown that line, then writes the next; then it exits.
FAKE_STEP = """
import sys
sys.path.insert(0, {root!r})
from tests.conftest import wait_for_report

for k in (1, 2, 3):
    with open({log!r}, "a") as f:
        f.write(f"step {{k}} of 3\\n")
    if not wait_for_report({pdd!r}, {task!r}, rf"; log: step {{k}} of 3$"):
        sys.exit(f"the poll never reported step {{k}}")
"""

# A step that ends a moment after the poll has begun its first wait: mostly during that wait, on
# a slow machine before the module's first look; the 60 s wait must not run out either way.
FAKE_SHORT_STEP = """
import sys, time
sys.path.insert(0, {root!r})
from tests.conftest import wait_for_report

if not wait_for_report({pdd!r}, {task!r}, event="runner_on_start"):
    sys.exit("the poll never began a wait")
time.sleep(2)
open({log!r}, "a").write("done\\n")
"""


def _play(tmp_path, run_playbook, script: str, delay_s: int = 1, started_ago_s: int = 0):
    log = tmp_path / "step.log"
    inventory = local_inventory(tmp_path)
    playbook = tmp_path / "slow.yml"
    playbook.write_text(f"""
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        started: "{{{{ now().timestamp() - {started_ago_s} }}}}"
    - ansible.builtin.shell: {json.dumps(script.format(log=log))}
      async: 60
      poll: 0
      register: job
    - ansible.builtin.include_role:
        name: kernel
        tasks_from: poll
      vars:
        kernel_poll_job: "{{{{ job }}}}"
        kernel_poll_label: "slow step"
        kernel_poll_log: "{log}"
        kernel_poll_started: "{{{{ started }}}}"
        kernel_poll_delay_s: {delay_s}
""")
    return run_playbook(playbook, inventory)


def _fake(tmp_path, run_playbook, source: str, task: str) -> str:
    """A shell command running `source` (a fake step) with the play's paths filled in."""
    script = tmp_path / "fake_step.py"
    script.write_text(source.format(root=str(ROOT), log=str(tmp_path / "step.log"),
                                    pdd=str(run_playbook.private_data_dir), task=task))
    return f"{sys.executable} {script}"


def _progress(runner) -> list[str]:
    return [ev["event_data"]["res"]["msg"] for ev in runner.events if ev.get("event") == "runner_on_ok"
            and ev["event_data"].get("task") == STEP_LINE]


def test_a_slow_step_reports_elapsed_time_and_its_log_while_it_runs(tmp_path, run_playbook):
    r = _play(tmp_path, run_playbook, _fake(tmp_path, run_playbook, FAKE_STEP, STEP_LINE))
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = _progress(r)
    got = [re.fullmatch(r"slow step: running, (\d+)m(\d\d)s elapsed(; log: step (\d) of 3)?", x) for x in lines]
    assert all(got), lines
    elapsed = [int(m.group(1)) * 60 + int(m.group(2)) for m in got]
    # a look waits at least a second while the step runs: time grows between its first and last line
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0], lines
    # each step of the log was shown while the step ran, in order (the step waited for each)
    shown = [int(m.group(4)) for m in got if m.group(4)]
    assert shown == sorted(shown) and set(shown) == {1, 2, 3}, lines
    assert re.search(r"slow step: running, \d+m\d\ds elapsed", r.stdout.read())  # in the play's own output


def test_a_step_that_ends_mid_wait_is_seen_ended_at_once(tmp_path, run_playbook):
    """The wait between looks is cut short by the job's end: a step that ends as the poll waits 60 s
    (the whole interval at once, as the step "began" 10 minutes ago) ends that wait early, by
    async_job_wait's own count of the seconds waited (not the wall clock), and is seen ended after
    that one look. (The wait's own logic, mid-wait ends included: tests/unit/test_jobwait.py.)"""
    r = _play(tmp_path, run_playbook, _fake(tmp_path, run_playbook, FAKE_SHORT_STEP, WAIT_LOOK),
              delay_s=60, started_ago_s=600)
    assert r.rc == 0, "\n".join(failure_messages(r))
    waits = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_ok"
             and ev["event_data"].get("task") == WAIT_LOOK]
    assert len(waits) == 1 and waits[0]["waited"] < 60, waits
    assert waits[0]["stdout"].strip() == "done", waits  # the log read after the wait: the step had ended


def test_a_failing_slow_step_fails_with_its_exit_status(tmp_path, run_playbook):
    r = _play(tmp_path, run_playbook, "echo starting >> {log}; sleep 2; echo 'make: *** [vmlinux] Error 2' >&2; exit 2")
    assert r.rc != 0
    (msg,) = failure_messages(r)
    assert msg.startswith("slow step failed (exit 2): make: *** [vmlinux] Error 2") and "step.log" in msg, msg


# A trainer that goes on only as fast as the wait reports it: it writes step 20 once the wait has
# reported step 10, and phase completed (step 80) once it has reported step 20.
FAKE_TRAINER = """
import json, os, sys
sys.path.insert(0, {root!r})
from tests.conftest import wait_for_report

def write(**status):
    with open({tmp!r}, "w") as f:
        json.dump(status, f)
    os.replace({tmp!r}, {status!r})

for seen, then in ((10, dict(phase="training", step=20)), (20, dict(phase="completed", step=80))):
    if not wait_for_report({pdd!r}, "Say where the run stands", rf"phase training at step {{seen}},"):
        write(phase="failed", step=seen, last_error=f"test fake: the wait never reported step {{seen}}")
        sys.exit(1)
    write(**then)
"""


def test_waiting_for_a_run_prints_its_phase_and_step(tmp_path, run_playbook):
    """train.yml -e wait=true (train_unit tasks_from wait): a line with the trainer's status.json
    phase and step every train_unit_wait_progress_s seconds while a fake trainer advances it."""
    run_dir = tmp_path / "runs" / "v2"
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"phase": "training", "step": 10}))
    writer = subprocess.Popen([sys.executable, "-c", FAKE_TRAINER.format(
        root=str(ROOT), tmp=str(run_dir / "status.tmp"), status=str(run_dir / "status.json"),
        pdd=str(run_playbook.private_data_dir))])
    try:
        r = run_playbook(role_play(tmp_path, "train_unit", "wait"), local_inventory(tmp_path), train_unit_run="v2", train_unit_runs_root=str(tmp_path / "runs"),
                         train_unit_wait_poll_s=1, train_unit_wait_progress_s=2, train_unit_wait_timeout_s=120)
    finally:
        writer.kill()  # gone already unless the play ended without reporting what it waits for
        writer.wait()
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = [ev["event_data"]["res"]["msg"] for ev in r.events if ev.get("event") == "runner_on_ok"
             and ev["event_data"].get("task") == "Say where the run stands"]
    got = [re.fullmatch(r"run v2: phase (training|completed) at step (\d+), \d+m\d\ds waited", x) for x in lines]
    assert all(got), lines
    # the run as the trainer went: training at 10 then 20, each shown, in order; completed once, last
    assert [m.group(1) for m in got] == ["training"] * (len(got) - 1) + ["completed"], lines
    steps = [int(m.group(2)) for m in got]
    assert steps == sorted(steps) and set(steps[:-1]) == {10, 20} and steps[-1] == 80, lines
