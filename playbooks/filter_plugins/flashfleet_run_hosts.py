"""Jinja filters of playbooks/check_run.yml: which hosts each selected run acts on, and why a run's
hosts cannot be used. A run's entry of flashfleet_runs names its hosts as `hosts: [ct200]` (inventory
hosts) or `group: gpu_nodes` (an inventory group), or neither (the default group).

    {{ selected | flashfleet_run_host_problems(runs, groups) }}
        ['run v2 names both hosts and group: keep one', ...]   ([] when every run is usable)
    {{ selected | flashfleet_run_hosts_by_run(runs, groups, default_group, narrow) }}
        {'v2': ['ct200'], ...}: the run's hosts that are also in `narrow` (-e flashfleet_hosts=GROUP's
        hosts, else every host); a run naming neither gets the default group's hosts
"""

from __future__ import annotations

import json


def _spec(runs, run) -> dict:
    spec = runs[run]
    return spec if isinstance(spec, dict) else {}


def _kept(items, other) -> list:
    """The items also in `other`, each once, in their order (Ansible's intersect on lists)."""
    out = []
    for x in items:
        if x in other and x not in out:
            out.append(x)
    return out


def _missing(items, other) -> list:
    """The items not in `other`, each once, in their order (Ansible's difference on lists)."""
    out = []
    for x in items:
        if x not in other and x not in out:
            out.append(x)
    return out


def _a_host_list(hosts) -> bool:
    return not isinstance(hosts, str) and hasattr(hosts, "__len__") and hasattr(hosts, "__getitem__") and len(hosts) > 0


def flashfleet_run_host_problems(selected, runs, groups) -> list[str]:
    """One message per selected run whose hosts or group the inventory cannot give."""
    problems = []
    known_hosts = list(groups["all"])
    for r in selected:
        spec = _spec(runs, r)
        if "hosts" in spec and "group" in spec:
            problems.append(f"run {r} names both hosts and group: keep one")
        elif "hosts" in spec and not _a_host_list(spec["hosts"]):
            problems.append(f"run {r}: hosts must be a non-empty list of inventory hosts, e.g. hosts: [ct200]")
        elif "hosts" in spec and _missing(spec["hosts"], known_hosts):
            problems.append(f"run {r} names host(s) {', '.join(map(str, _missing(spec['hosts'], known_hosts)))}"
                            f" that the inventory does not define: add them to the inventory or correct flashfleet_runs."
                            f"{r}.hosts (inventory hosts: {', '.join(known_hosts)})")
        elif "group" in spec and spec["group"] not in groups:
            names = sorted(g for g in groups if g not in ("all", "ungrouped"))
            problems.append(f"run {r} names group {json.dumps(spec['group'])} that the inventory does not define:"
                            f" add it to the inventory or correct flashfleet_runs.{r}.group (groups: {', '.join(names)})")
    return problems


def flashfleet_run_hosts_by_run(selected, runs, groups, default_group, narrow) -> dict[str, list]:
    """{run: [hosts]} for the selected runs (check their problems first)."""
    out = {}
    for r in selected:
        spec = _spec(runs, r)
        if "hosts" in spec:
            out[r] = _kept(spec["hosts"], narrow)
        elif "group" in spec:
            out[r] = _kept(groups[spec["group"]], narrow)
        else:
            out[r] = list(groups.get(default_group, []))
    return out


class FilterModule:
    def filters(self):
        return {"flashfleet_run_host_problems": flashfleet_run_host_problems,
                "flashfleet_run_hosts_by_run": flashfleet_run_hosts_by_run}
