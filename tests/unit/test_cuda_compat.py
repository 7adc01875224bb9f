"""CUDA toolkit -> minimum driver table and the driver check (roles/cuda_toolkit filter)."""

from __future__ import annotations

import flashfleet.cudacompat as cc
import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize(
    "toolkit, minimum",
    [
        ("11.8", "520.61.05"),
        ("12.0.0", "525.60.13"),
        ("12.4.0", "550.54.14"),
        ("12.4.1", "550.54.15"),
        ("12.6.1", "560.28.03"),  # an unlisted update needs what the last listed one before it needed
        ("12.6.3", "560.35.05"),
        ("12.8.0", "570.26"),
        ("12.8.1", "570.124.06"),
        ("12.9.1", "575.57.08"),
        ("13.0", "580.65.06"),
        ("13.0.2", "580.95.05"),
        ("13.0.7", "580.95.05"),
    ],
)
def test_min_driver(toolkit, minimum):
    assert cc.cuda_min_driver(toolkit) == minimum


@pytest.mark.parametrize(
    "driver, toolkit, ok",
    [
        ("580.95.05", "13.0.2", True),
        ("580.95.04", "13.0.2", False),
        ("575.57.08", "13.0.0", False),  # a 12.9 driver under a 13.0 toolkit: the incident's mismatch
        ("590.44.01", "13.0.2", True),
        ("570.124.06", "12.8.1", True),
        ("570.86.10", "12.8.1", False),  # numerically, not as strings: 86 < 124
        ("570.124.6", "12.8.1", True),
        ("535.54.03", "12.2", True),
        ("535.54.03", "12.4", False),
        ("1000.1", "12.0", True),
    ],
)
def test_driver_ok(driver, toolkit, ok):
    assert cc.cuda_driver_ok(driver, toolkit) is ok


@pytest.mark.parametrize("bad", ["10.2", "14.0", "99.9.9"])
def test_unknown_toolkit_is_an_error_not_a_guess(bad):
    with pytest.raises(ValueError, match="not in the driver table"):
        cc.cuda_min_driver(bad)


@pytest.mark.parametrize("bad", ["", "580.x", "13", "v13.0", "580.95.05-1"])
def test_malformed_versions(bad):
    with pytest.raises(ValueError):
        cc.cuda_driver_ok(bad, "13.0") if bad not in ("13",) else cc.cuda_min_driver(bad)


def test_table_is_monotonic():
    keys = sorted(cc.MIN_DRIVER, key=cc._key)
    drivers = [cc._key(cc.MIN_DRIVER[k]) for k in keys]
    assert drivers == sorted(drivers)


def test_filter_plugin_gives_ansible_the_same_table(tmp_path, run_playbook):
    """The role's filter plugin is a thin wrapper: a real play gets flashfleet.cudacompat's answers."""
    import json

    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"dest": str(tmp_path / "out.json"), "mode": "0644",
                                  "content": "{{ {'min': '12.8' | cuda_min_driver, "
                                             "'ok': '570.86.10' | cuda_driver_ok('12.8')} | to_json }}"}}]}]))
    r = run_playbook(play, "localhost,", envvars={
        "ANSIBLE_FILTER_PLUGINS": str(ROOT / "roles/cuda_toolkit/filter_plugins")})
    assert r.status == "successful"
    assert json.loads((tmp_path / "out.json").read_text()) == {"min": cc.cuda_min_driver("12.8"),
                                                               "ok": cc.cuda_driver_ok("570.86.10", "12.8")}
