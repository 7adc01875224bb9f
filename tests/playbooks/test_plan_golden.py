"""Golden files of every shipped run: what the roles write on a host for each run of
inventory/example, inventory/local and the Molecule inventories, byte for byte.

For each run and each of its hosts, a local play (no host is reached: the roles are loaded with
tags never, only a debug task runs) renders the trainer's configuration (`<run>.json`), the run's
drop-in and environment file, the unit templates, each vLLM server's drop-in, the GPU indices the
preflight checks, the unit names, and training_data's dflash-data command line and --check
configuration, through the roles' own variables and templates. The test compares them with
tests/fixtures/golden/<inventory>/<run>/<host>/, so that a change in how a run is planned that
changes what a host receives fails here, file by file.

A deliberate change is recorded with FLASHFLEET_GOLDEN_WRITE=1 (the files are rewritten, the
test then fails once, naming them; review the diff before committing).
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, failure_messages

GOLDEN = ROOT / "tests/fixtures/golden"
# What a host's `dflash-train --serve-config` answers (the trainer computes it on the host, from the
# target's config): a fixed answer, so the servers' drop-ins are rendered as the role renders them.
SERVE = {"argv": ["--kv-transfer-config", '{"kv_connector":"FlashfleetConnector"}'], "layers": [2, 17, 32]}
# inventory/example reads its secrets from a vault: stand-ins that show where each lands.
VAULT = {"vault_wandb_api_key": "VAULT-WANDB-API-KEY"}
# The shipped inventories that define runs: a Molecule scenario that gains runs is covered at once.
INVENTORIES = {"example": ROOT / "inventory/example", "local": ROOT / "inventory/local",
               **{f"molecule-{p.parent.name}": p for p in sorted(ROOT.glob("molecule/*/inventory"))
                  if "flashfleet_runs:" in ((p / "group_vars/all.yml").read_text()
                                            if (p / "group_vars/all.yml").exists() else "")}}

# Per host of a run: file name -> Jinja that renders it as the roles do (train_unit's install.yml,
# vllm_server's tasks, training_data's vars). `srv` is one server's index.
TEMPLATES = ROOT / "roles"
RENDER = {
    "run.json": "{{ train_unit_trainer_config | to_nice_json(sort_keys=true) }}\n",
    "run.conf": f"{{{{ lookup('ansible.builtin.template', '{TEMPLATES}/train_unit/templates/run.conf.j2') }}}}",
    "run.env": f"{{{{ lookup('ansible.builtin.template', '{TEMPLATES}/train_unit/templates/run.env.j2') }}}}",
    "flashfleet-train@.service":
        f"{{{{ lookup('ansible.builtin.template', '{TEMPLATES}/train_unit/templates/flashfleet-train@.service.j2') }}}}",
    "units.json": "{{ {'trainer': train_unit_name, 'servers': train_unit_vllm_units} | to_json }}",
    "gpus.json": "{{ train_unit_gpu_wanted | to_json }}",
    "data.json": "{{ {'argv': training_data_argv, 'check_config': training_data_trainer_config} | to_json }}",
}
SERVER_UNIT = f"{{{{ lookup('ansible.builtin.template', '{TEMPLATES}/vllm_server/templates/flashfleet-vllm@.service.j2') }}}}"
SERVER_DROPIN = f"""{{{{ lookup('ansible.builtin.template', '{TEMPLATES}/vllm_server/templates/server.conf.j2',
      template_vars={{'vllm_server_index': srv, 'vllm_server_item': vllm_server_servers[srv],
        'vllm_server_argv': vllm_server_servers[srv].argv + vllm_server_serve.argv
                            + vllm_server_servers[srv].flags}}) }}}}"""


def _molecule_hosts(scenario: Path) -> dict:
    """The scenario's platforms as an inventory (molecule.yml names them and their groups)."""
    groups: dict = {}
    for p in yaml.safe_load((scenario / "molecule.yml").read_text())["platforms"]:
        for g in p.get("groups", []):
            groups.setdefault(g, {"hosts": {}})["hosts"][p["name"]] = None
    return {"all": {"children": groups}}


def _inventory(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """(an inventory directory to run on, the runs of flashfleet_runs as written)."""
    src = INVENTORIES[name]
    inv = tmp_path / name
    shutil.copytree(src, inv)
    if not (inv / "hosts.yml").exists():
        (inv / "hosts.yml").write_text(yaml.safe_dump(_molecule_hosts(src.parent)))
    all_vars = inv / "group_vars/all.yml"
    runs = (yaml.safe_load(all_vars.read_text()) or {}).get("flashfleet_runs", {}) if all_vars.exists() else {}
    return inv, runs


def _playbook(path: Path, runs: dict) -> Path:
    msg = RENDER
    plays = []
    for run, spec in runs.items():
        spec = spec or {}
        hosts = ",".join(spec["hosts"]) if "hosts" in spec else spec.get("group", "gpu_nodes")
        plays.append({
            "hosts": hosts, "gather_facts": False,
            "vars": {"golden_run": run, "train_unit_run": "{{ golden_run }}",
                     "train_unit_spec": "{{ flashfleet_runs[golden_run] }}",
                     # as train_unit's install.yml includes vllm_server
                     "vllm_server_run": "{{ train_unit_run }}", "vllm_server_spec": "{{ train_unit_spec }}",
                     "vllm_server_user": "{{ train_unit_user }}", "vllm_server_config_dir": "{{ train_unit_config_dir }}",
                     "vllm_server_trainer_venv": "{{ train_unit_venv }}",
                     "training_data_run": "{{ golden_run }}", "training_data_spec": "{{ flashfleet_runs[golden_run] }}"},
            "roles": [{"role": r, "tags": ["never"]} for r in ("train_unit", "vllm_server", "training_data")],
            "tasks": [
                {"name": "golden", "ansible.builtin.debug": {"msg": msg}, "tags": ["render"]},
                {"name": "golden server unit", "ansible.builtin.debug": {"msg": SERVER_UNIT}, "tags": ["render"],
                 "when": "vllm_server_servers | length > 0"},
                {"name": "golden server", "ansible.builtin.debug": {"msg": SERVER_DROPIN}, "tags": ["render"],
                 "loop": "{{ range(vllm_server_servers | length) | list }}", "loop_control": {"loop_var": "srv"}},
            ]})
    path.write_text(yaml.safe_dump(plays, sort_keys=False, width=1000))
    return path


def _rendered(run_playbook, tmp_path: Path, name: str) -> dict[str, str]:
    """{relative path under the inventory's golden directory: text} of every run on every host."""
    inv, runs = _inventory(name, tmp_path)
    r = run_playbook(_playbook(tmp_path / "golden.yml", runs), inv, cmdline="--tags render --skip-tags always",
                     vllm_server_serve=SERVE, **VAULT)
    assert r.rc == 0, "\n".join(failure_messages(r)) + r.stdout.read()[-3000:]
    plays = [p["vars"]["golden_run"] for p in yaml.safe_load((tmp_path / "golden.yml").read_text())]
    out, play = {}, -1
    for ev in r.events:
        if ev.get("event") == "playbook_on_play_start":
            play += 1
        if ev.get("event") not in ("runner_on_ok", "runner_item_on_ok"):
            continue
        data, run = ev["event_data"], plays[play]
        base = f"{run}/{data['host']}"
        if data["task"] == "golden":
            for file, text in data["res"]["msg"].items():
                out[f"{base}/{run + '.json' if file == 'run.json' else file}"] = text
        elif data["task"] == "golden server unit":
            out[f"{base}/flashfleet-vllm@.service"] = data["res"]["msg"]
        elif data["task"] == "golden server" and ev["event"] == "runner_item_on_ok":
            srv = data["res"]["srv"]
            out[f"{base}/flashfleet-vllm@{run}-{srv}.service.d/server.conf"] = data["res"]["msg"]
    return out


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_every_shipped_run_renders_its_golden_files(run_playbook, tmp_path, name):
    rendered = _rendered(run_playbook, tmp_path, name)
    golden = GOLDEN / name
    if os.environ.get("FLASHFLEET_GOLDEN_WRITE") == "1":
        shutil.rmtree(golden, ignore_errors=True)
        for rel, text in rendered.items():
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(text)
        pytest.fail(f"golden files of {name} rewritten ({len(rendered)}): review them, then run without "
                    "FLASHFLEET_GOLDEN_WRITE")
    stored = {str(p.relative_to(golden)): p.read_text() for p in golden.rglob("*") if p.is_file()} \
        if golden.exists() else {}
    assert sorted(rendered) == sorted(stored), (
        f"{name}: files rendered {sorted(set(rendered) - set(stored))}, golden only {sorted(set(stored) - set(rendered))}")
    for rel in sorted(rendered):
        if rendered[rel] != stored[rel]:
            diff = "".join(difflib.unified_diff(stored[rel].splitlines(True), rendered[rel].splitlines(True),
                                                f"golden/{name}/{rel}", "rendered"))
            pytest.fail(f"{name}/{rel} differs from its golden file:\n{diff}")
    assert rendered, f"{name} has runs: something must be rendered"
