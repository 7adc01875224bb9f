"""Scaling the trainer on CPU: target worker processes feeding data-parallel drafter ranks (gloo),
a dead worker ending the run, SIGTERM across ranks, two nodes on one machine, and --plan."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.checkpoint import complete_checkpoints
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import parse_devices
from flashfleet_trainer.planner import anchor_headroom, best_split, headroom_line, server_flags
from flashfleet_trainer.preflight import memory_need
from safetensors.torch import load_file


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _start(argv, tmp_path):
    """dflash-train as a real process with a real sd_notify socket (the unit's view)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "n.sock"))
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "n.sock")}
    proc = subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, sock


def _wait_ready(sock, proc, timeout=120):
    sock.settimeout(2)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if sock.recv(4096).decode().startswith("READY=1"):
                return
        except TimeoutError:
            pass
    raise AssertionError(f"no READY=1 (rc {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


def _workers(out):
    return json.loads((out / "status.json").read_text())["workers"]


def test_cpu_devices_may_repeat_gpu_indices_may_not():
    assert parse_devices("cpu,cpu", "--target-gpus") == ["cpu", "cpu"]
    assert parse_devices("0,1", "--target-gpus") == ["cuda:0", "cuda:1"]
    with pytest.raises(Exception, match="distinct"):
        parse_devices("1,1", "--target-gpus")


def test_two_targets_two_drafters_match_one_plus_one(trainer_argv, tmp_path):
    """Same seed and data: 1+1 accumulating 2 micro-batches = 2+2 with one each (same blocks, same
    averaged gradient), so the loss trajectory and the weights agree."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ("--max-steps", "3", "--use-soft-labels", "--save-interval", "100")
    assert main(trainer_argv(*common, "--grad-accum", "2", out=one)) == 0
    assert main(trainer_argv(*common, "--grad-accum", "1", "--target-gpus", "cpu,cpu", "--drafter-gpus", "cpu,cpu",
                             out=two)) == 0
    a, b = _metrics(one), _metrics(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4)
    assert [r["rows"] for r in b] == [r["rows"] for r in a]
    for r in b:
        for k in ("target_tokens_per_s", "drafter_rows_per_s", "queue_occupancy", "target_idle_frac",
                  "drafter_idle_frac"):
            assert r[k] is not None and r[k] >= 0, k
        assert 0 <= r["queue_occupancy"] <= 1 and 0 <= r["target_idle_frac"] <= 1
    wa = load_file(str(one / "checkpoints" / "step-00000003" / "drafter.safetensors"))
    wb = load_file(str(two / "checkpoints" / "step-00000003" / "drafter.safetensors"))
    for k in wa:
        assert (wa[k] - wb[k]).abs().max().item() < 1e-4, k
    st = json.loads((two / "status.json").read_text())
    assert st["phase"] == "completed" and st["step"] == 3 and st["pid"] == os.getpid()
    assert [w["role"] for w in st["workers"]] == ["target worker"] * 2 + ["drafter rank"] * 2
    assert [p.name for p in complete_checkpoints(two / "checkpoints")] == ["step-00000003"]  # rank 0 only


def _served_run(argv, out):
    """dflash-train with --drafter-serves-target as a real process whose one target worker is
    SIGSTOPped as soon as status.json lists it (seconds before it has imported torch), so every
    micro-batch has to come from the drafter ranks' own replicas; resumed once 3 steps are logged
    (the node waits for its workers to leave). Returns the exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv, "--drafter-serves-target"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    worker, deadline = None, time.time() + 60
    try:
        while worker is None and time.time() < deadline and proc.poll() is None:
            try:
                worker = [w for w in _workers(out) if w["role"] == "target worker"][0]
            except (OSError, ValueError, KeyError, IndexError):
                time.sleep(0.02)
        assert worker, "no target worker listed in status.json"
        os.kill(worker["pid"], signal.SIGSTOP)
        try:
            while time.time() < deadline + 120 and proc.poll() is None:
                if (out / "metrics.jsonl").exists() and len(_metrics(out)) >= 3:
                    break
                time.sleep(0.2)
        finally:
            os.kill(worker["pid"], signal.SIGCONT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return rc, proc.stderr.read()


def _check_served(ref, out):
    """The served run trained like the in-process one and evaluated with rank 0's own replica."""
    a, b = _metrics(ref), _metrics(out)
    assert [r["eval"] for r in b if "tau" in r] == ["final"] and [r for r in a if "tau" in r]
    a, b = [r for r in a if "tau" not in r], [r for r in b if "tau" not in r]
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4)
    for r in b:  # nothing came from the worker: the ranks' wait was their own serving, the worker idle
        assert 0 < r["drafter_serve_frac"] <= r["drafter_idle_frac"] <= 1, r
        assert r["target_idle_frac"] == pytest.approx(1.0, abs=0.05), r
    assert all(r["drafter_serve_frac"] == 0 for r in a)  # in-process there is no queue to serve


SERVED_STEPS = ("--max-steps", "3", "--use-soft-labels", "--save-interval", "100", "--eval-num-prompts", "2",
                "--eval-max-new-tokens", "6")


def test_drafters_that_serve_train_on_while_the_target_worker_is_stopped(trainer_argv, tmp_path):
    """--drafter-serves-target with the only target worker stopped: the run finishes on the drafter
    ranks' replicas with the in-process run's losses (1+1 accumulating 2 = 1 worker + 2 ranks)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert main(trainer_argv(*SERVED_STEPS, "--grad-accum", "2", out=ref)) == 0
    rc, err = _served_run(trainer_argv(*SERVED_STEPS, "--drafter-gpus", "cpu,cpu", out=out), out)
    assert rc == 0, err
    _check_served(ref, out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_drafter_serves_from_its_own_replica(trainer_argv, tmp_path):
    """The same on a GPU: the rank's replica and its features on cuda:0 (bf16, the LM head and
    embedding borrowed from it), the stopped worker on the CPU; the in-process run on cuda:0 is the
    reference."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    gpu = ("--drafter-gpus", "0")
    assert main(trainer_argv(*SERVED_STEPS, *gpu, "--target-gpus", "0", out=ref)) == 0
    rc, err = _served_run(trainer_argv(*SERVED_STEPS, *gpu, out=out), out)
    assert rc == 0, err
    _check_served(ref, out)


def test_drafter_serves_target_is_refused_where_the_drafter_runs_the_target_anyway(trainer_argv, capsys):
    assert main(trainer_argv("--drafter-serves-target", "--check")) == EX_CONFIG
    err = capsys.readouterr().err
    assert "--drafter-serves-target with one device" in err and "drop --drafter-serves-target" in err


def test_a_serving_drafter_device_is_counted_a_replica_in_the_memory_check():
    gpus = ["cuda:0", "cuda:1"]
    plain = memory_need(1e9, 1e8, gpus[:1], gpus[1:])
    serving = memory_need(1e9, 1e8, gpus, gpus[1:])
    assert plain == {"cuda:0": pytest.approx(2.2e9), "cuda:1": pytest.approx(1.6e9)}
    assert serving == {"cuda:0": pytest.approx(2.2e9), "cuda:1": pytest.approx(2.2e9 + 1.6e9)}
    assert memory_need(1e9, 1e8, ["cpu", "cpu"], ["cpu"]) == {"cpu": pytest.approx(2 * 4.4e9 + 1.6e9)}


def test_the_planner_counts_what_a_serving_drafter_adds():
    """The incident's rates as measured on one H200 on 2026-12-01: every split of 8 is target-bound; with the drafter
    GPU serving too, its time divides between training x rows and serving x - r of them."""
    rt, rd, rpt = 9103.0, 26629.0, 0.125
    table = best_split(8, rt, rd, rpt)
    seven = table[6]
    assert seven["targets"] == 7 and seven["bound"] == "target"
    assert seven["drafter_rows_per_s"] == pytest.approx(7 * rt * rpt)
    x, r = seven["serving_rows_per_s"], 7 * rt * rpt
    assert x / rd + (x - r) / (rt * rpt) == pytest.approx(1.0)  # the drafter GPU busy all the time
    assert x == pytest.approx(8730, abs=1)
    drafter_bound = best_split(8, 1e7, rd, rpt)[0]  # targets far ahead: serving adds nothing
    assert drafter_bound["bound"] == "drafter"
    assert drafter_bound["serving_rows_per_s"] == drafter_bound["drafter_rows_per_s"] == 7 * rd


def test_dead_target_worker_ends_the_run_with_a_clear_error(trainer_argv, tmp_path):
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "100000", "--save-interval", "100000", "--target-gpus", "cpu,cpu",
                        "--drafter-gpus", "cpu", out=out)
    proc, sock = _start(argv, tmp_path)
    try:
        _wait_ready(sock, proc)
        victim = [w for w in _workers(out) if w["role"] == "target worker" and w["index"] == 1][0]
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.time()
        rc = proc.wait(30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    err = proc.stderr.read()
    assert rc == 1 and took < 15, err
    line = [x for x in err.splitlines() if x.startswith("flashfleet-train: error:")]
    assert line and "target worker 1" in line[0] and str(victim["pid"]) in line[0] and "SIGKILL" in line[0], err
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "failed" and "target worker 1" in st["last_error"]
    for w in st["workers"]:  # nothing left behind
        with pytest.raises(ProcessLookupError):
            os.kill(w["pid"], 0)


def test_sigterm_stops_all_ranks_at_one_step_and_rank0_saves(trainer_argv, tmp_path):
    """systemd sends SIGTERM to every process of the unit; ranks agree on the step to stop after."""
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "100000", "--save-interval", "100000", "--drafter-gpus", "cpu,cpu",
                        out=out)
    proc, sock = _start(argv, tmp_path)
    try:
        _wait_ready(sock, proc)
        for pid in [proc.pid] + [w["pid"] for w in _workers(out)]:
            os.kill(pid, signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    assert rc == 0, proc.stderr.read()
    # The main process left last: nothing of its session (a unit's cgroup) outlived it, not even
    # multiprocessing's resource tracker, which ignores SIGTERM (systemd on cgroup v1 in a container
    # would otherwise wait out TimeoutStopSec).
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "stopped" and st["step"] >= 1
    assert complete_checkpoints(out / "checkpoints")[-1].name == f"step-{st['step']:08d}"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(trainer_argv, tmp_path, node, port, *extra, name=None):
    """One node of a 2-node run on this machine, in a process group of its own (a unit's cgroup)."""
    argv = trainer_argv("--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--rdzv-timeout", "60", *extra, out=tmp_path / f"node{node}")
    log = open(tmp_path / f"{name or f'node{node}'}.log", "w+")  # noqa: SIM115 (read back after exit)
    return subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv], stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True), log


def _log(node):
    proc, log = node
    log.seek(0)
    return log.read()


def _end(*nodes):
    for proc, log in nodes:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _wait_step(out, step, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads((out / "status.json").read_text()).get("step", 0) >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{out} did not reach step {step} in {timeout}s")


def _error_line(text):
    return [x for x in text.splitlines() if x.startswith("flashfleet-train: error:")]


def test_two_nodes_rendezvous_on_one_machine(trainer_argv, tmp_path):
    """Two dflash-train processes, --nnodes 2, one c10d store: one checkpoint stream, on node 0."""
    port = _free_port()
    nodes = [_node(trainer_argv, tmp_path, n, port, "--max-steps", "2") for n in (0, 1)]
    try:
        rcs = [proc.wait(120) for proc, _ in nodes]
        logs = [_log(n) for n in nodes]
    finally:
        _end(*nodes)
    assert rcs == [0, 0], logs
    assert "all 2 nodes joined" in logs[1]
    assert [r["step"] for r in _metrics(tmp_path / "node0")] == [1, 2]
    assert not (tmp_path / "node1" / "checkpoints").exists() and not (tmp_path / "node1" / "metrics.jsonl").exists()


def test_a_killed_node_takes_the_run_down_and_is_named_first(trainer_argv, tmp_path):
    """SIGKILL to every process of node 1 (what `systemctl kill -s KILL` does to its unit): node 0's
    collective fails at once; node 0 exits 1 within seconds, not --node-timeout, and names node 1."""
    port = _free_port()
    long_run = ("--max-steps", "100000", "--save-interval", "100000", "--node-timeout", "120")
    nodes = [_node(trainer_argv, tmp_path, n, port, *long_run) for n in (0, 1)]
    try:
        _wait_step(tmp_path / "node0", 2)
        os.killpg(nodes[1][0].pid, signal.SIGKILL)
        t0 = time.time()
        rc = nodes[0][0].wait(60)
        took = time.time() - t0
        log = _log(nodes[0])
    finally:
        _end(*nodes)
    line = _error_line(log)
    assert rc == 1 and took < 20 and line, log
    assert "node 0: drafter rank 0" in line[0] and "node 1 went first: node 1 stopped heartbeating" in line[0], line
    st = json.loads((tmp_path / "node0" / "status.json").read_text())
    assert st["phase"] == "failed" and st["last_error"] == line[0].removeprefix("flashfleet-train: error: ")


def test_a_restarted_node_does_not_join_the_run_under_way(trainer_argv, tmp_path):
    """Node 1 hangs (SIGSTOP: its sockets stay open, so no collective fails), and systemd would start
    it again: the new node 1 must not join the old run; it says so, and node 0 stops on that at
    once instead of waiting out --node-timeout."""
    port = _free_port()
    long_run = ("--max-steps", "100000", "--save-interval", "100000", "--node-timeout", "300")
    nodes = [_node(trainer_argv, tmp_path, n, port, *long_run) for n in (0, 1)]
    again = None
    try:
        _wait_step(tmp_path / "node0", 2)
        os.killpg(nodes[1][0].pid, signal.SIGSTOP)
        again = _node(trainer_argv, tmp_path, 1, port, *long_run, name="node1-again")
        rcs = (again[0].wait(120), nodes[0][0].wait(30))
        logs = (_log(again), _log(nodes[0]))
    finally:
        if nodes[1][0].poll() is None:
            os.killpg(nodes[1][0].pid, signal.SIGKILL)
        _end(*nodes, *([again] if again else []))
    assert rcs == (1, 1), logs
    assert "node 1 restarted while the run it belonged to was still under way" in _error_line(logs[0])[0], logs[0]
    assert "node 1 restarted" in _error_line(logs[1])[0], logs[1]


def test_rendezvous_needs_an_endpoint(trainer_argv, capsys):
    monkey_env = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        assert main(trainer_argv("--nnodes", "2", "--check")) == EX_CONFIG
    finally:
        os.environ.update(monkey_env)
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_a_target_bound_split_says_how_many_more_anchors_its_drafters_could_train():
    """The incident's 27B rates in the trainer on one H200 (2026-12-02): 7 + 1 is target-bound, its one
    drafter could train 21,588 / (7 x 11,504 x 0.125) = 2.1x the rows per target token."""
    seven = best_split(8, 11504.0, 21588.0, 0.125)[6]
    assert anchor_headroom(seven) == pytest.approx(21588 / (7 * 11504 * 0.125))
    line = headroom_line(seven, 512, 40.2, serve=False)
    assert "7 target + 1 drafter the targets are the bound" in line and "2.1x" in line
    assert "--max-anchors 512 -> about 1098" in line and "40.2 GiB" in line and "serves" not in line
    assert "--drafter-serves-target" in headroom_line(seven, 512, 40.2, serve=True)
    drafter_bound = best_split(8, 1e7, 21588.0, 0.125)[0]
    assert anchor_headroom(drafter_bound) == 1.0 and headroom_line(drafter_bound, 512, 40.2, False) is None
    balanced = best_split(2, 21588 / 0.125 / 1.02, 21588.0, 0.125)[0]  # 2% idle: within the measurement
    assert balanced["bound"] == "target" and headroom_line(balanced, 512, 40.2, False) is None


def test_splits_with_vllm_servers_count_each_servers_gpus():
    """8 GPUs, servers of 2 (tensor-parallel 2): 1, 2 or 3 servers leave 6, 4 or 2 drafter GPUs; 4
    servers would leave none and are not offered. Rt 1,000 tokens/s a server x 0.5 rows a token =
    500 rows/s a server; Rd 300 rows/s a drafter GPU."""
    table = best_split(8, 1000.0, 300.0, 0.5, per_target=2, serving=False)
    assert [(r["targets"], r["drafters"]) for r in table] == [(1, 6), (2, 4), (3, 2)]
    assert [r["drafter_rows_per_s"] for r in table] == [500.0, 1000.0, 600.0]  # min(500k, 300 x drafters)
    assert [r["bound"] for r in table] == ["target", "target", "drafter"]
    assert [r["serving_rows_per_s"] for r in table] == [500.0, 1000.0, 600.0]  # a drafter GPU serves no server
    assert max(table, key=lambda r: r["serving_rows_per_s"])["targets"] == 2  # the 4 + 4 layout
    assert [(r["targets"], r["drafters"]) for r in best_split(8, 1000.0, 300.0, 0.5, per_target=3)] == [(1, 5), (2, 2)]
    assert [r["targets"] for r in best_split(8, 1000.0, 300.0, 0.5, per_target=4)] == [1]  # 2 x 4 = 8: no drafter
    assert best_split(8, 1000.0, 300.0, 0.5) == best_split(8, 1000.0, 300.0, 0.5, per_target=1)  # the default


def test_a_server_split_names_the_servers_gpus_and_the_drafters():
    """The trainer sees only the drafter GPUs; the servers' are the lowest ids those leave."""
    import types

    facts = types.SimpleNamespace(servers=["s0", "s1"], drafter_devices=["cuda:4", "cuda:5", "cuda:6", "cuda:7"])
    row = best_split(8, 1000.0, 300.0, 0.5, per_target=2)[1]
    assert server_flags(facts, row, 2) == ('2 `vllm.servers` entries (--target-servers with 2 URL(s), --server-gpus 2): '
                                           'gpus "0,1", gpus "2,3"; --drafter-gpus 4,5,6,7')
    one = best_split(8, 1000.0, 300.0, 0.5, per_target=2)[0]
    assert server_flags(facts, one, 2).endswith('gpus "0,1"; --drafter-gpus 2,3,4,5,6,7')
    cpu = types.SimpleNamespace(servers=["s0"], drafter_devices=["cpu", "cpu"])
    assert server_flags(cpu, best_split(4, 1.0, 1.0, 1.0, per_target=2)[0], 2).endswith("; --drafter-gpus cpu,cpu")


def test_plan_prints_a_split(trainer_argv, capsys):
    assert main(trainer_argv("--plan", "--plan-steps", "2", "--target-gpus", "cpu,cpu",
                             "--drafter-gpus", "cpu,cpu")) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "rows/s" in out
    assert "plan:   1 target + 3 drafter" in out and "plan:   3 target + 1 drafter" in out
    best = [x for x in out.splitlines() if x.startswith("plan: best split of 4 device(s)")]
    assert best and "--target-gpus cpu" in best[0] and "--drafter-gpus cpu" in best[0]
    headroom = [x for x in out.splitlines() if "the targets are the bound" in x]
    assert len(headroom) == ("drafter-bound" not in best[0]), out  # said for a split the targets bound
    assert "rows/s (DFlash: forward, loss, backward, AdamW; peak" in out


def test_plan_measures_a_dflash2_step_and_says_so(trainer_argv, capsys):
    """--plan of a DFlash 2 run times DFlash 2's own step (planner.measure checks each measured
    step carried the selector loss) and names it."""
    assert main(trainer_argv("--plan", "--plan-steps", "1", "--target-gpus", "cpu", "--drafter-gpus", "cpu,cpu",
                             "--drafter-kind", "dflash2", "--block-size", "4")) == 0
    out = capsys.readouterr().out
    assert "rows/s (DFlash 2: its convolutions, candidate selector and selector loss included; peak" in out, out
