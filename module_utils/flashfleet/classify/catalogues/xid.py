"""NVIDIA's Xid catalogue: every Xid the driver can print in the kernel log (`NVRM: Xid (PCI:...): N,
...`), with what it means for a training run and the action NVIDIA's resolution bucket asks for.

Sources: NVIDIA's Xid catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog": mnemonic, description, "Resolution Bucket (Immediate
Action)", "Resolution Bucket (Investigatory Action)") and NVIDIA's NVSentinel
(distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv), which encodes the
same buckets. Where the two disagree the catalog page wins, except for Xid 160 (the page says
IGNORE, NVSentinel RESTART_BM, which the classifier kept from before this module). This module is
the one owner of the Xid table: signatures.XID_CATALOG is derived from it. Xids 162-172 have no bucket in either source: their
action is inferred from the page's description and marked `"inferred": True` in extra.

kind (extra["kind"]): "application" (the program's own fault: a crash verdict names it),
"hardware" (the GPU, its memory, links or firmware: outranks the crash it causes), "info" (IGNORE:
listed, never the verdict), "recovery" (Xid 154 names the driver's recovery action itself).
Unused Xids (the catalog's "Unused": no A100/H100/B100/GB200 driver prints them) keep the catalog's
CONTACT_SUPPORT: seeing one is itself unexpected."""

from __future__ import annotations

import re

from .entry import Entry

SOURCE = ("NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), Resolution Bucket "
          "(Immediate Action); NVIDIA NVSentinel gpu-health-monitor xiderrorsmapping.csv")

# NVIDIA's immediate-action bucket -> this project's action. WORKFLOW_* take the action their workflow
# starts with (45: the sympathetic teardown, restart; 48: reset, drain with 63/64; NVLink: reset the
# GPU; NVLink5: drain, decode the subcode with support). RESTART_VM is a bare-metal reboot here.
BUCKET_ACTIONS = {
    "RESTART_APP": "restart-app", "RESET_GPU": "reset-gpu", "RESTART_BM": "reboot-node", "RESTART_VM": "reboot-node",
    "CONTACT_SUPPORT": "drain-contact-support", "IGNORE": "none", "WORKFLOW_XID_45": "restart-app",
    "WORKFLOW_XID_48": "reset-gpu", "WORKFLOW_NVLINK_ERR": "reset-gpu", "WORKFLOW_NVLINK5_ERR": "drain-contact-support",
    "XID_154": "reset-gpu", "CHECK_MECHANICALS": "drain-contact-support", "UPDATE_SWFW": "drain-contact-support",
    "CHECK_UVM": "reset-gpu",
}

# What each kind means for the run (the start of every entry's meaning).
_KIND_MEANING = {
    "application": "the program hit a GPU fault of its own (the GPU stays healthy); the crash it caused is the run's "
                   "verdict and a restart recovers",
    "hardware": "the GPU, its memory, links or firmware failed under the run; this outranks the crash it caused",
    "info": "an informational event the catalog says to ignore; it does not explain a death by itself",
    "recovery": "the driver names the recovery the GPU now needs (GPU reset, node reboot, drain) for the Xid "
                "before it; follow that action",
}

_ACTION_WORDS = {
    "none": "nothing to do", "restart-app": "restart the run, drain the GPU if it repeats",
    "reset-gpu": "drain and reset the GPU before it is used again", "reboot-node": "drain and reboot the node",
    "drain-contact-support": "drain the GPU and contact NVIDIA or the vendor with nvidia-bug-report.sh output",
}

# (code, mnemonic, catalog description, bucket, kind, the tail of the driver's line in the sample).
# A tail of None repeats the description.
_ROWS = (
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "application",
     "Channel 00000010"),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP",
     "application", None),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", "application",
     "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "Fake or injected error from userspace", "IGNORE", "info", None),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", "application",
     None),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", "application",
     "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_c0000000. "
     "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
    # DMA faults on the host link: the catalog blames PCIe quality, not the program
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP", "hardware", None),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE", "info", None),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", "info", None),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "application", None),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "application", None),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "application", None),
    # IGNORE for the GPU, but the program that hit it died: XID_CATALOG restarts it
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", "application",
     "Ch 00000010"),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE", "info",
     None),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45",
     "application", "Ch 00000010"),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "hardware", None),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "hardware",
     "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
     "subpartition 0."),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board",
     "CHECK_MECHANICALS", "hardware", None),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", "application", None),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU", "hardware", None),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "info",
     "Row Remapper: New row (0x00000000000a3c1f) marked for remapping, reset gpu to activate."),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", "hardware", None),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE", "info", None),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", "info", None),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "application", None),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", "application", None),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "application", None),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "application", None),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "application", None),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "hardware",
     "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "application", None),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "application", None),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "application", None),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "hardware", None),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", "hardware",
     "GPU has fallen off the bus."),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", "application", None),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "application", None),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "application", None),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "application", None),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "application", None),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "application", None),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "application", None),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "application", None),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "info", None),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE", "info",
     None),
    # contained to the one program that touched the bad memory: restart it, reset the GPU when convenient
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "hardware",
     "Contained: SM (0x1). RST: No, D-RST: No"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "hardware",
     "Uncontained: FBHUB. RST: Yes, D-RST: No"),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "application", None),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "application", None),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "application", None),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "application", None),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "application", None),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "application", None),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "application", None),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "application", None),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "application", None),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "application", None),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "info", None),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "info", None),
    # NVSentinel: DESTINATION_FLA_TRANSLATION_ERROR, UNEXPECTED_ERR_REPORT_ISSUE
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "NVLink remote translation error", "IGNORE", "info", None),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU", "hardware",
     "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x3c046"),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "hardware", None),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "hardware",
     "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
     "(0x20800a4c 0x4)."),
    (120, "GSP_ERROR", "GSP Error", "RESET_GPU", "hardware", None),
    (121, "C2C_ERROR", "C2C Error", "IGNORE", "info", None),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", "application", None),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", "application", None),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", "application", None),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", "application", None),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", "application", None),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", "application", None),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", "application", None),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", "application", None),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", "application", None),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", "application", None),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", "hardware", None),
    # an illegal NVLink peer-to-peer access: the catalog calls it typically an application bug
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", "application", None),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "application", None),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", "hardware", None),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "info", None),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", "hardware", None),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "hardware", None),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "hardware", None),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", "hardware", None),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "info", None),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "info", None),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", "recovery",
     "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU", "hardware", None),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "hardware", None),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", "info", None),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "hardware", None),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", "hardware", None),
    # the catalog page: IGNORE; NVSentinel and XID_CATALOG: RESTART_BM (kept, to agree with XID_CATALOG)
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "RESTART_BM", "hardware", None),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "info", None),
)

# Xids newer than both sources' buckets: (code, mnemonic, description, kind, action). 162 takes
# NVSentinel's RESET_GPU; the rest are read from the catalog page's notes.
_INFERRED = (
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "hardware", "reset-gpu"),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "info", "none"),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "info", "none"),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "info", "none"),
    (166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic seen prior to link properly being configured for encrypted traffic",
     "hardware", "drain-contact-support"),
    (167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "hardware", "reboot-node"),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "hardware", "reboot-node"),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "hardware", "reset-gpu"),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "hardware", "drain-contact-support"),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM error, the detail of an Xid 48", "hardware", "reset-gpu"),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM error, the detail of an Xid 48", "hardware", "reset-gpu"),
)

# The catalog's "Unused" Xids: no current driver prints them (bucket CONTACT_SUPPORT).
_UNUSED = {
    1: "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", 2: "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD",
    3: "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", 4: "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY",
    5: "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", 6: "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR",
    7: "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", 9: "ROBUST_CHANNEL_GR_ERROR_INSTANCE",
    10: "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", 12: "ROBUST_CHANNEL_GR_ERROR_SW_METHOD",
    15: "ROBUST_CHANNEL_SCANLINE_TIMEOUT", 16: "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT",
    17: "ROBUST_CHANNEL_PARAMETER_ERROR", 18: "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR",
    19: "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", 20: "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD",
    21: "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", 22: "ROBUST_CHANNEL_VP_ERROR_SW_METHOD",
    23: "ROBUST_CHANNEL_RC_LOGGING_ENABLED", 24: "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT",
    26: "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", 27: "ROBUST_CHANNEL_VP_ERROR", 28: "ROBUST_CHANNEL_VP2_ERROR",
    29: "ROBUST_CHANNEL_BSP_ERROR", 30: "ROBUST_CHANNEL_BAD_ADDR_ACCESS", 33: "ROBUST_CHANNEL_SEC_ERROR",
    34: "ROBUST_CHANNEL_MSVLD_ERROR", 35: "ROBUST_CHANNEL_MSPDEC_ERROR", 36: "ROBUST_CHANNEL_MSPPP_ERROR",
    42: "ROBUST_CHANNEL_VIC_ERROR", 47: "ROBUST_CHANNEL_NVENC0_ERROR",
    49: "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", 50: "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR",
    51: "SILENT_RUNNING_STRESS_TEST_FAILURE", 52: "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE",
    53: "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", 55: "SILENT_RUNNING_TEMPERATURE_READ_ERROR",
    56: "DISPLAY_CHANNEL_EXCEPTION", 57: "FB_LINK_TRAINING_FAILURE_ERROR", 58: "FB_MEMORY_ERROR", 59: "PMU_ERROR",
    61: "PMU_BREAKPOINT", 65: "ROBUST_CHANNEL_NVENC1_ERROR", 73: "ROBUST_CHANNEL_NVENC2_ERROR",
    81: "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", 87: "NVTELEMETRY_DRIVER_REPORT", 90: "LTC_ERROR", 91: "RESERVED_XID",
    111: "BUNDLE_ERROR_EVENT", 112: "DISP_SUPERVISOR_ERROR", 113: "DP_LT_FAILURE", 114: "HEAD_RG_UNDERFLOW",
    115: "CORE_CHANNEL_REGS", 116: "WINDOW_CHANNEL_REGS", 117: "CURSOR_CHANNEL_REGS", 118: "HEAD_REGS",
    122: "SPI_PMU_RPC_READ_FAIL", 123: "SPI_PMU_RPC_WRITE_FAIL", 124: "SPI_PMU_RPC_ERASE_FAIL",
    125: "INFOROM_FS_ERROR", 138: "ROBUST_CHANNEL_DLA_ERROR",
}

_PCI = "PCI:0000:3b:00"


def _sample(code: int, kind: str, tail: str) -> str:
    # the driver names the process for faults raised in a channel, not for board-level events
    who = "pid=48213, name=python" if kind == "application" else "pid='<unknown>', name=<unknown>"
    if code == 154:
        return f"NVRM: Xid ({_PCI}): {code}, {tail}"
    return f"NVRM: Xid ({_PCI}): {code}, {who}, {tail}"


def _entry(code: int, mnemonic: str, description: str, bucket: str, kind: str, action: str, tail: str | None,
           **extra) -> Entry:
    verdict = f"gpu-xid-{code}" if kind in ("hardware", "recovery") else "crash"
    meaning = (f"Xid {code} {mnemonic} ({description}): {_KIND_MEANING[kind]}; "
               f"{_ACTION_WORDS[action]} (bucket {bucket or 'none given'})")
    return Entry("xid", f"Xid {code}", re.compile(rf"NVRM: Xid \((?:PCI:)?[0-9a-fA-F:.]+\): {code}\b(?!\.)"),
                 meaning, verdict, action, SOURCE, _sample(code, kind, tail or description), where="kernel",
                 number=code, extra={"kind": kind, "bucket": bucket, "mnemonic": mnemonic, **extra})


def _action(bucket: str, kind: str) -> str:
    # an application fault the GPU ignores (43, 137) still killed the program: restart it
    return "restart-app" if kind == "application" and bucket == "IGNORE" else BUCKET_ACTIONS[bucket]


ENTRIES = tuple(sorted(
    [_entry(c, m, d, b, k, _action(b, k), t) for c, m, d, b, k, t in _ROWS]
    + [_entry(c, m, d, "", k, a, None, inferred=True) for c, m, d, k, a in _INFERRED]
    + [_entry(c, m, "Unused", "CONTACT_SUPPORT", "hardware", "drain-contact-support", m, unused=True)
       for c, m in _UNUSED.items()],
    key=lambda e: e.number))
