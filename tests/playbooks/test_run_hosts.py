"""Runs name their hosts: each verb acts on the run's hosts only, a host in no run is untouched.

No containers: three hosts reached with the local connection (one, two, idle) and a two-run
inventory (`solo` names `hosts: [one]`, `pair` names `group: pair_nodes`, which holds `two`; `idle`
is in gpu_nodes but in no run). Which hosts a play touched is read from ansible-runner's events:
a host the play never selected has no event at all. status.yml runs for real (read-only);
stop.yml and train.yml run with --check against hosts without the run's unit or venv, so their
tasks fail, but on the run's hosts only, which is what is checked here.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT, failure_messages

RUNS = {"solo": {"trainer": {"target_gpus": "cpu", "drafter_gpus": "cpu"}, "hosts": ["one"]},
        "pair": {"trainer": {"target_gpus": "cpu", "drafter_gpus": "cpu"}, "group": "pair_nodes"},
        "ghost": {"trainer": {}, "hosts": ["one", "nowhere"]},
        "lostgroup": {"trainer": {}, "group": "no_such_group"}}


@pytest.fixture
def inventory(tmp_path):
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "flashfleet_runs_root": str(tmp_path / "runs"), "flashfleet_config_root": str(tmp_path / "etc"),
            "flashfleet_venv": str(tmp_path / "venv")}
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {
        "vars": {"flashfleet_runs": RUNS, "flashfleet_runs_dir": str(tmp_path / "controller-runs")},
        "children": {"gpu_nodes": {"hosts": {"one": host, "two": host, "idle": host}},
                     "pair_nodes": {"hosts": {"two": {}}}}}}))
    return inv


def _touched(runner) -> set[str]:
    """Hosts with any task event, the controller's own plays (localhost) left out."""
    return {ev["event_data"]["host"] for ev in runner.events
            if ev.get("event", "").startswith("runner_on_") and ev["event_data"].get("host") not in (None, "localhost")}


@pytest.mark.parametrize("run, hosts", [("solo", {"one"}), ("pair", {"two"})])
def test_status_reads_only_the_runs_hosts(run_playbook, inventory, run, hosts):
    r = run_playbook(ROOT / "status.yml", inventory, run=run)
    assert r.rc == 0, r.stdout.read()
    assert _touched(r) == hosts
    rows = next(ev["event_data"]["res"]["ansible_facts"]["run_status_table_rows"] for ev in r.events
                if ev.get("event") == "runner_on_ok" and ev["event_data"].get("task") == "Collect the rows of every host")
    assert {(row["host"], row["run"]) for row in rows} == {(h, run) for h in hosts}


def test_status_of_every_run_shows_each_host_its_own_runs(run_playbook, inventory, tmp_path):
    """Without -e run: the union of the runs' hosts, each with its own runs; idle is in no run."""
    solo_only = dict(RUNS)
    del solo_only["ghost"], solo_only["lostgroup"]
    data = json.loads(inventory.read_text())
    data["all"]["vars"]["flashfleet_runs"] = solo_only
    inventory.write_text(json.dumps(data))
    r = run_playbook(ROOT / "status.yml", inventory)
    assert r.rc == 0, r.stdout.read()
    assert _touched(r) == {"one", "two"}
    rows = next(ev["event_data"]["res"]["ansible_facts"]["run_status_table_rows"] for ev in r.events
                if ev.get("event") == "runner_on_ok" and ev["event_data"].get("task") == "Collect the rows of every host")
    assert sorted((row["host"], row["run"]) for row in rows) == [("one", "solo"), ("two", "pair")]


@pytest.mark.parametrize("playbook", ["stop.yml", "train.yml"])
@pytest.mark.parametrize("run, hosts", [("solo", {"one"}), ("pair", {"two"})])
def test_stop_and_train_act_on_the_runs_hosts_only(run_playbook, inventory, playbook, run, hosts):
    r = run_playbook(ROOT / playbook, inventory, cmdline="--check", run=run)
    assert _touched(r) == hosts, r.stdout.read()


@pytest.mark.parametrize("playbook", ["train.yml", "stop.yml", "diagnose.yml", "collect.yml", "status.yml"])
@pytest.mark.parametrize("run, needle", [
    ("ghost", "run ghost names host(s) nowhere that the inventory does not define: add them to the inventory"
              " or correct flashfleet_runs.ghost.hosts"),
    ("lostgroup", 'run lostgroup names group "no_such_group" that the inventory does not define'),
])
def test_a_run_naming_an_unknown_host_is_refused_before_any_host(run_playbook, inventory, playbook, run, needle):
    r = run_playbook(ROOT / playbook, inventory, run=run)
    assert r.rc != 0
    assert any(needle in m for m in failure_messages(r)), failure_messages(r)
    assert _touched(r) == set()


def test_flashfleet_hosts_narrows_a_run_that_names_its_hosts(run_playbook, inventory):
    r = run_playbook(ROOT / "status.yml", inventory, run="solo", flashfleet_hosts="pair_nodes")
    assert r.rc == 0, r.stdout.read()
    assert _touched(r) == set()


def test_the_example_inventory_runs_v2_on_one_27b_capable_host(run_playbook, tmp_path):
    """inventory/example: -e run=v2 is one node, ct200 (the Blackwell host's container), not ada1."""
    playbook = tmp_path / "show.yml"
    playbook.write_text(f"""
- ansible.builtin.import_playbook: {ROOT / 'playbooks/check_run.yml'}
- hosts: flashfleet_run
  gather_facts: false
  tasks:
    - ansible.builtin.debug: {{msg: "{{{{ inventory_hostname }}}}"}}
      delegate_to: localhost
""")
    r = run_playbook(playbook, ROOT / "inventory/example", run="v2", vault_s3_access_key="", vault_s3_secret_key="",
                     vault_wandb_api_key="")
    assert r.rc == 0, r.stdout.read()
    shown = {ev["event_data"]["host"] for ev in r.events if ev.get("event") == "runner_on_ok"
             and ev["event_data"].get("task_action") == "ansible.builtin.debug" and ev["event_data"]["host"] != "localhost"}
    assert shown == {"ct200"}
