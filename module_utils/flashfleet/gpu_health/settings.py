"""The health check's thresholds: one table, each with its default and the source of that default.

Every setting is overridable: in Ansible as `gpu_health_<name>` (roles/gpu_health/defaults), on the
command line as `python -m flashfleet.gpu_health --set name=value`. docs/gpu-health.md prints this
table. A "fail" finding quarantines the GPU and refuses the run; "warn" is printed and lets it start.
"""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("fail", "warn", "off")
NVIDIA_MEM = ("NVIDIA, GPU Memory Error Management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt): an "
              "uncorrectable error marks a row for remapping that takes effect at the next GPU reset; a remapping "
              "failure means the GPU should be evaluated for RMA")
SMI = "nvidia-smi(1), `nvidia-smi -q`: Clocks Event Reasons, GPU Link Info"


@dataclass(frozen=True)
class Setting:
    name: str
    default: object
    meaning: str
    source: str


SETTINGS = (
    Setting("ecc_uncorrectable_max", 0,
            "volatile (since the driver loaded) uncorrectable ECC errors a GPU may have; more fails it",
            NVIDIA_MEM + "; DCGM's memory health watch fails on any volatile DBE"),
    Setting("row_remap_pending", "fail", "a row remap (or page retirement) waiting for a GPU reset", NVIDIA_MEM
            + "; NVIDIA, Dynamic Page Retirement (docs.nvidia.com/deploy/dynamic-page-retirement): pending pages "
            "retire at the next driver load"),
    Setting("row_remap_failure", "fail", "the GPU ran out of spare rows (Remapping Failure Occurred: Yes)", NVIDIA_MEM),
    Setting("throttle_hw", "fail",
            "HW Slowdown, HW Thermal Slowdown or HW Power Brake Slowdown active (clocks cut by half or more)",
            SMI + ": HW Slowdown is the hardware protecting itself (temperature, power brake, power supply)"),
    Setting("throttle_sw_thermal", "warn", "SW Thermal Slowdown active (the driver lowers clocks near the limit)", SMI),
    Setting("pcie_width", "fail", "the PCIe link runs narrower than the card's maximum (x8 instead of x16)",
            SMI + ": Link Width Max / Current; width does not drop at idle, so narrower is a seating or riser fault"),
    Setting("pcie_gen", "warn",
            "the link's maximum generation (card and slot together) is below the card's own maximum",
            SMI + ": PCIe Generation Max / Device Max / Host Max; the current generation drops at idle to save "
            "power, so only the maxima are compared"),
    Setting("persistence_mode", "warn", "persistence mode off (each CUDA start re-initialises the GPU)",
            "NVIDIA, Driver Persistence (docs.nvidia.com/deploy/driver-persistence); DCGM's diagnostic fails its "
            "Persistence Mode deployment test without it"),
    Setting("driver_min", "", "the lowest NVIDIA driver accepted ('' = any; the trainer checks its CUDA's own "
            "minimum at start)", "this project: the driver the fleet was validated with"),
    Setting("xid_actions", ["reset-gpu", "reboot-node", "drain-contact-support"],
            "a Xid since boot (or since the GPU was last cleared) whose catalogue action is one of these fails the GPU",
            "NVIDIA Xid catalog, Resolution Bucket (Immediate Action), as module_utils/flashfleet/classify/"
            "catalogues/xid.py maps it (RESET_GPU, RESTART_BM, CONTACT_SUPPORT)"),
    Setting("dcgm", "fail", "a DCGM diagnostic test that fails on the GPU (when DCGM is installed)",
            "NVIDIA DCGM user guide, Diagnostics (docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics"
            ".html): level 1 in seconds (deployment), 2 in about two minutes, 3 and 4 longer"),
    Setting("matmul_min_of_expected", 0.6,
            "the bf16 matmul rate as a fraction of the card's expected figure below which the GPU fails",
            "expected: NVIDIA's datasheets' dense BF16 Tensor Core figures (EXPECTED_TFLOPS); a healthy H100 SXM "
            "measured 0.79-0.81 of it (docs/benchmarks.md), so 0.6 leaves room for clocks and still catches a "
            "card at half speed"),
    Setting("matmul_min_of_median", 0.9,
            "the rate as a fraction of the host's median GPU below which the GPU fails (a straggler: a synchronous "
            "run goes at its slowest card's pace)",
            "this project: well outside the few per cent two healthy cards of one host differ by"),
    Setting("matmul_expected_tflops", 0,
            "the card's expected bf16 dense TFLOP/s (0: the datasheet figure of its product name, EXPECTED_TFLOPS)",
            "NVIDIA H100 / H200 / A100 datasheets"),
    Setting("allreduce_min_busbw_gbs", -1,
            "the NCCL all-reduce bus bandwidth (GB/s) below which the run's GPUs fail together (-1: the figure "
            "for the product in EXPECTED_BUSBW_GBS, none for PCIe-only cards; 0: no floor)",
            "nccl-tests doc/PERFORMANCE.md (busbw = algbw x 2(n-1)/n for all-reduce); floors from this project's "
            "GPU machines (an all-reduce of 1 GiB on 2-8 NVLink H100s: 329-361 GB/s)"),
)
DEFAULTS = {s.name: s.default for s in SETTINGS}

# Dense bf16 Tensor Core TFLOP/s of each product name nvidia-smi prints (NVIDIA datasheets: the
# sparse figure halved). A card missing here is compared with its host's other cards only.
EXPECTED_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.0,   # H100 SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.0,             # H200 SXM
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
}
# Bus-bandwidth floors (GB/s) of an all-reduce across NVLink cards (quick and full sizes alike):
# about half of what 2-8 H100s gave here at 1 GiB, so a lost NVLink (traffic over PCIe, tens of
# GB/s) fails and a healthy node does not.
EXPECTED_BUSBW_GBS = {"NVIDIA H100 80GB HBM3": 150.0, "NVIDIA H200": 150.0, "NVIDIA A100-SXM4-80GB": 100.0,
                      "NVIDIA A100-SXM4-40GB": 100.0}


def resolve(overrides: dict | None) -> dict:
    """DEFAULTS with `overrides` applied; ValueError naming the setting for an unknown name or a
    value of the wrong kind."""
    cfg = dict(DEFAULTS)
    for name, value in (overrides or {}).items():
        if name not in DEFAULTS:
            raise ValueError(f"unknown GPU health setting {name!r}; known: {', '.join(sorted(DEFAULTS))}")
        default = DEFAULTS[name]
        if isinstance(default, str) and default in LEVELS:
            if value not in LEVELS:
                raise ValueError(f"GPU health setting {name}={value!r}: give one of {', '.join(LEVELS)}")
        elif isinstance(default, list):
            value = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
        elif isinstance(default, (int, float)) and not isinstance(default, bool):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"GPU health setting {name}={value!r}: give a number") from None
        cfg[name] = value
    return cfg
