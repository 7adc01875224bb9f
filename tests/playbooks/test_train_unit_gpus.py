"""The GPUs a run's preflight checks are the GPUs the trainer will use: a flag the run leaves out
counts as dflash-train's own default, read from the trainer's parser, not a default of the role's.

A play on this machine (local connection) loads the train_unit role's defaults and vars (tags never:
none of its tasks run) and prints train_unit_gpu_wanted for a run's spec.
"""

from __future__ import annotations

import pytest
from flashfleet_trainer.config import build_parser

from tests.conftest import failure_messages, local_inventory


def _wanted(tmp_path, run_playbook, spec: dict) -> list[int]:
    playbook = tmp_path / "wanted.yml"
    playbook.write_text("""
- hosts: all
  gather_facts: false
  roles:
    - {role: train_unit, tags: [never]}
  tasks:
    - ansible.builtin.debug:
        var: train_unit_gpu_wanted
      tags: [show]
""")
    r = run_playbook(playbook, local_inventory(tmp_path), cmdline="--tags show --skip-tags always",
                     train_unit_run="v2", train_unit_spec=spec)
    assert r.rc == 0, "\n".join(failure_messages(r))
    [value] = [ev["event_data"]["res"]["train_unit_gpu_wanted"] for ev in r.events
               if ev.get("event") == "runner_on_ok" and "train_unit_gpu_wanted" in ev["event_data"]["res"]]
    return value


def _trainer_default(dest: str) -> list[int]:
    return [int(i) for i in str(build_parser().get_default(dest)).split(",") if i.strip() not in ("cpu", "")]


def test_a_run_that_names_no_gpus_checks_the_trainers_default_gpus(tmp_path, run_playbook):
    wanted = _wanted(tmp_path, run_playbook, {"trainer": {}})
    assert wanted, "the trainer runs on GPUs by default, so the GPU check must not be skipped"
    assert wanted == _trainer_default("target_gpus") + _trainer_default("drafter_gpus")


@pytest.mark.parametrize("trainer, servers, expected", [
    ({"target_gpus": "cpu", "drafter_gpus": "cpu"}, [], []),
    ({"target_gpus": "0,1,2", "drafter_gpus": "3"}, [], [0, 1, 2, 3]),
    # With vLLM servers the trainer does not use target_gpus: left out, it is not counted.
    ({"drafter_gpus": "4,5"}, [{"port": 8000, "gpus": "0,1"}], [4, 5, 0, 1]),
    ({}, [{"port": 8000, "gpus": "2"}], _trainer_default("drafter_gpus") + [2]),
])
def test_the_runs_own_gpus_pass_through(tmp_path, run_playbook, trainer, servers, expected):
    spec = {"trainer": trainer, **({"vllm": {"servers": servers}} if servers else {})}
    assert _wanted(tmp_path, run_playbook, spec) == expected
