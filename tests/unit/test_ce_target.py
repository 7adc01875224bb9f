"""--ce-target target-argmax: the CE label of each supervised row is the target's most likely token
there, not the data's; unsupervised rows stay ignored, and the target's final state is produced in
every feed that the setting reaches."""

import json

import pytest
import torch
from flashfleet_trainer import loss as loss_mod
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.feed import wants_final_state
from flashfleet_trainer.loss import IGNORE, drafter_loss, get_loss_fn, target_argmax_labels

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _case(seed=0, n=5, b=6, h=16, v=40):
    g = torch.Generator().manual_seed(seed)
    hs, ht = torch.randn(n, b, h, generator=g), torch.randn(n, b, h, generator=g)
    w_head = torch.randn(v, h, generator=g)
    y = torch.randint(0, v, (n, b), generator=g)
    y[:, 0] = IGNORE
    y[1, 2:] = IGNORE
    y[3, 4] = IGNORE
    return hs, ht, w_head, y


def _oracle(ht, w_head, y):
    """The target's argmax at every supervised row, from the whole logits at once."""
    return torch.where(y != IGNORE, (ht @ w_head.T).argmax(-1), y)


def test_argmax_labels_equal_the_whole_logits_argmax_in_any_chunking(monkeypatch):
    _, ht, w_head, y = _case()
    want = _oracle(ht[:, 1:], w_head, y[:, 1:])
    assert (want != y[:, 1:]).any()  # the case tells the target's token from the data's
    for elements in (1, 3 * 40, 7 * 40, 1 << 26):  # one row a chunk, chunks that split a block, one chunk
        monkeypatch.setattr(loss_mod, "ARGMAX_CHUNK_ELEMENTS", elements)
        got = target_argmax_labels(ht[:, 1:], w_head, y[:, 1:])
        assert torch.equal(got, want), elements
    assert (got == IGNORE).sum() == (y[:, 1:] == IGNORE).sum()


@pytest.mark.parametrize("soft", [False, True])
def test_the_loss_trains_on_the_targets_argmax_not_the_data_token(soft, monkeypatch):
    """The loss with target-argmax labels is the data-label loss given the oracle's labels (and not
    the loss on the data's tokens), with soft labels or without; accuracy counts the argmax. With
    soft labels the argmax comes from the loss's own teacher logits: no logits pass of its own."""
    if soft:
        monkeypatch.setattr(loss_mod, "target_argmax_labels", lambda *a: pytest.fail("a second logits pass"))
    hs, ht, w_head, y = _case(seed=1)
    kw = dict(loss_fn=get_loss_fn("torch")[0], weighting="streak", use_soft_labels=soft, kl_temperature=1.0,
              kl_weight=0.5)
    oracle = _oracle(ht, w_head, y)
    got, st = drafter_loss(hs, ht, w_head, y, ce_target="target-argmax", **kw)
    want, st_want = drafter_loss(hs, ht, w_head, oracle, ce_target="data", **kw)
    data, _ = drafter_loss(hs, ht, w_head, y, ce_target="data", **kw)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert abs(got.item() - data.item()) > 1e-3
    assert st["correct"] == st_want["correct"] and st["count"] == st_want["count"]
    assert st["rows"] == int((y != IGNORE).sum())  # unsupervised rows stay out
    _, on_device = drafter_loss(hs, ht, w_head, y, ce_target="target-argmax", host_stats=False, **kw)
    assert torch.equal(on_device["labels"], oracle[:, 1:])  # what DFlash 2's selector loss takes


def test_the_gradient_reaches_the_drafter_only():
    hs, ht, w_head, y = _case(seed=2)
    hs.requires_grad_(True)
    ht.requires_grad_(True)
    loss, _ = drafter_loss(hs, ht, w_head, y, loss_fn=get_loss_fn("torch")[0], ce_target="target-argmax")
    loss.backward()
    assert hs.grad is not None and hs.grad.abs().sum() > 0 and ht.grad is None


def test_target_argmax_asks_every_feed_for_the_final_state(tmp_path):
    """The in-process and worker feeds and the vLLM feed (which then loads the final norm for the last
    layer every server hands over) all ask wants_final_state of the run's loss section."""
    base = ["--target-model", str(tmp_path), "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "o")]
    defaults = parse_args(base).loss
    assert defaults.ce_target == "target-argmax" and defaults.use_soft_labels  # measured (docs/trainer.md)
    for extra, want in (((), True), (("--ce-target", "data"), True),
                        (("--ce-target", "data", "--no-use-soft-labels"), False),
                        (("--kl-weight", "0", "--ce-target", "data"), False),
                        (("--no-use-soft-labels",), True), (("--kl-weight", "0"), True)):
        args = parse_args(base + list(extra))
        assert wants_final_state(args.loss) is want, extra


@pytest.mark.parametrize("soft", ["--use-soft-labels", "--no-use-soft-labels"])
def test_a_training_run_labels_each_row_with_the_targets_argmax_at_its_position(trainer_argv, trainer_tiny,
                                                                                tmp_path, monkeypatch, soft):
    """End to end: the labels the loss trains on are the tiny target's own argmax at anchor+k-1, each
    recomputed here from transformers' logits of the whole sequence; they differ from the data's
    tokens (so a run on the data's tokens fails this test). With soft labels the loss takes them
    from its own teacher logits (and returns them), without from target_argmax_labels."""
    from flashfleet_trainer import trainer as trainer_mod
    from transformers import AutoModelForCausalLM

    seen, real_prepare, real_get = [], trainer_mod.Trainer.prepare, trainer_mod.get_loss_fn

    def prepare(self, epoch, index, idx):
        p = real_prepare(self, epoch, index, idx)
        if p.blocks is not None:
            seen.append({"seqs": [self.data.seq(i)[0] for i in idx], "blocks": p.blocks})
        return p

    def get_loss_fn(*a, **k):
        fn, name = real_get(*a, **k)

        def spy(student, teacher, head, labels, *rest, **kw):
            out = fn(student, teacher, head, labels, *rest, **kw)
            used = out[-1].view(labels.shape) if kw.get("labels_from_teacher") else labels
            seen[len([s for s in seen if "labels" in s])]["labels"] = used.detach().clone()
            return out
        return spy, name

    monkeypatch.setattr(trainer_mod.Trainer, "PREPARE_AHEAD", False)
    monkeypatch.setattr(trainer_mod.Trainer, "prepare", prepare)
    monkeypatch.setattr(trainer_mod, "get_loss_fn", get_loss_fn)
    assert main(trainer_argv("--max-steps", "2", "--ce-target", "target-argmax", soft, "--noise-start", "0",
                             "--noise-end", "0", out=tmp_path / "run")) == 0
    model = AutoModelForCausalLM.from_pretrained(trainer_tiny / "model", dtype=torch.float32).eval()
    checked = differ = 0
    for mb in seen:
        blocks, labels = mb["blocks"], mb["labels"]
        with torch.no_grad():
            logits = [model(torch.as_tensor(s, dtype=torch.long)[None]).logits[0] for s in mb["seqs"]]
        for n in range(blocks.labels.shape[0]):
            z, a = logits[int(blocks.seq[n])], int(blocks.anchor[n])
            for k in range(1, blocks.labels.shape[1]):
                got, data = int(labels[n, k - 1]), int(blocks.labels[n, k])
                if data == IGNORE:
                    assert got == IGNORE
                    continue
                top2 = z[a + k - 1].topk(2).values
                if top2[0] - top2[1] < 1e-4:
                    continue  # a tie within rounding: either token is the argmax
                assert got == int(z[a + k - 1].argmax()), (n, k)
                checked += 1
                differ += got != data
    assert checked > 20 and differ > 0, (checked, differ)
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["step"] == 2 and recs
