"""Where a drafter rank's hidden states come from: the Feed interface and its two implementations.

A Feed turns micro-batches (lists of sequence ids) into target hidden states on the drafter's
device. The Trainer calls, in this order:

    feed.start(data, upcoming)   once, after resume: `data` is the loaded data set, `upcoming`
                                 an iterator over (epoch, index, sequence ids) of exactly the
                                 micro-batches this rank will ask for, in order (for prefetching)
    feed.get(key, idx)           once per micro-batch, key = (epoch, index), idx = its sequence
                                 ids, in the order of `upcoming`: returns its Features
    feed.close(wait)             once, when the rank has finished training (wait=True) or failed (False)

InProcessFeed: the target lives in the drafter's own process and is called in-line, one
micro-batch at a time (one node, one target, one drafter, same device).
QueueFeed: the target workers are other processes of the node (topology.py); the rank keeps
--queue-depth requests outstanding on the node's request queue and reads answers from its own.
With --drafter-serves-target the rank also holds a replica of its own (`local`): whenever no answer
has come back, it takes the node's next request off the queue and serves it on its own device,
instead of waiting (a target-bound split's drafter GPU otherwise idles most of each step).
A rank without a replica hands its interval evaluations to the replicas the same way
(QueueFeed.submit_eval, an EvalRequest; the record comes back through eval_results).
"""

import queue
import time
from dataclasses import dataclass
from typing import Protocol

import torch
from flashfleet.plan.settings import RunConfig

from .evaluate import worker_eval
from .target import HiddenStateProducer


@dataclass
class Features:
    """One micro-batch of hidden states on the drafter's device, and what getting them cost."""

    feats: torch.Tensor  # [S, T, n*H]
    last: torch.Tensor | None  # [S, T, H] final normed hidden (soft labels)
    lengths: torch.Tensor  # [S]
    target_s: float  # seconds a target spent on it
    wait_s: float  # seconds this drafter rank waited for it
    occupancy: float | None = None  # fraction of the queue that was ready when asked (None in-process)
    serve_s: float = 0.0  # of wait_s, seconds this rank's replica served the queue (--drafter-serves-target)
    by_drafter: bool = False  # a drafter rank's replica served it (--drafter-serves-target), not a target worker


class Feed(Protocol):
    """The interface in the module docstring; InProcessFeed and QueueFeed implement it."""

    def start(self, data, upcoming) -> None: ...

    def get(self, key, idx) -> Features: ...

    def close(self, wait: bool = True) -> None: ...


def pad_batch(data, idx):
    """Token ids of micro-batch `idx`, right-padded: (ids [S, T] int64, lengths [S])."""
    seqs = [data.seq(i)[0] for i in idx]
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return ids, lengths


def _sync(devices):
    for d in set(devices):
        if str(d).startswith("cuda"):
            torch.cuda.synchronize(d)


def wants_final_state(loss) -> bool:
    """Whether the target's final normed state goes with its features: only the loss's teacher logits
    read it (the KL term: soft labels with a KL weight above 0; the CE label: --ce-target
    target-argmax); otherwise the target's forward stops at its deepest feature layer and the trainer
    gathers no teacher rows. `loss`: the run's loss section (RunConfig.loss)."""
    return (loss.use_soft_labels and loss.kl_weight > 0) or loss.ce_target == "target-argmax"


@dataclass
class EvalRequest:
    """An interval evaluation a drafter rank hands to whichever replica takes it off the node's
    request queue (trainer.Trainer.interval_eval): the drafter's config and a copy of its weights
    after `step` (CPU: shared memory; CUDA: IPC handles, which the sender keeps alive until the
    answer is back). Its answer on the sender's reply queue is (EVAL, step, record)."""

    drafter: int  # the local rank that asked
    step: int
    config: dict  # DrafterConfig.to_dict()
    weights: dict  # the drafter's state dict


EVAL = "eval"  # an answer's first field when it is an evaluation's record, not a micro-batch's features


def answer(producer, device, request, want_last, by_drafter, cfg: RunConfig | None = None):
    """One request (drafter, key, ids, lengths) served by `producer` on `device`: (drafter, reply),
    the reply in QueueFeed's format, its seconds those of the target alone. An EvalRequest is
    evaluated on this replica instead (needs the run's `cfg`): (drafter, (EVAL, step, record))."""
    if isinstance(request, EvalRequest):
        return request.drafter, (EVAL, request.step, worker_eval(cfg, producer, device, request))
    drafter, key, ids, lengths = request
    t0 = time.perf_counter()
    feats, last = producer.forward_batch(ids, lengths, want_last=want_last)
    _sync([device])
    return drafter, (key, feats, last, lengths, time.perf_counter() - t0, by_drafter)


class InProcessFeed(Feed):
    """The target in the drafter's own process, called in-line: nothing overlaps, nothing to ship.

    It also hands the Trainer the target's embedding and LM head (`embed_weight`, `lm_head_weight`)
    and the producer itself (evaluation reuses it), so the target is loaded once."""

    def __init__(self, cfg: RunConfig, facts, device, log):
        self.producer = HiddenStateProducer.for_training(cfg, facts.target_devices, facts.layer_ids, device, log)
        self.embed_weight, self.lm_head_weight = self.producer.embed_weight, self.producer.lm_head_weight
        self.devices = facts.target_devices + [device]
        self.want_last = wants_final_state(cfg.loss)
        self.data = None  # set by start()

    def start(self, data, upcoming):
        self.data = data  # nothing to prefetch: `upcoming` is not needed

    def get(self, key, idx) -> Features:
        ids, lengths = pad_batch(self.data, idx)
        t0 = time.perf_counter()
        feats, last = self.producer.forward_batch(ids, lengths, want_last=self.want_last)
        _sync(self.devices)
        dt = time.perf_counter() - t0
        return Features(feats, last, lengths, dt, dt)

    def close(self, wait=True):
        pass


class QueueFeed(Feed):
    """A drafter rank's side of the node's queues: keeps `depth` requests outstanding, returns in order.

    requests: the node's one request queue, shared by every target worker and drafter rank;
    replies: this rank's own reply queue. A request is (local_rank, key, ids, lengths); a reply is
    (key, feats, last, lengths, target seconds, by a drafter rank), tensors as torch.multiprocessing handles.
    local: this rank's own HiddenStateProducer (--drafter-serves-target), or None; it answers a
    request of another rank on that rank's queue in `all_replies`."""

    POLL_S = 0.05  # with a replica of its own and no request left to serve: how long to wait for an answer

    def __init__(self, requests, replies, local_rank, depth, device, local=None, all_replies=None, want_last=True,
                 cfg: RunConfig | None = None):
        self.requests, self.replies, self.local_rank = requests, replies, local_rank
        self.cfg = cfg  # the run's settings: a replica of its own may take another rank's EvalRequest
        self.evals = []  # (step, record) of evaluations a replica finished for this rank, not yet taken
        self.depth, self.device = depth, device
        self.local, self.all_replies, self.want_last = local, all_replies, want_last
        self.ready, self.outstanding = {}, 0  # replies that came before they were asked for; requests in flight
        self.served = 0  # requests this rank's replica answered
        self.data = self.upcoming = None  # set by start()

    def start(self, data, upcoming):
        self.data, self.upcoming = data, upcoming
        self._fill()

    def _fill(self):
        while self.outstanding < self.depth:
            epoch, index, idx = next(self.upcoming)
            ids, lengths = pad_batch(self.data, idx)
            self.requests.put((self.local_rank, (epoch, index), ids, lengths))
            self.outstanding += 1

    def get(self, key, idx) -> Features:
        t0, serve_s = time.perf_counter(), 0.0
        occupancy = min(1.0, (len(self.ready) + self.replies.qsize()) / self.depth)
        while key not in self.ready:  # faster targets answer out of order
            serve_s += self._await_one()
        feats, last, lengths, busy, by_drafter = self.ready.pop(key)
        self.outstanding -= 1
        self._fill()
        feats = feats.to(self.device)  # device-to-device when the target sits on another GPU
        last = last.to(self.device) if last is not None else None
        if self.device != "cpu":
            torch.cuda.synchronize(self.device)
        return Features(feats, last, lengths, busy, time.perf_counter() - t0, occupancy, serve_s, by_drafter)

    def _await_one(self) -> float:
        """Take one answer off this rank's queue, or (with a replica, while none is back) serve the
        node's next request, or wait a moment. Returns the seconds spent serving."""
        try:  # with a replica: an answer already back, else work (without waiting), else a short wait
            reply = self.replies.get(block=self.local is None)
        except queue.Empty:
            served = self._serve_one()
            if served:
                return served
            try:
                reply = self.replies.get(timeout=self.POLL_S)
            except queue.Empty:
                return 0.0
        self._keep(reply)
        return 0.0

    def _keep(self, reply):
        if reply[0] == EVAL:
            self.evals.append(reply[1:])
        else:
            self.ready[reply[0]] = reply[1:]

    def submit_eval(self, step, weights, config):
        """Hand an interval evaluation of these weights (after `step`) to the node's replicas."""
        self.requests.put(EvalRequest(self.local_rank, step, config, weights))

    def eval_results(self, wait=False) -> list:
        """The (step, record) of evaluations finished for this rank since the last call; wait: block
        until there is one. Answers of micro-batches read on the way are kept for get()."""
        while True:
            try:
                self._keep(self.replies.get(block=wait and not self.evals))
            except queue.Empty:
                break
            if wait and self.evals:
                break
        got, self.evals = self.evals, []
        return got

    def _serve_one(self) -> float:
        """Take the node's next request, if any, and answer it with this rank's replica: its own into
        `ready`, another rank's on that rank's reply queue. Returns the seconds it took (0: none)."""
        try:  # a worker waiting in get() holds the queue's read lock, so idle workers are served first
            request = self.requests.get_nowait()
        except queue.Empty:
            return 0.0  # every request is with a target worker (or about to be): its answer is coming
        _sync([self.device])  # this rank's queued work first, so the serve's seconds are the target's alone
        drafter, reply = answer(self.local, self.device, request, self.want_last, by_drafter=True,
                                cfg=self.cfg)
        self.served += 1
        if drafter == self.local_rank:
            self._keep(reply)
        else:
            self.all_replies[drafter].put(reply)
        return reply[2]["eval_s"] if reply[0] == EVAL else reply[4]  # the target's seconds

    def close(self, wait=True):
        """Done training (wait): take the answers to the requests still outstanding, so none is left
        on the node's queue once this process is gone (a request's tensors live in this process's
        shared memory: a worker that took one after it left could not read it; the Trainer then
        waits for the other ranks, whose replicas may have served some of these answers from
        theirs). Failed: nothing."""
        while wait and len(self.ready) < self.outstanding:
            self._await_one()
