"""The target's decoder layers compiled (`compile_decoder_layers`, the trainer's default on a CUDA
target): the same features as the eager forward, hooks and the early stop still working, cached
(evaluation) forwards left eager, a hybrid stack's linear-attention layers compiled in parts; which
targets are compiled by default.
On CPU through dynamo's eager backend (exact); on a GPU through inductor (bf16 rounding)."""

import pytest
import torch
from flashfleet_trainer.compilation import _CompiledUnlessCached, compile_decoder_layers, compiled_by_default
from flashfleet_trainer.target import HiddenStateProducer, linear_attention_kernels, load_target_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LAYER_IDS = [0, 2, 2]  # the tiny target has 4 layers; the deepest feature layer is 2
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_layers_give_the_eager_features_and_cached_forwards_stay_eager(trainer_tiny, device):
    dtype, backend = (torch.float32, "eager") if device == "cpu" else (torch.bfloat16, "inductor")
    path = trainer_tiny / "model"
    ids = torch.randint(1, 127, (3, 40), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([40, 21, 33])
    eager = HiddenStateProducer(None, [device], LAYER_IDS, device,
                                replicas=[(device, load_target_model(path, device, dtype))])
    ref = eager.forward_batch(ids, lengths)
    model = load_target_model(path, device, dtype)
    n_layers = model.config.num_hidden_layers
    assert compile_decoder_layers(model, backend=backend) == n_layers
    calls = {"compiled": 0, "eager": 0}

    def counting(kind, fn):
        def counted(*a, **k):
            calls[kind] += 1
            return fn(*a, **k)
        return counted

    for layer in model.get_decoder().layers:  # count which forward each layer call takes
        for kind in calls:
            setattr(layer.forward, kind, counting(kind, getattr(layer.forward, kind)))
    compiled = HiddenStateProducer(None, [device], LAYER_IDS, device, replicas=[(device, model)])
    tol = dict(atol=0, rtol=0) if device == "cpu" else dict(atol=3e-2, rtol=3e-2)
    for got, want in zip(compiled.forward_batch(ids, lengths), ref, strict=True):
        torch.testing.assert_close(got, want, **tol)
    assert calls == {"compiled": 2 * n_layers, "eager": 0}  # two length groups, every layer compiled
    feats, last = compiled.forward(ids[1:2, :21], want_last=False)
    assert last is None and calls["compiled"] == 2 * n_layers + 3  # stopped after layer 2
    torch.testing.assert_close(feats, ref[0][1:2, :21], **tol)
    from transformers import DynamicCache

    compiled.forward(ids[:1, :8], past_key_values=DynamicCache(config=model.config))
    assert calls["eager"] == n_layers


@pytest.mark.parametrize("device", DEVICES)
def test_a_hybrid_stack_compiles_its_full_attention_layers_whole_and_its_linear_ones_in_parts(device):
    from flashfleet_trainer.tiny import make_hybrid_target

    if device == "cpu" and linear_attention_kernels()["chunk_gated_delta_rule"] != "torch":
        pytest.skip("flash-linear-attention is bound: its kernels take CUDA tensors only")
    dtype, backend = (torch.float32, "eager") if device == "cpu" else (torch.bfloat16, "inductor")
    model = make_hybrid_target(64, 128, 8, seed=3)[0].to(device, dtype).eval().requires_grad_(False)
    ids = torch.randint(1, 63, (3, 48), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([48, 20, 37])
    layer_ids = [1, 3, 6]  # linear, full, linear
    ref = HiddenStateProducer(None, [device], layer_ids, device, replicas=[(device, model)]).forward_batch(ids, lengths)
    assert compile_decoder_layers(model, backend=backend) == 8
    for layer in model.get_decoder().layers:
        linear = hasattr(layer, "linear_attn")
        assert isinstance(layer.forward, _CompiledUnlessCached) != linear
        parts = (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp, layer.linear_attn.norm) if linear else ()
        assert all(hasattr(m.forward, "_torchdynamo_orig_callable") for m in parts)
    compiled = HiddenStateProducer(None, [device], layer_ids, device, replicas=[(device, model)])
    for got, want in zip(compiled.forward_batch(ids, lengths), ref, strict=True):
        if device == "cpu":
            torch.testing.assert_close(got, want, atol=0, rtol=0)
        else:  # bf16 through 8 layers: elementwise bounds flag a few near-zero features; bound the whole
            assert (got.float() - want.float()).norm() <= 2e-2 * want.float().norm()


def test_which_targets_are_compiled_by_default():
    assert compiled_by_default("cuda:0") and compiled_by_default("cuda") and compiled_by_default(torch.device("cuda", 1))
    assert not compiled_by_default("cpu")


def test_the_producer_says_the_first_micro_batch_compiles(trainer_tiny, monkeypatch):
    """In one process the producer's status says so; a target worker process tells its main process."""
    import flashfleet_trainer.target as target
    from flashfleet_trainer.compilation import compile_note

    said = []
    monkeypatch.setattr(target, "compiled_by_default", lambda device: True)  # as on CUDA (looked up in target)
    monkeypatch.setattr(target, "compile_decoder_layers", lambda model: model.config.num_hidden_layers)
    p = target.HiddenStateProducer(trainer_tiny / "model", ["cpu"], LAYER_IDS, "cpu", on_status=said.append,
                              compile_layers=True)
    assert said[-1] == "target 1/1: " + compile_note(4) and p.compiled_layers == 4, said
    assert compile_note(4).startswith("4 decoder layers compile in the first micro-batch")
    said.clear()
    p = target.HiddenStateProducer(trainer_tiny / "model", ["cpu"], LAYER_IDS, "cpu", on_status=said.append)
    assert not any("compile" in s for s in said) and p.compiled_layers == 0, said  # not asked (evaluation, off)


def test_a_target_worker_tells_the_main_process_that_its_first_micro_batch_compiles(monkeypatch):
    import queue
    from types import SimpleNamespace

    from flashfleet_trainer.compilation import compile_note
    from flashfleet_trainer.topology import load_target

    for layers, want in ((64, [("loaded", 3), ("status", "target worker 3: " + compile_note(64))]),
                         (0, [("loaded", 3)])):  # eager (a CPU target, --target-compile off): no note
        monkeypatch.setattr(HiddenStateProducer, "for_training",
                            classmethod(lambda cls, *a, n=layers, **k: SimpleNamespace(compiled_layers=n)))
        events = queue.Queue()
        assert load_target(3, "target worker 3", "cuda:3", None, [1, 2], events).compiled_layers == layers
        assert [events.get_nowait() for _ in range(events.qsize())] == want
