"""playbooks/filter_plugins/flashfleet_run_hosts.py: check_run.yml's choice of each run's hosts and
its refusals, as plain functions (tests/playbooks/test_run_hosts.py runs them inside the verbs)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("flashfleet_run_hosts", ROOT / "playbooks/filter_plugins/flashfleet_run_hosts.py")
rh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rh)

GROUPS = {"all": ["a1", "a2", "b1", "localhost"], "ungrouped": [], "gpu_nodes": ["a1", "a2"], "big": ["b1"]}
RUNS = {"plain": {"trainer": {}}, "listed": {"hosts": ["a2", "b1"]}, "grouped": {"group": "big"},
        "both": {"hosts": ["a1"], "group": "big"}, "ghost": {"hosts": ["a1", "nowhere", "nowhere", "elsewhere"]},
        "text": {"hosts": "a1"}, "empty": {"hosts": []}, "lost": {"group": "no_such_group"}, "odd": None}


@pytest.mark.parametrize("run, problem", [
    ("plain", None), ("listed", None), ("grouped", None), ("odd", None),
    ("both", "run both names both hosts and group: keep one"),
    ("text", "run text: hosts must be a non-empty list of inventory hosts, e.g. hosts: [ct200]"),
    ("empty", "run empty: hosts must be a non-empty list of inventory hosts, e.g. hosts: [ct200]"),
    ("ghost", "run ghost names host(s) nowhere, elsewhere that the inventory does not define: add them to the "
              "inventory or correct flashfleet_runs.ghost.hosts (inventory hosts: a1, a2, b1, localhost)"),
    ("lost", 'run lost names group "no_such_group" that the inventory does not define: add it to the inventory or '
             "correct flashfleet_runs.lost.group (groups: big, gpu_nodes)"),
])
def test_each_refusal_names_the_run_and_the_fix(run, problem):
    assert rh.flashfleet_run_host_problems([run], RUNS, GROUPS) == ([problem] if problem else [])


def test_every_selected_run_is_checked():
    assert len(rh.flashfleet_run_host_problems(["both", "plain", "lost"], RUNS, GROUPS)) == 2


@pytest.mark.parametrize("narrow, expected", [
    (GROUPS["all"], {"plain": ["a1", "a2"], "listed": ["a2", "b1"], "grouped": ["b1"], "odd": ["a1", "a2"]}),
    # -e flashfleet_hosts=gpu_nodes narrows the runs that name their hosts, like --limit.
    (GROUPS["gpu_nodes"], {"plain": ["a1", "a2"], "listed": ["a2"], "grouped": [], "odd": ["a1", "a2"]}),
])
def test_each_run_gets_its_hosts_within_the_narrowing_group(narrow, expected):
    assert rh.flashfleet_run_hosts_by_run(list(expected), RUNS, GROUPS, "gpu_nodes", narrow) == expected


def test_a_run_naming_neither_gets_the_default_group_or_nothing():
    assert rh.flashfleet_run_hosts_by_run(["plain"], RUNS, GROUPS, "big", GROUPS["all"]) == {"plain": ["b1"]}
    assert rh.flashfleet_run_hosts_by_run(["plain"], RUNS, GROUPS, "absent", GROUPS["all"]) == {"plain": []}
