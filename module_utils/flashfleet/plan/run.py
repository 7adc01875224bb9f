"""plan_run: everything one host of a run receives, derived from the run's entry of flashfleet_runs,
in one place. The roles render what it returns (roles/flashfleet_contract's flashfleet_plan filter);
no role derives any of it again.

    plan_run("v2-ada", entry, hosts=["ada1"], host="ada1", runs_root="/var/lib/flashfleet/runs")
    -> {"unit": "flashfleet-train@v2-ada.service",
        "trainer": {...},            the trainer's configuration: <run>.json, flat RunConfig names
        "nodes": {...},              nnodes, node_rank, rdzv_endpoint ({} for a one-host run)
        "servers": [{"index": 0, "unit": ..., "port": 8100, "gpus": "0,1", "url": ..., "bind": ..., "argv": [...],
                     "flags": [...]}, ...],
        "server_units": [...], "gpus": [4, 5, 6, 7, 0, 1, 2, 3], "gpu_env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "resources": {...}, "rdma": false,
        "nccl": {...}, "wandb": {...}, "webhook_url": "", "data": {"argv": [...], "check_config": {...}}}

A malformed entry raises PlanError with every problem entry.run_entry_problems finds (the same
lines check_run.yml shows before any host is touched).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..contract import layout
from . import gpus
from .entry import run_entry_problems
from .settings import FIELDS

# A run's vLLM servers serve this host's trainer only: they listen on the loopback.
SERVER_BIND = "127.0.0.1"
# The rendezvous port of a run on several hosts unless its entry names one (torchrun's).
RDZV_PORT = 29400


class PlanError(ValueError):
    """A run entry the plan refuses: the message is its problems, one per line."""


def server_url(port) -> str:
    """The URL the trainer and dflash-data reach a server of this host at."""
    return f"http://{SERVER_BIND}:{port}"


def name_problem(name: str, what: str, example: str) -> str | None:
    """Flag names are given bare (`tensor-parallel-size`, `max_len`): a leading dash is refused."""
    if name.startswith("-") or not name:
        return f"{what} key {name!r}: give {example.split()[0]}'s flag name without dashes, e.g. {example.split()[1]}"
    return None


def vllm_flags(args) -> list[str]:
    """A run's `vllm.args` as `vllm serve` flags, in name order: true the bare flag, false its --no-
    form (vLLM's boolean flags take both), a list or mapping its JSON, anything else its string.

        {tensor-parallel-size: 2, enforce-eager: true, enable-prefix-caching: false}
        -> ['--no-enable-prefix-caching', '--enforce-eager', '--tensor-parallel-size', '2']
    """
    out = []
    for name, value in sorted((args or {}).items()):
        name = str(name)
        if problem := name_problem(name, "vllm.args", "vLLM tensor-parallel-size"):
            raise PlanError(problem)
        if value is True:
            out.append(f"--{name}")
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, list | dict):
            out += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:
            out += [f"--{name}", str(value)]
    return out


def data_flags(entry) -> list[str]:
    """A run's `data:` mapping as dflash-data flags, in name order: dashes for underscores, true the
    bare flag, false and null leave it out, a list its items after the flag, anything else its string.

        {input: [a.jsonl, b.jsonl], max_len: 2048, shuffle: true, seed: null}
        -> ['--input', 'a.jsonl', 'b.jsonl', '--max-len', '2048', '--shuffle']
    """
    out = []
    for name, value in sorted((entry or {}).items()):
        name = str(name)
        if problem := name_problem(name, "data", "dflash-data max_len"):
            raise PlanError(problem)
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def _setting(trainer: Mapping, name: str):
    """The run's value of a trainer setting, else dflash-train's own default (never a role's)."""
    return trainer[name] if name in trainer else FIELDS[name].default


def trainer_config(run: str, entry: Mapping, runs_root: str, nodes: Mapping | None = None,
                   servers: list | None = None) -> dict:
    """The trainer's configuration: the run's `trainer:` flags, its own output directory and, for the
    run's unit (not for dflash-data's --check, which runs before any server), its servers' URLs,
    its place among the run's hosts and its wandb settings."""
    out = {**(entry.get("trainer") or {}), "output_dir": f"{runs_root}/{run}"}
    if servers is None:
        return out
    if servers:
        out["target_servers"] = ",".join(s["url"] for s in servers)
    out.update(nodes or {})
    wandb = entry.get("wandb") or {}
    for key in ("project", "run_name"):
        if wandb.get(key):
            out[f"wandb_{key}"] = wandb[key]
    if wandb.get("settings"):
        out["wandb_settings"] = json.dumps(wandb["settings"])
    return out


def _nodes(entry: Mapping, hosts: list, host, rdzv_host: str) -> dict:
    """A run on several hosts: one unit per host, joined by the trainer's c10d rendezvous on the
    first host (its address: rdzv_host)."""
    if len(hosts) < 2:
        return {}
    return {"nnodes": len(hosts), "node_rank": hosts.index(host),
            "rdzv_endpoint": f"{rdzv_host}:{entry.get('rdzv_port', RDZV_PORT)}"}


def _servers(run: str, entry: Mapping, model, vllm_venv: str) -> list[dict]:
    vllm = entry.get("vllm") or {}
    listed = vllm.get("servers") or []
    units = layout.vllm_unit_names(run, len(listed))
    flags = vllm_flags(vllm.get("args"))
    out = []
    for i, (s, unit) in enumerate(zip(listed, units, strict=True)):
        port, gpu_list = int(s["port"]), str(s.get("gpus", "cpu"))
        out.append({"index": i, "unit": unit, "port": port, "gpus": gpu_list, "url": server_url(port),
                    "bind": SERVER_BIND, "cuda_visible_devices": "" if gpu_list == "cpu" else gpu_list,
                    "argv": [f"{vllm_venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                             "--model", model, "--host", SERVER_BIND, "--port", str(port)],
                    "flags": flags})
    return out


def _gpus(trainer: Mapping, servers: list) -> list[int]:
    """GPU indices the run uses on this host, its servers' included (empty for a CPU run); with
    servers, a target_gpus the run leaves out is unused by the trainer, so not counted."""
    target = "cpu" if servers and "target_gpus" not in trainer else _setting(trainer, "target_gpus")
    return (gpus.indices(target) + gpus.indices(_setting(trainer, "drafter_gpus"))
            + [g for s in servers for g in gpus.indices(s["gpus"])])


def _data(run: str, entry: Mapping, servers: list, venv: str, runs_root: str) -> dict:
    """dflash-data's command line (the `data:` entry's flags; regenerate's server by default the
    run's first server on this host) and dflash-train --check's configuration of the run's flags."""
    trainer, data = entry.get("trainer") or {}, dict(entry.get("data") or {})
    regenerate = data.pop("regenerate", None)
    regenerating = "regenerate" in (entry.get("data") or {}) and regenerate is not False
    if regenerating:
        data.update({"server": servers[0]["url"]} if servers else {})
        data.update(regenerate if isinstance(regenerate, Mapping) else {})
    argv = [f"{venv}/bin/dflash-data", "regenerate" if regenerating else "build",
            "--model", trainer.get("target_model", ""), "--out", trainer.get("data_dir", "")]
    complete = (data.get("input") and trainer.get("target_model") and trainer.get("data_dir")
                and (not regenerating or data.get("server")))
    problem = "" if complete else (
        f"run {run} does not say what to make its data from. Fix: give flashfleet_runs.{run}.data.input"
        " (conversation files on the host), trainer.target_model and trainer.data_dir, and with data.regenerate"
        " its server (or a vllm.servers entry)")
    return {"argv": argv + data_flags(data), "check_config": trainer_config(run, entry, runs_root),
            "dir": trainer.get("data_dir", ""), "problem": problem}


def plan_run(run: str, entry, *, hosts=(), host=None, rdzv_host: str = "", runs_root: str = "",
             venv: str = "", vllm_venv: str = "", resource_defaults: Mapping | None = None,
             nccl_env: Mapping | None = None) -> dict:
    """This host's share of the run `run` (entry: its flashfleet_runs entry; hosts: the run's hosts
    in order, host: this one; rdzv_host: the first host's address; the paths: the roles' own)."""
    problems = run_entry_problems(run, entry)
    if problems:
        raise PlanError("; ".join(problems))
    entry = entry or {}
    trainer = entry.get("trainer") or {}
    hosts = list(hosts)
    servers = _servers(run, entry, trainer.get("target_model"), vllm_venv)
    nodes = _nodes(entry, hosts, host, rdzv_host)
    return {
        "run": run, "unit": layout.unit_name(run),
        "trainer": trainer_config(run, entry, runs_root, nodes, servers),
        "nodes": nodes, "servers": servers, "server_units": [s["unit"] for s in servers],
        "gpus": _gpus(trainer, servers), "gpu_env": dict(gpus.DEVICE_ORDER_ENV),
        "resources": {**(resource_defaults or {}), **(entry.get("resources") or {})},
        "rdma": bool(entry.get("rdma", False)),
        "nccl": {**(nccl_env or {}), **(entry.get("nccl") or {})},
        "wandb": dict(entry.get("wandb") or {}),
        "webhook_url": (entry.get("webhook") or {}).get("url", ""),
        "vllm_env": dict((entry.get("vllm") or {}).get("env") or {}),
        "data": _data(run, entry, servers, venv, runs_root),
    }
