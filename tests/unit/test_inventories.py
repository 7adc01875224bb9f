"""The shipped inventories: they parse, and every run in them is a valid dflash-train configuration.

The example inventory's `v2` is the first incident's command line; this test proves every one of
its flags is a flag of dflash-train with the same meaning (a typo would otherwise surface only
at launch, as a --check failure on the fleet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flashfleet.contract import locks
from flashfleet_trainer.config import parse_args

from tests.conftest import ROOT

INCIDENT_FLAGS = (
    "--target-model --data-dir --output-dir --target-gpus --drafter-gpus --epochs --lr --warmup-ratio "
    "--weight-decay --grad-accum --grad-clip --token-budget --max-seq-len --max-batch-size --block-size "
    "--max-anchors --num-draft-layers --use-soft-labels --kl-temperature --kl-weight --streak-alpha "
    "--noise-start --noise-end --save-interval --wandb-project --wandb-run-name").split()


def _inventory(name: str) -> dict:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(ROOT / "inventory" / name), "--list"],
        capture_output=True, text=True, check=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    return json.loads(out.stdout)


def _runs(inv: dict) -> dict:
    host = inv["gpu_nodes"]["hosts"][0] if "hosts" in inv["gpu_nodes"] else None
    if host is None:  # gpu_nodes made of child groups
        child = inv["gpu_nodes"]["children"][0]
        host = inv[child]["hosts"][0]
    return inv["_meta"]["hostvars"][host]["flashfleet_runs"]


@pytest.mark.parametrize("name", ["local", "example"])
def test_every_run_is_a_valid_trainer_configuration(name, tmp_path):
    runs = _runs(_inventory(name))
    assert runs, f"inventory/{name} defines no run"
    for run, spec in runs.items():
        config = dict(spec["trainer"], output_dir=str(tmp_path / run))
        path = tmp_path / f"{run}.json"
        path.write_text(json.dumps(config))
        args = parse_args(["--config", str(path)])  # raises ConfigError on an unknown key or bad value
        assert args.output_dir == str(tmp_path / run)


def test_example_v2_is_the_incident_run_flag_for_flag():
    v2 = _runs(_inventory("example"))["v2"]
    given = {f"--{k.replace('_', '-')}" for k in v2["trainer"]} | {"--output-dir", "--wandb-project", "--wandb-run-name"}
    assert set(INCIDENT_FLAGS) <= given, sorted(set(INCIDENT_FLAGS) - given)
    assert v2["trainer"]["target_gpus"] == "0,1,2,3,4,5,6" and v2["trainer"]["drafter_gpus"] == "7"
    assert v2["wandb"]["run_name"] == "v2-kpro6-7x1-softKL-6ep"


def test_the_cuda_lock_is_torchs_cuda_13_build_and_shares_every_other_pin_with_the_cpu_lock():
    """The two host profiles may differ only in torch and what its CUDA build pulls in."""
    def pins(name):  # the contract's lock reader: hashes, continuations and markers are part of a lock
        return locks.parse((ROOT / "requirements" / name).read_text())

    cpu, cuda = pins("node-cpu.lock"), pins("node-cuda.lock")
    assert cpu["torch"].endswith("+cpu") and cuda["torch"] == cpu["torch"].removesuffix("+cpu")
    assert cuda["nvidia-cuda-runtime"].startswith("13.0.")
    shared = set(cpu) & set(cuda) - {"torch"}
    assert {p for p in shared if cpu[p] != cuda[p]} == set()
    assert {"wandb", "pydantic", "transformers"} <= shared


def test_example_v2_trains_the_published_qwen36_27b_drafter_and_passes_check(tmp_path, monkeypatch):
    """v2's target is a Qwen3.6-27B directory: its flags, run through --check's preflight on a
    directory with that model's config.json and header-only fake weights (--check reads headers,
    never data), give exactly the published DFlash drafter's shape."""
    from flashfleet_trainer import preflight as pf

    from tests.unit.test_qwen35_check import PUBLISHED_27B_DRAFTER, QWEN36_27B, fake_wrapped_checkpoint

    v2 = dict(_runs(_inventory("example"))["v2"]["trainer"])
    assert v2["target_model"].rstrip("/").endswith("Qwen3.6-27B")
    model = fake_wrapped_checkpoint(tmp_path / "Qwen3.6-27B", QWEN36_27B)
    data = tmp_path / "data"
    data.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 4]] * 2}), data / "x.parquet")
    # the host here has no GPUs and not the fleet's memory: the devices are what is not under test
    v2.update(target_model=str(model), data_dir=str(data), output_dir=str(tmp_path / "run"), target_gpus="cpu",
              drafter_gpus="cpu")
    monkeypatch.setattr(pf, "_mem_available_bytes", lambda: 1 << 50)
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(v2))
    facts = pf.preflight(parse_args(["--config", str(path)]))
    d = facts.drafter_config
    for k, v in PUBLISHED_27B_DRAFTER.items():
        assert getattr(d, k) == v, k
    # and the explicit flags are the defaults for this target: dropping them changes nothing
    for k in ("target_layers", "mask_token_id", "drafter_layer_types", "sliding_window", "drafter_num_heads",
              "drafter_num_kv_heads", "drafter_head_dim", "drafter_intermediate_size"):
        v2.pop(k)
    path.write_text(json.dumps(v2))
    assert pf.preflight(parse_args(["--config", str(path)])).drafter_config == d
