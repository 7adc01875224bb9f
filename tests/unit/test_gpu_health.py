"""Every GPU health check on recorded outputs (tests/fixtures/gpu_health, its README says where each
came from): the healthy recording passes, and each fault, written into it the way the cited real
outputs show it, fails (or warns) the GPU it is on and no other.

The faults: a row remap pending, an x8 link, a thermal (HW) slowdown, a DCGM failure, a Xid since
boot, and the rest of the checks' inputs (ECC, page retirement, remap failure, PCIe generation,
persistence, driver, the matmul straggler, the all-reduce floor).
"""

from __future__ import annotations

import json
import re

import pytest
from flashfleet.gpu_health import checks, dcgm, gather, nvidia_smi, probe, settings, xid

from tests.conftest import ROOT

FIX = ROOT / "tests/fixtures/gpu_health"
UUID0, UUID1 = "GPU-8e1c3f4a-6b2d-4c1e-9a7f-2d5b8c0e4f11", "GPU-1f0d9e27-3a44-4b8c-8e2d-7c6a5b4d3e22"


def recorded() -> dict:
    return gather.recorded(str(FIX))


def edit_gpu(raw: dict, gpu: int, old: str, new: str) -> dict:
    """raw with `old` replaced by `new` (a regex on one line) inside GPU `gpu`'s section only."""
    text = raw["nvidia_smi"]["out"]
    starts = [m.start() for m in re.finditer(r"^GPU ", text, re.M)] + [len(text)]
    section = text[starts[gpu]:starts[gpu + 1]]
    changed, n = re.subn(old, new, section, count=1, flags=re.M)
    assert n == 1, f"{old!r} is not in GPU {gpu}'s section of the recording"
    raw["nvidia_smi"]["out"] = text[:starts[gpu]] + changed + text[starts[gpu + 1]:]
    return raw


def finding(result: dict, gpu: int, check: str) -> tuple[str, str]:
    row = next(r for r in result["rows"] if r["index"] == gpu)
    return next((lv, t) for name, lv, t in row["findings"] if name == check)


def status(result: dict) -> list[str]:
    return [r["status"] for r in result["rows"]]


def test_the_healthy_recording_passes_every_check():
    result = checks.judge(recorded())
    assert result["ok"], checks.table(result)
    assert [r["uuid"] for r in result["rows"]] == [UUID0, UUID1]
    assert status(result) == ["ok", "ok"]
    levels = {name: lv for name, lv, _ in result["rows"][0]["findings"]}
    assert levels == {"ecc": "ok", "row_remap": "ok", "throttle": "ok", "pcie": "ok", "persistence": "ok",
                      "driver": "ok", "xid": "ok", "dcgm": "ok", "matmul": "ok"}
    assert result["host"][0][:2] == ("allreduce", "ok")


def test_the_parser_reads_the_facts_the_checks_use():
    g = nvidia_smi.parse(recorded()["nvidia_smi"]["out"])
    assert g["driver"] == "580.105.08"
    first = g["gpus"][0]
    assert (first["index"], first["bus"], first["uuid"], first["name"]) == (0, "00000000:18:00.0", UUID0,
                                                                              "NVIDIA H100 80GB HBM3")
    assert first["pcie"] == {"gen_max": 5, "gen_current": 5, "gen_device_max": 5, "gen_host_max": 5,
                             "width_max": 16, "width_current": 16}
    assert first["ecc_uncorrectable"] == 0 and first["remap_pending"] is False and first["persistence"] is True
    assert first["throttle"]["hw_slowdown"] is False and first["temperature_c"] == 29


def test_row_remap_pending_fails_that_gpu():
    # as ml-engineering's A100 (compute/accelerator/nvidia/debug.md) shows it after a Xid 63
    raw = edit_gpu(recorded(), 1, r"(Remapped Rows\n(?:.*\n){2}\s+Pending\s+: )No", r"\1Yes")
    result = checks.judge(raw)
    assert status(result) == ["ok", "fail"]
    level, text = finding(result, 1, "row_remap")
    assert level == "fail" and "row remap is pending until the GPU is reset" in text
    assert checks.judge(raw, {"row_remap_pending": "warn"})["ok"], "the setting must lower it to a warning"


def test_a_remapping_failure_and_a_pending_page_retirement_fail():
    raw = edit_gpu(recorded(), 0, r"(Remapping Failure Occurred\s+: )No", r"\1Yes")
    assert finding(checks.judge(raw), 0, "row_remap")[0] == "fail"
    raw = edit_gpu(recorded(), 0, r"(Pending Page Blacklist\s+: )N/A", r"\1Yes")  # pre-Ampere cards retire pages
    level, text = finding(checks.judge(raw), 0, "row_remap")
    assert level == "fail" and "page retirement" in text


def test_volatile_uncorrectable_ecc_fails_above_the_setting():
    raw = edit_gpu(recorded(), 0, r"(Volatile\n(?:.*\n){4}\s+DRAM Uncorrectable\s+: )0", r"\g<1>2")
    result = checks.judge(raw)
    level, text = finding(result, 0, "ecc")
    assert level == "fail" and text.startswith("ECC: 2 volatile uncorrectable")
    assert checks.judge(raw, {"ecc_uncorrectable_max": 2})["ok"]
    # the aggregate (lifetime) counters are not the volatile ones
    raw = edit_gpu(recorded(), 0, r"(Aggregate\n(?:.*\n){4}\s+DRAM Uncorrectable\s+: )0", r"\g<1>7")
    assert finding(checks.judge(raw), 0, "ecc")[0] == "ok"


def test_an_x8_link_fails_and_an_idle_gen1_link_does_not():
    raw = edit_gpu(recorded(), 0, r"(Link Width\n\s+Max\s+: 16x\n\s+Current\s+: )16x", r"\g<1>8x")
    level, text = finding(checks.judge(raw), 0, "pcie")
    assert level == "fail" and "link x8 of the card's x16" in text
    assert finding(checks.judge(raw, {"pcie_width": "warn"}), 0, "pcie")[0] == "warn"
    idle = edit_gpu(recorded(), 0, r"(PCIe Generation\n\s+Max\s+: 5\n\s+Current\s+: )5", r"\g<1>1")
    assert finding(checks.judge(idle), 0, "pcie")[0] == "ok", "the current generation drops at idle"
    slot = edit_gpu(recorded(), 0, r"(PCIe Generation\n\s+Max\s+: )5", r"\g<1>4")
    level, text = finding(checks.judge(slot), 0, "pcie")
    assert level == "warn" and "at most gen 4" in text


def test_a_thermal_hw_slowdown_fails_and_a_software_one_warns():
    raw = edit_gpu(recorded(), 1, r"(HW Slowdown\s+: )Not Active\n(\s+HW Thermal Slowdown\s+: )Not Active",
                   r"\1Active\n\2Active")
    raw = edit_gpu(raw, 1, r"(GPU Current Temp\s+: )31 C", r"\g<1>92 C")
    result = checks.judge(raw)
    level, text = finding(result, 1, "throttle")
    assert status(result) == ["ok", "fail"] and "hw_slowdown, hw_thermal active" in text and "92 C" in text
    sw = edit_gpu(recorded(), 0, r"(SW Thermal Slowdown\s+: )Not Active", r"\1Active")
    assert finding(checks.judge(sw), 0, "throttle")[0] == "warn"


def test_an_older_driver_s_clocks_throttle_reasons_are_read_too():
    raw = recorded()
    raw["nvidia_smi"]["out"] = raw["nvidia_smi"]["out"].replace("Clocks Event Reasons", "Clocks Throttle Reasons")
    raw = edit_gpu(raw, 0, r"(HW Slowdown\s+: )Not Active\n(\s+HW Thermal Slowdown\s+: )Not Active\n"
                           r"(\s+HW Power Brake Slowdown\s+: )Not Active", r"\1Active\n\2Not Active\n\3Active")
    assert "hw_power_brake" in finding(checks.judge(raw), 0, "throttle")[1]


def test_persistence_off_warns_and_an_old_driver_fails_when_a_minimum_is_set():
    raw = edit_gpu(recorded(), 0, r"(Persistence Mode\s+: )Enabled", r"\1Disabled")
    assert finding(checks.judge(raw), 0, "persistence")[0] == "warn"
    assert finding(checks.judge(recorded(), {"driver_min": "590.1"}), 0, "driver")[0] == "fail"
    assert finding(checks.judge(recorded(), {"driver_min": "580.105.08"}), 0, "driver")[0] == "ok"


XID79 = "1796376001.220410 h100-node kernel: NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = ("1796376003.001200 h100-node kernel: NVRM: Xid (PCI:0000:2a:00): 13, pid=48213, name=python, Graphics SM "
         "Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address")


def with_kernel(*lines: str) -> dict:
    raw = recorded()
    raw["kernel"]["out"] += "\n".join(lines) + "\n"
    return raw


def test_a_xid_since_boot_that_needs_a_gpu_action_fails_that_gpu_only():
    result = checks.judge(with_kernel(XID79, XID13))
    assert status(result) == ["fail", "warn"]
    level, text = finding(result, 0, "xid")
    assert level == "fail" and "reboot-node" in text and "Xid 79" in text and "fallen off the bus" in text
    assert finding(result, 1, "xid")[0] == "warn", "an application Xid needs no GPU action: noted only"


def test_a_xid_before_the_gpu_was_cleared_counts_as_dealt_with():
    assert checks.judge(with_kernel(XID79), cleared={UUID0: 1796376100.0})["rows"][0]["status"] == "ok"
    assert checks.judge(with_kernel(XID79), cleared={UUID0: 1796375000.0})["rows"][0]["status"] == "fail"


def test_xid_lines_from_dmesg_take_the_boot_time():
    [x] = xid.parse("[  361.108171] NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=python, An uncorrectable double "
                    "bit error (DBE) has been detected", "dmesg", boot_time=1796375640.0)
    assert x["ts"] == pytest.approx(1796376001.108171) and x["action"] == "reset-gpu"
    assert x["bus"] == nvidia_smi.bus_key("00000000:18:00.0")


def test_a_dcgm_failure_fails_the_gpu_it_names():
    raw = recorded()
    raw["dcgm"]["out"] = raw["dcgm"]["out"].replace(
        "+-----  Hardware", "").replace(
        "|                           | GPU1: Pass                                     |\n"
        "+---------------------------+",
        "|                           | GPU1: Pass                                     |\n"
        "+-----  Hardware  ----------+------------------------------------------------+\n"
        "| memory                    | Fail                                           |\n"
        "|                           | GPU0: Pass                                     |\n"
        "|                           | GPU1: Fail                                     |\n"
        "| Warning: GPU1             | Memory error detected on GPU 1: DBE at 0x3f2a  |\n"
        "|                           |  1000                                          |\n"
        "+---------------------------+")
    result = checks.judge(raw)
    assert status(result) == ["ok", "fail"]
    level, text = finding(result, 1, "dcgm")
    assert level == "fail" and "memory: " in text and "DBE at 0x3f2a 1000" in text


def test_dcgm_3s_error_rows_name_the_gpus_they_mean():
    # the rows as ml-engineering's debug.md shows a repeating Xid 64 in `dcgmi diag -r 3`
    text = ("Successfully ran diagnostic for group.\n"
            "+---------------------------+------------------------------------------------+\n"
            "| Diagnostic                | Result                                         |\n"
            "+===========================+================================================+\n"
            "|-----  Deployment  --------+------------------------------------------------|\n"
            "| Page Retirement/Row Remap | Fail                                           |\n"
            "| Error                     | GPU 1 has uncorrectable memory errors and row  |\n"
            "|                           |  remappings are pending                        |\n"
            "| Inforom                   | Pass                                           |\n"
            "+---------------------------+------------------------------------------------+\n")
    parsed = dcgm.parse(text)
    assert dcgm.failures(parsed, [0, 1]) == {1: ["Page Retirement/Row Remap: GPU 1 has uncorrectable memory "
                                                 "errors and row remappings are pending"]}


def test_a_dcgm_failure_that_names_no_gpu_fails_every_gpu_and_an_unreachable_engine_only_warns():
    text = ("Successfully ran diagnostic for group.\n| Diagnostic | Result |\n"
            "| CUDA Main Library | Fail |\n| Error | libcuda.so could not be loaded |\n")
    assert sorted(dcgm.failures(dcgm.parse(text), [0, 1])) == [0, 1]
    raw = recorded()
    raw["dcgm"]["out"] = "Error: unable to establish a connection to the specified host: localhost\n"
    result = checks.judge(raw)
    assert result["ok"] and finding(result, 0, "dcgm")[0] == "warn"
    raw.pop("dcgm")
    assert finding(checks.judge(raw), 0, "dcgm") == ("skip", "DCGM: not installed (the dcgm role installs it)")


def probe_with(**changes) -> dict:
    raw = recorded()
    result = raw["probe"]["result"]
    for i, tflops in changes.get("tflops", {}).items():
        result["gpus"][i]["tflops"] = tflops
    result["allreduce"].update(changes.get("allreduce", {}))
    return raw


def test_a_matmul_straggler_and_a_card_below_its_expected_figure_fail():
    result = checks.judge(probe_with(tflops={1: 600.0}))
    assert status(result) == ["ok", "fail"]
    assert "a straggler" in finding(result, 1, "matmul")[1]
    result = checks.judge(recorded(), {"matmul_expected_tflops": 2000})  # a threshold above what the card gives
    assert status(result) == ["fail", "fail"] and "below 0.6 (matmul_min_of_expected)" in finding(result, 0, "matmul")[1]


def test_the_all_reduce_floor_and_a_wrong_sum_fail_the_host():
    result = checks.judge(probe_with(allreduce={"busbw_gbs": 40.0}))
    assert not result["ok"] and result["host"][0][1] == "fail" and "below the floor 150" in result["host"][0][2]
    assert checks.judge(probe_with(allreduce={"busbw_gbs": 40.0}), {"allreduce_min_busbw_gbs": 0})["ok"]
    assert checks.judge(probe_with(allreduce={"correct": False}))["host"][0][1] == "fail"


def test_without_gpus_or_a_trainer_venv_the_probe_is_skipped_with_a_word():
    raw = recorded()
    raw["probe"] = {"skipped": "no trainer venv python at /nowhere/python"}
    result = checks.judge(raw)
    assert result["ok"] and finding(result, 0, "matmul") == ("skip", "matmul: no trainer venv python at /nowhere/python")
    assert result["host"][0][1] == "skip"


def test_nvidia_smi_failing_or_a_missing_gpu_fails_the_host():
    raw = recorded()
    raw["nvidia_smi"] = {"rc": 9, "out": "", "err": "Unable to determine the device handle for GPU0000:18:00.0: Unknown Error"}
    result = checks.judge(raw)
    assert not result["ok"] and "Unknown Error" in result["host"][0][2]
    result = checks.judge(recorded(), indices=[0, 3])
    assert not result["ok"] and "GPU(s) [3] not in nvidia-smi's report" in result["host"][0][2]
    assert [r["index"] for r in checks.judge(recorded(), indices=[1])["rows"]] == [1]


def test_busbw_is_nccl_tests_definition():
    # nccl-tests' all_reduce_perf on 8 H200s: 8 GiB in 31517 us -> algbw 272.55, busbw 476.96 GB/s
    assert probe.busbw_gbs(8589934592, 31517e-6, 8) == pytest.approx(476.96, abs=0.01)


def test_a_bad_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown GPU health setting 'pcie_widht'"):
        settings.resolve({"pcie_widht": "warn"})
    with pytest.raises(ValueError, match="pcie_width='maybe': give one of fail, warn, off"):
        settings.resolve({"pcie_width": "maybe"})
    assert settings.resolve({"xid_actions": "reboot-node"})["xid_actions"] == ["reboot-node"]


def test_the_recorded_probe_is_what_the_probe_prints():
    got = json.loads((FIX / "probe.json").read_text())
    assert {"gpus", "allreduce"} <= set(got) and {"uuid", "tflops"} <= set(got["gpus"][0])


def test_the_docs_table_is_the_settings_table():
    text = (ROOT / "docs/gpu-health.md").read_text()
    for s in settings.SETTINGS:
        assert f"| `{s.name}` | `{s.default}` | {s.meaning} | {s.source} |" in text, f"docs/gpu-health.md: {s.name}"


def test_a_real_h100_recording_passes_and_its_facts_are_read():
    """tests/fixtures/gpu_health/h100: `nvidia-smi -q` and the probe's line recorded on one lent H100
    (driver 580.159.04, 2026-12-07, tests/benchmarks/gpu_health_record.sh), not written by hand: the
    parser reads the real report's layout, the card passes, and a matmul threshold above the card's
    784 TFLOP/s fails it naming the figure."""
    raw = gather.recorded(str(FIX / "h100"))
    g = nvidia_smi.parse(raw["nvidia_smi"]["out"])
    assert g["driver"] == "580.159.04"
    (card,) = g["gpus"]
    assert (card["index"], card["bus"], card["name"]) == (0, "00000000:00:06.0", "NVIDIA H100 80GB HBM3")
    assert card["uuid"] == "GPU-3a345e60-dcbc-534e-67a0-6e49df54ed57"
    assert card["pcie"]["width_current"] == card["pcie"]["width_max"] == 16
    assert card["remap_pending"] is False and card["persistence"] is True
    result = checks.judge(raw)
    assert result["ok"] and status(result) == ["ok"], checks.table(result)
    result = checks.judge(raw, {"matmul_expected_tflops": 2000})
    assert status(result) == ["fail"]
    assert "784 TFLOP/s bf16, 0.39 of the expected 2000" in finding(result, 0, "matmul")[1]
