"""What is wrong with a run's entry of flashfleet_runs: the plan's only refusal of a run entry,
found on the controller before any host is touched (playbooks/check_run.yml, through the
flashfleet_plan filters) and again by plan_run. Without it a malformed entry reaches the hosts,
where a role's argument spec refuses it with a dump of the spec, or worse is accepted: a run name
systemd cannot take as a unit instance, two vLLM servers on one GPU or port.

    run_problems(["v2"], runs)
        ['run v2: flashfleet_runs.v2.trainer must be a mapping, not a list: ...', ...]   ([] when usable)

Every field is optional here (collect/diagnose/status need only the name); the roles that need a
field (train_unit: trainer) still require it. Runs are checked one by one: the entries do not say
which runs share a host at the same time, so ports and GPUs are compared within a run only; the
host's side (roles/train_unit/tasks/ports_check.yml) refuses a port another process holds there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from ..contract import layout
from . import gpus as gpu_list

# systemd.unit(5): a unit name, its suffix included, is at most 255 characters.
UNIT_NAME_MAX = 255
# The servers run as the run's user, which cannot bind a privileged port.
PORTS = range(1024, 65536)


def _port(v):
    if isinstance(v, str) and v.isdigit():
        v = int(v)  # vllm_server reads ports through int
    return v if isinstance(v, int) and not isinstance(v, bool) and v in PORTS else None


def _gpus(v):
    """The GPU indices of a `gpus`/`*_gpus` value ("0,1", 3, "cpu"), or None when it is none of them."""
    try:
        return gpu_list.indices(v)
    except ValueError:
        return None


# kind: (test, what the value must be)
KINDS = {
    "mapping": (lambda v: isinstance(v, Mapping), "a mapping"),
    "text": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "port": (lambda v: _port(v) is not None, f"a TCP port from {PORTS.start} to {PORTS.stop - 1}"),
    "gpus": (lambda v: _gpus(v) is not None, 'GPU indices as a string such as "0,1", or "cpu"'),
    "url": (lambda v: isinstance(v, str) and re.match(r"https?://[^\s/]+", v) is not None, "an http(s) URL"),
    "hosts": (lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(h, str) and h for h in v),
              "a non-empty list of inventory host names"),
    "servers": (lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(s, Mapping) for s in v),
                "a non-empty list of {port, gpus} mappings, one per vLLM server"),
    "oom": (lambda v: v in ("stop", "kill", "continue"), "one of stop, kill, continue"),
}

# The entry's fields, as roles/train_unit/meta/argument_specs.yml lists them (its train_unit_spec;
# tests/unit/test_controller_bad_input.py keeps the two equal):
# field: (kind, example for the fix), and for a mapping its own fields (any others are refused).
FIELDS = {
    "trainer": ("mapping", "trainer: {target_model: /srv/models/target, target_gpus: \"0\"}"),
    "hosts": ("hosts", "hosts: [ct200]"),
    "group": ("text", "group: gpu_nodes"),
    "resources": ("mapping", "resources: {start_timeout_s: 1800}"),
    "wandb": ("mapping", "wandb: {project: dflash}"),
    "vllm": ("mapping", "vllm: {servers: [{port: 8100, gpus: \"0,1\"}]}"),
    "rdzv_port": ("port", "rdzv_port: 29400"),
    "webhook": ("mapping", "webhook: {url: \"https://hooks.example.org/flashfleet\"}"),
    "rdma": ("bool", "rdma: true"),
    "nccl": ("mapping", "nccl: {NCCL_SOCKET_IFNAME: ens1f0}"),
    "data": ("mapping", "data: {input: [/var/lib/flashfleet/conversations.jsonl]}"),
}
SUBFIELDS = {
    "resources": {**{k: ("count", f"{k}: 600") for k in
                     ("start_timeout_s", "watchdog_s", "stop_timeout_s", "restart_sec", "min_free_disk_gb")},
                  "oom_policy": ("oom", "oom_policy: stop")},
    "wandb": {"project": ("text", "project: dflash"), "run_name": ("text", "run_name: v2"),
              "settings": ("mapping", "settings: {}")},
    "webhook": {"url": ("url", "url: \"https://hooks.example.org/flashfleet\"")},
    "vllm": {"servers": ("servers", "servers: [{port: 8100, gpus: \"0,1\"}]"), "args": ("mapping", "args: {}"),
             "env": ("mapping", "env: {}")},
    "trainer": {"target_gpus": ("gpus", "target_gpus: \"0,1\""), "drafter_gpus": ("gpus", "drafter_gpus: \"2\"")},
}
REQUIRED = {"webhook": "url", "vllm": "servers"}
SERVER = {"port": ("port", "port: 8100"), "gpus": ("gpus", "gpus: \"0,1\"")}


def _describe(v) -> str:
    if isinstance(v, Mapping):
        return "a mapping"
    if isinstance(v, list | tuple):
        return "a list"
    if v is None:
        return "empty"
    return json.dumps(v) if isinstance(v, str | int | float | bool) else type(v).__name__


def _check(path: str, v, kind: str, example: str) -> list[str]:
    test, want = KINDS[kind]
    return [] if test(v) else [f"{path} must be {want}, not {_describe(v)}: correct it in the inventory, e.g. {example}"]


def _fields(path: str, entry: Mapping, fields: dict, closed: bool = True) -> list[str]:
    """The problems of a mapping's known fields, and (closed: the roles' argument specs refuse
    others) one for its unknown ones."""
    out = [p for k, (kind, example) in fields.items() if k in entry for p in _check(f"{path}.{k}", entry[k], kind, example)]
    unknown = [str(k) for k in entry if k not in fields]
    if closed and unknown:
        out.append(f"{path} has unknown field(s) {', '.join(unknown)}: remove or correct them"
                   f" (its fields: {', '.join(fields)})")
    return out


def _name_problem(name: str, servers: int) -> list[str]:
    if not layout.RUN_NAME_RE.match(name):
        fixed = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-._") or "v2"
        return [f"run name {json.dumps(name)} cannot be a systemd unit instance (flashfleet-train@<run>.service):"
                f" rename the run in flashfleet_runs with letters, digits, '_', '.' and '-' only, starting with a"
                f" letter or digit, e.g. {fixed}"]
    longest = max([layout.unit_name(name), layout.verdict_unit_name(name), *layout.vllm_unit_names(name, servers)], key=len)
    if len(longest) > UNIT_NAME_MAX:
        return [f"run name {name} is too long: its unit {longest[:40]}... has {len(longest)} characters,"
                f" systemd takes {UNIT_NAME_MAX}; rename the run in flashfleet_runs with a shorter name"]
    return []


def _server_clashes(path: str, servers: list, rdzv_port) -> list[str]:
    """Servers of a run share its hosts: two on one GPU or one port would fight over it."""
    out, ports, gpus = [], {}, {}
    if _port(rdzv_port) is not None:
        ports[_port(rdzv_port)] = "rdzv_port"
    for i, s in enumerate(servers):
        me = f"{path}[{i}]"
        if _port(s.get("port")) in ports:
            out.append(f"{me}.port {_port(s['port'])} is also {ports[_port(s['port'])]}'s: give every server a port"
                       f" of its own, e.g. port: {max(ports) + 1}")
        elif _port(s.get("port")) is not None:
            ports[_port(s["port"])] = me
        shared = sorted(g for g in _gpus(s.get("gpus", "cpu")) or [] if g in gpus)
        if shared:
            out.append(f"{me}.gpus shares GPU(s) {', '.join(map(str, shared))} with {gpus[shared[0]]}: give every"
                       f" server GPUs of its own (disjoint gpus, e.g. \"0,1\" and \"2,3\")")
        gpus.update({g: me for g in _gpus(s.get("gpus", "cpu")) or [] if g not in gpus})
    return out


def run_entry_problems(name, entry) -> list[str]:
    """Every problem of one run's entry, each naming the field and the fix; [] when usable."""
    shown = str(name) if layout.RUN_NAME_RE.match(str(name)) else json.dumps(str(name))
    path = f"flashfleet_runs.{shown}"
    if entry is None:
        entry = {}  # `v2:` with nothing under it: every field left to its default
    if not isinstance(entry, Mapping):
        return [f"run {shown}: {path} must be a mapping of the run's fields, not {_describe(entry)}:"
                f" correct it in the inventory, e.g. {shown}: {{hosts: [ct200], trainer: {{...}}}}"]
    out = _fields(path, entry, FIELDS)
    for field, sub in SUBFIELDS.items():
        value = entry.get(field)
        if isinstance(value, Mapping):
            out += _fields(f"{path}.{field}", value, sub, closed=field != "trainer")  # trainer: any dflash-train flag
            if field in REQUIRED and REQUIRED[field] not in value:
                out.append(f"{path}.{field} needs {REQUIRED[field]}: add it, e.g. {sub[REQUIRED[field]][1]}")
    servers = (entry.get("vllm") or {}).get("servers") if isinstance(entry.get("vllm"), Mapping) else None
    servers = servers if KINDS["servers"][0](servers) else []
    for i, s in enumerate(servers):
        out += _fields(f"{path}.vllm.servers[{i}]", s, SERVER)
        if "port" not in s:
            out.append(f"{path}.vllm.servers[{i}] needs a port: add it, e.g. port: {8100 + i}")
    out += _server_clashes(f"{path}.vllm.servers", servers, entry.get("rdzv_port"))
    if servers and isinstance(entry.get("trainer"), Mapping) and "target_servers" in entry["trainer"]:
        out.append(f"{path}.trainer.target_servers is derived from vllm.servers: remove it")
    out += _name_problem(str(name), len(servers))
    return [f"run {shown}: {p}" for p in out]


def run_problems(selected, runs) -> list[str]:
    """The problems of the selected runs' entries (runs: flashfleet_runs)."""
    if not isinstance(runs, Mapping):
        return [f"flashfleet_runs must be a mapping of run name to entry, not {_describe(runs)}: correct it in the"
                " inventory, e.g. flashfleet_runs: {v2: {hosts: [ct200], trainer: {...}}}"]
    # -e run=NAME is always a string: a key YAML read as a number (2024:) could never be selected.
    numbers = [f"flashfleet_runs key {k} is not a string: quote it in the inventory (\"{k}\": ...)"
               for k in runs if not isinstance(k, str)]
    return numbers + [p for r in selected if r in runs for p in run_entry_problems(r, runs[r])]

