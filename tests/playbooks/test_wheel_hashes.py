"""The host install checks every wheel against the lock's sha256: a tampered wheel is refused.

The role's own sync task (roles/python_env/tasks/sync.yml: uv pip sync --require-hashes from the
host's wheelhouse) runs against this machine with the local connection, on a fresh venv, with a
wheelhouse holding one small wheel built here and a lock naming its sha256. Then one byte of the
wheel is changed: the same task must fail on the hash and install nothing. The repository's host
locks are checked to hash every pin (what `make lock` writes).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, failure_messages, local_inventory, role_play

NAME, VERSION = "ff_hashprobe", "1.0"


def _wheel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    files = {f"{NAME}/__init__.py": "VALUE = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, text in {**files, f"{info}/RECORD": record}.items():
            zf.writestr(zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return path


@pytest.fixture
def host(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "bin/uv").symlink_to(Path(sys.executable).parent / "uv")
    wheel = _wheel(tmp_path / "wheelhouse/node-cpu")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (venv / "flashfleet.lock").write_text(f"{NAME.replace('_', '-')}=={VERSION} \\\n    --hash=sha256:{digest}\n")
    return venv, wheel


def _sync(tmp_path, run_playbook, venv):
    return run_playbook(role_play(tmp_path, "python_env", "sync"), local_inventory(tmp_path),
                        envvars={"UV_CACHE_DIR": str(tmp_path / "uv-cache")}, python_env_dir=str(venv),
                        python_env_wheelhouse=str(tmp_path / "wheelhouse"), python_env_profile="cpu")


def _installed(venv: Path) -> bool:
    return any(venv.glob(f"lib/python*/site-packages/{NAME}-{VERSION}.dist-info"))


def test_the_locked_wheel_installs(tmp_path, run_playbook, host):
    venv, _ = host
    r = _sync(tmp_path, run_playbook, venv)
    assert r.rc == 0, "\n".join(failure_messages(r)) + r.stdout.read()
    assert _installed(venv)


def test_a_wheel_with_one_byte_changed_is_refused_and_nothing_installed(tmp_path, run_playbook, host):
    venv, wheel = host
    # One byte that no CRC covers (the first file's modification time in its local header), so the
    # wheel still unpacks: only the hash can tell.
    data = bytearray(wheel.read_bytes())
    data[10] ^= 0x01
    wheel.write_bytes(bytes(data))
    r = _sync(tmp_path, run_playbook, venv)
    assert r.rc != 0
    (failed,) = [ev["event_data"]["res"] for ev in r.events if ev.get("event") == "runner_on_failed"]
    assert "--require-hashes" in failed["cmd"]
    assert re.search(r"hash", failed["stderr"], re.IGNORECASE), failed["stderr"]
    assert hashlib.sha256(bytes(data)).hexdigest() in failed["stderr"], failed["stderr"]
    assert not _installed(venv)


@pytest.mark.parametrize("lock", ["node-cpu.lock", "node-cuda.lock"])
def test_every_pin_of_the_host_locks_carries_a_hash(lock):
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    pins = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z0-9]", line)]
    assert pins
    assert [lines[i] for i in pins if not (lines[i].endswith("\\") and lines[i + 1].strip().startswith("--hash=sha256:"))] == []
