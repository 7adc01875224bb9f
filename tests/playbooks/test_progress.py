"""Long steps say how they are doing: progress lines in the play's output while a slow step runs.

A fake slow step (a shell loop writing a line to its log every 2 seconds for 16 seconds) runs as
an async job on this machine (local connection), and the kernel role's poll (roles/kernel/tasks/
poll.yml, what the kernel build and the NVIDIA module build wait with) reports on it every second.
The play's output must show several progress lines, with growing elapsed times and the log's
latest line, before the step ends; a failing step fails the play with its exit status and log.
"""

from __future__ import annotations

import json
import re
import sys
import time

from tests.conftest import failure_messages, local_inventory, role_play


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


def _progress(runner) -> list[str]:
    return [ev["event_data"]["res"]["msg"] for ev in runner.events if ev.get("event") == "runner_on_ok"
            and ev["event_data"].get("task") == "Say how long it has run"]


def test_a_slow_step_reports_elapsed_time_and_its_log_while_it_runs(tmp_path, run_playbook):
    r = _play(tmp_path, run_playbook, "for i in $(seq 1 8); do echo \"step $i of 8\" >> {log}; sleep 2; done")
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = _progress(r)
    assert len(lines) >= 2, lines  # each poll costs a few seconds of Ansible itself on a loaded machine
    elapsed = [int(m) * 60 + int(s) for m, s in (re.search(r"running, (\d+)m(\d+)s elapsed", x).groups() for x in lines)]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0], lines
    assert all(x.startswith("slow step: running, ") for x in lines)
    assert any(re.search(r"; log: step \d+ of 8$", x) for x in lines), lines
    stdout = r.stdout.read()
    assert "slow step: running, 0m" in stdout  # in the play's own output, not only in events


def test_a_step_that_ends_mid_wait_is_seen_ended_within_seconds(tmp_path, run_playbook):
    """The wait between looks is cut short by the job's end: a 3 s step whose poll waits 60 s (the
    whole interval at once, as the step "began" 10 minutes ago) ends the play well before 60 s."""
    t0 = time.monotonic()
    r = _play(tmp_path, run_playbook, "sleep 3; echo done >> {log}", delay_s=60, started_ago_s=600)
    took = time.monotonic() - t0
    assert r.rc == 0, "\n".join(failure_messages(r))
    assert took < 45, f"the play took {took:.0f} s: the poll slept out its 60 s wait after the step had ended"


def test_a_failing_slow_step_fails_with_its_exit_status(tmp_path, run_playbook):
    r = _play(tmp_path, run_playbook, "echo starting >> {log}; sleep 2; echo 'make: *** [vmlinux] Error 2' >&2; exit 2")
    assert r.rc != 0
    (msg,) = failure_messages(r)
    assert msg.startswith("slow step failed (exit 2): make: *** [vmlinux] Error 2") and "step.log" in msg, msg


def test_waiting_for_a_run_prints_its_phase_and_step(tmp_path, run_playbook):
    """train.yml -e wait=true (train_unit tasks_from wait): a line with the trainer's status.json
    phase and step every train_unit_wait_progress_s seconds while a fake trainer advances it."""
    import subprocess

    run_dir = tmp_path / "runs" / "v2"
    run_dir.mkdir(parents=True)
    writer = subprocess.Popen([sys.executable, "-c", f"""
import json, os, time
for step in range(1, 9):
    phase = "completed" if step == 8 else "training"
    with open({str(run_dir / 'status.tmp')!r}, "w") as f:
        json.dump({{"phase": phase, "step": step * 10}}, f)
    os.replace({str(run_dir / 'status.tmp')!r}, {str(run_dir / 'status.json')!r})
    time.sleep(2)
"""])
    try:
        r = run_playbook(role_play(tmp_path, "train_unit", "wait"), local_inventory(tmp_path), train_unit_run="v2", train_unit_runs_root=str(tmp_path / "runs"),
                         train_unit_wait_poll_s=1, train_unit_wait_progress_s=2, train_unit_wait_timeout_s=120)
    finally:
        writer.wait(timeout=60)
    assert r.rc == 0, "\n".join(failure_messages(r))
    lines = [ev["event_data"]["res"]["msg"] for ev in r.events if ev.get("event") == "runner_on_ok"
             and ev["event_data"].get("task") == "Say where the run stands"]
    steps = [int(re.search(r"at step (\d+)", x).group(1)) for x in lines if "phase training" in x]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] > steps[0], lines
    assert lines[-1].startswith("run v2: phase completed at step 80"), lines
