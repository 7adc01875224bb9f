"""DFlash 2 drafters exported by dflash-export, served by vLLM itself and by z-lab's dflash.

vLLM's CPU build refuses to start a DFlash 2 drafter; tests/vllm_dflash2.py makes it run, for the
tests only (docs/export.md says what it changes and why), and serves three drafters of one shape
with one engine start: a trained DFlash 2 drafter, an untrained one, and the trained one's backbone
with identity convolutions and a zero selector. What a user serving them would see must be what
the project's evaluator measured: vLLM's greedy output is the target's own, its mean acceptance
length equals dflash-eval's tau within 2%, the untrained drafter is accepted about never, and
identity convolutions with a zero selector draft exactly as the same backbone exported as a DFlash
drafter does. z-lab's DFlash2DraftModel loads the same export as a second client and its greedy
speculative loop gives the target's output too. On a host whose vLLM is the CPU build, collect.yml
-e serve_check=true says in one line that DFlash 2 needs vLLM's GPU build.
"""

import json
import os
import subprocess

import pytest
import torch
from flashfleet_trainer import export, vllm_serve_check
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig
from flashfleet_trainer.evaluate import load_exported_drafter, load_prompts, speculative_tau
from flashfleet_trainer.target import HiddenStateProducer

from tests.unit.test_export import _zlab
from tests.vllm_server import ROOT, VLLM_PYTHON, collect_here, need_vllm

MAX_NEW = 16
PROMPTS = 4
BLOCK = 4
DFLASH2 = ("--drafter-kind", "dflash2", "--selector-rank", "32")  # speculators' other defaults (16 channels a group, top-16)
# The data's labels and the CE alone: with 4 prompts x 16 tokens one cycle is 3-5% of tau, so the 2%
# comparison needs drafts free of near-ties between the two fp32 paths; this drafter is (the
# argmax-trained one drafts one cycle differently, 3.25 against 3.14)
LABELS = ("--ce-target", "data", "--no-use-soft-labels")


def _train(tiny, root, name, *extra):
    argv = ["--target-model", str(tiny / "model"), "--data-dir", str(tiny / "data"), "--output-dir",
            str(root / name), "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", str(BLOCK),
            "--num-draft-layers", "2", "--token-budget", "256", "--max-seq-len", "32", "--max-batch-size", "8",
            "--max-anchors", "16", "--warmup-ratio", "0.1", "--eval-num-prompts", "0", "--log-interval", "1000",
            *DFLASH2, *LABELS, *extra]
    assert train_main(argv) == 0
    out = root / f"{name}-export"
    assert export.main([str(root / name), str(out)]) == 0
    return out


def _write(cfg, state, tiny, out):
    config, tensors = export.to_dflash(cfg, state, export.target_facts(tiny / "model"))
    return export.write_dir(out, config, tensors, "# test\n")


def _identity_and_dflash(tiny, run, root):
    """The trained run's backbone twice: as DFlash 2 with identity convolutions and a zero
    selector, and as a DFlash drafter (the same tensors less the convolutions and the selector)."""
    cfg, state = export.read_checkpoint(export.resolve_checkpoint(run))
    drafter = DFlashDrafter(cfg)
    drafter.load_state_dict(state)
    with torch.no_grad():
        for layer in drafter.layers:
            layer.attention_conv.reset_parameters()  # base tap 0 = 1, the rest and the projection 0
            layer.mlp_conv.reset_parameters()
        for p in drafter.selector.parameters():
            p.zero_()
    identity = _write(cfg, drafter.state_dict(), tiny, root / "identity")
    plain_cfg = DrafterConfig.from_dict({**cfg.to_dict(), "drafter_kind": "dflash"})
    plain = {k: v for k, v in state.items() if "_conv." not in k and not k.startswith("selector.")}
    return identity, _write(plain_cfg, plain, tiny, root / "dflash")


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """The serving test's tiny target (trained until a drafter can learn it; heads of 32, which
    vLLM's CPU attention takes), a DFlash 2 drafter trained on it and one that was not, and the
    trained one's backbone as identity-DFlash 2 and as DFlash."""
    need_vllm()
    from flashfleet_trainer.tiny import build

    root = tmp_path_factory.mktemp("serve2")
    tiny = root / "tiny"
    build(tiny, seed=0, vocab=128, hidden=128, layers=4, steps=100, num_seqs=64, prompt_len=8,
          completion_len=24, num_eval=PROMPTS, log=lambda s: None)
    trained = _train(tiny, root, "trained", "--lr", "3e-3", "--max-steps", "100")
    untrained = _train(tiny, root, "untrained", "--lr", "1e-12", "--max-steps", "1")
    identity, dflash = _identity_and_dflash(tiny, root / "trained", root)
    return tiny, trained, untrained, identity, dflash


def _evaluator(tiny, drafter_dir, prompts):
    """dflash-eval's figures (tau, each prompt's output) for an exported drafter, in this process."""
    drafter = load_exported_drafter(drafter_dir, tiny / "model")
    producer = HiddenStateProducer(tiny / "model", ["cpu"], drafter.config.target_layer_ids, "cpu")
    trace = []
    res = speculative_tau(producer, drafter, prompts, drafter.config.block_size, MAX_NEW, trace=trace)
    return res["tau"], [t["output"][:MAX_NEW] for t in trace]


def _vllm(tiny, drafter_dirs, dflash_dir, prompts, tmp_path):
    """vLLM's figures for each DFlash 2 drafter, one engine (tests/vllm_dflash2.py), and, side by
    side in a second process, for a DFlash drafter served as users serve it (vllm_serve_check)."""
    path, out2, out1 = tmp_path / "prompts.json", tmp_path / "dflash2.json", tmp_path / "dflash.json"
    path.write_text(json.dumps(prompts))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "trainer"), "VLLM_CPU_KVCACHE_SPACE": "1"}
    new = ["--max-new-tokens", str(MAX_NEW)]
    argvs = ([str(ROOT / "tests" / "vllm_dflash2.py"), str(tiny / "model"), str(path), str(out2),
              *map(str, drafter_dirs), *new],
             ["-m", "flashfleet_trainer.vllm_serve_check", str(tiny / "model"), str(dflash_dir), str(path), str(out1),
              *new])
    procs = [subprocess.Popen([str(VLLM_PYTHON), *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for argv in argvs]
    try:
        for proc in procs:
            log, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, log[-4000:]
    finally:
        for proc in procs:  # the other one, when one failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return json.loads(out2.read_text()), json.loads(out1.read_text())


@pytest.mark.slow
def test_vllm_serves_dflash2_exports_as_the_evaluator_measured_them(drafters, tmp_path):
    torch.set_num_threads(1)
    tiny, trained, untrained, identity, dflash = drafters
    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["block_size"] == BLOCK
    prompts = load_prompts(tiny / "data" / "eval" / "prompts.jsonl", PROMPTS)
    tau, outputs = _evaluator(tiny, trained, prompts)
    assert tau > 1.5, tau  # the comparison is about accepted drafts, not only bonus tokens
    tau0, outputs0 = _evaluator(tiny, untrained, prompts)
    tau_dflash, outputs_dflash = _evaluator(tiny, dflash, prompts)

    (served, served0, served_id), served_dflash = _vllm(tiny, [trained, untrained, identity], dflash, prompts,
                                                        tmp_path)
    for s in (served, served0, served_id, served_dflash):
        assert s["vllm_version"].startswith("0.32") and s["block_size"] == BLOCK and s["drafts"] > 0, s
        assert s["outputs"] == outputs  # greedy and lossless: the target's own tokens
    assert outputs0 == outputs_dflash == outputs
    assert served["tau"] == pytest.approx(tau, rel=0.02), (served["tau"], tau)
    assert served0["tau"] < 1.2 and tau0 < 1.2, (served0["tau"], tau0)
    assert served_dflash["tau"] == pytest.approx(tau_dflash, rel=0.02), (served_dflash["tau"], tau_dflash)
    # identity convolutions and a zero selector: exactly the DFlash drafter's drafts and acceptance
    counts = ("drafts", "draft_tokens", "accepted")
    assert [served_id[k] for k in counts] == [served_dflash[k] for k in counts], (served_id, served_dflash)
    assert served_id["tau"] != served["tau"]  # and not what the trained modules give


@pytest.mark.slow
def test_zlab_dflash2_loads_the_export_and_generates_the_targets_output(drafters, monkeypatch):
    """z-lab's DFlash2DraftModel (dflash 0.1.0) reads the trained export (its convolutions, its
    selector) and its greedy speculative loop against the target in transformers gives the
    target's own output, the evaluator's, committing what the evaluator commits in every cycle
    with a whole block to verify."""
    import time

    from transformers import AutoModelForCausalLM

    zlab = _zlab()
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # its stats time with torch.cuda.synchronize()
    tiny, trained, *_ = drafters
    model = zlab.DFlash2DraftModel.from_pretrained(str(trained), dtype=torch.float32).eval()
    assert model.block_size == BLOCK and model.candidate_selector.top_k == 16
    assert model.layers[0].attention_conv.base_kernel.shape == (2, 2, 128)
    target = AutoModelForCausalLM.from_pretrained(str(tiny / "model"), dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
    prompts = load_prompts(tiny / "data" / "eval" / "prompts.jsonl", PROMPTS)
    drafter = load_exported_drafter(trained, tiny / "model")
    producer = HiddenStateProducer(tiny / "model", ["cpu"], drafter.config.target_layer_ids, "cpu")
    trace = []
    speculative_tau(producer, drafter, prompts, BLOCK, MAX_NEW, trace=trace)
    for prompt, ours in zip(prompts, trace, strict=True):
        st = zlab.dflash_generate(model, target, torch.tensor([prompt]), MAX_NEW, None, return_stats=True)
        assert st.output_ids[0, len(prompt):].tolist() == ours["output"][:MAX_NEW]
        start, full = len(prompt), 0  # cycles with a whole block and no truncation at max_length
        for produced in st.acceptance_lengths:
            if start + BLOCK + 1 > len(prompt) + MAX_NEW:
                break
            full, start = full + 1, start + produced
        assert full >= 2 and st.acceptance_lengths[:full] == ours["committed"][:full]


def test_the_serve_check_says_dflash2_needs_vllms_gpu_build(tmp_path):
    """vllm_serve_check (vLLM's venv, importing nothing of flashfleet) refuses a DFlash 2 drafter on
    vLLM's CPU build in one line, and nothing else: a DFlash drafter, or DFlash 2 on the GPU build."""
    assert vllm_serve_check.DFLASH2 == export.ARCHITECTURES["dflash2"]
    for kind in ("dflash", "dflash2"):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "config.json").write_text(json.dumps({"architectures": [export.ARCHITECTURES[kind]],
                                                                 "block_size": BLOCK}))
    line = vllm_serve_check.build_problem(tmp_path / "dflash2", on_cpu=True)
    assert "DFlash 2 needs vLLM's GPU build on the host" in line and "CPU build, which refuses" in line
    assert "(fix: " in line and "serve_check=true" in line
    assert vllm_serve_check.build_problem(tmp_path / "dflash2", on_cpu=False) is None
    assert vllm_serve_check.build_problem(tmp_path / "dflash", on_cpu=True) is None


@pytest.mark.slow
def test_collect_serve_check_says_dflash2_needs_vllms_gpu_build(drafters, tmp_path, run_playbook):
    """collect.yml -e export=true -e serve_check=true for a DFlash 2 run on a host whose vLLM is
    the CPU build (this machine, local connection): the play fails with the one line, before
    dflash-eval measures anything and before vLLM loads a model."""
    tiny, trained, *_ = drafters
    r = collect_here(run_playbook, tmp_path, tiny, trained.parent / "trained")
    run, home, host_root = "trained", tmp_path / "runs", tmp_path / "host"
    out = r.stdout.read()
    assert r.rc != 0
    assert "serve_check on here: flashfleet-train: config error: " in out, out[-3000:]
    assert "DFlash 2 needs vLLM's GPU build on the host" in out
    assert (home / run / "drafter" / "config.json").is_file()  # the export itself came home
    assert not (host_root / run / "serve-check" / "prompts.json").exists()  # dflash-eval never ran
    assert not (home / run / "serve_check.json").exists()
