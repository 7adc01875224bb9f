"""Shared pytest helpers: the repository root, a way to run playbooks through ansible-runner, and
an opt-in shuffle of the tests' order.

No test may leave the pytest process changed for the next. Ansible is never imported into it:
importing Ansible patches the process (sys.intern, socket.getaddrinfo: ansible.module_utils.
_internal._patches), and torch's compiler, imported later, then refuses sys.intern
("substitute_in_graph expects a function but got ... SysInternPatch"); ansible_runner.run replaces
the process's SIGINT and SIGTERM handlers. So run_playbook runs ansible-runner in a child process,
and every test is checked (_no_ansible_left) for Ansible left imported or sys.intern patched.

--shuffle-seed N: run the collected tests in an order shuffled with random.Random(N), to show that
no test depends on another's having run first (`pytest tests/unit --shuffle-seed 1`). The files'
order is shuffled, and the tests' order within each file, but a file's tests stay together: a
module-scoped fixture (a vLLM server, a trained drafter) is still set up once. `make test` runs
the suite shuffled with a fixed seed (tests/stages.sh, PYTEST_SHUFFLE_SEED), so CI is repeatable
and still proves the order does not matter; other seeds try other orders.

Hypothesis, for the property-based tests of bad input: profile "ci" (the default: derandomized, so
every run tries the same examples, and a budget that keeps `make test` within its time) or
"nightly" (20x the examples, a new random draw each run):
    HYPOTHESIS_PROFILE=nightly .venv/bin/pytest -q -k "generated or bad_input"
A test asks for `examples(n)`: n times the profile's budget.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

CI_EXAMPLES = 20
settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, deadline=None, database=None)
settings.register_profile("nightly", max_examples=20 * CI_EXAMPLES, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: float = 1) -> int:
    """n x the profile's budget of examples: cheap properties get more than slow ones."""
    return max(1, int(n * settings.default.max_examples))

# One torch (OpenMP/BLAS) thread in the test process and the trainers it starts: the tests' models
# are tiny, and on a two-core machine a second thread only adds synchronization (the trainer tests
# measured about 2x faster in wall time with one; docs/benchmarks.md). Set here, before any test
# module imports torch; a value already in the environment is kept. Multi-process trainer runs
# still set their own per-process threads (topology._cpu_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--shuffle-seed", type=int, default=None, metavar="N",
                     help="run the tests in an order shuffled with random.Random(N) (default: as collected)")


def pytest_report_header(config):
    seed = config.getoption("--shuffle-seed")
    return None if seed is None else f"tests shuffled with --shuffle-seed {seed}"


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle-seed")
    if seed is None:
        return
    rng, files = random.Random(seed), {}
    for item in items:  # grouped by file, in collection order
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(files.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


_BUILTIN_INTERN, _GETADDRINFO = sys.intern, socket.getaddrinfo


def _ansible_modules() -> set[str]:
    return {m for m in sys.modules if m == "ansible" or m.startswith("ansible.")}


@pytest.fixture(autouse=True)
def _no_ansible_left():
    """Fail the test that leaves Ansible imported into the pytest process, or its patches applied
    (run Ansible's Python in a child process instead: run_playbook, or python -c)."""
    before = _ansible_modules()
    yield
    left = sorted(_ansible_modules() - before)
    patched = [name for name, now, orig in (("sys.intern", sys.intern, _BUILTIN_INTERN),
                                            ("socket.getaddrinfo", socket.getaddrinfo, _GETADDRINFO))
               if now is not orig]
    if left or patched:
        pytest.fail(f"this test left Ansible in the pytest process (imported: {left[:3]}{'...' if len(left) > 3 else ''}; "
                    f"patched: {patched}); later tests (torch's compiler) break. Run Ansible's Python in a "
                    "child process (run_playbook does)", pytrace=False)


# ansible_runner.run in a child: its arguments as JSON (argv[1]); what it returns, to a file (argv[2]).
_RUNNER = """
import json, sys
import ansible_runner
r = ansible_runner.run(**json.loads(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    json.dump({"rc": r.rc, "status": r.status, "artifact_dir": r.config.artifact_dir}, f)
"""


class PlaybookRun:
    """What ansible_runner.run returns, as the tests use it, read back from a run's artifacts:
    rc, status, events (in the order emitted), stdout (a file to read)."""

    def __init__(self, rc: int, status: str, artifact_dir: str):
        self.rc, self.status, self.artifact_dir = rc, status, Path(artifact_dir)

    @property
    def events(self) -> list[dict]:
        return _events(self.artifact_dir / "job_events")

    @property
    def stdout(self) -> io.StringIO:
        return io.StringIO((self.artifact_dir / "stdout").read_text())


def _events(job_events: Path) -> list[dict]:
    """The events in a job_events directory, in order; one being written (not whole yet) and the
    ones after it are left for a later read."""
    files = sorted((f for f in job_events.glob("*.json") if re.match(r"^\d+-", f.name) and "-partial" not in f.name),
                   key=lambda f: int(f.name.split("-", 1)[0]))
    events = []
    for f in files:
        try:
            events.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            break
    return events


@pytest.fixture
def run_playbook(tmp_path, monkeypatch):
    """Run a playbook with ansible-runner (events and artifacts, not scraped stdout), in a child
    process (see the module's docstring); its private data dir is run_playbook.private_data_dir.

    ansible-playbook is taken from the interpreter's own venv, however pytest was started.
    """
    if importlib.util.find_spec("ansible_runner") is None:
        pytest.skip("ansible_runner is not installed")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    pdd = tmp_path / "pdd"

    def run(playbook: Path | str, inventory: Path | str, cmdline: str | None = None,
            envvars: dict | None = None, **extravars) -> PlaybookRun:
        pdd.mkdir(exist_ok=True)
        kwargs = dict(
            private_data_dir=str(pdd), playbook=str(playbook), inventory=str(inventory),
            extravars=extravars, quiet=True, cmdline=cmdline,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory",
                     "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), **(envvars or {})})
        result = tmp_path / "runner-result.json"
        result.unlink(missing_ok=True)
        child = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(kwargs), str(result)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if child.returncode != 0 or not result.exists():
            raise RuntimeError(f"ansible-runner failed (exit {child.returncode}): {child.stderr[-3000:]}")
        return PlaybookRun(**json.loads(result.read_text()))

    run.private_data_dir = pdd
    return run


def reported(private_data_dir: Path | str, task: str, event: str = "runner_on_ok") -> list[str]:
    """The msg of each `event` (runner_on_ok: a result; runner_on_start: "" when it began) of
    `task` that a run under private_data_dir has had so far: ansible-runner writes each event to
    its artifacts as it happens. For a fake (a step, a trainer, systemctl) that goes on only once
    the play has looked at it, so that a test controls the pace it observes instead of racing it."""
    return [ev["event_data"].get("res", {}).get("msg", "")
            for job_events in sorted(Path(private_data_dir).glob("artifacts/*/job_events"))
            for ev in _events(job_events)
            if ev.get("event") == event and ev.get("event_data", {}).get("task") == task]


def wait_for_report(private_data_dir: Path | str, task: str, pattern: str = "", event: str = "runner_on_ok",
                    timeout_s: float = 300) -> bool:
    """Wait until a msg of `task` matches `pattern` (re.search; "" matches any); False after
    timeout_s without one (the fake then fails, so a broken play fails its test, not hangs it)."""
    deadline = time.monotonic() + timeout_s
    while not any(re.search(pattern, m) for m in reported(private_data_dir, task, event)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def failure_messages(runner) -> list[str]:
    """The msg of every failed task event of an ansible-runner run."""
    return [ev["event_data"]["res"].get("msg", "") for ev in runner.events
            if ev.get("event") == "runner_on_failed"]


def local_inventory(tmp_path: Path, host: str = "here") -> Path:
    """An inventory of one host reached with the local connection, on this interpreter."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {host: {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    return inventory


def role_play(tmp_path: Path, role: str, tasks_from: str, role_vars: dict | None = None,
              name: str = "play.yml") -> Path:
    """A playbook that runs one task file of one role on every host (role_vars: the include's vars)."""
    include = {"ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}
    if role_vars:
        include["vars"] = role_vars
    playbook = tmp_path / name
    playbook.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [include]}]))
    return playbook
