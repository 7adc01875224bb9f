"""The GPU quarantine (flashfleet.contract.quarantine) and the host check around it
(flashfleet.gpu_health.host.check_host) on recorded outputs: a failed check quarantines the GPU
with its evidence file, a quarantined GPU refuses a run that uses it (naming it and why), a clear
re-runs the check first, concurrent writers lose no record, a damaged file refuses instead of
passing, and --plan leaves quarantined GPUs out."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing

import pytest
from flashfleet.contract import quarantine
from flashfleet.gpu_health.host import check_host

from tests.unit.test_gpu_health import UUID0, UUID1, XID79, edit_gpu, recorded, with_kernel


def test_a_record_is_kept_once_and_a_second_reason_is_added(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    entry, changed = quarantine.record(path, UUID0.upper().replace("GPU-", ""), "Xid 79", "diagnose", "ev.json",
                                       action="reboot-node", now=1.0)
    assert changed and entry["uuid"] == UUID0 and entry["since"] == "1970-01-01T00:00:01Z"
    assert quarantine.record(path, UUID0, "Xid 79", "diagnose", "ev.json", now=2.0) == (entry, False)
    quarantine.record(path, UUID0, "health check: ECC", "gpu-check", "check.json", now=3.0)
    [held] = quarantine.quarantined(quarantine.read(path)).values()
    assert [r["reason"] for r in held["records"]] == ["Xid 79", "health check: ECC"] and held["reason"] == "Xid 79"


def test_a_clear_moves_the_entry_and_remembers_when(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    quarantine.record(path, UUID0, "Xid 79", "diagnose", "ev.json")
    assert quarantine.clear(path, UUID1, "me") is None
    quarantine.clear(path, UUID0, "train.yml", now=50.0)
    doc = quarantine.read(path)
    assert quarantine.quarantined(doc) == {} and doc["cleared"][0]["cleared_by"] == "train.yml"
    assert quarantine.last_cleared(doc, UUID0) == 50.0


def _add(args):
    path, i = args
    quarantine.record(path, f"GPU-{i:08x}-0000-0000-0000-000000000000", f"reason {i}", "gpu-check", "e")


def test_concurrent_writers_lose_no_record(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_add, [(path, i) for i in range(24)])
    assert len(quarantine.quarantined(quarantine.read(path))) == 24


def test_a_damaged_quarantine_is_an_error_not_an_empty_one(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    (tmp_path / ".gpu-health").mkdir()
    (tmp_path / ".gpu-health" / "quarantine.json").write_text('{"quarantined": {')
    with pytest.raises(quarantine.QuarantineError, match="quarantine.json: not JSON"):
        quarantine.read(path)
    with pytest.raises(ValueError, match="is not a GPU UUID"):
        quarantine.normalize_uuid("3")


def test_a_failed_check_quarantines_the_gpu_with_its_evidence(tmp_path):
    result = check_host(str(tmp_path), [0, 1], raw=with_kernel(XID79), now=1796376500.0)
    assert not result["ok"] and result["recorded"] == [UUID0]
    evidence = json.loads(open(result["evidence"]).read())
    assert "Xid (PCI:0000:18:00): 79" in evidence["raw"]["kernel"]["out"]
    [held] = result["quarantined"]
    assert held["uuid"] == UUID0 and held["evidence"] == result["evidence"] and held["source"] == "gpu-check"
    assert "reboot-node" in held["reason"]


def test_a_run_on_a_quarantined_gpu_is_refused_naming_it_and_why(tmp_path):
    quarantine.record(quarantine.path_for(str(tmp_path)), UUID1, "gpu-xid-48: double bit ECC", "diagnose",
                      "runs/v2/n1/evidence.json", action="reset-gpu", pci="00000000:2A:00.0")
    result = check_host(str(tmp_path), [0, 1], raw=recorded())
    [line] = result["refused"]
    assert not result["ok"] and line.startswith(f"GPU 1 {UUID1} (00000000:2A:00.0): gpu-xid-48: double bit ECC")
    assert "evidence runs/v2/n1/evidence.json" in line and result["rows"] == []
    assert check_host(str(tmp_path), [0], raw=recorded())["ok"], "a run without that GPU may start"


def test_a_clear_runs_the_check_first_and_releases_only_a_healthy_gpu(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    sick = edit_gpu(recorded(), 1, r"(Remapping Failure Occurred\s+: )No", r"\1Yes")
    check_host(str(tmp_path), [1], raw=sick)
    assert UUID1 in quarantine.quarantined(quarantine.read(path))
    again = check_host(str(tmp_path), [1], raw=sick, clear=UUID1)
    assert again["cleared"] is None and UUID1 in quarantine.quarantined(quarantine.read(path))
    fixed = check_host(str(tmp_path), [1], raw=recorded(), clear=UUID1, cleared_by="test")
    assert fixed["ok"] and fixed["cleared"]["uuid"] == UUID1 and fixed["quarantined"] == []
    with pytest.raises(ValueError, match="no such GPU on this host"):
        check_host(str(tmp_path), [1], raw=recorded(), clear="GPU-00000000-0000-0000-0000-000000000000")


def test_with_two_gpus_quarantined_each_can_be_cleared_in_turn(tmp_path):
    path = quarantine.path_for(str(tmp_path))
    for uuid in (UUID0, UUID1):
        quarantine.record(path, uuid, "gpu-xid-79: fallen off the bus", "diagnose", "runs/v2/n1/evidence.json")
    # gpu_check.yml -e clear_quarantine=UUID (every GPU): the one being cleared is checked alone
    alone = check_host(str(tmp_path), None, raw=recorded(), clear=UUID0)
    assert alone["ok"] and alone["cleared"]["uuid"] == UUID0 and [r["uuid"] for r in alone["rows"]] == [UUID0]
    quarantine.record(path, UUID0, "gpu-xid-79: fallen off the bus", "diagnose", "runs/v2/n1/evidence.json")
    # train.yml on both: this one is released, the other still refuses the run (and can be cleared next)
    run = check_host(str(tmp_path), [0, 1], raw=recorded(), clear=UUID1)
    assert run["cleared"]["uuid"] == UUID1 and not run["ok"]
    [line] = run["refused"]
    assert line.startswith(f"GPU 0 {UUID0}: gpu-xid-79") and run["lines"][0] == line
    assert check_host(str(tmp_path), [0, 1], raw=recorded(), clear=UUID0)["ok"]
    assert quarantine.quarantined(quarantine.read(path)) == {}


def test_clearing_a_gpu_quarantined_for_a_xid_lets_the_next_check_pass(tmp_path):
    raw = with_kernel(XID79)
    check_host(str(tmp_path), [0], raw=raw, now=1796376500.0)
    assert check_host(str(tmp_path), [0], raw=raw, clear=UUID0, now=1796376600.0)["cleared"]
    later = check_host(str(tmp_path), [0], raw=raw, now=1796376700.0)
    assert later["ok"], "the Xid before the clear was dealt with"


def test_the_plan_leaves_quarantined_gpus_out(tmp_path):
    from flashfleet_trainer.errors import ConfigError
    from flashfleet_trainer.planner import without_quarantined

    runs_root = tmp_path / "runs"
    quarantine.record(quarantine.path_for(str(runs_root)), UUID1, "Xid 79", "diagnose", "ev.json")
    uuids = {"cuda:0": UUID0, "cuda:1": UUID1, "cuda:2": "GPU-22222222-0000-0000-0000-000000000000"}
    lines = []

    @dataclasses.dataclass
    class Facts:
        target_devices: list
        drafter_devices: list

    kept = without_quarantined(Facts(["cuda:0", "cuda:1"], ["cuda:2"]), str(runs_root / "v2"), lines.append, uuids.__getitem__)
    assert kept.target_devices == ["cuda:0"] and kept.drafter_devices == ["cuda:2"]
    assert lines[0].startswith(f"plan: cuda:1 is quarantined on this host, left out of the plan: {UUID1}")
    with pytest.raises(ConfigError, match="every device of --drafter-gpus is quarantined"):
        without_quarantined(Facts(["cuda:0"], ["cuda:1"]), str(runs_root / "v2"), lines.append, uuids.__getitem__)
