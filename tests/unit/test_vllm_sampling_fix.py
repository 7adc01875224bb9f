"""vLLM 0.32.0's CPU build (the pinned one) samples speculative tokens wrongly: its C++ stand-in
for the rejection sampler's expand kernel never writes its output, so each sampled request's
temperature reaches its draft rows as uninitialised memory (vllm_serve_check.sampling_problem).
The serve check refuses to report a sampled acceptance length from such a build; the benchmark
judge replaces the kernel in its own process (fix_sampling) and records that it did. Run in the
vLLM venv; no engine is started."""

import json
import subprocess

import pytest

from tests.vllm_server import ROOT, VLLM_PYTHON, need_vllm

PROBE = """
import json, torch
from flashfleet_trainer import vllm_serve_check as c
before = c.sampling_problem()
fix = c.fix_sampling()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
# three requests of 2, 3 and 1 rows; temperature 0 (greedy) read as 1, as the sampler asks
rows = expand_batch_to_tokens(torch.tensor([0.5, 0.0, 2.0]), torch.tensor([2, 5, 6], dtype=torch.int32), 6,
                              replace_from=0.0, replace_to=1.0)
print(json.dumps({"before": before, "fix": fix, "after": c.sampling_problem(), "rows": rows.tolist(),
                  "again": c.fix_sampling()}))
"""


def _vllm(*args, **kw):
    env = {"PYTHONPATH": f"{ROOT / 'trainer'}:{ROOT / 'module_utils'}", "PATH": "/usr/bin:/bin",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.run([str(VLLM_PYTHON), *args], capture_output=True, text=True, env=env, timeout=300, **kw)


def test_pinned_cpu_build_is_found_broken_and_the_judges_fix_repairs_it():
    need_vllm()
    r = _vllm("-c", PROBE)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "expand kernel gave" in got["before"] and "not the drafter's" in got["before"]
    assert got["fix"].startswith("vllm.v1.sample.rejection_sampler.expand_kernel replaced")
    assert got["after"] is None and got["again"] is None  # fixed, and a second call changes nothing
    assert got["rows"] == pytest.approx([0.5, 0.5, 1.0, 1.0, 1.0, 2.0])


def test_serve_check_refuses_a_sampled_measure_on_that_build(tmp_path):
    need_vllm()
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 4, "architectures": ["DFlashDraftModel"]}))
    prompts = tmp_path / "prompts.json"
    prompts.write_text("[[1, 2, 3]]")
    out = tmp_path / "out.json"
    r = _vllm("-m", "flashfleet_trainer.vllm_serve_check", str(tmp_path / "no-target"), str(drafter), str(prompts),
              str(out), "--temperature", "1")
    assert r.returncode == 78, r.stderr[-2000:]
    assert "acceptance length at temperature > 0 is not the drafter's" in r.stderr
    assert "(fix: measure at --temperature 0, or on vLLM's GPU build" in r.stderr
    assert not out.exists()  # refused before any engine or output
