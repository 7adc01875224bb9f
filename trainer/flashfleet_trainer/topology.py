"""The processes of one node: target workers, drafter ranks, and the main process that watches them.

    dflash-train (main process: rendezvous, sd_notify, SIGTERM, watching)
      |- target worker i   one per --target-gpus entry: loads a target replica, serves requests
      |- drafter rank j    one per --drafter-gpus entry: a Trainer; ranks all-reduce gradients
                           (with --drafter-serves-target it holds a target replica too, below)

Hidden states (the rank's side is feed.QueueFeed). Each drafter rank asks for the micro-batches
it will train on, up to --queue-depth ahead, on ONE request queue that every target worker of
the node takes from (so a free target always takes the next request, and faster targets do
more). The answer comes back on the rank's own reply queue. Tensors travel as torch.multiprocessing handles, never as pickled
data: CPU tensors as shared memory, CUDA tensors as CUDA IPC handles, which the rank copies
device-to-device onto its own GPU. The queue is bounded by the number of outstanding requests.
With --drafter-serves-target each drafter rank also loads a replica on its own device and takes
requests off the same queue whenever it would otherwise wait (feed.QueueFeed): in a target-bound
split (the incident's 7 + 1) the drafter's GPU then runs the target in the time it sat idle.

Interval evaluations (--eval-interval) go the same way: rank 0, holding no replica, puts a
feed.EvalRequest (the drafter's config and a copy of its weights) on the request queue; the target
worker that takes it evaluates on its own replica and answers on rank 0's reply queue, while the
drafter ranks train on (docs/trainer.md gives the measurement). At the end each rank takes the
answers still outstanding and the ranks meet in a barrier, so nothing left on a queue refers to
the memory of a process that has gone.

Failure. Children die with the main process (PR_SET_PDEATHSIG). The main process waits on all
children's sentinels: a target or drafter that exits before the drafters finished takes the run
down at once (every child killed, one line naming the worker, its pid and its exit; exit 1;
rank 0's node records it in status.json). A non-finite loss is all-reduced, so every drafter rank
raises it at the same step, before anything saves that state: the ranks exit 65 (EX_NONFINITE),
rank 0 having printed and recorded the line, and the node exits 65 too (the unit does not
restart on it). Across nodes the main processes share the c10d
TCPStore of the rendezvous: each writes its wall clock there every second (its heartbeat) and
watches the others'; a node whose heartbeat stands still for --node-timeout seconds, or a
failure published under the key `failed`, stops every node. Which node went first: when one
node's drafter dies, the collectives of every other node fail within moments too, so a node that
sees a local failure records when it happened (`down/<node>`), waits a few seconds for the
others' records (a node killed outright records nothing, but its heartbeat stops), and names the
earliest. A node that restarts while the run it belonged to is still under way does not join it:
it says so and exits, and the units start again together. The main process exits last, after
multiprocessing's resource tracker (see _end_resource_tracker).

Notifications. Every sd_notify message goes out from the main process: local rank 0 forwards its
own (QueueNotifier), the other ranks say nothing. The unit sets NotifyAccess=all, but one sender
is what lets READY=1 wait until every local target worker has loaded too.

Stopping. SIGTERM reaches every process of the unit's cgroup. Drafter ranks agree to stop in the
step's all-reduce, rank 0 saves, all exit 0; target workers ignore SIGTERM and leave when the
main process tells them to (after the drafters are done); the main process then exits 0.
"""

import ctypes
import datetime
import gc
import json
import multiprocessing.connection as mpc
import os
import queue
import signal
import socket
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp
from flashfleet.contract import messages
from flashfleet.contract.messages import EX_CONFIG, EX_NONFINITE
from flashfleet.plan.settings import RunConfig

from .errors import ConfigError, NonFiniteLoss
from .feed import QueueFeed, answer, wants_final_state
from .metrics import Status
from .notify import Notifier
from .target import HiddenStateProducer
from .trainer import Rank, run_rank

HEARTBEAT_S = 1.0
# Once something has failed, a peer whose heartbeat stood still this long is taken to be gone,
# and this is how long a failing node waits for the others' records before naming the first.
STALL_S = 3 * HEARTBEAT_S
BLAME_WAIT_S = 2 * STALL_S


class TopologyError(RuntimeError):
    """A worker or node failed, or the nodes never met: not a config error, not retried in-process."""


def _die_with_parent():
    """Ask the kernel to SIGKILL this child if the main process goes away (no orphaned workers)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _cpu_threads(n_procs: int):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, n_procs)))


class QueueNotifier(Notifier):
    """Local rank 0's notifier: its messages become events that the node's main process sends on
    (holding READY=1 back until every local target worker has loaded)."""

    def __init__(self, events):
        self.events = events

    def status(self, text):
        self.events.put(("status", text))

    def ready(self, text="training"):
        self.events.put(("ready", text))

    def watchdog(self):
        self.events.put(("watchdog", ""))

    def stopping(self):
        self.events.put(("stopping", ""))


# ---- target worker ---------------------------------------------------------------------------

def load_target(index, name, device, cfg: RunConfig, layer_ids, events):
    """A target replica's producer (a worker's, or a serving drafter rank's: `name`), loaded; the main
    process is told, and, when the layers compile in the first micro-batch, why that one will be
    slow (its status line)."""
    from .compilation import compile_note

    producer = HiddenStateProducer.for_training(cfg, [device], layer_ids, device)
    events.put(("loaded", index))
    if producer.compiled_layers:
        events.put(("status", f"{name}: {compile_note(producer.compiled_layers)}"))
    return producer


def target_worker(index, device, args, layer_ids, requests, replies, events, n_procs):
    """Serve hidden states for requests (drafter, key, ids, lengths), and interval evaluations for
    feed.EvalRequest's, until a None arrives."""
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # leave when told, after the drafters saved
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if device == "cpu":
        _cpu_threads(n_procs)
    else:
        torch.cuda.set_device(device)
    producer = load_target(index, f"target worker {index}", device, args, layer_ids, events)
    for q in replies:
        q.cancel_join_thread()  # replies nobody reads any more must not block this process's exit
    want_last = wants_final_state(args.loss)
    while True:
        req = requests.get()
        if req is None:
            return
        drafter, reply = answer(producer, device, req, want_last, by_drafter=False, cfg=args)
        replies[drafter].put(reply)
        del reply, req  # an evaluation's weights (CUDA: the sender's memory) are let go at once


# ---- drafter rank ----------------------------------------------------------------------------

def drafter_rank(local_rank, rank, world, n_targets, args, facts, store_addr, requests, replies, events,
                 stop_event, main_pid, depth, n_procs, crashed_at):
    """One data-parallel drafter rank in its own process. Exit code: 0, 78 (config), 65 (a non-finite
    loss: every rank sees the same all-reduced one and stops at the same step), 1 (crash)."""
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())  # until the Trainer installs its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch.distributed as dist

    device = facts.drafter_devices[local_rank]
    if device == "cpu":
        _cpu_threads(n_procs)
    else:
        torch.cuda.set_device(device)
    code = 0
    try:
        if world > 1:
            host, port = store_addr
            store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=args.rdzv_timeout))
            # Generous: rank 0 may save a checkpoint while the others wait in the next all-reduce;
            # dead peers are detected by the main processes, not by this timeout.
            dist.init_process_group("gloo" if device == "cpu" else "nccl", store=dist.PrefixStore("drafters", store),
                                    rank=rank, world_size=world, timeout=datetime.timedelta(hours=1))
        local = None
        if args.drafter_serves_target:  # a replica of its own, counted after the node's target workers
            local = load_target(len(facts.target_devices) + local_rank, f"drafter rank {rank}'s target", device,
                                args, facts.layer_ids, events)
        feed = None if args.target_servers else QueueFeed(  # None: the Trainer asks the vLLM servers itself
            requests, replies[local_rank], local_rank, depth, device, local=local, all_replies=replies,
            want_last=wants_final_state(args.loss), cfg=args)
        r = Rank(rank=rank, world=world, local_rank=local_rank, n_targets=n_targets,
                 notifier=QueueNotifier(events) if local_rank == 0 else Notifier.null(), stop_event=stop_event,
                 main_pid=main_pid)
        log = (lambda s: print(s, flush=True)) if rank == 0 else (lambda s: print(f"[rank {rank}] {s}", flush=True))
        run_rank(args, facts, log, rank=r, feed=feed)
    except ConfigError as e:
        print(e.line(), file=sys.stderr, flush=True)
        code = EX_CONFIG
    except NonFiniteLoss as e:  # run_rank has recorded it in status.json (rank 0)
        if rank == 0:
            print(e.line(), file=sys.stderr, flush=True)
        code = EX_NONFINITE
    except BaseException:
        crashed_at[local_rank] = time.time()  # before anything else: a peer's collective fails right after
        traceback.print_exc()
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(code)  # skip queue feeder joins: the main process owns the queues' lifetime


# ---- the node's main process -----------------------------------------------------------------

def _describe_exit(code) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Node:
    """One node's main process: rendezvous, spawn, forward notifications, watch, stop."""

    def __init__(self, args, facts, log):
        self.args, self.facts, self.log = args, facts, log
        self.T, self.D = len(facts.target_devices), len(facts.drafter_devices)
        # Target replicas on this node: one per worker, and one in each drafter rank that serves.
        self.replicas = self.T + (self.D if args.drafter_serves_target else 0)
        self.world = args.nnodes * self.D
        self.node = args.node_rank
        self.main = self.node == 0  # global rank 0 lives here: status.json is this node's to write
        self.notifier = Notifier()  # sd_notify: this process speaks for its children (QueueNotifier)
        self.status = None  # status.json, on node 0 (set in run)
        self.store = None  # the c10d TCPStore (set in rendezvous; None for a single rank)
        self.endpoint = None  # the rendezvous address (across nodes)
        self.beats = None  # once all have joined: {other node: (its last heartbeat seen, monotonic time seen)}
        # target workers (or vLLM target servers) in the whole run (rendezvous counts other nodes')
        self.n_targets_total = self.T or len(facts.servers)
        # Set in spawn: the queues and shared state every child gets, and the children themselves.
        self.requests = self.events = self.stop = self.crashed_at = None
        self.replies = []
        self.children = []  # (role, index, device, rank, process)

    # -- rendezvous --
    def rendezvous(self) -> tuple[str, int] | None:
        """Store address for the drafters' process group (None when there is only one rank)."""
        import torch.distributed as dist

        a = self.args
        timeout = datetime.timedelta(seconds=a.rdzv_timeout)
        if a.nnodes == 1:
            if self.world == 1:
                return None
            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
            return "127.0.0.1", self.store.port
        host, port = a.rdzv_endpoint.rsplit(":", 1)
        self.endpoint = a.rdzv_endpoint
        try:
            self.store = dist.TCPStore(host, int(port), is_master=self.main, wait_for_workers=False, timeout=timeout)
        except Exception as e:
            raise TopologyError(f"node {self.node}: cannot reach the rendezvous store at {a.rdzv_endpoint} within "
                                f"{a.rdzv_timeout:.0f}s ({str(e).splitlines()[0]})") from e
        if not self.main and self.store.check(["started"]):
            why = (f"node {self.node} restarted while the run it belonged to was still under way; the run stops "
                   f"and every node starts again from the newest checkpoint")
            self._publish_failure(self.node, why)
            raise TopologyError(why)
        me = {"host": socket.gethostname(), "targets": self.n_targets_total, "drafters": self.D}
        self._beat()
        self.store.set(f"join/{self.node}", json.dumps(me))
        keys = [f"join/{i}" for i in range(a.nnodes)]
        self.log(f"node {self.node}/{a.nnodes}: joined the rendezvous at {a.rdzv_endpoint}, waiting for the others")
        try:
            self.store.wait(keys, timeout)
        except Exception as e:
            missing = [i for i, k in enumerate(keys) if not self.store.check([k])]
            raise TopologyError(f"rendezvous at {a.rdzv_endpoint}: node(s) {missing} did not join within "
                                f"{a.rdzv_timeout:.0f}s") from e
        nodes = [json.loads(self.store.get(k)) for k in keys]
        if any(n["drafters"] != self.D for n in nodes):
            raise ConfigError(f"nodes disagree on the number of drafter ranks ({[n['drafters'] for n in nodes]})",
                              "give every node the same --drafter-gpus count")
        self.n_targets_total = sum(n["targets"] for n in nodes)
        self.log(f"node {self.node}: all {a.nnodes} nodes joined ({', '.join(n['host'] for n in nodes)}); "
                 f"{self.n_targets_total} target worker(s), {self.world} drafter rank(s) in all")
        if self.main:
            self.store.set("started", "1")
        self.beats = {i: (None, time.monotonic()) for i in range(a.nnodes) if i != self.node}
        return host, int(port)

    # -- spawning --
    def spawn(self, store_addr):
        a, p = self.args, self.facts
        ctx = mp.get_context("spawn")
        self.requests, self.events, self.stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.crashed_at = ctx.Array("d", self.D)  # when each drafter rank raised (wall clock), for naming the first
        self.replies = [ctx.Queue() for _ in range(self.D)]
        depth = a.queue_depth or max(2, -(-2 * self.T // self.D))
        n_procs = self.T + self.D
        for i, dev in enumerate(p.target_devices):
            proc = ctx.Process(target=target_worker, name=f"target-{i}", args=(
                i, dev, a, p.layer_ids, self.requests, self.replies, self.events, n_procs))
            proc.start()
            self.children.append(("target worker", i, dev, None, proc))
        child_plan = _strip(p)
        for j, dev in enumerate(p.drafter_devices):
            rank = self.node * self.D + j
            proc = ctx.Process(target=drafter_rank, name=f"drafter-{rank}", args=(
                j, rank, self.world, self.n_targets_total, a, child_plan, store_addr, self.requests, self.replies,
                self.events, self.stop, os.getpid(), depth, n_procs, self.crashed_at))
            proc.start()
            self.children.append(("drafter rank", rank, dev, rank, proc))
        for role, i, dev, _, proc in self.children:
            self.log(f"node {self.node}: started {role} {i} on {dev} (pid {proc.pid})")
        if self.main:
            self.status.update(workers=[{"role": role, "index": i, "device": dev, "pid": proc.pid, "node": self.node}
                                        for role, i, dev, _, proc in self.children])

    # -- watching --
    def _beat(self):
        """A heartbeat is the sender's wall clock: a silent node's last one says when it was last alive."""
        self.store.set(f"hb/{self.node}", repr(time.time()))

    def _silent_nodes(self, after_s) -> dict[int, float]:
        """Other nodes whose heartbeat has not changed for after_s seconds (of this node's watching):
        {node: its last heartbeat's time}. Nodes that said they are done are dropped from the watch."""
        now, silent = time.monotonic(), {}
        for i, (seen, since) in list(self.beats.items()):
            if self.store.check([f"done/{i}"]):
                del self.beats[i]
                continue
            beat = self.store.get(f"hb/{i}").decode()
            if beat != seen:
                self.beats[i] = (beat, now)
            elif now - since > after_s:
                silent[i] = float(beat)
        return silent

    def heartbeat(self) -> str | None:
        """Beat, and look at the other nodes. Returns a failure message or None."""
        try:
            self._beat()
            if self.store.check(["failed"]):
                first = json.loads(self.store.get("failed"))
                return messages.went_first(self.node, first["node"], first["msg"])
            for i, wall in self._silent_nodes(self.args.node_timeout).items():
                msg = f"node {i} stopped heartbeating {time.time() - wall:.0f}s ago (its process or host is gone)"
                self._publish_failure(i, msg)
                return messages.went_first(self.node, i, msg)
        except Exception as e:
            return messages.went_first(self.node, 0, f"the rendezvous store at {self.endpoint} is gone "
                                                    f"({str(e).splitlines()[0]})")
        return None

    def _publish_failure(self, node, msg):
        """Record which node failed first, and how (first writer wins: later accounts are echoes)."""
        try:
            self.store.compare_set("failed", "", json.dumps({"node": node, "msg": msg}))
        except Exception:
            pass  # the store's host is gone; the others learn it from that

    def _who_went_first(self, msg, at) -> str:
        """After a local failure at wall time `at` in a multi-node run, name the node that went first.

        Records the failure (down/<node>), then waits up to BLAME_WAIT_S until every other node has
        either recorded one too or fallen silent for STALL_S (killed outright: no record, and its
        last heartbeat says when it was last alive). The earliest is named; a node still healthy at
        the end is not a candidate. Returns this node's message, with the first node's account
        appended when that is another node, and publishes the first node's account under `failed`.
        """
        try:
            self.store.set(f"down/{self.node}", json.dumps({"at": at, "msg": msg}))
            deadline = time.monotonic() + BLAME_WAIT_S
            while True:
                downs = {i: json.loads(self.store.get(f"down/{i}")) for i in range(self.args.nnodes)
                         if self.store.check([f"down/{i}"])}
                silent = {i: t for i, t in self._silent_nodes(STALL_S).items() if i not in downs}
                if all(i in downs or i in silent for i in self.beats) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        except Exception:
            return msg  # the store's host is gone: what this node saw is all there is
        accounts = [(d["at"], i, d["msg"]) for i, d in downs.items()]
        accounts += [(t, i, f"node {i} stopped heartbeating (its process or host is gone)") for i, t in silent.items()]
        _, first, first_msg = min(accounts)
        self._publish_failure(first, first_msg)
        try:
            self.store.set(f"named/{self.node}", str(first))
            if self.main:  # the store lives in this process: keep it until the failing nodes have named theirs
                self._wait_for_keys([f"named/{i}" for i in downs], BLAME_WAIT_S)
        except Exception:
            pass
        return msg if first == self.node else messages.also_went_first(msg, first, first_msg)

    def watch(self) -> int:
        """Until the drafters finish (0), one fails (1, 78, or 65 on a non-finite loss), or another node does (1)."""
        loaded, ready_pending, ready_sent, last_beat = set(), None, False, 0.0
        procs = {proc.sentinel: c for c in self.children for proc in [c[4]]}
        drafters_left = {c[3] for c in self.children if c[0] == "drafter rank"}
        while True:
            mpc.wait(list(procs), timeout=0.5)
            while True:
                try:
                    kind, value = self.events.get_nowait()
                except queue.Empty:
                    break
                if kind == "loaded":
                    loaded.add(value)
                    self.notifier.status(f"target {len(loaded)}/{self.replicas} loaded")
                elif kind == "status":
                    self.notifier.status(value)
                elif kind == "ready":
                    ready_pending = value
                elif kind == "watchdog":
                    self.notifier.watchdog()
                elif kind == "stopping":
                    self.notifier.stopping()
            if ready_pending and not ready_sent and len(loaded) == self.replicas:
                self.notifier.ready(ready_pending)  # every rank has joined and stepped, every target loaded
                ready_sent = True
            for sentinel, (role, i, dev, rank, proc) in list(procs.items()):
                code = proc.exitcode
                if code is None:
                    continue
                del procs[sentinel]
                if role == "drafter rank" and code == 0:
                    drafters_left.discard(rank)
                    continue
                if role == "drafter rank" and code == EX_CONFIG:
                    return self.fail(f"node {self.node}: drafter rank {i} stopped on a config error (see above)",
                                     EX_CONFIG)
                if role == "drafter rank" and code == EX_NONFINITE:
                    return self.fail(f"node {self.node}: drafter rank {i} stopped on a non-finite loss or gradient "
                                     "norm (see above; the newest checkpoint is the last good one)", EX_NONFINITE)
                local = i - self.node * self.D if role == "drafter rank" else None
                return self.fail(f"node {self.node}: {role} {i} (pid {proc.pid}, {dev}) {_describe_exit(code)}",
                                 at=(self.crashed_at[local] or None) if local is not None else None)
            if not drafters_left:
                return self.finish()
            if self.store is not None and self.args.nnodes > 1 and time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                msg = self.heartbeat()
                if msg:
                    return self.fail(msg, publish=False)

    def finish(self) -> int:
        """Drafters are done: release the targets, then leave."""
        if self.store is not None and self.args.nnodes > 1:
            try:
                self.store.set(f"done/{self.node}", "1")
            except Exception:
                pass  # node 0 may already be gone; our part is done either way
        for _ in range(self.T):
            self.requests.put(None)
        deadline = time.monotonic() + 60
        for role, i, _, _, proc in self.children:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                self.log(f"node {self.node}: {role} {i} did not exit; killing pid {proc.pid}")
                proc.kill()
                proc.join()
        if self.main and self.args.nnodes > 1:  # the store lives here: keep it until the others are done
            self._wait_for_keys([f"done/{i}" for i in range(1, self.args.nnodes)], self.args.node_timeout)
        return 0

    def _wait_for_keys(self, keys, timeout_s):
        """Until every key is in the store, or timeout_s passed (node 0 keeping its store up for others)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(self.store.check([k]) for k in keys):
            time.sleep(0.2)

    def fail(self, msg, code=1, publish=True, at=None) -> int:
        """End the run on this node. at: when the failure happened, if earlier than now (wall clock)."""
        at = at or time.time()
        self.kill_all()
        if publish and self.store is not None and self.beats is not None:
            msg = self._who_went_first(msg, at)
        if self.main:
            st = Status(self.args.output_dir, keep=True)
            if code == EX_NONFINITE and messages.NONFINITE_RE.match(st.state.get("last_error") or ""):
                st.update(phase="failed")  # rank 0's own line (which step, which value) stays last_error
            else:
                st.update(phase="failed", last_error=msg)
        print(messages.error(msg), file=sys.stderr, flush=True)
        return code

    def release(self):
        """Flush and close the queue this process wrote to (its feeder thread holds semaphores)."""
        if self.requests is not None:
            self.requests.close()
            self.requests.join_thread()

    def kill_all(self):
        for _, _, _, _, proc in self.children:
            if proc.exitcode is None:
                proc.kill()
        for _, _, _, _, proc in self.children:
            proc.join(10)

    def run(self) -> int:
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        stop_seen = []

        def on_term(*_):
            if self.stop is not None:
                self.stop.set()
            if not stop_seen:
                stop_seen.append(1)
                self.notifier.stopping()
                self.log("stop requested: the drafter ranks finish the current step, rank 0 saves")

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        try:
            if self.main:
                self.status = Status(self.args.output_dir)
                self.status.update(phase="loading")
            self.notifier.status("rendezvous" if self.args.nnodes > 1 else "starting workers")
            try:
                store_addr = self.rendezvous()
            except TopologyError as e:
                return self.fail(str(e))
            self.spawn(store_addr)
            if stop_seen:
                self.stop.set()
            return self.watch()
        except BaseException:
            self.kill_all()
            raise
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def _strip(facts):
    """The start facts without the transformers config, so drafter ranks need not import transformers."""
    import dataclasses

    return dataclasses.replace(facts, target_config=None)


def _end_resource_tracker():
    """Make this process the unit's last one to exit.

    multiprocessing's resource tracker (a helper process that spawn-started children need) ignores
    SIGTERM and leaves only after this process has gone. On a cgroup-v1 host systemd inside a
    container is never told when a unit's last process leaves, so a stop would wait out
    TimeoutStopSec and end `failed (timeout)`. Closing the tracker's pipe ends it; waiting for it
    here means the cgroup is empty when systemd sees the main process exit.
    """
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    fd, pid = getattr(tracker, "_fd", None), getattr(tracker, "_pid", None)
    if fd is None or pid is None:
        return
    tracker._fd = tracker._pid = None
    try:
        os.close(fd)
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
        pass


def supervise(args, facts, log) -> int:
    node = Node(args, facts, log)
    try:
        return node.run()
    finally:
        node.release()
        del node
        gc.collect()  # the queues' and events' semaphores unregister now, while the tracker still listens
        _end_resource_tracker()
