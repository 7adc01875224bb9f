"""A malformed run entry is refused by check_run.yml on the controller, before any host is touched:
one failed task on localhost whose message names the run, the field and the fix.

One host reached with the local connection; train.yml runs with --check as a second guard. The
user's reports are fixed cases; Hypothesis draws a few more from the checker's own schema (the
bulk of the generated cases run on the filter alone: tests/unit/test_controller_bad_input.py).
"""

from __future__ import annotations

import json
import sys

import flashfleet.plan.entry as entries
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, failure_messages

TRAINER = {"target_gpus": "cpu", "drafter_gpus": "cpu"}


def _inventory(path, runs):
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "flashfleet_runs_root": str(path / "runs"), "flashfleet_config_root": str(path / "etc"),
            "flashfleet_venv": str(path / "venv")}
    inv = path / "hosts.json"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": runs},
                                       "children": {"gpu_nodes": {"hosts": {"one": host}}}}}))
    return inv


def _refused_on_the_controller(r) -> list[str]:
    """The failure messages, after checking that only localhost failed and no host had a task."""
    assert r.rc != 0
    touched = {ev["event_data"].get("host") for ev in r.events if ev.get("event", "").startswith("runner_on_")}
    assert touched == {"localhost"}, touched
    messages = failure_messages(r)
    assert len(messages) == 1 and "Traceback" not in r.stdout.read(), messages
    return messages


@pytest.mark.parametrize("run, entry, needle", [
    ("a/b", {"trainer": TRAINER, "hosts": ["one"]}, 'run name "a/b" cannot be a systemd unit instance'),
    ("dup", {"trainer": {"drafter_gpus": "2"}, "hosts": ["one"],
             "vllm": {"servers": [{"port": 8100, "gpus": "0,1"}, {"port": 8101, "gpus": "1"}]}},
     "flashfleet_runs.dup.vllm.servers[1].gpus shares GPU(s) 1 with flashfleet_runs.dup.vllm.servers[0]"),
    ("ports", {"trainer": {"drafter_gpus": "2"}, "hosts": ["one"],
               "vllm": {"servers": [{"port": 8100, "gpus": "0"}, {"port": 8100, "gpus": "1"}]}},
     "flashfleet_runs.ports.vllm.servers[1].port 8100 is also"),
    ("listed", {"trainer": [TRAINER], "hosts": ["one"]}, "flashfleet_runs.listed.trainer must be a mapping, not a list"),
    ("hostmap", {"trainer": TRAINER, "hosts": {"one": None}}, "flashfleet_runs.hostmap.hosts must be a non-empty list"),
])
def test_the_users_malformed_entries_never_reach_the_host(run_playbook, tmp_path, run, entry, needle):
    r = run_playbook(ROOT / "train.yml", _inventory(tmp_path, {run: entry}), cmdline="--check", run=run)
    [message] = _refused_on_the_controller(r)
    assert needle in message and message.startswith(f"run {json.dumps(run) if '/' in run else run}: "), message


def test_flashfleet_runs_as_a_list_is_refused_with_a_message(run_playbook, tmp_path):
    r = run_playbook(ROOT / "status.yml", _inventory(tmp_path, [{"v2": {}}]), run="v2")
    [message] = _refused_on_the_controller(r)
    assert message.startswith("flashfleet_runs must be a mapping"), message


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), field=st.sampled_from(sorted(entries.FIELDS)))
def test_generated_wrong_types_are_refused_by_the_playbook(run_playbook, tmp_path_factory, data, field):
    wrong = st.one_of(st.lists(st.integers(), max_size=2), st.integers(-5, 5), st.text(max_size=4),
                      st.dictionaries(st.text(max_size=3), st.none(), max_size=1), st.none(), st.booleans())
    value = data.draw(wrong.filter(lambda v: not entries.KINDS[entries.FIELDS[field][0]][0](v)))
    path = tmp_path_factory.mktemp("gen")
    r = run_playbook(ROOT / "train.yml", _inventory(path, {"gen": {"trainer": TRAINER, "hosts": ["one"], field: value}}),
                     cmdline="--check", run="gen")
    [message] = _refused_on_the_controller(r)
    assert f"flashfleet_runs.gen.{field} must be" in message, message
