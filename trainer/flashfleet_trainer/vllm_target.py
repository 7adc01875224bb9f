"""The target computed by vLLM servers (--target-servers): a feed.Feed that asks them for features.

A target larger than one GPU (Qwen3.6-27B on 48 GB cards, Qwen3-235B anywhere) runs in vLLM, with
vLLM's own tensor and data parallelism; the trainer never loads its layers. Each server runs the
`extract_hidden_states` speculative method with flashfleet's KV connector (vllm_connector.py):
a completion request for a sequence's token ids (one output token) makes the server write that
sequence's hidden states at the layers it was started for to a safetensors file on this host
(/dev/shm), whose path comes back in the reply's `kv_transfer_params`. Here:

    Server        one vLLM server: reachability, version, served model, one checked extraction
    read_hidden   one file, read once its writer is done (the writer holds its lock) and removed
    check_hidden  the guards: the sequence sent, the layers expected, finite, non-zero, distinct
    VllmFeed      the Feed: the next --queue-depth micro-batches in flight, one request per
                  sequence, servers taken round-robin, features assembled as the in-process
                  target gives them (the final norm applied here, from the target's own weight)
    ServerCheck   --server-check-every: one sequence's features against this process's own target

A server that dies or answers wrongly stops the run with TargetServerError (exit 1: the unit's
restart policy resumes from the newest checkpoint once the server is back). One that serves another
model, or something that is no vLLM server at all, is a ConfigError (exit 78): no restart fixes it.
"""

import fcntl
import http.client
import itertools
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import torch
from flashfleet.contract.messages import TARGET_SERVER
from flashfleet.plan.settings import RunConfig

from .config import parse_devices
from .errors import ConfigError, TargetServerError, UnreachableServerError
from .feed import Features, pad_batch, wants_final_state
from .vllm_format import HIDDEN_KEY, LAYER_IDS_KEY, TOKENS_KEY, server_layer_ids

# The oldest vLLM whose hand-over this project has tested (its CPU build, both tiny targets'
# architectures). Older builds returned all-zero hidden states for Qwen3.5/3.6 hybrid targets.
MIN_VLLM = (0, 32, 0)
REQUEST_TIMEOUT_S = 600.0  # one extraction: a long prefill behind a full batch on a busy server
CONNECT_TIMEOUT_S = 10.0  # the start's questions (version, model): a server that cannot answer is down
WAIT_LOG_S = 30.0  # while a start waits for a server (--target-server-wait): a line this often


def parse_servers(spec) -> list[str]:
    """'http://h:8100,http://h:8101' -> base URLs (no trailing slash); ValueError naming a bad one."""
    urls = [u.strip().rstrip("/") for u in str(spec or "").split(",") if u.strip()]
    for u in urls:
        p = urlparse(u)
        if p.scheme not in ("http", "https") or not p.hostname or p.port is None or p.path not in ("", "/"):
            raise ValueError(f"{u!r} is not http://HOST:PORT")
    if len(set(urls)) != len(urls):
        raise ValueError(f"{spec!r} names a server twice")
    return urls


def _version_tuple(v: str) -> tuple:
    nums = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        nums.append(int(digits or 0))
    return tuple(nums + [0] * (3 - len(nums)))


class Server:
    """One vLLM OpenAI-compatible server (`vllm serve`) started for a run's layers."""

    def __init__(self, url: str):
        self.url = url
        self.version = self.model = None
        self.max_model_len = 0

    def _call(self, path, body=None, timeout=REQUEST_TIMEOUT_S) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = " ".join(e.read().decode(errors="replace")[:300].split())  # one line, an HTML page too
            raise TargetServerError(f"{TARGET_SERVER} {self.url}{path} answered HTTP {e.code}: {detail}") from e
        except (OSError, http.client.HTTPException) as e:  # refused, reset, cut short, timed out
            raise UnreachableServerError(f"{TARGET_SERVER} {self.url} unreachable or failed during {path} "
                                    f"({type(e).__name__}: {e})") from e
        except ValueError as e:  # not JSON (an HTML page): something else listens there
            answer = e
        if not isinstance(answer, dict):
            # vLLM answers every request with a JSON object: no restart of ours makes this one do so
            raise ConfigError(f"{TARGET_SERVER} {self.url}{path} answered something not a JSON object "
                              f"({' '.join(str(answer).split())[:80]}): that is no vLLM server",
                              "point the URL at the vLLM server's http://HOST:PORT (dflash-train --serve-config "
                              "prints how to start it)")
        return answer

    def connect(self) -> "Server":
        """Ask the server its version and model (a server still loading is unreachable)."""
        self.version = self._call("/version", timeout=CONNECT_TIMEOUT_S).get("version", "?")
        models = self._call("/v1/models", timeout=CONNECT_TIMEOUT_S).get("data") or []
        if not isinstance(models, list) or len(models) != 1:
            raise TargetServerError(f"{TARGET_SERVER} {self.url} serves {len(models)} models, not one")
        card = models[0] if isinstance(models[0], dict) else {}
        if not card.get("id") or not isinstance(card.get("max_model_len") or 0, int):
            raise ConfigError(f"{TARGET_SERVER} {self.url}/v1/models lists no model id and max_model_len: that is no "
                              "vLLM server", "point the URL at the vLLM server's http://HOST:PORT")
        self.model, self.max_model_len = card["id"], card.get("max_model_len") or 0
        return self

    def alive(self) -> bool:
        try:
            self._call("/version", timeout=CONNECT_TIMEOUT_S)
            return True
        except TargetServerError:
            return False

    def hidden_states(self, seq, want, hidden=None) -> torch.Tensor:
        """The checked [T, layers, H] states of token ids `seq` (extract, read_hidden, check_hidden);
        a file its writer never finished is the server's death when the server is gone."""
        path = self.extract(seq)
        try:
            tensors = read_hidden(path, self.url)
        except TargetServerError as e:
            if not self.alive():
                raise UnreachableServerError(f"{TARGET_SERVER} {self.url} unreachable: it went down while "
                                             f"writing {path}") from e
            raise
        return check_hidden(tensors, seq, want, self.url, hidden)

    def extract(self, ids) -> str:
        """Hidden states of token ids `ids`: the path of the file the server writes them to."""
        reply = self._call("/v1/completions", {"model": self.model, "prompt": [int(t) for t in ids],
                                               "max_tokens": 1, "temperature": 0.0})
        path = (reply.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise TargetServerError(f"{TARGET_SERVER} {self.url} returned no hidden_states_path: it was not "
                                    "started with the extract_hidden_states method and flashfleet's connector")
        return path


def read_hidden(path: str, url: str) -> dict:
    """The tensors of one extraction file of server `url`, read once the server's writer releases
    its lock; the file and its lock are removed either way (transient: nothing else reads them)."""
    from safetensors.torch import load_file

    lock = path + ".lock"
    try:
        try:
            lf = open(lock)
        except FileNotFoundError as e:  # the server made it before replying, where it writes
            raise TargetServerError(f"{TARGET_SERVER} {url} wrote {path}, which is not on this host: the servers "
                                    "must write where the trainer reads (this host's /dev/shm)") from e
        with lf:
            fcntl.flock(lf, fcntl.LOCK_SH)  # sleeps until the writer's exclusive lock is released
            try:
                return load_file(path, device="cpu")
            except Exception as e:  # no file or a partial one: the writer failed (a full /dev/shm, a crash)
                raise TargetServerError(f"{TARGET_SERVER} {url} did not write {path} whole "
                                        f"({type(e).__name__}: {e}): is /dev/shm full?") from e
    finally:
        for p in (path, lock):
            try:
                os.remove(p)
            except OSError:
                pass


def check_hidden(tensors: dict, sent, want_ids, url: str, hidden: int | None = None) -> torch.Tensor:
    """The [T, layers, H] hidden states of one file, after the guards: the sequence is the one sent,
    the layers those the run needs, the width the target's (`hidden`, when given: a server of
    another model fails here), every value finite, no layer all zero, no two layers identical.
    (vLLM builds before mid-2026 returned all-zero states for Qwen3.5/3.6 hybrid targets: a drafter
    trained on them looks fine in training and is almost never accepted when served.)"""
    h, tokens, ids = tensors[HIDDEN_KEY], tensors[TOKENS_KEY], tensors.get(LAYER_IDS_KEY)
    where = f"{TARGET_SERVER} {url}"
    if ids is None or ids.tolist() != list(want_ids):
        raise TargetServerError(f"{where} extracts vLLM layers {None if ids is None else ids.tolist()}, the run "
                                f"needs {list(want_ids)}: restart it with this run's layers (dflash-train "
                                "--serve-config prints its settings)")
    if tokens.tolist() != [int(t) for t in sent] or h.shape[0] != len(sent):
        raise TargetServerError(f"{where} returned states of another sequence ({h.shape[0]} tokens for "
                                f"{len(sent)} sent)")
    if hidden is not None and h.shape[-1] != hidden:
        # A server of another model: a restart of the trainer cannot fix it (exit 78, not 1)
        raise ConfigError(f"{where} returned states {h.shape[-1]} wide, the target's are {hidden}: it serves "
                          "another model than --target-model",
                          "start the server with the --target-model's directory, or pass --target-model of the "
                          "model it serves")
    if not torch.isfinite(h).all():
        raise TargetServerError(f"{where} returned non-finite hidden states")
    flat = h.transpose(0, 1).reshape(h.shape[1], -1)
    if (flat == 0).all(dim=1).any():
        raise TargetServerError(f"{where} returned all-zero hidden states for a layer (vLLM before mid-2026 "
                                "did so for Qwen3.5/3.6 hybrid targets): upgrade vLLM")
    if h.shape[0] > 1 and any(torch.equal(flat[i], flat[j]) for i in range(len(flat)) for j in range(i)):
        raise TargetServerError(f"{where} returned identical hidden states for two layers")
    return h


class ServerCheck:
    """--server-check-every N: at the first micro-batch and every N after, the features of its first
    sequence from the server against this process's own target (--server-check-device, loaded
    once). The guards catch broken files; this catches a server that serves something else: another
    model or revision, a wrong dtype or quantization, an engine bug (the zero features vLLM gave
    hybrid targets before mid-2026 were one)."""

    def __init__(self, cfg: RunConfig, layer_ids, log):
        from .target import HiddenStateProducer

        self.every, self.tol = cfg.topology.server_check_every, cfg.topology.server_check_tol
        self.log, self.seen = log, 0
        self.device = parse_devices(cfg.topology.server_check_device, "--server-check-device")[0]
        self.producer = HiddenStateProducer(cfg.paths.target_model, [self.device], layer_ids, self.device)

    def due(self) -> bool:
        due = self.seen % self.every == 0
        self.seen += 1
        return due

    def compare(self, url, seq, feats, last):
        """feats [T, n*H] and last [T, H] (normed, or None) of `seq` from the server at `url`."""
        ids = torch.as_tensor(seq, dtype=torch.long)[None].to(self.device)
        mine, mine_last = self.producer.forward(ids, want_last=last is not None)
        pairs = [("features", feats, mine[0])] + ([("final state", last, mine_last[0])] if last is not None else [])
        for what, theirs, ours in pairs:
            err = ((theirs.float().cpu() - ours.float().cpu()).norm() / ours.float().norm().clamp_min(1e-12)).item()
            self.log(f"server check: {url}: {len(seq)} tokens, {what} relative error {err:.2e} (tol {self.tol:g})")
            if not err <= self.tol:
                raise TargetServerError(
                    f"{TARGET_SERVER} {url} {what} differ from this process's own target ({len(seq)} tokens): "
                    f"relative error {err:.3g} > --server-check-tol {self.tol:g}; does the server serve the same "
                    "model, revision and dtype as --target-model?")


class VllmFeed:
    """feed.Feed over vLLM servers (module docstring). `norm`: the target's final norm (a module), or
    None when the run needs no final state (feed.wants_final_state)."""

    def __init__(self, servers: list[Server], layer_ids, num_layers, norm, device, depth, max_batch_size, hidden=None,
                 check: ServerCheck | None = None):
        self.servers, self.layer_ids, self.norm, self.device = servers, list(layer_ids), norm, device
        self.check = check
        self.hidden = hidden  # the target's width, checked on every file
        self.want = server_layer_ids(layer_ids, num_layers)  # the columns of every file, in order
        self.cols = [self.want.index(i + 1) for i in self.layer_ids]
        self.last_col = self.want.index(num_layers)
        self.depth = max(1, depth)
        self.pool = ThreadPoolExecutor(max_workers=min(64, self.depth * max_batch_size),
                                       thread_name_prefix="vllm-target")
        self.turn = itertools.cycle(range(len(servers)))  # round-robin, one sequence at a time
        self.inflight = {}  # key -> (server URL, future) per sequence of that micro-batch, in its order
        self.data = self.upcoming = None

    @classmethod
    def for_training(cls, cfg: RunConfig, facts, device, log=print) -> "VllmFeed":
        """A drafter rank's feed over the servers preflight checked (facts.servers), with the target's
        final norm on `device` when the loss reads the final state, and the --server-check-every check."""
        from .target import load_final_norm

        hidden = facts.drafter_config.hidden_size
        servers = facts.servers or check_servers(cfg.topology.target_servers, facts.layer_ids, facts.num_target_layers,
                                                 cfg.data.max_seq_len, facts.vocab_size, hidden)[0]
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        norm = load_final_norm(cfg.paths.target_model, device, dtype) if wants_final_state(cfg.loss) else None
        check = ServerCheck(cfg, facts.layer_ids, log) if cfg.topology.server_check_every else None
        return cls(servers, facts.layer_ids, facts.num_target_layers, norm, device, cfg.topology.queue_depth or 2,
                   cfg.data.max_batch_size, hidden, check)

    def start(self, data, upcoming):
        self.data, self.upcoming = data, upcoming
        self._fill()

    def _one(self, server: Server, seq) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        h = server.hidden_states(seq, self.want, self.hidden)
        return h, time.perf_counter() - t0

    def _fill(self):
        while len(self.inflight) < self.depth:
            item = next(self.upcoming, None)
            if item is None:
                return
            epoch, index, idx = item
            seqs = [self.data.seq(i)[0] for i in idx]
            asked = [(self.servers[next(self.turn)], s) for s in seqs]
            self.inflight[(epoch, index)] = [(server.url, self.pool.submit(self._one, server, s)) for server, s in asked]

    def get(self, key, idx) -> Features:
        t0 = time.perf_counter()
        ready = sum(all(f.done() for _, f in fs) for fs in self.inflight.values())
        occupancy = min(1.0, ready / self.depth)
        asked = self.inflight.pop(key)
        answers = [f.result() for _, f in asked]  # a server's failure is raised here, in the loop
        target_s = max(s for _, s in answers)  # its slowest sequence: request, server, file (they run side by side)
        self._fill()
        ids, lengths = pad_batch(self.data, idx)
        feats = last = None
        for s, (h, _) in enumerate(answers):
            if feats is None:
                feats = h.new_zeros(ids.shape[0], ids.shape[1], len(self.cols) * h.shape[-1])
                last = None if self.norm is None else h.new_zeros(ids.shape[0], ids.shape[1], h.shape[-1])
            n = h.shape[0]
            feats[s, :n] = h[:, self.cols].reshape(n, -1)
            if last is not None:
                last[s, :n] = h[:, self.last_col]
        feats = feats.to(self.device)
        if last is not None:
            with torch.no_grad():
                last = self.norm(last.to(self.device, self.norm.weight.dtype))
            last[(torch.arange(ids.shape[1])[None] >= lengths[:, None]).to(last.device)] = 0
        if self.check is not None and self.check.due():
            n = int(lengths[0])
            self.check.compare(asked[0][0], ids[0, :n].tolist(), feats[0, :n], None if last is None else last[0, :n])
        return Features(feats, last, lengths, target_s, time.perf_counter() - t0, occupancy)

    def close(self, wait=True):
        """Requests not sent yet are dropped; those a server has are waited for (wait=True, the end of
        training), so that their files are read and removed too (the last micro-batches asked for
        ahead of the end). After a failure (wait=False) nothing more is sent."""
        self.pool.shutdown(wait=wait, cancel_futures=True)


STORAGE_PATH = "/dev/shm/flashfleet-vllm"  # where servers write their files (names are unique per request)


def serve_argv(layer_ids, num_layers, storage_path=STORAGE_PATH) -> list[str]:
    """The arguments `vllm serve` needs to hand a run its features (--serve-config prints them; the
    server units and the tests pass them): the layers to extract, flashfleet's connector writing to
    `storage_path`, chunked prefill off as vLLM's extraction guide asks, and no access log."""
    from .vllm_format import CONNECTOR, CONNECTOR_MODULE

    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
                                                 server_layer_ids(layer_ids, num_layers)}}}
    kv = {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage_path)}}
    # No access log: a line per sequence would bury the server's journal, which diagnose reads.
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
            "--no-enable-chunked-prefill", "--disable-uvicorn-access-log"]


def check_servers(spec, layer_ids, num_layers, max_seq_len, vocab, hidden=None, wait_s=0.0,
                  log=print) -> tuple[list[Server], list[str]]:
    """--target-servers at start and at --check: each server reachable, recent enough, serving
    sequences of --max-seq-len, and extracting this run's layers, proven by one real extraction of a
    short sequence (its file read, checked by the guards and removed). Raises TargetServerError."""
    servers, lines = [Server(u) for u in parse_servers(spec)], []
    want = server_layer_ids(layer_ids, num_layers)
    deadline = time.monotonic() + wait_s
    for s in servers:
        seconds = probe_until(s, want, deadline, vocab, hidden, log)
        if s.max_model_len and s.max_model_len < max_seq_len + 1:
            raise TargetServerError(f"{TARGET_SERVER} {s.url} takes {s.max_model_len} tokens, but --max-seq-len "
                                    f"{max_seq_len} needs {max_seq_len + 1} (the sequence and one output token)")
        lines.append(f"vLLM {s.version} at {s.url} serving {s.model} (max {s.max_model_len} tokens): extracts "
                     f"vLLM layers {want}; probe extraction ok in {seconds:.2f} s")
    return servers, lines


def probe(server: Server, want, vocab=None, hidden=None) -> float:
    """Connect, check the version, extract a short sequence and check it (Server.hidden_states): the
    seconds the extraction took. Raises TargetServerError."""
    server.connect()
    if _version_tuple(server.version) < MIN_VLLM:
        raise TargetServerError(f"{TARGET_SERVER} {server.url} runs vLLM {server.version}, older than "
                                f"{'.'.join(map(str, MIN_VLLM))}, the oldest whose hand-over of hidden states "
                                "is tested here (older builds returned zeros for hybrid targets)")
    seq = [t % (vocab or 1 << 30) for t in range(1, 9)]
    t0 = time.perf_counter()
    server.hidden_states(seq, want, hidden)
    return time.perf_counter() - t0


def probe_until(server: Server, want, deadline, vocab=None, hidden=None, log=print) -> float:
    """probe(), retried while the server does not answer and the deadline (time.monotonic) is ahead,
    with a line at the first miss and then every WAIT_LOG_S: a server that restarts (a 27B target
    reloads for minutes) is waited for instead of failing the trainer's start again and again into
    its unit's start limit, and the journal says so from the start."""
    t0 = time.monotonic()
    last = None
    while True:
        try:
            return probe(server, want, vocab, hidden)
        except UnreachableServerError:
            now = time.monotonic()
            if now >= deadline:
                raise
            if last is None or now - last >= WAIT_LOG_S:
                log(f"waiting for {TARGET_SERVER} {server.url} to answer ({now - t0:.0f} s)")
                last = now
            time.sleep(min(2.0, max(0.0, deadline - now)))


def main(argv=None) -> int:
    """`dflash-vllm-probe URL --layers 3,4 [--timeout S]`: wait until a vLLM target server answers a
    real extraction of the layers given (vLLM ids, as --serve-config prints them), then exit 0; a
    server unit's readiness check (ExecStartPost), so that `systemctl start` means "hands out
    features", not "listens". Exit 1 with one line at once when the server answers wrongly (other
    layers, zeros), or after --timeout seconds unreachable."""
    import math
    import sys

    from flashfleet.contract.messages import EX_CONFIG

    from .errors import CliParser

    p = CliParser(prog="dflash-vllm-probe", description=main.__doc__.split(":")[0],
                  epilog="Exit codes: 0 ready; 1 unreachable or answering wrongly (one line); 78 a bad argument "
                         "or a server that can never pass (one line)")
    p.add_argument("url")
    p.add_argument("--layers", required=True, help="vLLM layer ids the server must extract, e.g. 3,4")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the server to answer (>= 0)")
    try:
        a = p.parse_args(argv)
        try:
            want = [int(x) for x in a.layers.split(",")]
            urls = parse_servers(a.url)
        except ValueError as e:
            raise ConfigError(f"dflash-vllm-probe {a.url} --layers {a.layers}: {e}",
                              "pass one http://HOST:PORT and --layers of vLLM ids, e.g. --layers 3,4") from e
        if len(urls) != 1 or min(want) < 0 or not (math.isfinite(a.timeout) and a.timeout >= 0):
            raise ConfigError(f"dflash-vllm-probe {a.url} --layers {a.layers} --timeout {a.timeout}: one URL, "
                              "layer ids >= 0 and a finite --timeout >= 0 are needed", "e.g. dflash-vllm-probe "
                              "http://127.0.0.1:8100 --layers 3,4 --timeout 600")
        server = Server(urls[0])
        seconds = probe_until(server, want, time.monotonic() + a.timeout, log=lambda s: print(s, flush=True))
    except ConfigError as e:
        print(e.line(), file=sys.stderr, flush=True)
        return EX_CONFIG
    except TargetServerError as e:
        print(f"dflash-vllm-probe: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"vLLM {server.version} at {server.url} ({server.model}) extracts layers {want}: "
          f"probe ok in {seconds:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
