"""--drafter-serves-target on the rank's side (feed.QueueFeed with a replica of its own): when no
answer has come back, the rank takes the node's next request and serves it itself, its own into
its hand, another rank's onto that rank's queue; an answer already there is used as it is.

The queues are the standard library's (the node's are multiprocessing queues with the same
interface); the replica is a stand-in whose features are a function of the token ids, so which
request a feature came from is visible."""

import queue
import threading

import torch
from flashfleet_trainer.feed import QueueFeed


class Replica:
    """A producer stand-in: features = the ids (float) repeated over 3 channels; counts its calls."""

    def __init__(self):
        self.calls = []

    def forward_batch(self, ids, lengths, want_last=True):
        self.calls.append(ids.clone())
        feats = ids.float()[..., None].expand(-1, -1, 3).clone()
        return feats, (feats[..., :1].clone() if want_last else None)


class Data:
    """Sequence i is [i, i + 1, ..., i + 3]."""

    def seq(self, i):
        return list(range(i, i + 4)), None


def upcoming(start=0):
    for index in range(start, start + 1000):
        yield 0, index, [index * 10, index * 10 + 1]


def feed_for(local_rank=0, depth=2, local=None, ranks=2):
    replies = [queue.Queue() for _ in range(ranks)]
    f = QueueFeed(queue.Queue(), replies[local_rank], local_rank, depth, "cpu", local=local, all_replies=replies)
    return f, replies


def get(f, key, within_s=20.0):
    """f.get(key) in a thread: a feed that never answers fails the test instead of hanging it."""
    out = []
    t = threading.Thread(target=lambda: out.append(f.get(key, None)), daemon=True)
    t.start()
    t.join(within_s)
    assert out, f"no features for {key} within {within_s} s"
    return out[0]


def expected(index):
    ids = torch.tensor([list(range(i, i + 4)) for i in (index * 10, index * 10 + 1)])
    return ids.float()[..., None].expand(-1, -1, 3)


def test_with_no_answer_back_the_rank_serves_its_own_requests_in_order():
    replica = Replica()
    f, _ = feed_for(local=replica)
    f.start(Data(), upcoming())
    for index in range(4):
        got = get(f, (0, index))
        assert torch.equal(got.feats, expected(index)), index
        assert got.last is not None and got.by_drafter and 0 < got.serve_s <= got.wait_s
    assert f.served == 4 and len(replica.calls) == 4
    assert f.requests.qsize() == 2  # the queue stays filled to the depth


def test_another_ranks_request_is_answered_on_its_queue():
    replica = Replica()
    f, replies = feed_for(local_rank=0, local=replica)
    theirs = torch.tensor([[7, 8, 9, 10]])
    f.requests.put((1, (0, 99), theirs, torch.tensor([4])))  # rank 1 asked first
    f.start(Data(), upcoming())
    got = get(f, (0, 0))
    assert torch.equal(got.feats, expected(0))
    key, feats, last, lengths, busy, by_drafter = replies[1].get_nowait()
    assert key == (0, 99) and torch.equal(feats, theirs.float()[..., None].expand(-1, -1, 3)) and busy >= 0
    assert by_drafter
    assert f.served == 2 and replies[0].empty()


def test_an_answer_already_back_is_used_and_no_request_is_taken():
    replica = Replica()
    f, replies = feed_for(local=replica)
    f.start(Data(), upcoming())
    mine = torch.full((2, 4, 3), 5.0)
    replies[0].put(((0, 0), mine, None, torch.tensor([4, 4]), 0.25, False))
    got = get(f, (0, 0))
    assert torch.equal(got.feats, mine) and got.target_s == 0.25 and got.serve_s == 0 and not got.by_drafter
    assert f.served == 0 and replica.calls == []
    assert f.requests.qsize() == 3  # its two, and the one that refilled the answered slot


def test_without_a_replica_the_rank_only_waits():
    f, replies = feed_for(local=None)
    f.start(Data(), upcoming())
    threading.Timer(0.3, replies[0].put, args=(((0, 0), torch.ones(2, 4, 3), None, torch.tensor([4, 4]), 0.1, False),)).start()
    got = get(f, (0, 0))
    assert torch.equal(got.feats, torch.ones(2, 4, 3)) and got.serve_s == 0 and got.wait_s > 0
    assert f.requests.qsize() == 3
