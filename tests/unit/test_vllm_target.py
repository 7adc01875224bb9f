"""The vLLM target backend (--target-servers, vllm_target.py): the guards on their own, then real
vLLM servers (vLLM's CPU build, tests/vllm_server.py) serving the tiny Qwen3 target:

- the features equal the in-process target's, final state included;
- two drafter ranks trained through two servers give the in-process run's losses, and both served;
- a server killed mid-run ends the run with a clear error; the same command started again while
  the server reloads waits for it and resumes from the newest checkpoint (what the unit's restart
  does);
- nothing is left in the servers' storage directory.

The hybrid Qwen3.5 tiny target is not served here: vLLM 0.32.0's Qwen3.5 module imports its
vision model, which needs torchvision, and PyPI has no torchvision for torch's +cpu build.
"""

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch
from flashfleet.contract import messages
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.data import load_data
from flashfleet_trainer.feed import InProcessFeed, wants_final_state
from flashfleet_trainer.preflight import preflight
from flashfleet_trainer.trainer import MicroBatches
from flashfleet_trainer.vllm_format import HIDDEN_KEY, LAYER_IDS_KEY, TOKENS_KEY, server_layer_ids
from flashfleet_trainer.vllm_target import (
    WAIT_LOG_S,
    TargetServerError,
    VllmFeed,
    check_hidden,
    read_hidden,
    serve_argv,
)
from flashfleet_trainer.vllm_target import (
    main as probe_main,
)
from safetensors.torch import save_file

from tests.unit.conftest import tiny_argv
from tests.vllm_server import VllmServer, need_vllm

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS = [2]  # the tiny argv's one draft layer reads the 4-layer target's default layer 2
N_LAYERS = 4


# ---- the guards, no server ---------------------------------------------------------------------

def _states(t=5, layers=2, h=8):
    torch.manual_seed(0)
    return {HIDDEN_KEY: torch.randn(t, layers, h), TOKENS_KEY: torch.arange(t),
            LAYER_IDS_KEY: torch.tensor([3, 4])}


def test_server_layers_are_each_feature_layers_output_and_the_last_sorted_distinct():
    assert server_layer_ids([2], 4) == [3, 4]
    assert server_layer_ids([3, 1], 4) == [2, 4]  # layer 3's output is the last one's
    argv = serve_argv([1, 2], 4, "/dev/shm/x")
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["shared_storage_path"] == "/dev/shm/x"
    assert "--no-enable-chunked-prefill" in argv


@pytest.mark.parametrize("spoil,why", [
    (lambda s: s[HIDDEN_KEY][:, 1].zero_(), "all-zero"),
    (lambda s: s[HIDDEN_KEY].__setitem__((2, 0, 3), float("nan")), "non-finite"),
    (lambda s: s[HIDDEN_KEY][:, 1].copy_(s[HIDDEN_KEY][:, 0]), "identical"),
    (lambda s: s.__setitem__(LAYER_IDS_KEY, torch.tensor([2, 4])), "extracts vLLM layers [2, 4]"),
    (lambda s: s.__setitem__(TOKENS_KEY, torch.arange(1, 6)), "another sequence"),
])
def test_features_the_run_must_not_train_on_are_refused(spoil, why):
    good = _states()
    assert check_hidden(good, list(range(5)), [3, 4], "http://s").shape == (5, 2, 8)
    bad = _states()
    spoil(bad)
    with pytest.raises(TargetServerError, match=why.replace("[", r"\[").replace("]", r"\]")):
        check_hidden(bad, list(range(5)), [3, 4], "http://s")


def test_a_file_is_read_once_its_writer_is_done_and_then_removed(tmp_path):
    path = str(tmp_path / "req.safetensors")
    fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the server holds the lock until the file is whole

    def writer():
        time.sleep(0.3)
        save_file(_states(), path)
        os.close(fd)
    threading.Thread(target=writer).start()
    t0 = time.monotonic()
    got = read_hidden(path, "http://s")
    assert time.monotonic() - t0 >= 0.25 and got[HIDDEN_KEY].shape == (5, 2, 8)
    assert os.listdir(tmp_path) == []
    with pytest.raises(TargetServerError, match="not on this host"):
        read_hidden(str(tmp_path / "elsewhere.safetensors"), "http://s")


@pytest.mark.parametrize("servers,extra,why", [
    ("127.0.0.1:8100", (), "is not http://HOST:PORT"),
    ("http://127.0.0.1:8100,http://127.0.0.1:8100", (), "names a server twice"),
    ("http://127.0.0.1:8100", ("--drafter-serves-target",), "no replica to serve with"),
])
def test_bad_server_flags_are_refused_before_anything_is_contacted(trainer_argv, capsys, servers, extra, why):
    assert main(trainer_argv("--target-servers", servers, *extra, "--check")) == EX_CONFIG
    assert why in capsys.readouterr().err


def test_a_start_waiting_for_its_server_says_so_at_once_then_every_interval(monkeypatch):
    """probe_until against a server that answers only after 70 s (a clock of its own): a line at the
    first miss, then one every WAIT_LOG_S, and the probe's result once it answers."""
    from types import SimpleNamespace

    from flashfleet_trainer import vllm_target

    clock = [0.0]
    fake_time = SimpleNamespace(monotonic=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))

    def probe(server, want, vocab=None, hidden=None):
        if clock[0] < 70:
            raise vllm_target.UnreachableServerError("vLLM target server http://127.0.0.1:8100 unreachable")
        return 0.25

    monkeypatch.setattr(vllm_target, "time", fake_time)
    monkeypatch.setattr(vllm_target, "probe", probe)
    lines = []
    server = SimpleNamespace(url="http://127.0.0.1:8100")
    assert vllm_target.probe_until(server, [1], deadline=600, log=lines.append) == 0.25
    said = [float(re.search(r"\((\d+) s\)$", x).group(1)) for x in lines]
    assert all(x.startswith("waiting for vLLM target server http://127.0.0.1:8100 to answer") for x in lines)
    assert said == [0, WAIT_LOG_S, 2 * WAIT_LOG_S], lines
    clock[0] = 0.0
    with pytest.raises(vllm_target.UnreachableServerError):  # a deadline reached ends the wait
        vllm_target.probe_until(server, [1], deadline=10, log=lines.append)


def test_an_unreachable_server_fails_the_start_for_a_retry_not_for_good(trainer_argv, capsys):
    assert main(trainer_argv("--target-servers", "http://127.0.0.1:9", "--check")) == 1  # not 78: a restart helps
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "flashfleet_trainer.errors.UnreachableServerError: vLLM target server http://127.0.0.1:9 unreachable"), err
    assert re.match(messages.START_FAILURE_PATTERN, err[0]) and messages.TARGET_SERVER_RE.search(err[0])


# ---- real vLLM servers ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The trainer tests' tiny target with 32-wide heads: vLLM's CPU attention takes no head of 16."""
    from flashfleet_trainer.tiny import build

    out = tmp_path_factory.mktemp("tiny32")
    build(out, seed=0, vocab=128, hidden=128, layers=N_LAYERS, steps=30, num_seqs=48, prompt_len=8,
          completion_len=24, num_eval=3, log=lambda s: None)
    return out


@pytest.fixture
def argv(tiny, tmp_path):
    return lambda *extra, out=None: tiny_argv(tiny, out or tmp_path / "run", *extra)


@pytest.fixture(scope="module")
def servers(tiny, tmp_path_factory):
    """Two vLLM servers for the tiny target's layers, sharing one storage directory, started side by side."""
    need_vllm()
    d = tmp_path_factory.mktemp("vllm")
    started = [VllmServer(tiny / "model", LAYERS, N_LAYERS, d / "shm", d / f"server{i}.log") for i in range(2)]
    try:
        for s in started:
            s.launch()
        yield [s.wait() for s in started]
    finally:
        for s in started:
            s.stop()


def test_features_from_the_server_equal_the_in_process_targets(servers, argv):
    args = parse_args(argv("--use-soft-labels", "--target-servers", servers[0].url))
    facts = preflight(args)
    assert wants_final_state(args.loss)
    ref_args = parse_args(argv("--use-soft-labels"))
    ref = InProcessFeed(ref_args, preflight(ref_args), "cpu", lambda s: None)
    feed = VllmFeed.for_training(args, facts, "cpu")
    data = load_data(args.data_dir, args.max_seq_len, facts.vocab_size)
    batches = MicroBatches(data.lengths, args).epoch(0)[:3]
    ref.start(data, iter([]))
    feed.start(data, iter((0, i, idx) for i, idx in enumerate(batches)))
    try:
        for i, idx in enumerate(batches):
            got, want = feed.get((0, i), idx), ref.get((0, i), idx)
            assert torch.equal(got.lengths, want.lengths)
            torch.testing.assert_close(got.feats, want.feats, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got.last, want.last, atol=1e-4, rtol=1e-4)
    finally:
        feed.close()
    assert list((servers[0].storage).iterdir()) == []  # every file read and removed


def test_the_readiness_probe_passes_a_ready_server_and_fails_at_once_on_other_layers(servers, capsys):
    want = server_layer_ids(LAYERS, N_LAYERS)
    assert probe_main([servers[0].url, "--layers", ",".join(map(str, want))]) == 0
    t0 = time.monotonic()
    assert probe_main([servers[0].url, "--layers", "1,4", "--timeout", "60"]) == 1
    assert time.monotonic() - t0 < 30 and "extracts vLLM layers [3, 4], the run needs [1, 4]" in capsys.readouterr().err


def _losses(out):
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_two_servers_feed_two_drafter_ranks_as_the_in_process_target_feeds_one(servers, argv, tmp_path):
    """The second incident's shape in miniature: servers for the target, data-parallel drafter ranks
    (torch.distributed) asking them directly; the same blocks and gradients as one in-process rank
    accumulating two micro-batches."""
    steps = ("--max-steps", "4", "--use-soft-labels", "--queue-depth", "2")
    assert main(argv(*steps, "--grad-accum", "2", out=tmp_path / "ref")) == 0
    before = [s.requests_served() for s in servers]
    urls = ",".join(s.url for s in servers)
    assert main(argv(*steps, "--drafter-gpus", "cpu,cpu", "--target-servers", urls, out=tmp_path / "vllm")) == 0
    assert _losses(tmp_path / "vllm") == pytest.approx(_losses(tmp_path / "ref"), rel=1e-4)
    served = [s.requests_served() - b for s, b in zip(servers, before, strict=True)]
    assert min(served) > 0, served  # round-robin: both servers answered
    assert list(servers[0].storage.iterdir()) == []


def test_plan_measures_one_server_and_splits_the_node_into_servers_of_server_gpus_and_drafters(servers, argv, capsys):
    """--plan through real servers: Rt through the first server only, a drafter rank on the CPU, and
    the node of 2 servers x 2 devices + 2 drafters = 6 split into 1 or 2 servers of 2 (3 would
    leave no drafter)."""
    urls = ",".join(s.url for s in servers)
    assert main(argv("--check", "--target-servers", urls, "--server-gpus", "2")) == 0
    topology = [x for x in capsys.readouterr().out.splitlines() if x.startswith("check: topology:")]
    assert topology and "2 vLLM target server(s) of --server-gpus 2 GPU(s) each" in topology[0], topology
    assert re.search(r"weights ~[\d.]+ GiB in bf16 per server GPU", topology[0]), topology
    before = [s.requests_served() for s in servers]
    assert main(argv("--plan", "--plan-steps", "2", "--target-servers", urls, "--server-gpus", "2",
                     "--drafter-gpus", "cpu,cpu")) == 0
    out = [x for x in capsys.readouterr().out.splitlines() if x.startswith("plan:")]
    measured = re.search(rf"target on vLLM server {re.escape(servers[0].url)}: ([\d,]+) tokens/s .*--server-gpus 2\); "
                         r"drafter on cpu: ([\d,]+) rows/s .*; ([\d.]+) draft rows per target token", out[0])
    assert measured, out
    assert all(float(v.replace(",", "")) > 0 for v in measured.groups()), out[0]
    assert [x.split(":")[1] for x in out[1:3]] == ["   1 vLLM server(s) x 2 device(s) + 4 drafter",
                                                  "   2 vLLM server(s) x 2 device(s) + 2 drafter"], out
    best = out[3]
    assert best.startswith("plan: best split of 6 device(s): ") and "--server-gpus 2" in best, out
    assert re.search(r"1 `vllm.servers` entry .*--drafter-gpus cpu,cpu,cpu,cpu$|2 `vllm.servers` entries .*"
                     r"--drafter-gpus cpu,cpu$", best), best
    served = [s.requests_served() - b for s, b in zip(servers, before, strict=True)]
    assert served[1] == 1 and served[0] > 1, served  # the second server only probed at the start
    assert list(servers[0].storage.iterdir()) == []  # the answers asked for ahead were read and removed too


def test_server_check_holds_the_server_to_this_processs_own_target(servers, argv, tmp_path, capsys):
    """--server-check-every: the served target agrees with the one loaded here (fp32 both sides) at
    the first micro-batch and every N after; a server serving another model of the same shape (the
    trainer's --target-model a differently seeded twin) is refused at the first, in one line."""
    from flashfleet_trainer.tiny import build

    check = ("--use-soft-labels", "--target-servers", servers[0].url, "--server-check-every", "2", "--max-steps", "3")
    assert main(argv(*check, out=tmp_path / "same")) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("server check:")]
    assert len(lines) == 4, lines  # micro-batches 0 and 2 of 3 steps: features and final state each
    assert all(float(re.search(r"relative error (\S+)", x).group(1)) < 1e-4 for x in lines), lines
    twin = tmp_path / "twin"
    build(twin, seed=1, vocab=128, hidden=128, layers=N_LAYERS, steps=5, num_seqs=8, prompt_len=8, completion_len=24,
          num_eval=1, log=lambda s: None)
    assert main([*argv(*check, out=tmp_path / "twin-run"), "--target-model", str(twin / "model")]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"TargetServerError: {messages.TARGET_SERVER} {servers[0].url} features differ" in err, err
    assert "> --server-check-tol 0.02" in err and messages.TARGET_SERVER_RE.search(err)


def test_a_killed_server_ends_the_run_clearly_and_the_restart_resumes(servers, argv, tmp_path):
    """It kills the second server and starts it again on the same port. The kill can leave the
    hidden-states file being written (and its lock) in the servers' shared storage, which no one
    reads again; the test removes what it left, so that the module's other tests, in any order,
    find only their own files there (each checks every file it caused was read and removed)."""
    victim = servers[1]
    before = set(victim.storage.iterdir())
    try:
        _kill_and_restart(victim, argv, tmp_path)
    finally:
        for left in set(victim.storage.iterdir()) - before:
            left.unlink(missing_ok=True)


def _kill_and_restart(victim, argv, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "flashfleet_trainer.cli",
           *argv("--max-steps", "400", "--save-interval", "2", "--target-servers", victim.url, out=out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints").is_dir() or not any((out / "checkpoints").glob("step-*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.2)
        victim.kill()
        log, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, log
    assert f"UnreachableServerError: vLLM target server {victim.url} unreachable" in log
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "failed" and st["last_error"].startswith(f"UnreachableServerError: vLLM target server {victim.url}")
    step_at_death = st["step"]
    # The unit's restart comes while the server is still down: the start waits for it (and says so,
    # at once and then every WAIT_LOG_S), and resumes once it is back. The server is started only after that line, so
    # the check does not depend on which of the two starts faster.
    rerun = subprocess.Popen([*cmd, "--max-steps", str(step_at_death + 2)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(rerun.stdout), daemon=True)
    reader.start()
    waiting = f"waiting for vLLM target server {victim.url} to answer"
    try:
        deadline = time.monotonic() + 120
        while not any(waiting in line for line in list(lines)):
            assert rerun.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        victim.start()  # back on the same port
        rerun.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        if rerun.poll() is None:
            rerun.kill()
    out = "".join(lines)
    assert rerun.returncode == 0, out
    assert "resumed from" in out and f"completed at step {step_at_death + 2}" in out


def test_a_final_evaluation_that_cannot_fit_beside_the_drafter_is_refused_at_check(trainer_argv, capsys, monkeypatch):
    """A target served by vLLM because it fits no GPU would be loaded whole for the final tau, and for
    each interval one: refused (78) with the way out, here with a 48 GB card that the tiny target is
    made to outgrow."""
    import types

    import flashfleet_trainer.preflight as pf
    import flashfleet_trainer.vllm_target as vt

    monkeypatch.setattr(vt, "check_servers", lambda *a, **k: ([], ["vLLM stand-in"]))  # no server contacted
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=48e9))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (47e9, 48e9))
    real = pf.read_target_weights
    monkeypatch.setattr(pf, "read_target_weights", lambda d: types.SimpleNamespace(
        params=26e9, nbytes=52e9, wrapped=False, skipped=0, shapes=real(d).shapes))  # a 26B target's headers
    argv = trainer_argv("--target-servers", "http://127.0.0.1:8100", "--drafter-gpus", "0", "--check")
    assert main([*argv, "--eval-num-prompts", "4", "--eval-interval", "0"]) == EX_CONFIG
    assert "pass --eval-num-prompts 0 --eval-interval 0" in capsys.readouterr().err
    assert main([*argv, "--eval-num-prompts", "0", "--eval-interval", "100"]) == EX_CONFIG
    assert "--eval-interval 100 with --target-servers: the evaluations would load" in capsys.readouterr().err
    assert main([*argv, "--eval-num-prompts", "0", "--eval-interval", "0"]) == 0
