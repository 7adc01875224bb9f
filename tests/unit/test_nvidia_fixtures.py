"""The NVIDIA test fixtures keep the interfaces the nvidia_driver role relies on.

The runfile fixture must refuse the invocations the role must never make (kernel modules from the
runfile, an interactive install) before it writes anything; the open-modules fixture must expose
the real tree's build interface and version variable.
"""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

RUNFILE = ROOT / "tests" / "fixtures" / "nvidia-runfile" / "fixture-runfile.sh"
MODULES = ROOT / "tests" / "fixtures" / "nvidia-open-modules"
ROLE_DEFAULTS = ROOT / "roles" / "nvidia_driver" / "defaults" / "main.yml"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(RUNFILE), *args], capture_output=True, text=True, timeout=30, check=False)


def test_runfile_refuses_to_install_kernel_modules() -> None:
    r = _run("--silent", "--no-questions", "--ui=none")
    assert r.returncode == 1
    assert "--no-kernel-modules" in r.stderr


def test_runfile_refuses_an_interactive_install() -> None:
    r = _run("--no-kernel-modules")
    assert r.returncode == 1
    assert "--silent" in r.stderr


def test_runfile_rejects_unknown_options() -> None:
    r = _run("--silent", "--no-kernel-modules", "--install-everything")
    assert r.returncode == 2
    assert "unknown option --install-everything" in r.stderr


def test_runfile_accepts_the_roles_default_options() -> None:
    # Every option in the role's defaults must be one the fixture knows (it rejects the rest).
    text = ROLE_DEFAULTS.read_text()
    line = next(x for x in text.splitlines() if x.startswith("nvidia_driver_runfile_args:"))
    options = re.findall(r"--[a-z-]+(?:=[a-z]+)?", line)
    assert options, line
    known = RUNFILE.read_text()
    for opt in options:
        assert opt in known, opt


def test_open_modules_fixture_has_the_build_interface() -> None:
    top = (MODULES / "Makefile").read_text()
    assert re.search(r"^modules:", top, re.M) and re.search(r"^modules_install:", top, re.M)
    kbuild = (MODULES / "kernel-open" / "Makefile").read_text()
    for var in ("SYSSRC", "SYSOUT", "INSTALL_MOD_DIR"):
        assert var in kbuild, var
    version = re.search(r"^NVIDIA_VERSION\s*=\s*(\S+)", (MODULES / "version.mk").read_text(), re.M)
    assert version and version.group(1) == "999.0.1"
    assert "TEST FIXTURE" in (MODULES / "README.md").read_text()
