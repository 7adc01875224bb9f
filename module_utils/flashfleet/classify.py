"""Turn one host's evidence (the JSON the flashfleet_evidence module gathers, flashfleet.evidence)
into a verdict.

Standard library only, no Ansible import: the role's filter plugin imports it on the controller
(`from flashfleet import classify`), and a user runs it offline on evidence that diagnose.yml or
collect.yml brought home:

    flashfleet-classify runs/v2/gpu01/evidence.json
    flashfleet-classify runs/v2                        # every host
    flashfleet-classify --json runs/v2/gpu01/evidence.json

(`python -m flashfleet.classify ...` is the same without the console script.)

Rules (see docs/diagnosis.md): one verdict per host, the most specific one the evidence proves,
with the lines that prove it, a next step (a sentence) and an action (machine-readable, ACTIONS).
Every source of the evidence is read: systemd's record and messages, the trainer's output (whole
multi-line exceptions, native aborts), the kernel log (OOM kills, every Xid, the other NVRM lines,
segfault/trap lines naming the faulting library), nvidia-smi's output and the venv drift.
- A hardware Xid in the invocation's window outranks the crash it caused; with several, the first
  is the root and the others are listed.
- A kernel OOM line naming the run's cgroup or one of its pids outranks a bare SIGKILL.
- Host, driver and toolchain findings (driver/library mismatch, a driver too old for the CUDA
  runtime, NVML errors, missing compiler or Python headers) come before blaming the run's
  configuration (exit 78) or a crash that is only their symptom.
- A death before READY is `init-crash`, whatever its cause; the cause is named in `cause`.
  systemd's own start outcomes (`start-limit-hit`, `start-timeout`, `exec-failed`) are verdicts
  of their own.
- SIGKILL with an unreadable kernel log is `killed-by-signal`, "kernel log unreadable, OOM not
  ruled out".
- When nothing proves a cause: `unknown`, with the evidence.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .contract import layout, messages

# diagnosis.json's schema. 2: `action` beside `next_step`; verdicts native-crash, driver-mismatch,
# driver-too-old, gpu-unavailable, toolchain-error, nccl-error, start-limit-hit, start-timeout,
# exec-failed; `xids` (every Xid of the window, the root first) on GPU verdicts.
SCHEMA = 2

VERDICTS = (
    "running", "completed", "not-started", "init-crash", "crash", "native-crash", "host-oom-kill",
    "cgroup-oom-kill", "cuda-oom", "gpu-xid-<n>", "gpu-unavailable", "driver-mismatch",
    "driver-too-old", "toolchain-error", "nccl-timeout", "nccl-error", "watchdog-hang", "disk-full",
    "killed-by-signal", "peer-failure", "start-limit-hit", "start-timeout", "exec-failed", "nonfinite-loss",
    "filesystem-error", "stopped", "unknown",
    "server-oom", "server-kv-cache", "server-nccl", "server-not-ready", "server-died",
)

# ---------------------------------------------------------------------------------------------
# Actions: the one table. Every verdict carries one of these beside its sentence (`next_step`).
# The GPU classes are the resolution buckets of NVIDIA's Xid catalog ("Resolution Bucket
# (Immediate Action)": RESTART_APP, RESET_GPU, RESTART_BM/RESTART_VM, CONTACT_SUPPORT, IGNORE;
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and NVML's GPU recovery
# actions (none, GPU reset, node reboot, drain P2P, drain and reset); the rest are this project's.

ACTIONS = {
    "none": "nothing to do",
    "launch": "launch the run: `ansible-playbook train.yml -e run=RUN`",
    "restart-app": "restart the run: the GPU recovers by itself once the process that hit the fault is gone "
                   "(Xid catalog RESTART_APP); drain the GPU if it repeats",
    "reset-gpu": "drain this GPU (exclude it from the run), reset it (`nvidia-smi -r`, or reboot) before it is "
                 "used again (Xid catalog RESET_GPU); RMA if it repeats",
    "reboot-node": "drain the node and reboot it: the GPU cannot be recovered in place (Xid catalog RESTART_BM); "
                   "RMA if it repeats",
    "drain-contact-support": "drain the GPU/node and contact NVIDIA or the hardware vendor with nvidia-bug-report.sh "
                             "output (Xid catalog CONTACT_SUPPORT)",
    "fix-config": "fix the run's configuration or resources as the reason says, then train.yml",
    "free-disk": "free space on the filesystem named (lower keep-last checkpoints, clear /dev/shm), then restart; "
                 "the unit resumes from the newest complete checkpoint",
    "raise-timeout": "raise the run's resources.start_timeout_s (TimeoutStartSec) if the start is only slow, or "
                     "find where it hung (last output), then train.yml",
    "reset-failed": "the unit will not start again by itself: fix the cause, then `systemctl reset-failed UNIT` "
                    "(train.yml does it) and start it",
    "rerun": "restart the run (train.yml); it resumes from the newest complete checkpoint",
    "check-network": "check the network between the nodes (NCCL_SOCKET_IFNAME, routes, firewall, IB/RoCE links), "
                     "then restart the run",
    "diagnose-peer": "diagnose the host that went first (named in the reason); this one restarts with the run",
    "fix-driver": "repair the NVIDIA driver on the host (provision: nvidia_driver role): matching kernel module "
                  "and libraries, loaded module, fabric manager, a driver new enough for the CUDA runtime; "
                  "reboot if the module was upgraded under a loaded one",
    "fix-toolchain": "install the build toolchain the JIT needs (provision: build_toolchain / cuda_toolkit roles)",
    "fix-venv": "re-sync the venv from the lock (provision: python_env role) and compare `venv` drift in "
                "evidence.json; a binary built for another torch, CUDA or CPU must be rebuilt or replaced",
    "restage": "a staged file (model, dataset) is corrupt or truncated: stage it again (dataset role), then train.yml",
    "check-filesystem": "the filesystem named failed under the run (I/O errors, the kernel aborted its journal or "
                        "remounted it read-only): check the disk (dmesg, SMART), repair it (fsck / xfs_repair) and "
                        "remount it read-write, or move the run's output elsewhere; then train.yml",
    "fix-server": "fix the vLLM server's settings as the reason says (the run's `vllm:` entry: its `args` such as "
                  "--gpu-memory-utilization and --max-model-len, or the GPUs and tensor-parallel size of its "
                  "`servers`), then train.yml",
    "check-target-server": "find in the vLLM target server's journal why it went (out of memory at load, a KV "
                           "cache too small, NCCL) and fix that: a server that died restarts by itself, and the "
                           "trainer's unit resumes the run from its newest checkpoint once the server answers again",
    "investigate": "no mechanical fix: read the lines shown and evidence.json (journal, kernel log)",
    "check-host": "the host gave no evidence: check that it is reachable and that diagnose.yml can run there",
}

# Default action of each verdict (gpu-xid-<n> takes its Xid's class, init-crash its cause's).
VERDICT_ACTIONS = {
    "running": "none", "completed": "none", "stopped": "none", "not-started": "launch",
    "init-crash": "investigate", "crash": "investigate", "native-crash": "investigate",
    "host-oom-kill": "fix-config", "cgroup-oom-kill": "fix-config", "cuda-oom": "fix-config",
    "gpu-unavailable": "fix-driver", "driver-mismatch": "fix-driver", "driver-too-old": "fix-driver",
    "toolchain-error": "fix-toolchain", "nccl-timeout": "rerun", "nccl-error": "investigate",
    "watchdog-hang": "rerun", "disk-full": "free-disk", "killed-by-signal": "rerun",
    "peer-failure": "diagnose-peer", "start-limit-hit": "reset-failed", "start-timeout": "raise-timeout",
    "exec-failed": "fix-config", "nonfinite-loss": "fix-config", "filesystem-error": "check-filesystem",
    "server-oom": "fix-server", "server-kv-cache": "fix-server", "server-nccl": "investigate",
    "server-not-ready": "fix-server", "server-died": "check-target-server", "unknown": "investigate",
    "unreachable": "check-host",
    "no-evidence": "check-host",
}

# GPU actions, mildest first: with several Xids (or a Xid 154) the strongest one wins.
GPU_ACTION_ORDER = ("none", "restart-app", "reset-gpu", "reboot-node", "drain-contact-support")

# The Xids this classifier knows: kind, NVIDIA's immediate-action bucket, our action, mnemonic.
# Source: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate
# Action)"), as NVIDIA's NVSentinel encodes it (distros/kubernetes/nvsentinel/charts/
# gpu-health-monitor/xiderrorsmapping.csv); NVIDIA Health Validation marks 46 and 48 critical
# (drain, reset, service). WORKFLOW_* buckets are mapped to the action their workflow starts with.
# kind: "application" (the program's own fault: a crash verdict names it), "hardware" (outranks
# the crash it causes), "info" (IGNORE: listed, never the verdict), "recovery" (Xid 154 names the
# driver's recovery action itself).
XID_CATALOG = {
    8: ("application", "RESTART_APP", "restart-app", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT"),
    13: ("application", "RESTART_APP", "restart-app", "ROBUST_CHANNEL_GR_EXCEPTION"),
    31: ("application", "RESTART_APP", "restart-app", "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT"),
    43: ("application", "IGNORE", "restart-app", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR"),
    45: ("application", "WORKFLOW_XID_45", "restart-app", "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL"),
    46: ("hardware", "RESET_GPU", "reset-gpu", "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR"),
    48: ("hardware", "WORKFLOW_XID_48", "reset-gpu", "ROBUST_CHANNEL_GPU_ECC_DBE"),
    62: ("hardware", "RESET_GPU", "reset-gpu", "PMU_HALT_ERROR"),
    63: ("info", "IGNORE", "none", "INFOROM_DRAM_RETIREMENT_EVENT"),
    64: ("hardware", "RESET_GPU", "reset-gpu", "INFOROM_DRAM_RETIREMENT_FAILURE"),
    74: ("hardware", "WORKFLOW_NVLINK_ERR", "reset-gpu", "NVLINK_ERROR"),
    79: ("hardware", "RESTART_BM", "reboot-node", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
    92: ("info", "IGNORE", "none", "EXCESSIVE_SBE_INTERRUPTS"),
    94: ("hardware", "RESTART_APP", "restart-app", "ROBUST_CHANNEL_CONTAINED_ERROR"),
    95: ("hardware", "RESET_GPU", "reset-gpu", "ROBUST_CHANNEL_UNCONTAINED_ERROR"),
    109: ("hardware", "RESET_GPU", "reset-gpu", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR"),
    110: ("hardware", "RESET_GPU", "reset-gpu", "SEC_FAULT_ERROR"),
    119: ("hardware", "RESET_GPU", "reset-gpu", "GSP_RPC_TIMEOUT"),
    120: ("hardware", "RESET_GPU", "reset-gpu", "GSP_ERROR"),
    136: ("hardware", "RESET_GPU", "reset-gpu", "ALI_TRAINING_FAIL"),
    140: ("hardware", "RESET_GPU", "reset-gpu", "UNRECOVERABLE_ECC_ERROR_ESCAPE"),
    143: ("hardware", "RESET_GPU", "reset-gpu", "GPU_INIT_ERROR"),
    **{code: ("hardware", "WORKFLOW_NVLINK5_ERR", "drain-contact-support", mnemonic) for code, mnemonic in (
        (144, "NVLINK_SAW_ERROR"), (145, "NVLINK_RLW_ERROR"), (146, "NVLINK_TLW_ERROR"), (147, "NVLINK_TREX_ERROR"),
        (148, "NVLINK_NVLPW_CTRL_ERROR"), (149, "NVLINK_NETIR_ERROR"), (150, "NVLINK_MSE_ERROR"))},
    154: ("recovery", "XID_154", "reset-gpu", "GPU_RECOVERY_ACTION_CHANGED"),
    155: ("hardware", "RESET_GPU", "reset-gpu", "NVLINK_SW_DEFINED_ERROR"),
    156: ("hardware", "RESET_GPU", "reset-gpu", "RESOURCE_RETIREMENT_EVENT"),
    158: ("hardware", "RESET_GPU", "reset-gpu", "GPU_FATAL_TIMEOUT"),
    160: ("hardware", "RESTART_BM", "reboot-node", "CHANNEL_RETIREMENT_EVENT"),
}
XID_APPLICATION = {c for c, (kind, *_rest) in XID_CATALOG.items() if kind == "application"}
XID_HARDWARE = {c for c, (kind, *_rest) in XID_CATALOG.items() if kind in ("hardware", "recovery")}

# Xid 154 "GPU recovery action changed from 0x0 (None) to 0xN (...)": NVML's
# nvmlDeviceGpuRecoveryAction_t (NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET,
# RECOVER_IMEX_DOMAIN, BUS_RESET, SYSTEM_REBOOT) as our action.
RECOVERY_ACTIONS = {0: "none", 1: "reset-gpu", 2: "reboot-node", 3: "reset-gpu", 4: "reset-gpu",
                    5: "drain-contact-support", 6: "reset-gpu", 7: "reboot-node"}

# systemd's own exit statuses (EXIT_CHDIR..EXIT_CREDENTIALS, systemd.exec(5) "Process Exit
# Codes"): the trainer never ran. EXEC means ExecStart= (the venv's dflash-train) is missing.
SYSTEMD_EXIT_STEPS = {200: "CHDIR", 201: "NICE", 202: "FDS", 203: "EXEC", 204: "MEMORY", 205: "LIMITS",
                      206: "OOM_ADJUST", 207: "SIGNAL_MASK", 208: "STDIN", 209: "STDOUT", 210: "CHROOT",
                      211: "IOPRIO", 212: "TIMERSLACK", 213: "SECUREBITS", 214: "SETSCHEDULER",
                      215: "CPUAFFINITY", 216: "GROUP", 217: "USER", 218: "CAPABILITIES", 219: "CGROUP",
                      220: "SETSID", 221: "CONFIRM", 222: "STDERR", 224: "PAM", 225: "NETWORK",
                      226: "NAMESPACE", 227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 229: "SELINUX_CONTEXT",
                      230: "PERSONALITY", 231: "APPARMOR_PROFILE", 232: "ADDRESS_FAMILIES",
                      233: "RUNTIME_DIRECTORY", 235: "CHOWN", 236: "SMACK_PROCESS_LABEL", 237: "KEYRING",
                      238: "STATE_DIRECTORY", 239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY",
                      241: "CONFIGURATION_DIRECTORY", 242: "NUMA_POLICY", 243: "CREDENTIALS"}
EXEC_STEP_ACTIONS = {"EXEC": "fix-venv"}

# Signals a process sends itself when it crashes; anything else came from outside.
CRASH_SIGNALS = {4, 5, 6, 7, 8, 11, 31}
# systemd counts these signals as a clean exit (systemd.service(5), SuccessExitStatus=): a unit they
# end is not restarted by Restart=on-failure (nor on-abnormal/on-abort/on-watchdog), only by always.
CLEAN_EXIT_SIGNALS = {1, 2, 13, 15}
RESTARTS_ON_CLEAN_EXIT = {"always", "on-success"}
SIGNAL_NAMES = {1: "HUP", 2: "INT", 3: "QUIT", 4: "ILL", 5: "TRAP", 6: "ABRT", 7: "BUS", 8: "FPE",
                9: "KILL", 11: "SEGV", 13: "PIPE", 14: "ALRM", 15: "TERM", 31: "SYS"}
SIGNAL_NUMBERS = {name: num for num, name in SIGNAL_NAMES.items()}

KERNEL_AFTER_EXIT_S = 30.0
KERNEL_BEFORE_START_S = 5.0
OOM_TIME_TIE_S = 10.0
FAULT_TIME_TIE_S = 10.0

# systemd catalog message ids (systemd 252, src/systemd/sd-messages.h)
MID_STARTED = "39f53479d3a045ac8e11786248231fbf"
MID_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
MID_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
MID_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
MID_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"

RE_OOM_KILL = re.compile(
    r"oom-kill:constraint=(?P<constraint>\w+),.*?(?:oom_memcg=(?P<oom_memcg>[^,]*),)?"
    r"task_memcg=(?P<task_memcg>[^,]*),task=(?P<task>[^,]*),pid=(?P<pid>\d+)")
RE_OOM_KILLED = re.compile(
    r"(?P<kind>Memory cgroup out of memory|Out of memory): Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)")
RE_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[^)]*)\): (?P<code>\d+)(?P<rest>.*)")
RE_XID_PID = re.compile(r"pid=(?P<pid>\d+|'<unknown>'|<unknown>)")
RE_XID_NAME = re.compile(r"name=(?P<name>[^,]*)")
RE_XID_CAUSED_BY = re.compile(r"caused by previous Xid (?P<code>\d+)")
RE_XID_154 = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<code>[0-9a-fA-F]+)"
                        r"(?: \((?P<name>[^)]*)\))?")
RE_MAIN_EXIT = re.compile(r"(?:Main|main|Control|control) process exited, code=(?P<code>\w+), "
                          r"status=(?P<status>\d+)(?:/(?P<name>\w+))?")
RE_RESULT = re.compile(r"Failed with result '(?P<result>[\w-]+)'")
RE_START_LIMIT = re.compile(r"Start request repeated too quickly")
RE_START_TIMEOUT = re.compile(r"\b(?P<op>start|start-pre|start-post) operation timed out\. Terminating", re.IGNORECASE)
RE_EXEC_STEP = re.compile(r"Failed at step (?P<step>[A-Z_]+) spawning (?P<path>\S+?):? (?P<error>.+)$")
# An exception line: a class named *Error/*Exception/*Exit/*Interrupt/*Warning, or any class with its
# module path (`filelock.Timeout: ...`, `triton.runtime.errors.OutOfResources: ...`): many libraries'
# exceptions end in neither; the module path keeps other `word: text` lines (`NVRM: ...`) out.
_EXC_NAME = (r"(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt{})"
             r"|(?:[a-z_]\w*\.)+[A-Z]\w*(?=:))")
RE_EXCEPTION = re.compile(r"^(?P<name>" + _EXC_NAME.format("|Warning") + r")(?::\s?(?P<text>.*))?$")
RE_EXCEPTION_ANY = re.compile(r"(?:^|\s)(?P<name>" + _EXC_NAME.format("") + r")(?::\s?(?P<text>.*))?$")
RE_TORCH_SHORT_WRITE = re.compile(r"inline_container\.cc.*unexpected pos|PytorchStreamWriter failed writing|file write failed")
# Prefixes launchers put before each line of a rank's output: torchrun (`[rank3]: `,
# `[default0]:`), srun --label (`10: `), some wrappers (`[80746] `).
RE_LINE_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s?|\d{1,4}: |\[\d+\] )+")
# A line that starts a new log record, never the continuation of an exception's message.
RE_LOG_RECORD = re.compile(
    r"^(?:\[?\d{4}-\d\d-\d\d[ T]\d|\[[EWIF]\d{4} |\[?[EWIF]\d{4} \d\d:|\[rank\d+\]:\[|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG)[: ]|wandb:|" + re.escape(messages.PROGRAM) + r":"
    r"|Exception raised from |frame #\d+|Traceback \(most recent call last\)"
    r"|During handling of the above exception|The above exception was the direct cause)")
NEARLY_FULL_BYTES = 64 * 2**20
NEARLY_FULL_FRACTION = 0.01

# --- host, driver and toolchain findings: (kind, pattern, action, what it means). Kinds are
# verdicts. Read in the kernel log (NVRM), in nvidia-smi's output (gpu evidence) and in the
# trainer's output; they come before a config error or a crash that is only their symptom.
RE_API_MISMATCH = re.compile(
    r"API mismatch: the client(?: '(?P<client>[^']*)' \(pid (?P<pid>\d+)\))?(?:\s|#012)+(?:NVRM:\s*)?has the version "
    r"(?P<client_version>\d+(?:\.\d+)*), but(?:\s|#012)+(?:NVRM:\s*)?this kernel module has(?:\s|#012)+(?:NVRM:\s*)?"
    r"the version (?P<module_version>\d+(?:\.\d+)*)")
HOST_SIGNATURES = (
    ("driver-mismatch", re.compile(r"Driver/library version mismatch|driver/library version mismatch"), "fix-driver",
     "the loaded NVIDIA kernel module and the user-space libraries differ (an upgrade without a reboot): "
     "reboot, or reload the driver"),
    ("driver-mismatch", re.compile(r"Error 803|system has unsupported display driver / cuda driver combination"),
     "fix-driver", "CUDA found a user-space driver that does not match the kernel module: reboot or reload the driver"),
    ("driver-too-old", re.compile(r"CUDA driver version is insufficient for CUDA runtime version"), "fix-driver",
     "the NVIDIA driver is older than the CUDA runtime torch ships: upgrade the driver (or pin an older torch)"),
    ("driver-too-old", re.compile(r"The NVIDIA driver on your system is too old \(found version \d+\)"), "fix-driver",
     "the NVIDIA driver is older than this torch build needs: upgrade the driver (or pin an older torch)"),
    ("driver-too-old", re.compile(r"provided PTX was compiled with an unsupported toolchain|CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
     "fix-driver", "PTX from a newer toolkit than the driver supports: upgrade the driver"),
    ("driver-too-old", re.compile(r"Error 804|forward compatibility was attempted on non supported HW"), "fix-driver",
     "CUDA forward compatibility needs a data-centre GPU: install a driver new enough for the runtime"),
    ("gpu-unavailable", re.compile(r"Error 802|system not yet initialized"), "fix-driver",
     "CUDA is not ready on an NVSwitch system: start nvidia-fabricmanager (matching the driver version)"),
    ("gpu-unavailable", re.compile(r"couldn't communicate with the NVIDIA driver|Found no NVIDIA driver on your system"
                                   r"|NVRM: No NVIDIA graphics adapter probed|probe routine was not called"
                                   r"|RmInitAdapter failed|rm_init_adapter failed"), "fix-driver",
     "the NVIDIA kernel module is not loaded or did not initialise the GPU"),
    ("gpu-unavailable", re.compile(r"Failed to initialize NVML: Unknown Error|No devices were found"), "fix-driver",
     "NVML cannot see the GPUs (module, device nodes or the GPUs themselves)"),
    # cuInit's CUDA_ERROR_UNKNOWN: the host's driver state (nvidia_uvm not loaded, a driver upgraded
    # without a reboot, after a suspend), not the run's CUDA_VISIBLE_DEVICES whatever torch's text suggests
    ("gpu-unavailable", re.compile(r"CUDA unknown error - this may be due to an incorrectly set up environment"),
     "fix-driver", "CUDA could not initialise the GPUs on this host (cuInit: unknown error; usually nvidia_uvm not "
     "loaded or a driver upgraded without a reboot): reload the driver or reboot; not the run's configuration"),
    ("gpu-unavailable", re.compile(r"CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are "
                                   r"busy or unavailable|cudaErrorDevicesUnavailable"), "reset-gpu",
     "the GPU is held by another process (compute mode Exclusive_Process: `nvidia-smi -q -d COMPUTE`) or stuck: "
     "stop that process, or reset the GPU"),
    ("gpu-unavailable", re.compile(r"GPU requires reset|NVML_ERROR_RESET_REQUIRED"), "reset-gpu",
     "NVML says the GPU must be reset before it can be used again"),
    ("gpu-unavailable", re.compile(r"GPU is lost|Unable to determine the device handle for GPU ?[0-9A-Fa-f:.]*: Unknown Error"
                                   r"|NVML_ERROR_GPU_IS_LOST"), "reboot-node",
     "NVML has lost the GPU (it fell off the bus or hung): reboot the node, reseat or RMA the GPU if it repeats"),
    ("toolchain-error", re.compile(r"Failed to find C compiler"), "fix-toolchain",
     "Triton found no C compiler: install gcc (build_toolchain role)"),
    ("toolchain-error", re.compile(r"Python\.h: No such file or directory|include file 'Python\.h' not found"),
     "fix-toolchain", "Triton cannot build its launcher: install the Python headers for the venv's interpreter (python3-dev)"),
    ("toolchain-error", re.compile(r"ptxas fatal\s*: Value '[^']+' is not defined for option 'gpu-name'"), "fix-toolchain",
     "ptxas does not know this GPU: the CUDA toolkit is too old for the architecture"),
    ("toolchain-error", re.compile(r"cannot find -lcuda"), "fix-toolchain",
     "Triton cannot link libcuda.so: the driver's libcuda.so link is missing from the linker path"),
    # EROFS/EIO: the filesystem failed (or is read-only to the unit: ReadOnlyPaths=, ProtectSystem=)
    ("filesystem-error", re.compile(r"Read-only file system|\[Errno 30\]|\[Errno 5\] Input/output error"),
     "check-filesystem", "a write failed on a read-only or failing filesystem (EROFS/EIO): the kernel remounts a "
     "filesystem read-only after I/O errors; or the path is read-only to the unit (ReadOnlyPaths=, ProtectSystem=)"),
)

# Kernel lines that explain a death without naming the GPU driver: a filesystem that failed under
# the run, a GPU's PCIe link that failed (AER). Read in every kernel line of the window.
KERNEL_SIGNATURES = (
    ("filesystem-error", re.compile(
        r"Remounting filesystem read-only|Aborting journal on device|Detected aborted journal|EXT4-fs error"
        r"|XFS \(\S+\): .*(?:Shutting down filesystem|shut down due to|log I/O error|xfs_log_force: error)"
        r"|Buffer I/O error on dev|blk_update_request: I/O error|I/O error, dev \w+, sector"), "check-filesystem",
     "the kernel reports the filesystem failing under the run (I/O errors; journal aborted or remounted read-only)"),
    ("gpu-unavailable", re.compile(r"nvidia [0-9a-fA-F:.]+: AER: |AER: .*Uncorrect\w* \(Fatal\)"
                                   r"|PCIe Bus Error: severity=Uncorrect\w* \(Fatal\)"), "reboot-node",
     "the PCIe link failed (AER: uncorrectable error, recovery failed): the GPU is gone until the node is "
     "rebooted; reseat or RMA the GPU if it repeats"),
)

# Signatures in a crash's output that name a next step and an action.
HINTS = (
    (re.compile(r"no kernel image is available for execution on the device"),
     "the installed torch/kernels were not built for this GPU architecture", "fix-venv"),
    (re.compile(r"is not compatible with the current PyTorch installation"),
     "this torch build does not support the GPU architecture: install a torch built for it", "fix-venv"),
    (re.compile(r"validation error for Settings|Extra inputs are not permitted"),
     "wandb rejected its settings: the wandb/pydantic versions drifted from the lock; re-sync the venv (provision) ",
     "fix-venv"),
    (re.compile(r"undefined symbol: |cannot open shared object file"),
     "a compiled extension does not match the installed torch/CUDA libraries: re-sync the venv from the lock "
     "(provision) and rebuild the extension", "fix-venv"),
    (re.compile(r"ModuleNotFoundError|ImportError: cannot import name|No module named "),
     "a package is missing or drifted: re-sync the venv from the lock (provision) and compare `venv` drift in "
     "evidence.json", "fix-venv"),
    (re.compile(r"uncorrectable ECC error encountered|CUDA_ERROR_ECC_UNCORRECTABLE"),
     "the GPU hit an uncorrectable memory error (hardware): drain and reset the GPU; look for Xid 48/94/95 in the "
     "kernel log", "reset-gpu"),
    (re.compile(r"illegal memory access|device-side assert triggered|Assertion `.*` failed"),
     "a kernel faulted on the GPU (application bug, e.g. an index out of range): re-run with "
     "CUDA_LAUNCH_BLOCKING=1 to find the op", "investigate"),
    (re.compile(r"SafetensorError|HeaderTooLarge|PytorchStreamReader failed|failed finding central directory"
                r"|Parquet magic bytes not found"),
     "a model or checkpoint file is corrupt or truncated (or a Git LFS pointer): stage it again", "restage"),
    (RE_TORCH_SHORT_WRITE, "a checkpoint write came up short: check free space and the health of the output filesystem",
     "free-disk"),
    (messages.TARGET_SERVER_RE,
     "the run's vLLM target server (named in the line) died, is unreachable or answered wrongly: read its unit's "
     f"journal (journalctl -u '{layout.VLLM_UNIT_TEMPLATE.replace('@', '@RUN-*')}')", "check-target-server"),
    (re.compile(r"No space left on device|\[Errno 28\]"),
     "free space on the output filesystem (or lower keep-last checkpoints), then restart; the unit resumes from the "
     "newest complete checkpoint", "free-disk"),
    # What common library errors mean for a run: resource exhaustion in disguise, the unit's limits,
    # the network at start-up, a launcher's usage error.
    (re.compile(r"Cannot allocate memory|\[Errno 12\]|DefaultCPUAllocator: can't allocate|is killed by signal: "
                r"Killed|exitcode\s*: -9\b|\(exitcode: -9\)|return code = -9\b|Signal 9 \(SIGKILL\)"),
     "host memory ran out: a process of the run was refused memory or SIGKILLed (the kernel's OOM killer kills "
     "DataLoader workers and ranks this way; its line may be gone from the kernel log): lower DataLoader workers, "
     "prefetch or batch, or raise MemoryMax", "fix-config"),
    (re.compile(r"can't start new thread|Thread creation failed|fork rejected by pids controller"),
     "the unit's task limit is reached (TasksMax=, the cgroup's pids.max; `systemctl show -p TasksMax,TasksCurrent "
     "UNIT`) or ulimit -u: raise TasksMax for the run's unit, or lower DataLoader workers and thread counts",
     "fix-config"),
    (re.compile(r"Too many open files|\[Errno 24\]|received 0 items of ancdata"),
     "the open-file limit is reached (LimitNOFILE= of the unit, ulimit -n; torch's file_descriptor sharing of "
     "DataLoader tensors uses one per tensor): raise LimitNOFILE, or lower DataLoader workers", "fix-config"),
    (re.compile(r"Address already in use|errno: 98\b"),
     "the rendezvous port is taken (another run or a leftover process on this host): give each run its own master "
     "port, or stop the other process", "fix-config"),
    (re.compile(r": error: (?:unrecognized arguments|the following arguments are required|argument )"),
     "the program refused its command line (argparse): fix the arguments the unit passes", "fix-config"),
    (re.compile(r"couldn't connect to 'https?://|LocalEntryNotFoundError|Couldn't reach |Max retries exceeded with url"
                r"|Run initialization has timed out|wandb: Network error|client socket has timed out"
                r"|failed to connect to|Temporary failure in name resolution|Name or service not known"),
     "a server the run needs at start-up could not be reached (the Hugging Face hub, wandb, the rendezvous "
     "master): check the host's network, proxy and DNS; stage models locally (HF_HUB_OFFLINE=1) and log wandb "
     "offline where the host has no way out", "check-network"),
)

# /dev/shm running out: the DataLoader's workers or NCCL's shared-memory transport.
# GPU memory exhausted, in torch's words and in its libraries': cuBLAS and cuDNN fail to create
# their handle (ALLOC_FAILED, NOT_INITIALIZED) when the GPU has no memory left for it.
RE_CUDA_OOM = re.compile(r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|Cuda failure '?out of memory"
                         r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_NOT_INITIALIZED|CUDA error: out of memory")

RE_SHM_FULL = re.compile(r"out of shared memory|Error while creating shared memory segment|"
                         r"unable to (?:write to|open) (?:shared memory|file </torch_\d+)|posix_fallocate failed")

# NCCL: the error line, its code and the `Last error:` that names the cause.
RE_NCCL_ERROR = re.compile(r"NCCL error(?: in: |: )|\b(?P<code>nccl(?:SystemError|UnhandledCudaError|InternalError|"
                           r"InvalidUsage|InvalidArgument|RemoteError))\b")
NCCL_LAST_ERROR_ACTIONS = (
    (re.compile(r"Cuda failure '?out of memory|Cuda failure 2 "), "cuda-oom"),
    (RE_SHM_FULL, "disk-full"),
    (re.compile(r"socket|Connect to|Connection (?:refused|reset|closed)|No route to host|NET/IB|NET/Socket|ibv_|"
                r"Got completion|connection abort|Network is unreachable|timed out", re.IGNORECASE), "check-network"),
)

# Native crashes: C++ terminate, glibc aborts, Python's fatal errors, systemd-coredump's report.
RE_TERMINATE = re.compile(r"terminate called (?:after throwing an instance of '(?P<type>[^']+)'|(?P<other>without an "
                          r"active exception|recursively))")
RE_WHAT = re.compile(r"^\s*what\(\):\s*(?P<what>.*)$")
RE_GLIBC = re.compile(
    r"(?:\*\*\* Error in `(?P<prog>[^']*)': )?(?P<msg>(?:free|malloc|realloc|calloc|munmap_chunk|malloc_consolidate|"
    r"_int_free|_int_malloc|tcache_thread_shutdown)\(\): [^*\n]*?|double free or corruption \([^)]*\)|corrupted size "
    r"vs\. prev_size[^*\n]*?|corrupted double-linked list[^*\n]*?)(?:: 0x[0-9a-f]+)?(?: \*\*\*)?\s*$")
RE_SMASHING = re.compile(r"\*\*\* (?P<msg>(?:stack smashing|buffer overflow) detected) \*\*\*")
RE_FATAL = re.compile(r"^(?:Fatal glibc error: (?P<glibc>.+)|Fatal Python error: (?P<python>.+))$")
RE_COREDUMP = re.compile(r"Process (?P<pid>\d+) \((?P<comm>[^)]*)\) of user \d+ dumped core")
RE_STACK_LIB = re.compile(r"#\d+\s+0x[0-9a-f]+ (?:\S+ )?\((?P<lib>[^ )+]+)")
RE_BACKTRACE_LIB = re.compile(r"^(?P<lib>/\S+?\.so[\w.]*)\((?:[^)]*)\)\[0x[0-9a-f]+\]")
RE_FRAME_LIB = re.compile(r"^frame #\d+: .* \(0x[0-9a-f]+ in (?P<lib>\S+)\)$")
# Kernel lines of a user-space crash: `comm[pid]: segfault at ADDR ip IP sp SP error N in lib[..]`,
# `traps: comm[pid] trap invalid opcode ip:.. sp:.. error:0 in lib[..]`.
RE_SEGFAULT = re.compile(r"(?P<comm>[^\s\[]+)\[(?P<pid>\d+)\]: segfault at (?P<addr>\S+) ip \S+ sp \S+ error (?P<err>\d+)"
                         r"(?: in (?P<lib>[^\[\s]+)\[)?")
RE_TRAP = re.compile(r"traps: (?P<comm>[^\s\[]+)\[(?P<pid>\d+)\] (?P<what>trap [a-z ]+?|general protection(?: fault)?|"
                     r"divide error)(?= ip:| in |$)(?:.*? in (?P<lib>[^\[\s]+)\[)?")
# A launcher's line for a rank that died of a signal (torchrun, deepspeed): a crash signal is a native crash.
RE_CHILD_SIGNAL = re.compile(r"(?:exits with return code = |exitcode\s*: |\(exitcode: )-(?P<sig>\d+)\b")
RE_DRIVER_LIB = re.compile(r"^lib(?:cuda|nvidia-|nvcuda|nvoptix)|^nvidia", re.IGNORECASE)
# Exceptions that say the GPU, its driver or a collective failed: a host finding explains them.
RE_GPUISH = re.compile(r"CUDA|cuda|NVML|nvml|NCCL|nccl|GPU|[Dd]river|libcuda|device", re.IGNORECASE)

NEXT_STEPS = {
    "running": "nothing to do; `collect.yml -e run=RUN` brings metrics home",
    "completed": "collect the run: `ansible-playbook collect.yml -e run=RUN`",
    "not-started": "launch it: `ansible-playbook train.yml -e run=RUN`",
    "stopped": "stopped through systemd; start again with train.yml to resume from the newest checkpoint",
    "host-oom-kill": "the machine ran out of RAM: lower host memory use (fewer target replicas per host, smaller prefetch, model in /dev/shm counts as RAM) or add memory",
    "cgroup-oom-kill": "the run exceeded its memory limit: raise MemoryMax for the run (or the container's limit), or lower batch/prefetch",
    "cuda-oom": "GPU memory exhausted: lower --token-budget / --max-batch-size / --max-seq-len, or move the drafter to a GPU with more free memory",
    "nccl-timeout": "a collective timed out: look for a rank that died or hung first (diagnose every host), check the network/NVLink, then restart",
    "nccl-error": "NCCL failed (its `Last error:` is in the reason): fix what it names, then restart",
    "watchdog-hang": "the trainer stopped sending WATCHDOG=1: look at the last journal lines for where it hung (data loading, a collective); restart resumes from the newest checkpoint",
    "disk-full": "free space on the output filesystem, then restart; the unit resumes from the newest complete checkpoint",
    "killed-by-signal": "something outside the run killed it: check who (operators, other automation, the OOM killer if the kernel log was unreadable); restart with train.yml",
    "crash": "fix the exception shown; the unit restarts on failure and resumes from the newest complete checkpoint",
    "native-crash": "a native library crashed the process (named in the reason): see the action; a core dump (coredumpctl) shows the stack",
    "peer-failure": "another node of the run failed first (named in the reason): diagnose that host; this one restarts with the run and resumes from the newest checkpoint",
    "init-crash": "fix the cause shown and launch again with train.yml",
    "start-limit-hit": "the unit hit its start limit and will not restart by itself: fix the cause (in the reason), then `systemctl reset-failed UNIT` and start it (train.yml does both)",
    "start-timeout": "READY=1 never came within TimeoutStartSec: raise the run's resources.start_timeout_s if loading is only slow, or find where it hung (last output), then train.yml",
    "exec-failed": "systemd could not start the trainer at all (the step is in the reason): fix it (provision / train.yml), then start again",
    "unknown": "read evidence.json (journal, unit properties, kernel log) by hand",
    "server-oom": "the vLLM server ran out of memory loading the target or profiling: give it more GPUs (tensor "
                  "parallel), a lower --gpu-memory-utilization where another process shares the GPU, or free the "
                  "GPU; then train.yml",
    "server-kv-cache": "the vLLM server's KV cache cannot hold one sequence of --max-model-len: raise "
                       "--gpu-memory-utilization (VLLM_CPU_KVCACHE_SPACE on CPU), lower the run's --max-model-len, "
                       "or add GPUs (tensor parallel); then train.yml",
    "server-nccl": "NCCL failed between the vLLM server's tensor-parallel workers (the line is in the reason): "
                   "check the GPUs' peer links, /dev/shm and NCCL's environment, then train.yml",
    "server-not-ready": "the vLLM server never became ready (its last error is in the reason): fix it, or raise "
                        "vllm_server_start_timeout_s if the load is only slow; then train.yml",
    "server-died": "the vLLM server died after it served (the reason says how): it restarts by itself and the "
                   "trainer resumes from its newest checkpoint once the server answers; if it repeats, read its "
                   "journal (journalctl -u SERVER)",
}


# ---------------------------------------------------------------------------------------------
# small readers


def message(entry: dict) -> str:
    """MESSAGE of a journal JSON entry: a string, a byte array (not valid UTF-8) or a list of values."""
    value = entry.get("MESSAGE")
    if value is None:
        return ""
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return bytes(v & 0xFF for v in value).decode("utf-8", errors="replace")
        return "\n".join(message({"MESSAGE": v}) for v in value)
    return str(value)


def field(entry: dict, name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return bytes(value).decode("utf-8", errors="replace")
        return str(value[-1]) if value else None
    return str(value)


def realtime(entry: dict) -> float | None:
    value = field(entry, "__REALTIME_TIMESTAMP")
    try:
        return int(value) / 1e6 if value is not None else None
    except ValueError:
        return None


def parse_systemd_time(value: str | None) -> float | None:
    """A systemctl show timestamp: `Thu 2023-11-30 18:10:01.123456 UTC` (--timestamp=us+utc), `@1701367801`
    (--timestamp=unix) or `Thu 2023-11-30 18:10:01 UTC`."""
    if not value or value in ("n/a", "0"):
        return None
    value = value.strip()
    if value.startswith("@"):
        try:
            return float(value[1:])
        except ValueError:
            return None
    for fmt in ("%a %Y-%m-%d %H:%M:%S %Z", "%a %Y-%m-%d %H:%M:%S.%f %Z"):
        try:
            parsed = datetime.strptime(value, fmt)
        except ValueError:
            continue
        return parsed.replace(tzinfo=UTC).timestamp()
    return None


def status_time(value) -> float | None:
    """A time from status.json: unix seconds (number or numeric string) or ISO 8601 (`...Z`)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    number = as_float(text)
    if number is not None:
        return number
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "?"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_float(value, default=None):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def as_int(value, default=None):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------
# the journal, cut into invocations


class Invocation:
    def __init__(self, ident: str | None):
        self.id = ident
        self.entries: list[dict] = []
        self.exit_code: str | None = None     # exited | killed | dumped
        self.exit_status: int | None = None
        self.exit_name: str | None = None     # status=203/EXEC -> EXEC
        self.result: str | None = None        # success | exit-code | signal | core-dump | oom-kill | watchdog | timeout ...
        self.results: list[str] = []          # every result systemd reported, in order (start-limit-hit comes last)
        self.exit_ts: float | None = None
        self.exit_line: str | None = None
        self.result_line: str | None = None
        self.started = False                  # "Started <unit>": READY=1 for Type=notify
        self.started_line: str | None = None
        self.start_failed = False
        self.stopping = False
        self.stopping_line: str | None = None
        self.watchdog_line: str | None = None
        self.oom_line: str | None = None
        self.start_limit_line: str | None = None
        self.start_limit_ts: float | None = None
        self.start_timeout_line: str | None = None
        self.restarts: int | None = None      # "restart counter is at N"

    @property
    def first_ts(self) -> float | None:
        for e in self.entries:
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    @property
    def last_ts(self) -> float | None:
        for e in reversed(self.entries):
            ts = realtime(e)
            if ts is not None:
                return ts
        return None

    def app_lines(self) -> list[tuple[float | None, str]]:
        """The trainer's own output (everything not from PID 1 about the unit)."""
        out = []
        for e in self.entries:
            if is_manager_entry(e):
                continue
            for line in message(e).splitlines() or [""]:
                out.append((realtime(e), line))
        return out


def is_manager_entry(entry: dict) -> bool:
    return field(entry, "_PID") == "1" or (entry.get("UNIT") is not None and entry.get("_SYSTEMD_UNIT") in (None, "init.scope"))


def split_invocations(entries: list[dict]) -> list[Invocation]:
    invocations: list[Invocation] = []
    by_id: dict[str, Invocation] = {}
    current: Invocation | None = None
    for entry in entries:
        ident = field(entry, "_SYSTEMD_INVOCATION_ID") or field(entry, "INVOCATION_ID")
        if ident:
            if ident not in by_id:
                by_id[ident] = Invocation(ident)
                invocations.append(by_id[ident])
            inv = by_id[ident]
            current = inv
        else:
            if current is None:
                current = Invocation(None)
                invocations.append(current)
            inv = current
        inv.entries.append(entry)
        if is_manager_entry(entry):
            _manager_event(inv, entry)
    return invocations


RE_RESTART_COUNTER = re.compile(r"restart counter is at (?P<n>\d+)")


def _manager_event(inv: Invocation, entry: dict) -> None:
    text = message(entry)
    mid = field(entry, "MESSAGE_ID")
    code = field(entry, "EXIT_CODE")
    m = RE_MAIN_EXIT.search(text)
    if code or m:
        inv.exit_code = code or m.group("code")
        status = field(entry, "EXIT_STATUS") or (m.group("status") if m else None)
        if status is not None and not status.isdigit():
            status = str(SIGNAL_NUMBERS.get(status.upper().removeprefix("SIG"), status))
        inv.exit_status = as_int(status)
        inv.exit_name = m.group("name") if m else None
        inv.exit_ts = realtime(entry)
        inv.exit_line = text
    result = field(entry, "UNIT_RESULT")
    m = RE_RESULT.search(text)
    if result or m:
        inv.result = result or m.group("result")
        inv.results.append(inv.result)
        inv.result_line = text
        inv.exit_ts = inv.exit_ts or realtime(entry)
    if mid == MID_STARTED or text.startswith("Started "):
        inv.started = True
        inv.started_line = text
    if mid == MID_FAILED or text.startswith("Failed to start "):
        inv.start_failed = True
    if mid == MID_STOPPING or text.startswith("Stopping "):
        inv.stopping = True
        inv.stopping_line = text
    if "Watchdog timeout" in text:
        inv.watchdog_line = text
    if "killed by the OOM killer" in text:
        inv.oom_line = text
    if RE_START_LIMIT.search(text):
        inv.start_limit_line = text
        inv.start_limit_ts = realtime(entry)
    if RE_START_TIMEOUT.search(text):
        inv.start_timeout_line = text
    m = RE_RESTART_COUNTER.search(text)
    if m:
        inv.restarts = int(m.group("n"))


# ---------------------------------------------------------------------------------------------
# the kernel log


def kernel_events(evidence: dict, start: float | None, end: float | None) -> tuple[list[dict], list[dict]]:
    """OOM kills and Xid lines of the kernel log inside [start, end] (bounds widened a little)."""
    scan = kernel_scan(evidence, start, end)
    return scan["ooms"], scan["xids"]


def kernel_scan(evidence: dict, start: float | None, end: float | None) -> dict:
    """Everything of interest in the kernel log inside [start, end] (bounds widened a little): OOM
    kills, every Xid (in order), the other host findings (`nvrm`: NVRM's API mismatch, an adapter that
    did not initialise; KERNEL_SIGNATURES: a failing filesystem, a PCIe AER failure) and user-space
    crash lines (segfault, trap) naming the faulting library."""
    kernel = evidence.get("kernel") or {}
    lo = start - KERNEL_BEFORE_START_S if start is not None else None
    hi = end + KERNEL_AFTER_EXIT_S if end is not None else None
    ooms: dict[str, dict] = {}
    xids: list[dict] = []
    faults: list[dict] = []
    texts: list[tuple[float | None, str]] = []
    for entry in kernel.get("entries") or []:
        ts = realtime(entry)
        if ts is not None and ((lo is not None and ts < lo) or (hi is not None and ts > hi)):
            continue
        text = message(entry)
        texts.append((ts, text))
        m = RE_OOM_KILL.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.update(constraint=m.group("constraint"), task_memcg=m.group("task_memcg"),
                       oom_memcg=m.group("oom_memcg"), comm=m.group("task"), ts=ts)
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_OOM_KILLED.search(text)
        if m:
            oom = ooms.setdefault(m.group("pid"), {"pid": m.group("pid"), "lines": []})
            oom.setdefault("ts", ts)
            oom.setdefault("comm", m.group("comm"))
            oom["memcg_kill"] = m.group("kind").startswith("Memory cgroup")
            oom["lines"].append(kline(ts, text))
            continue
        m = RE_XID.search(text)
        if m:
            xids.append(_xid(m, ts, text))
            continue
        m = RE_SEGFAULT.search(text) or RE_TRAP.search(text)
        if m:
            what = m.groupdict().get("what") or f"segfault at {m.group('addr')}"
            faults.append({"comm": m.group("comm"), "pid": m.group("pid"), "lib": m.group("lib"), "what": what.strip(),
                           "ts": ts, "line": kline(ts, text)})
    # NVRM findings: one printk can span lines (`NVRM: ...` continuations, or `#012` in syslog).
    nvrm = []
    joined = "\n".join(text for _, text in texts)
    m = RE_API_MISMATCH.search(joined)
    if m:
        ts = next((t for t, text in texts if "API mismatch" in text), None)
        nvrm.append({"kind": "driver-mismatch", "action": "fix-driver", "ts": ts, "source": "kernel",
                     "text": re.sub(r"\s*(?:\n|#012)\s*", " ", m.group(0)),
                     "line": kline(ts, "NVRM: " + re.sub(r"\s*(?:\n|#012)\s*", " ", m.group(0))),
                     "what": f"NVRM: API mismatch: the client{' ' + repr(m.group('client')) if m.group('client') else ''} "
                             f"has {m.group('client_version')}, the kernel module {m.group('module_version')}: "
                             f"reboot (or reload the nvidia modules) so that module and libraries match"})
    for ts, text in texts:
        nvidia = "NVRM" in text or "nvidia" in text.lower()
        for kind, rx, action, what in (HOST_SIGNATURES if nvidia else ()) + KERNEL_SIGNATURES:
            if kind != "driver-mismatch" and rx.search(text):
                nvrm.append({"kind": kind, "action": action, "ts": ts, "line": kline(ts, text), "what": what,
                             "source": "kernel", "text": text.strip()})
                break
    return {"ooms": list(ooms.values()), "xids": xids, "nvrm": nvrm, "faults": faults}


def _xid(m: re.Match, ts: float | None, text: str) -> dict:
    rest = m.group("rest")
    pid = RE_XID_PID.search(rest)
    name = RE_XID_NAME.search(rest)
    code = int(m.group("code"))
    kind, bucket, action, mnemonic = XID_CATALOG.get(code, ("unknown", None, "investigate", None))
    x = {"code": code, "pci": m.group("pci"), "ts": ts,
         "pid": pid.group("pid") if pid and pid.group("pid").isdigit() else None,
         "name": name.group("name").strip() if name else None, "kind": kind, "bucket": bucket,
         "action": action, "mnemonic": mnemonic, "hardware": kind in ("hardware", "recovery"),
         "application": kind == "application", "line": kline(ts, text)}
    if code == 154:
        r = RE_XID_154.search(rest)
        if r:
            x["action"] = RECOVERY_ACTIONS.get(int(r.group("code"), 16), "reset-gpu")
            x["recovery"] = r.group("name") or f"0x{r.group('code')}"
    caused = RE_XID_CAUSED_BY.search(rest)
    if caused:  # e.g. `45, ... caused by previous Xid 149`: a follow-on naming its root
        x["caused_by"] = int(caused.group("code"))
    return x


def kline(ts: float | None, text: str) -> str:
    return f"kernel {fmt_time(ts)}: {text.strip()}"


def jline(ts: float | None, text: str) -> str:
    return f"journal {fmt_time(ts)}: {text.strip()}"


def host_memcg(evidence: dict) -> str | None:
    """The memory cgroup this host (a container, say) lives in, from PID 1's /proc/1/cgroup; None
    when that is the root (a real host) or unknown: then nothing can be excluded by it."""
    own = (evidence.get("cgroup") or {}).get("own") or []
    path = None
    for line in own:
        parts = str(line).split(":", 2)
        if len(parts) == 3 and ("memory" in parts[1].split(",") or (parts[0] == "0" and parts[1] == "" and path is None)):
            path = parts[2]
            if "memory" in parts[1].split(","):
                break
    if path is None:
        return None
    path = path.removesuffix("/init.scope").rstrip("/")
    return path or None


def memcg_in_host(memcg: str | None, host_cg: str | None) -> bool:
    """False when the kernel line's cgroup is provably another container's (a shared kernel)."""
    if not memcg or not host_cg:
        return True
    return memcg == host_cg or memcg.startswith(host_cg + "/")


def memcg_names_other_unit(memcg: str | None, unit_names: set[str]) -> bool:
    if not memcg:
        return False
    leaf = memcg.rstrip("/").rsplit("/", 1)[-1]
    return leaf.endswith((".service", ".scope")) and not any(u in memcg for u in unit_names)


# ---------------------------------------------------------------------------------------------
# the other evidence: nvidia-smi, and what the trainer's own output says


def gpu_findings(evidence: dict) -> list[dict]:
    """NVML trouble in the gpu evidence (nvidia-smi's error text, fields such as `[GPU requires
    reset]`, a recovery action other than None where evidence.py records one). Current state, at
    diagnose time."""
    gpu = evidence.get("gpu") or {}
    if not gpu.get("present"):
        return []
    texts = []
    if gpu.get("error"):
        texts.append(str(gpu["error"]))
    if gpu.get("csv"):
        texts.extend(line for line in str(gpu["csv"]).splitlines() if "[" in line)
    for row in gpu.get("gpus") or []:
        for key, value in (row or {}).items():
            if isinstance(value, str) and value.startswith("[") and value not in ("[N/A]", "[Not Supported]"):
                texts.append(f"GPU {row.get('index', '?')} {key}: {value}")
        action = str((row or {}).get("recovery_action") or "")
        if action and action.lower() not in ("none", "n/a", "[n/a]", "0", "0x0"):
            texts.append(f"GPU {row.get('index', '?')} GPU Recovery Action: {action}")
    out = []
    for text in texts:
        for line in text.splitlines():
            for kind, rx, action, what in HOST_SIGNATURES:
                if rx.search(line):
                    out.append({"kind": kind, "action": action, "line": f"nvidia-smi: {line.strip()}", "what": what,
                                "ts": None, "source": "nvidia-smi", "text": line.strip()})
                    break
            else:
                m = re.search(r"GPU Recovery Action: (?P<a>.+)", line)
                if m:
                    a = m.group("a").lower()
                    act = "reboot-node" if "reboot" in a else "reset-gpu"
                    out.append({"kind": "gpu-unavailable", "action": act, "line": f"nvidia-smi: {line.strip()}",
                                "what": f"NVML reports a pending recovery action ({m.group('a')})", "ts": None,
                                "source": "nvidia-smi", "text": line.strip()})
    return out


def strip_prefix(line: str) -> str:
    """A rank's line without its launcher prefix (`[rank3]: `, `10: `)."""
    return RE_LINE_PREFIX.sub("", line)


def app_signatures(app) -> list[dict]:
    """Host, driver and toolchain signatures in the trainer's output, in order."""
    out = []
    for ts, line in app:
        body = strip_prefix(line).strip()
        if body.startswith(("raise ", "File ", "warnings.warn(")):  # a traceback's source lines, not its message
            continue
        for kind, rx, action, what in HOST_SIGNATURES:
            if rx.search(line):
                out.append({"kind": kind, "action": action, "line": jline(ts, line), "what": what, "ts": ts,
                            "source": "trainer", "text": body})
                break
    return out


def exception_block(app) -> dict | None:
    """The final exception of the last traceback (or the last exception-looking line), kept whole:
    its continuation lines (a pydantic error's fields, NCCL's `Last error:` and the cause after it)."""
    n = len(app)
    last_tb = None
    for i, (_, line) in enumerate(app):
        if "Traceback (most recent call last)" in line:
            last_tb = i
    found = None
    if last_tb is not None:
        for i in range(last_tb + 1, n):
            body = strip_prefix(app[i][1])
            if not body.strip() or body[:1].isspace():
                continue
            if RE_EXCEPTION.match(body.strip()):
                found = (i, body.strip())
                break
        if found is None:  # lines with an unknown prefix (timestamps, host names)
            for i in range(last_tb + 1, n):
                m = RE_EXCEPTION_ANY.search(app[i][1].strip())
                if m and not app[i][1].lstrip().startswith(("File ", "raise ", "except ")):
                    found = (i, app[i][1].strip()[m.start("name"):])
                    break
    else:
        for i, (_, line) in enumerate(app):
            body = strip_prefix(line).strip()
            m = RE_EXCEPTION.match(body)
            if m and m.group("text") is not None:
                found = (i, body)
    if found is None:
        return None
    i, head = found
    ts0 = app[i][0]
    cont = []
    for j in range(i + 1, min(n, i + 10)):
        ts, raw = app[j]
        body = strip_prefix(raw)
        if not body.strip() or RE_LOG_RECORD.match(body.strip()) or RE_TERMINATE.search(body):
            break
        if ts is not None and ts0 is not None and ts - ts0 > 2.0:
            break
        cont.append((j, body.rstrip()))
        if sum(len(c) for _, c in cont) > 800:
            break
    name = RE_EXCEPTION.match(head)
    lines = ([jline(app[last_tb][0], app[last_tb][1])] if last_tb is not None else []) + [jline(ts0, app[i][1])]
    lines += [jline(app[j][0], app[j][1]) for j, _ in cont]
    text = " / ".join([head] + [c.strip() for _, c in cont if c.strip()])
    return {"head": head, "name": name.group("name") if name else head.split(":", 1)[0], "index": i, "ts": ts0,
            "text": text, "lines": lines, "traceback": last_tb is not None}


def nccl_block(app) -> dict | None:
    """NCCL's error (DistBackendError, ncclSystemError...) with its `Last error:` text."""
    hit = None
    for i, (_, line) in enumerate(app):
        if RE_NCCL_ERROR.search(line):
            hit = i
            break
    if hit is None:
        return None
    block, last_error, code = [], None, None
    for j in range(hit, min(len(app), hit + 12)):
        ts, raw = app[j]
        body = strip_prefix(raw).strip()
        if j > hit and (not body or body.startswith(("Exception raised from", "frame #", "Traceback"))):
            break
        m = RE_NCCL_ERROR.search(body)
        if m and m.group("code"):
            code = code or m.group("code")
        block.append((ts, raw))
        if body.rstrip(":").strip().endswith("Last error"):
            nxt = strip_prefix(app[j + 1][1]).strip() if j + 1 < len(app) else ""
            last_error = nxt if nxt and not nxt.startswith(("Exception raised from", "frame #")) else ""
            if last_error:
                block.append(app[j + 1])
            break
    action = "investigate"
    for rx, act in NCCL_LAST_ERROR_ACTIONS:
        if last_error and rx.search(last_error):
            action = act
            break
    text = " / ".join(strip_prefix(raw).strip() for _, raw in block if strip_prefix(raw).strip())
    return {"index": hit, "ts": app[hit][0], "code": code, "last_error": last_error, "action": action,
            "text": text, "lines": [jline(ts, raw) for ts, raw in block]}


def native_crash(app, faults, facts, run_pids) -> dict | None:
    """A native crash: C++ terminate (with its what()), a glibc abort, stack smashing, Python's
    fatal error, systemd-coredump's report, or a kernel segfault/trap line of the run's process;
    with the library that faulted where the evidence names one."""
    found = None
    for i, (ts, raw) in enumerate(app):
        line = strip_prefix(raw)
        m = RE_TERMINATE.search(line)
        if m:
            msg = f"terminate called after throwing an instance of '{m.group('type')}'" if m.group("type") else \
                f"terminate called {m.group('other')}"
            what = []
            for j in range(i + 1, min(len(app), i + 4)):
                w = RE_WHAT.match(strip_prefix(app[j][1]))
                if w:
                    what.append(w.group("what").strip())
                    nxt = strip_prefix(app[j + 1][1]).strip() if j + 1 < len(app) else ""
                    if nxt and not RE_LOG_RECORD.match(nxt):
                        what.append(nxt)
                    break
            found = {"index": i, "ts": ts, "message": msg + (f": what(): {' / '.join(what)}" if what else ""),
                     "what": " ".join(what), "lines": [jline(ts, raw)] + [jline(*app[k]) for k in range(i + 1, min(len(app), i + 1 + len(what)))]}
            break
        m = RE_GLIBC.search(line.strip()) or RE_SMASHING.search(line)
        if m:
            found = {"index": i, "ts": ts, "message": f"glibc abort: {m.group('msg')}", "what": "", "lines": [jline(ts, raw)]}
            break
        m = RE_FATAL.match(line.strip())
        if m:
            found = {"index": i, "ts": ts, "message": f"Fatal {'glibc' if m.group('glibc') else 'Python'} error: "
                                                       f"{m.group('glibc') or m.group('python')}", "what": "",
                     "lines": [jline(ts, raw)]}
            break
        m = RE_COREDUMP.search(line)
        if m:
            found = {"index": i, "ts": ts, "message": f"process {m.group('pid')} ({m.group('comm')}) dumped core",
                     "what": "", "lines": [jline(ts, raw)]}
            break
        m = RE_CHILD_SIGNAL.search(line)
        if m and int(m.group("sig")) in CRASH_SIGNALS:
            sig = int(m.group("sig"))
            found = {"index": i, "ts": ts, "message": f"a rank died of signal {sig}/{SIGNAL_NAMES[sig]} (its launcher: "
                                                       f"{line.strip()[-160:]})", "what": "", "lines": [jline(ts, raw)]}
            break
    lib = None
    if found is not None:
        for ts, raw in app[found["index"]:found["index"] + 40]:
            line = strip_prefix(raw).strip()
            m = RE_BACKTRACE_LIB.match(line) or RE_STACK_LIB.search(line) or RE_FRAME_LIB.match(line)
            if m:
                name = m.group("lib").rsplit("/", 1)[-1]
                if not re.match(r"lib(?:c|pthread|stdc\+\+|gcc_s|c10)[.-]", name) and name != "python":
                    lib = lib or name
                    found["lines"].append(jline(ts, raw))
                    break
    # kernel: a segfault/trap of one of the run's processes, or at the unit's crash-signal exit
    fault = None
    for f in faults:
        tied = f["pid"] in run_pids or (
            facts.get("code") in ("killed", "dumped") and facts.get("status") in CRASH_SIGNALS
            and f.get("ts") is not None and facts.get("ts") is not None
            and -FAULT_TIME_TIE_S <= f["ts"] - facts["ts"] <= 2.0)
        if tied:
            fault = f
            break
    if fault is not None:
        kernel_lib = fault.get("lib")
        msg = f"{fault['comm']}[{fault['pid']}]: {fault['what']}" + (f" in {kernel_lib}" if kernel_lib else "")
        if found is None:
            found = {"index": len(app), "ts": fault["ts"], "message": msg, "what": "", "lines": [fault["line"]]}
        else:
            found["lines"].append(fault["line"])
            found["message"] += f"; kernel: {msg}"
        lib = kernel_lib or lib
        found["trap"] = "invalid opcode" in fault["what"]
    if found is None:
        return None
    found["lib"] = lib
    return found


# ---------------------------------------------------------------------------------------------
# the verdict


class Finding:
    """A candidate verdict with its proof, its sentence (next_step) and its action."""

    def __init__(self, verdict: str, reason: str, lines: list[str], next_step: str | None = None,
                 action: str | None = None, **extra):
        self.verdict = verdict
        self.reason = " / ".join(part.strip() for part in reason.splitlines() if part.strip())
        self.lines = lines
        key = "gpu-xid" if verdict.startswith("gpu-xid-") else verdict
        self.action = action or VERDICT_ACTIONS.get(key, "investigate")
        self.next_step = next_step or NEXT_STEPS.get(key) or ACTIONS.get(self.action)
        self.extra = extra

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "evidence": self.lines,
                "next_step": self.next_step, "action": self.action, **self.extra}


def classify(evidence: dict) -> dict:
    """The diagnosis of one host: verdict, one-line reason, proving lines, next step, action, facts."""
    run = evidence.get("run") or "?"
    unit = evidence.get("unit") or layout.unit_name(run)
    props = ((evidence.get("unit_props") or {}).get("properties")) or {}
    journal = evidence.get("journal") or {}
    status = ((evidence.get("status") or {}).get("data")) or {}
    kernel = evidence.get("kernel") or {}
    ckpt = evidence.get("checkpoints") or {}
    newest = (ckpt.get("newest") or {}).get("name")
    step = as_int(status.get("step"))
    if step is None:
        step = as_int(((evidence.get("metrics") or {}).get("last") or {}).get("step"))

    invocations = split_invocations(journal.get("entries") or [])
    warnings = []
    if not journal.get("readable", True):
        warnings.append(f"journal unreadable: {journal.get('error')}")
    if not kernel.get("readable", True):
        warnings.append(f"kernel log unreadable: {kernel.get('error')}")
    for d in (evidence.get("venv") or {}).get("drift") or []:
        warnings.append(f"venv drift: {d.get('name')} installed {d.get('installed')} but locked {d.get('locked')}")
    gpu = evidence.get("gpu") or {}
    if gpu.get("present") and gpu.get("readable") is False:
        warnings.append(f"nvidia-smi failed: {str(gpu.get('error') or '?').splitlines()[0][:200]}")

    finding = with_servers(_decide(evidence, run, unit, props, status, invocations, warnings), evidence, warnings)
    deaths = death_rows(evidence)
    if finding.verdict == "running" and not finding.extra.get("previous") and deaths:
        # The journal has moved on (rotated, or cut at its line cap): the death recorded at the time says it.
        last = deaths[-1]
        finding.extra["previous"] = {"verdict": last["verdict"], "reason": last["reason"], "evidence": [],
                                     "ended_at": last["ended_at"], "action": last["action"], "record": last["record"]}
        finding.reason += f"; last recorded death ({last['record']}): {last['verdict']} ({last['reason']})"
    out = {
        "schema": SCHEMA,
        "run": run,
        "host": evidence.get("host"),
        "unit": unit,
        **finding.as_dict(),
        "step": step,
        "newest_checkpoint": newest,
        "nrestarts": as_int(props.get("NRestarts"), 0),
        # When the unit's main process last ended (epoch seconds), for ordering failures across hosts.
        "ended_at": parse_systemd_time(props.get("ExecMainExitTimestamp")),
        "warnings": warnings,
        # Every death the host recorded at the moment it happened (deaths/, flashfleet.death), oldest first.
        "deaths": deaths,
        "classified_at": time.time(),
    }
    if out.get("next_step"):
        out["next_step"] = out["next_step"].replace("RUN", run).replace("UNIT", unit)
    return out


# ---------------------------------------------------------------------------------------------
# vLLM target servers (the run's flashfleet-vllm@<run>-<i> units, evidence["servers"])
#
# A run whose target runs in vLLM dies with TARGET_SERVER's line when a server goes; the server's
# own journal says why. Each dead server gets one of the server-* verdicts; the first to die
# becomes the host's verdict when the trainer names a server (or never started), otherwise each
# is a warning. Signatures are vLLM's own messages (vllm 0.32: v1/core/kv_cache_utils.py,
# v1/worker/utils.py), torch's and NCCL's, searched over the server's whole invocation (vLLM's
# API process repeats only "Engine core initialization failed. See root cause above").

SERVER_SIGNATURES = (  # (verdict, pattern, what it says, action where not the verdict's): the first match names it
    ("server-kv-cache", re.compile(
        r"No available memory for the cache blocks|KV cache is needed, which is larger than the available KV cache"
        r"|larger than the maximum number of tokens that can be stored in KV cache"
        r"|[Ii]nsufficient (?:memory for|space in) (?:the )?KV cache|Available KV cache memory: -"
        r"|less than requested memory for kv\b|in _check_enough_kv_cache_memory"),
     "the KV cache cannot hold one sequence of the server's max model length", None),
    ("server-oom", re.compile(
        r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory|cudaErrorMemoryAllocation"
        r"|DefaultCPUAllocator: (?:can't|not enough memory)|on startup is less than (?:desired GPU memory utilization"
        r"|the engine's budget)|MemoryError"),
     "out of memory while loading or profiling the target", None),
    ("server-nccl", re.compile(RE_NCCL_ERROR.pattern + r"|Watchdog caught collective operation timeout|NCCL WARN"),
     "NCCL failed between the server's tensor-parallel workers", None),
    ("server-not-ready", re.compile(r"Timed out waiting for engines? to"),
     "vLLM's API process gave up waiting for its engine to start (a slow load or warm-up)", "raise-timeout"),
)


def server_deaths(evidence: dict) -> list[Finding]:
    """One Finding per vLLM server unit of the run whose last invocation that ended failed (a
    server down now, or one that died and was restarted: extra `up_again`), the first to die first."""
    found = []
    for server in (evidence.get("servers") or {}).get("units") or []:
        finding = _server_death(evidence, server)
        if finding is not None:
            found.append(finding)
    return sorted(found, key=lambda f: f.extra.get("ended_at") or 0.0)


def _server_death(evidence: dict, server: dict) -> Finding | None:
    name = server.get("unit") or "?"
    props = ((server.get("unit_props") or {}).get("properties")) or {}
    invocations = split_invocations(((server.get("journal") or {}).get("entries")) or [])
    up = props.get("ActiveState") in ("active", "reloading") or (
        props.get("ActiveState") == "activating" and props.get("SubState") != "auto-restart")
    if up:  # serving (or starting) again: its last earlier invocation that failed, if any
        earlier = [i for i in invocations if i.id != props.get("InvocationID") and (i.exit_code or i.result)]
        failed = [i for i in earlier if _server_failed(i, i.result, i.exit_code, i.exit_status)]
        if not failed:
            return None
        inv, facts = failed[-1], _exit_facts({}, failed[-1], current=False)
    else:
        inv = _last_exit_invocation(invocations, props)
        facts = _exit_facts(props, inv, current=True)
        if not _server_failed(inv, facts["result"], facts["code"], facts["status"]):
            return None  # stopped, or never ran
    end = facts["ts"] or inv.last_ts
    app = inv.app_lines()
    base = [f"{name}: {_describe_exit(facts)}" + (f", Result={facts['result']}" if facts["result"] else "")
            + (" (running again since)" if up else "")]
    base += [jline(ts, line) for ts, line in (
        (inv.exit_ts, inv.exit_line), (inv.exit_ts, inv.result_line), (None, inv.start_timeout_line)) if line]

    def finding(verdict, reason, lines, action=None):
        return Finding(verdict, reason, lines, NEXT_STEPS[verdict].replace("SERVER", name), action,
                       server=name, ended_at=end, up_again=up)

    for verdict, rx, what, action in SERVER_SIGNATURES:
        hit = _grep(app, rx)
        if hit:
            return finding(verdict, f"{name}: {what}: {strip_prefix(hit[1]).strip()[:300]}",
                           [jline(*hit)] + base, action)
    start = inv.first_ts or (None if up else parse_systemd_time(props.get("ExecMainStartTimestamp")))
    pids = _run_pids({} if up else props, {}, inv)
    for oom in kernel_scan(evidence, start, end)["ooms"]:
        if oom["pid"] in pids or name in (oom.get("task_memcg") or ""):
            return finding("server-oom", f"{name}: the kernel killed the server for memory ({oom.get('comm')}, pid "
                           f"{oom['pid']})", oom["lines"] + base)
    if facts["result"] == "oom-kill":
        return finding("server-oom", f"{name}: systemd reports an OOM kill in the server's cgroup", base)
    text, lines = _last_exception(app)
    last = f": {text}" if text else ""
    if not inv.started:
        how = ("its start timed out (TimeoutStartSec) before the readiness probe's extraction answered"
               if inv.start_timeout_line else f"it ended ({_describe_exit(facts)}) before it became ready")
        return finding("server-not-ready", f"{name}: {how}{last}", lines + base,
                       "raise-timeout" if inv.start_timeout_line and not text else None)
    return finding("server-died", f"{name}: died after it became ready ({_describe_exit(facts)}){last}",
                   lines + base)


def _server_failed(inv: Invocation, result, code, status) -> bool:
    """The server's invocation ended on its own: a failure systemd reports, a start that timed out,
    or an exit 0 that no stop asked for (vLLM's API server exits 0 once its engine has died)."""
    if inv.start_timeout_line or inv.start_failed or result not in (None, "success"):
        return True
    return code == "exited" and status == 0 and not inv.stopping


def _names_a_server(reason: str, lines: list[str]) -> bool:
    """The trainer's death is a target server's: it printed TARGET_SERVER's line."""
    return any(messages.TARGET_SERVER in text for text in [reason, *lines])


def with_servers(finding: Finding, evidence: dict, warnings: list[str]) -> Finding:
    """The host's finding with the run's vLLM servers that died: the first to die is the verdict
    when the trainer's death names a server or the trainer never started (train.yml stops when a
    server is not ready); it explains the trainer's previous death when the trainer runs again
    after one that named a server; otherwise each is a warning."""
    dead = server_deaths(evidence)
    if not dead:
        return finding
    first = dead[0]
    if finding.verdict == "not-started" or (finding.verdict != "running"
                                            and _names_a_server(finding.reason, finding.lines)):
        others = [{"verdict": d.verdict, "reason": d.reason, "server": d.extra["server"]} for d in dead[1:]]
        return Finding(first.verdict, f"{first.reason}; the trainer: {finding.verdict} ({finding.reason})",
                       first.lines + finding.lines[-2:], action=first.action,
                       trainer={"verdict": finding.verdict, "reason": finding.reason, "action": finding.action},
                       servers=others, **first.extra)
    previous = finding.extra.get("previous")
    if previous and _names_a_server(previous["reason"], previous["evidence"]):
        finding.extra["previous"] = {**previous, "verdict": first.verdict, "reason": first.reason,
                                     "evidence": first.lines + previous["evidence"][-2:], "action": first.action,
                                     "server": first.extra["server"], "trainer": {k: previous[k] for k in ("verdict", "reason")}}
        finding.reason += f"; behind it: {first.verdict} ({first.reason})"
        return finding
    warnings.extend(f"vLLM server {'died (up again)' if d.extra['up_again'] else 'down'}: {d.verdict}: {d.reason}"
                    for d in dead)
    return finding


def death_rows(evidence: dict) -> list[dict]:
    """One row per death record in the evidence (deaths.records): the verdict made at the time."""
    rows = []
    for rec in (evidence.get("deaths") or {}).get("records") or []:
        v = rec.get("verdict") if isinstance(rec.get("verdict"), dict) else {}
        death = v.get("death") if isinstance(v.get("death"), dict) else {}
        rows.append({"record": rec.get("name"), "verdict": v.get("verdict") or "unreadable",
                     "reason": v.get("reason") or rec.get("error") or "", "action": v.get("action"),
                     "result": death.get("result"), "ended_at": v.get("ended_at"),
                     "recorded_at": death.get("recorded_at")})
    return rows


def _decide(evidence, run, unit, props, status, invocations, warnings) -> Finding:
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    load = props.get("LoadState", "")
    unit_props = evidence.get("unit_props") or {}
    journal_readable = (evidence.get("journal") or {}).get("readable", True)
    props_line = "systemctl: " + " ".join(
        f"{k}={props[k]}" for k in ("LoadState", "ActiveState", "SubState", "Result", "ExecMainCode",
                                    "ExecMainStatus", "NRestarts") if k in props)

    ever_ran = bool(invocations) or bool(status) or parse_systemd_time(props.get("ExecMainStartTimestamp")) is not None
    if not ever_ran:
        if not unit_props.get("readable", True):
            return Finding("unknown", f"unit state unreadable ({unit_props.get('error')}) and no journal or status.json",
                           [f"systemctl: {unit_props.get('error')}"])
        if load == "not-found":
            reason = f"{unit} is not installed (template unit missing) and nothing of the run exists"
        elif not (evidence.get("config") or {}).get("present", True):
            reason = f"no run configuration at {(evidence.get('config') or {}).get('path')}, no journal, no status.json"
        else:
            reason = "the unit has never started on this host: no invocation in the journal, no status.json"
        if not journal_readable:
            return Finding("unknown", "journal unreadable and no status.json: cannot tell whether it ever started",
                           [props_line])
        return Finding("not-started", reason, [props_line])

    if active in ("active", "reloading") or (active == "activating" and sub != "auto-restart"):
        return _running(evidence, run, unit, props, status, invocations, props_line, warnings)

    # The unit is down (inactive, failed, or waiting to restart): explain its last death.
    target = _last_exit_invocation(invocations, props)
    return _explain_death(evidence, run, unit, props, status, target, props_line, warnings, current=True)


def _running(evidence, run, unit, props, status, invocations, props_line, warnings) -> Finding:
    active = props.get("ActiveState")
    lines = [props_line]
    metrics_last = (evidence.get("metrics") or {}).get("last") or {}
    step = status.get("step", metrics_last.get("step"))
    if active == "activating":
        text = props.get("StatusText") or status.get("phase") or "loading"
        reason = f"starting, not READY yet ({text})"
    else:
        reason = f"training, step {step}" if step is not None else "active"
        updated = status_time(status.get("updated"))
        if updated is not None:
            age = (evidence.get("collected_at") or time.time()) - updated
            reason += f", status updated {age:.0f} s ago"
            lines.append(f"status.json: phase={status.get('phase')} step={step} updated {fmt_time(updated)}")
    nrestarts = as_int(props.get("NRestarts"), 0)
    previous = None
    if nrestarts or len(invocations) > 1:
        current_id = props.get("InvocationID")
        earlier = [i for i in invocations if i.id != current_id and (i.exit_code or i.result)]
        if earlier:
            prev = _explain_death(evidence, run, unit, {}, {}, earlier[-1], "", [], current=False)
            previous = {"verdict": prev.verdict, "reason": prev.reason, "evidence": prev.lines,
                        "ended_at": earlier[-1].exit_ts, "action": prev.action}
            if nrestarts:
                reason += f"; restarted {nrestarts}x, last death: {prev.verdict} ({prev.reason})"
            else:  # started again by hand (train.yml), not by Restart=
                reason += f"; an earlier invocation ended: {prev.verdict} ({prev.reason})"
    # Hardware trouble while running is worth saying even if the run survived it.
    start = parse_systemd_time(props.get("ExecMainStartTimestamp"))
    scan = kernel_scan(evidence, start, None)
    for x in scan["xids"]:
        if x["hardware"]:
            warnings.append(f"hardware Xid {x['code']} on {x['pci']} while running ({x['action']}): {x['line']}")
    for h in scan["nvrm"] + gpu_findings(evidence):
        warnings.append(f"{h['kind']} while running ({h['action']}): {h['line']}")
    return Finding("running", reason, lines, previous=previous)


def _last_exit_invocation(invocations: list[Invocation], props: dict) -> Invocation:
    ident = props.get("InvocationID") or None
    for inv in invocations:
        if ident and inv.id == ident:
            return inv
    with_exit = [i for i in invocations if i.exit_code or i.result]
    if with_exit:
        return with_exit[-1]
    return invocations[-1] if invocations else Invocation(ident)


def _exit_facts(props: dict, inv: Invocation, current: bool) -> dict:
    """Result / exit code / status of the invocation: systemctl's record, else the journal's."""
    facts = {"result": inv.result, "code": inv.exit_code, "status": inv.exit_status, "ts": inv.exit_ts,
             "source": "journal", "name": inv.exit_name}
    if current and props:
        main_code = as_int(props.get("ExecMainCode"), 0)
        exit_ts = parse_systemd_time(props.get("ExecMainExitTimestamp"))
        if main_code or exit_ts is not None:
            facts.update(code={1: "exited", 2: "killed", 3: "dumped"}.get(main_code, facts["code"]),
                         status=as_int(props.get("ExecMainStatus"), facts["status"]),
                         ts=exit_ts or facts["ts"], source="systemctl")
        if props.get("Result") and (props["Result"] != "success" or facts["result"] is None):
            facts["result"] = props["Result"]
    return facts


def _run_pids(props: dict, status: dict, inv: Invocation) -> set[str]:
    pids = set()
    for value in (props.get("ExecMainPID"), props.get("MainPID"), status.get("pid")):
        if as_int(value):
            pids.add(str(as_int(value)))
    for e in inv.entries:
        if not is_manager_entry(e) and field(e, "_PID"):
            pids.add(field(e, "_PID"))
    return pids


# Verdicts that say how systemd's start itself went: never wrapped in init-crash.
START_OUTCOMES = {"start-timeout", "exec-failed", "start-limit-hit", "stopped", "completed"}


def _explain_death(evidence, run, unit, props, status, inv, props_line, warnings, current) -> Finding:
    facts = _exit_facts(props, inv, current)
    kernel = evidence.get("kernel") or {}
    kernel_readable = kernel.get("readable", True)
    start = inv.first_ts or (parse_systemd_time(props.get("ExecMainStartTimestamp")) if current else None)
    end = facts["ts"] or inv.last_ts
    scan = kernel_scan(evidence, start, end)
    app = inv.app_lines()
    base = [line for line in (props_line,) if line]
    if inv.exit_line:
        base.append(jline(inv.exit_ts, inv.exit_line))
    if inv.result_line:
        base.append(jline(inv.exit_ts, inv.result_line))

    ready = inv.started
    if not ready and not inv.start_failed and current and status:
        # Journal may have been cut (journal line cap) or unreadable: fall back to the trainer's status.
        first_seen = inv.first_ts
        if status.get("ready") and (first_seen is None or not journal_is_complete(evidence)):
            ready = True
    if inv.started_line:
        base.append(f"journal: {inv.started_line} (READY=1 received)")

    # systemd refused a further start: the unit will not restart; the death before it is the cause.
    limit_hit = facts["result"] == "start-limit-hit" or inv.start_limit_line is not None
    if limit_hit:
        prior = [r for r in inv.results if r != "start-limit-hit"]
        facts = dict(facts, result=prior[-1] if prior else None)
        if inv.start_limit_line:
            base.append(jline(inv.start_limit_ts, inv.start_limit_line))

    cause = _clean_ending(inv, facts, status if current else {}, base)
    if cause is None:
        cause = _cause(evidence, run, unit, props, status, inv, facts, scan, app, kernel_readable, base, current)
    if limit_hit:
        burst, interval = props.get("StartLimitBurst"), props.get("StartLimitIntervalUSec")
        limit = (f" ({burst} starts within {interval})" if burst and interval else
                 f" (after {inv.restarts} automatic restarts)" if inv.restarts else "")
        return Finding("start-limit-hit",
                       f"the unit hit its start limit{limit}: systemd refused the next start ('Start request repeated "
                       f"too quickly') and will not start it again until `systemctl reset-failed {unit}`; the run before "
                       f"it ended: {cause.verdict}: {cause.reason}", cause.lines,
                       action="reset-failed",
                       cause={"verdict": cause.verdict, "reason": cause.reason, "action": cause.action, **cause.extra})
    if cause.verdict in START_OUTCOMES:
        return cause
    if not ready:
        when = f"{(end - start):.0f} s after start" if (start is not None and end is not None) else "during start-up"
        return Finding("init-crash", f"died before READY ({when}): {cause.reason}", cause.lines, cause.next_step,
                       action=cause.action,
                       cause={"verdict": cause.verdict, "reason": cause.reason, "action": cause.action, **cause.extra})
    return cause


def _clean_ending(inv, facts, status, base) -> Finding | None:
    """A stop through systemd or a finished run (exit 0)."""
    phase = status.get("phase")
    if facts["result"] == "success" or (facts["code"] == "exited" and facts["status"] == 0):
        if inv.stopping or phase == "stopped":
            proof = base + ([jline(None, inv.stopping_line)] if inv.stopping_line else []) + (
                [f"status.json: phase={phase}"] if phase else [])
            return Finding("stopped", "stopped through systemd (clean exit)", proof)
        if phase == "completed":
            return Finding("completed", f"finished: exit 0, status.json phase=completed at step {status.get('step')}",
                           base + [f"status.json: phase=completed step={status.get('step')}"])
        if facts["result"] == "protocol":  # Type=notify: exit 0 without READY=1 fails since systemd 233
            return Finding("crash", "the trainer exited 0 without sending READY=1 (Result=protocol)", base,
                           action="investigate")
        if facts["code"] == "exited" and facts["status"] == 0:
            return Finding("unknown", "exit 0 but status.json says neither completed nor stopped",
                           base + [f"status.json: phase={phase}"])
    return None


def journal_is_complete(evidence: dict) -> bool:
    journal = evidence.get("journal") or {}
    return journal.get("readable", True) and not journal.get("truncated")


def _describe_exit(facts: dict) -> str:
    code, status = facts.get("code"), facts.get("status")
    if code in ("killed", "dumped") and status is not None:
        return f"signal {status}/{SIGNAL_NAMES.get(status, '?')}" + (" (core dumped)" if code == "dumped" else "")
    if code == "exited":
        return f"exit status {status}"
    return f"result {facts.get('result') or 'unknown'}"


def _last_exception(app: list[tuple[float | None, str]]) -> tuple[str | None, list[str]]:
    """The final exception line of the last traceback (or the last exception-looking line), with
    its continuation lines joined into the text."""
    block = exception_block(app)
    if not block:
        return None, []
    return block["text"], block["lines"]


def _grep(app, pattern: re.Pattern | str) -> tuple[float | None, str] | None:
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    hit = None
    for ts, line in app:
        if rx.search(line):
            hit = (ts, line)
    return hit


# Words that make a line more specific about a failure than the lines around it.
RE_SPECIFIC = re.compile(r"error|fail|fatal|exception|killed|abort|denied|timed out|unable|cannot|can't|refused"
                         r"|not found|invalid", re.IGNORECASE)


def _specific_lines(app, most: int = 3) -> list[tuple[float | None, str]]:
    """The last lines of the output that say most about a failure no rule knows (else the last line)."""
    said = [(ts, line) for ts, line in app if line.strip()]
    specific = [(ts, line) for ts, line in said if RE_SPECIFIC.search(line)
                and not strip_prefix(line).lstrip().startswith(("File ", "raise "))]
    return (specific or said[-1:])[-most:]


def _hint(text: str) -> str | None:
    return _hint_action(text)[0]


def _hint_action(text: str) -> tuple[str | None, str | None]:
    for rx, hint, action in HINTS:
        if rx.search(text):
            return hint, action
    for _kind, rx, action, what in HOST_SIGNATURES:
        if rx.search(text):
            return what, action
    return None, None


def _dedupe(lines: list[str], limit: int = 12) -> list[str]:
    out = []
    for line in lines:
        if line not in out:
            out.append(line)
    return out[:limit]


def _xid_finding(xids: list[dict], exit_desc: str, base: list[str]) -> Finding | None:
    """The first hardware Xid of the window is the root; later ones are listed. A follow-on Xid
    that names its cause (`45, ... caused by previous Xid 149`) points at the root too. The action
    is the strongest any of them needs (a Xid 154 states the driver's own recovery action)."""
    hw = [x for x in xids if x["kind"] == "hardware"]
    refs = [x for x in xids if x.get("caused_by") in XID_HARDWARE and XID_CATALOG[x["caused_by"]][0] == "hardware"]
    recovery = [x for x in xids if x["kind"] == "recovery"]
    if hw:
        root = hw[0]
        code, pci, mnemonic = root["code"], root["pci"], root["mnemonic"]
        how = f"NVIDIA Xid {code} ({mnemonic}, hardware/driver) on GPU {pci}"
    elif refs:
        ref = refs[0]
        code, pci = ref["caused_by"], ref["pci"]
        mnemonic = XID_CATALOG[code][3]
        root = {"code": code, "pci": pci, "action": XID_CATALOG[code][2], "line": ref["line"]}
        how = f"NVIDIA Xid {ref['code']} on GPU {pci} names Xid {code} ({mnemonic}, hardware/driver) as its cause"
    elif recovery:
        root = recovery[0]
        code, pci = root["code"], root["pci"]
        how = f"NVIDIA Xid 154 on GPU {pci}: the driver's GPU recovery action is {root.get('recovery') or '?'}"
    else:
        return None
    actions = [root["action"]] + [x["action"] for x in hw + recovery]
    action = max((a for a in actions if a in GPU_ACTION_ORDER), key=GPU_ACTION_ORDER.index, default=root["action"])
    seen, listed = set(), []
    for x in xids:
        key = (x["code"], x["pci"])
        if key in seen:
            continue
        seen.add(key)
        listed.append({"code": x["code"], "pci": x["pci"], "kind": x["kind"], "action": x["action"],
                       "count": sum(1 for y in xids if (y["code"], y["pci"]) == key),
                       **({"recovery": x["recovery"]} if x.get("recovery") else {}),
                       **({"caused_by": x["caused_by"]} if x.get("caused_by") else {})})
    others: dict[int, dict] = {}
    for x in listed:
        if x["code"] == code and x["pci"] == pci:
            continue
        o = others.setdefault(x["code"], {"count": 0, "gpus": set(), "kind": x["kind"], "recovery": x.get("recovery")})
        o["count"] += x["count"]
        o["gpus"].add(x["pci"])
    reason = how
    if others:
        reason += "; also in the window: " + ", ".join(
            f"Xid {c}" + (f" x{o['count']}" if o["count"] > 1 else "")
            + (f" on {len(o['gpus'])} GPUs" if len(o["gpus"]) > 1 else "") + f" ({o['kind']}"
            + (f", {o['recovery']}" if o.get("recovery") else "") + ")" for c, o in list(others.items())[:8])
    if action != root["action"]:
        reason += f"; the action follows the strongest of them ({action})"
    reason += f"; the run then ended with {exit_desc}"
    lines = base + _dedupe([root["line"]] + [x["line"] for x in xids], 10)
    return Finding(f"gpu-xid-{code}", reason, lines, ACTIONS[action], action=action,
                   xid=code, pci=pci, xids=listed)


def _cause(evidence, run, unit, props, status, inv, facts, scan, app, kernel_readable, base, current) -> Finding:
    code, sig = facts["code"], facts["status"]
    killed = code in ("killed", "dumped")
    exit_desc = _describe_exit(facts)
    unit_names = {unit, unit.replace("-", "\\x2d")}
    ooms, xids = scan["ooms"], scan["xids"]
    run_pids = _run_pids(props if current else {}, status if current else {}, inv)

    # 1. A hardware Xid in the window outranks the crash it caused: the first one is the root.
    found = _xid_finding(xids, exit_desc, base)
    if found:
        return found

    # 2. A kernel OOM kill tied to the run.
    host_cg = host_memcg(evidence)
    tied = []
    for oom in ooms:
        memcg = (oom.get("task_memcg") or "") + " " + (oom.get("oom_memcg") or "")
        if any(u in memcg for u in unit_names):
            tied.append((oom, f"its cgroup names {unit}"))
        elif oom["pid"] in run_pids:
            tied.append((oom, f"pid {oom['pid']} was the run's"))
        elif (sig == 9 and killed and not memcg_names_other_unit(oom.get("task_memcg"), unit_names)
              and memcg_in_host(oom.get("task_memcg"), host_cg)
              and oom.get("ts") is not None and facts["ts"] is not None
              and -OOM_TIME_TIE_S <= oom["ts"] - facts["ts"] <= 2.0):
            tied.append((oom, f"killed {facts['ts'] - oom['ts']:.1f} s before the unit's SIGKILL, in this host's "
                              f"cgroup {oom.get('task_memcg') or '?'} (tied by time: pid namespaces differ)"))
    if tied:
        oom, why = tied[-1]
        host_wide = oom.get("constraint") == "CONSTRAINT_NONE" or (
            oom.get("constraint") is None and oom.get("memcg_kill") is False)
        verdict = "host-oom-kill" if host_wide else "cgroup-oom-kill"
        what = "the whole host ran out of memory" if host_wide else f"memory cgroup limit ({oom.get('oom_memcg') or oom.get('task_memcg') or 'cgroup'})"
        return Finding(verdict, f"kernel OOM killer killed {oom.get('comm')} pid {oom['pid']}: {what}; {why}",
                       base + oom["lines"], oom_pid=oom["pid"], constraint=oom.get("constraint"))
    if facts["result"] == "oom-kill" or inv.oom_line:
        proof = base + ([jline(None, inv.oom_line)] if inv.oom_line else [])
        limit = props.get("MemoryMax", "")
        return Finding("cgroup-oom-kill",
                       f"systemd reports an OOM kill in the unit's cgroup (Result=oom-kill, MemoryMax={limit or '?'})"
                       + ("" if kernel_readable else "; kernel log unreadable, whether the host or the limit ran out is not known"),
                       proof)

    # 3. systemd's own start outcomes: the trainer never ran (exit 200-243), or READY never came.
    step_hit = None
    for ts, line in app + [(realtime(e), message(e)) for e in inv.entries if is_manager_entry(e)]:
        m = RE_EXEC_STEP.search(line)
        if m:
            step_hit = (ts, line, m)
    if step_hit or (code == "exited" and sig in SYSTEMD_EXIT_STEPS):
        step = step_hit[2].group("step") if step_hit else (facts.get("name") or SYSTEMD_EXIT_STEPS.get(sig))
        detail = (f" spawning {step_hit[2].group('path')}: {step_hit[2].group('error').strip()}" if step_hit else "")
        return Finding("exec-failed", f"systemd could not start the trainer: step {step} failed{detail} ({exit_desc})",
                       base + ([jline(step_hit[0], step_hit[1])] if step_hit else []),
                       action=EXEC_STEP_ACTIONS.get(step, "fix-config"), exec_step=step)
    if (inv.start_timeout_line or (facts["result"] == "timeout" and not inv.started and not inv.stopping)) \
            and not inv.stopping:
        limit = props.get("TimeoutStartUSec")
        took = f" after {(facts['ts'] or inv.last_ts) - inv.first_ts:.0f} s" if (inv.first_ts and (facts['ts'] or inv.last_ts)) else ""
        last = next((line.strip() for _, line in reversed(app) if line.strip()), None)
        return Finding("start-timeout",
                       f"READY=1 did not come within TimeoutStartSec{f' ({limit})' if limit else ''}: systemd stopped the "
                       f"start{took} ({exit_desc})" + (f"; last output: {last[:160]}" if last else "; no output from the trainer"),
                       base + ([jline(None, inv.start_timeout_line)] if inv.start_timeout_line else [])
                       + [jline(ts, line) for ts, line in app[-2:] if line.strip()])

    # 4. Signatures in the trainer's own output that name the cause outright.
    hit = _grep(app, RE_CUDA_OOM)
    if hit:
        return Finding("cuda-oom", f"GPU memory exhausted: {strip_prefix(hit[1]).strip()[:200]}", base + [jline(*hit)])
    disks = evidence.get("disk") or {}
    shm_hit = _grep(app, RE_SHM_FULL)
    if shm_hit:
        shm = disks.get("shm") or {}
        free = f"; {_size(shm['free_bytes'])} free now on {shm.get('path', '/dev/shm')}" if shm.get("free_bytes") is not None else ""
        return Finding("disk-full", f"shared memory (/dev/shm) ran out: {strip_prefix(shm_hit[1]).strip()[:200]}{free}",
                       base + [jline(*shm_hit)], where="/dev/shm")
    disk = disks.get("checkpoints") or disks.get("output_dir") or {}
    free = ""
    if disk.get("free_bytes") is not None:
        where = disk.get("path") + (f" -> {disk['realpath']}" if disk.get("realpath") else "")
        free = f"; {_size(disk['free_bytes'])} free now on {where}"
    saving = " during a checkpoint save" if _grep(app, r"checkpoint|\.tmp-step-|torch[\\/]serialization\.py") else ""
    hit = _grep(app, r"Disk quota exceeded|\[Errno 122\]")
    if hit:  # EDQUOT: the quota of the user or project ran out, not the filesystem
        return Finding("disk-full", f"disk quota exceeded (EDQUOT){saving}: the quota of the run's user or project "
                       f"is used up, not necessarily the filesystem (`quota -s`, `lfs quota`){free}; free space under "
                       f"the quota or raise it: {strip_prefix(hit[1]).strip()[:200]}", base + [jline(*hit)])
    hit = _grep(app, r"No space left on device|\[Errno 28\]")
    if hit:
        return Finding("disk-full", f"No space left on device{saving}{free}", base + [jline(*hit)])
    # torch.save's zip writer does not say ENOSPC: a short write surfaces as "unexpected pos" or
    # "PytorchStreamWriter failed writing file". Disk-full only when the filesystem is full now.
    hit = _grep(app, RE_TORCH_SHORT_WRITE)
    if hit and saving and _nearly_full(disk):
        return Finding("disk-full", f"the checkpoint save failed: a write came up short (torch: {hit[1].strip()[:120]}) "
                       f"on a full filesystem{free}", base + [jline(*hit)])
    # A multi-node run's trainer says when another node went first (docs/trainer.md): this host's
    # ranks failed because that one did, whatever exception their collectives raised.
    hit = _grep(app, messages.PEER_FAILURE_RE)
    if hit:
        line = hit[1].strip()
        account = line[line.index(messages.ERROR_PREFIX) + len(messages.ERROR_PREFIX):].strip()
        return Finding("peer-failure", account[:300], base + [jline(*hit)])
    hit = _grep(app, r"Watchdog caught collective operation timeout")
    if hit:
        line = strip_prefix(hit[1]).strip()
        line = line[line.index("Watchdog caught"):] if "Watchdog caught" in line else line
        return Finding("nccl-timeout", f"NCCL collective timed out: {line[:240]}", base + [jline(*hit)])
    if facts["result"] == "watchdog" or inv.watchdog_line:
        proof = base + ([jline(None, inv.watchdog_line)] if inv.watchdog_line else [])
        tail = [jline(ts, line) for ts, line in app[-3:]]
        return Finding("watchdog-hang", "no WATCHDOG=1 within WatchdogSec: systemd killed the hung trainer"
                       + (f" (last output: {app[-1][1].strip()[:120]})" if app else ""), proof + tail)

    # 5. Host, driver and toolchain findings, before blaming the configuration or a crash that is
    #    only their symptom: the kernel's NVRM lines, nvidia-smi's errors, the trainer's signatures.
    exc = exception_block(app)
    config_hit = _grep(app, messages.CONFIG_ERROR_RE)
    is_config = bool(config_hit) or (code == "exited" and sig == messages.EX_CONFIG)
    nat = native_crash(app, scan["faults"], facts, run_pids)
    nccl = nccl_block(app)
    own = app_signatures(app)
    host = scan["nvrm"] + (gpu_findings(evidence) if current else []) + own
    if host:
        explains = (exc is None or is_config or nat is not None or bool(own)
                    or bool(RE_GPUISH.search(exc["text"])))
        if explains:
            h = host[0]
            then = (f"; the trainer then: {strip_prefix(config_hit[1]).strip()[:200]}" if config_hit else
                    f"; the trainer then: {exc['text'][:240]}" if exc and h["text"] not in exc["text"] else
                    f"; {nat['message'][:200]}" if nat else "")
            lines = base + _dedupe([x["line"] for x in host], 6) + (exc["lines"][:3] if exc else []) + (
                [jline(*config_hit)] if config_hit else [])
            others = sorted({x["kind"] for x in host[1:]} - {h["kind"]})
            return Finding(h["kind"], f"{h['what']} ({h['source']}: {h['text'][:240]}){then} ({exit_desc})"
                           + (f"; also: {', '.join(others)}" if others else ""), _dedupe(lines, 16), action=h["action"])
    host_note = f"; also on this host: {host[0]['kind']} ({host[0]['source']}: {host[0]['text'][:160]})" if host else ""

    # 6. NCCL's own error, with the cause its `Last error:` names.
    if nccl and (exc is None or exc["index"] >= nccl["index"] - 3 or RE_NCCL_ERROR.search(exc["text"])):
        last = f"; Last error: {nccl['last_error']}" if nccl["last_error"] else "; NCCL gave no Last error"
        return Finding("nccl-error", f"{nccl['text'][:500]}{'' if nccl['last_error'] else last} ({exit_desc}){host_note}",
                       base + nccl["lines"], action=nccl["action"], nccl_code=nccl["code"], last_error=nccl["last_error"])

    # 7. A native crash (unless a Python exception came first and the abort is only its teardown).
    if nat is not None:
        first = exc is None or nat["index"] < exc["index"] or (
            nat["index"] >= len(app) and nat.get("ts") is not None and exc.get("ts") is not None and nat["ts"] < exc["ts"])
        if first:
            lib = nat.get("lib")
            hint, hint_act = _hint_action(nat.get("what") or "")
            if lib and RE_DRIVER_LIB.search(lib):
                action = "fix-driver"
            elif nat.get("trap") and lib:
                action = "fix-venv"  # an instruction this CPU lacks: a binary built for another CPU
            else:
                action = hint_act or "investigate"
            reason = f"native crash: {nat['message'][:400]}" + (f" (in {lib})" if lib and lib not in nat["message"] else "")
            return Finding("native-crash", f"{reason} ({exit_desc}){host_note}", base + _dedupe(nat["lines"], 8),
                           hint, action=action, library=lib)

    # 8. The trainer's deterministic config error (exit EX_CONFIG, one stderr line).
    if is_config:
        text = config_hit[1].strip() if config_hit else f"exit status {messages.EX_CONFIG} (config error)"
        return Finding("crash", text, base + ([jline(*config_hit)] if config_hit else []),
                       "fix the run configuration as the message says, then train.yml", action="fix-config",
                       kind="config-error")

    # 8b. The trainer stopped itself on a NaN/infinite loss (exit EX_NONFINITE, one stderr line):
    # deterministic, so the unit does not restart it; the newest checkpoint is the last good one.
    nonfinite_hit = _grep(app, messages.NONFINITE_RE)
    if nonfinite_hit or (code == "exited" and sig == messages.EX_NONFINITE):
        text = (nonfinite_hit[1].strip().removeprefix(messages.ERROR_PREFIX) if nonfinite_hit
                else f"exit status {messages.EX_NONFINITE} (non-finite loss)")
        return Finding("nonfinite-loss", text, base + ([jline(*nonfinite_hit)] if nonfinite_hit else []),
                       "lower --lr (or check the data), then train.yml: it resumes from the newest checkpoint, "
                       "the last good one", action="fix-config")

    # 9. Outside signals vs. crashes.
    exc_text = exc["text"] if exc else None
    app_xids = [x for x in xids if x["application"] or x["kind"] == "info"]
    xid_note = ""
    for kind, what in (("application", "application fault, not hardware"), ("info", "informational, catalog IGNORE")):
        some = [x for x in app_xids if x["kind"] == kind]
        if some:
            xid_note += f"; Xid {some[-1]['code']} ({what}) on {some[-1]['pci']}"
    if killed and sig is not None and sig not in CRASH_SIGNALS and not exc:
        if inv.stopping:
            return Finding("stopped", f"stopped through systemd, ended by {exit_desc}",
                           base + [jline(None, inv.stopping_line)])
        reason = f"killed by {exit_desc} from outside the run"
        if sig == 9:
            if not kernel_readable:
                reason += f"; kernel log unreadable, OOM not ruled out ({kernel_reason(evidence)})"
            else:
                others = [o for o in ooms]
                reason += ("; no OOM kill of the run in the kernel log" if not others else
                           f"; the kernel log's OOM kill(s) in the window name other processes ({', '.join(o.get('comm') or '?' for o in others)})")
        lines = base + [line for o in ooms for line in o["lines"]]
        restart = props.get("Restart") or "on-failure"
        if sig in CLEAN_EXIT_SIGNALS and restart not in RESTARTS_ON_CLEAN_EXIT:
            reason += (f"; systemd counts SIG{SIGNAL_NAMES[sig]} as a clean exit, so Restart={restart} does not "
                       "restart the unit: it stays down until started again")
            return Finding("killed-by-signal", reason + host_note, lines,
                           "find who sent the signal (no systemctl stop asked for it), then start the run again "
                           "with train.yml: it resumes from the newest checkpoint", signal=sig)
        return Finding("killed-by-signal", reason + host_note, lines, signal=sig)

    if code in ("exited", "killed", "dumped") or facts["result"] not in (None, "success"):
        tail = " ".join(line for _, line in app[-50:])
        if exc_text:
            hint, action = _hint_action(exc_text)
            if not hint:
                hint, action = _hint_action(tail)
            reason = f"{exc_text[:600]} ({exit_desc}){xid_note}{host_note}"
        else:
            said = _grep(app, messages.ERROR_RE)  # the trainer's own one-line account comes first
            hint, action = _hint_action(said[1] if said else tail)
            said = said or next(((ts, line) for ts, line in reversed(app) if hint and _hint_action(line)[0] == hint),
                                None)
            if said:
                reason = f"{exit_desc}; the output says: {strip_prefix(said[1]).strip()[:240]}{xid_note}{host_note}"
                exc = {"lines": [jline(*said)]}
            else:  # no rule knows it: the most specific lines, said to be unrecognised
                specific = _specific_lines(app)
                reason = (f"unrecognised failure: {' / '.join(strip_prefix(x[1]).strip()[:200] for x in specific)} "
                          f"({exit_desc}){xid_note}{host_note}" if specific else
                          f"{exit_desc}, no output from the trainer{xid_note}{host_note}")
                exc = {"lines": [jline(*x) for x in specific]} if specific else None
        lines = base + (exc["lines"] if exc else []) + [x["line"] for x in app_xids]
        return Finding("crash", reason, _dedupe(lines, 20), hint, action=action or "investigate",
                       exception=exc.get("head") if exc else None)

    gaps = []
    if not (evidence.get("journal") or {}).get("readable", True):
        gaps.append("journal unreadable")
    if not facts["code"]:
        gaps.append("systemd's exit record is gone (unit unloaded or reset)")
    return Finding("unknown", f"unit is {props.get('ActiveState', '?')} and nothing explains how it ended"
                   + (f": {', '.join(gaps)}" if gaps else f" ({exit_desc})")
                   + (f"; status.json last said phase={status.get('phase')} step={status.get('step')}" if status else "")
                   + host_note,
                   base + ([f"status.json: phase={status.get('phase')} updated {fmt_time(status_time(status.get('updated')))}"] if status else []))


def _nearly_full(disk: dict) -> bool:
    free, total = disk.get("free_bytes"), disk.get("total_bytes")
    if free is None:
        return False
    return free < NEARLY_FULL_BYTES or (bool(total) and free < NEARLY_FULL_FRACTION * total)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def kernel_reason(evidence: dict) -> str:
    return str((evidence.get("kernel") or {}).get("error") or "not readable")


# ---------------------------------------------------------------------------------------------
# command line


def _evidence_files(args: list[str]) -> list[Path]:
    files = []
    for arg in args:
        p = Path(arg)
        if p.is_dir():
            files.extend(sorted(p.glob("*/evidence.json")) or sorted(p.glob("evidence.json")))
        else:
            files.append(p)
    return files


# Verdicts that are not a failure: a run that was fine, or never ran, did not "go first".
# peer-failure is a failure, but never the first: the host says another one went before it.
NOT_FAILURES = {"running", "completed", "not-started", "stopped", "unreachable", "no-evidence", "unknown",
                "peer-failure"}


def first_failure(rows: list[dict]) -> dict | None:
    """The host whose run died first, by its unit's exit time: in a multi-node run the others
    usually fail because that one did (a collective or rendezvous error). A host whose unit has
    already been restarted counts with the death before it. Host clocks must agree (NTP); None
    when no host failed with a known exit time."""
    deaths = []
    for r in rows:
        prev = r.get("previous") or {}
        if r.get("verdict") not in NOT_FAILURES and r.get("ended_at") is not None:
            deaths.append((r["ended_at"], r.get("host"), r.get("verdict")))
        elif prev.get("verdict") not in NOT_FAILURES and prev.get("ended_at") is not None:
            deaths.append((prev["ended_at"], r.get("host"), prev.get("verdict")))
    if not deaths:
        return None
    ended_at, host, verdict = min(deaths, key=lambda d: d[0])
    return {"host": host, "verdict": verdict, "ended_at": ended_at}


def table(rows: list[dict]) -> str:
    head = ("host", "verdict", "action", "step", "newest checkpoint", "reason")
    data = [(str(r.get("host") or "?"), str(r.get("verdict")),
             str(r.get("action") or VERDICT_ACTIONS.get(str(r.get("verdict")), "-")),
             str(r.get("step") if r.get("step") is not None else "-"),
             str(r.get("newest_checkpoint") or "-"), str(r.get("reason") or "")[:160]) for r in rows]
    widths = [max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(head)]
    widths[-1] = len(head[-1])
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(d, widths, strict=True)).rstrip() for d in data]
    return "\n".join(out)


# The evidence document's shape (flashfleet.evidence.gather): the JSON type of each field the
# classifier reads, where present and not null ("[]": each item of the list).
EVIDENCE_SHAPE = {
    "run": str, "unit": str, "host": str, "collected_at": (int, float), "unit_props": dict,
    "unit_props.properties": dict, "journal": dict, "journal.entries": list, "journal.entries[]": dict,
    "kernel": dict, "kernel.entries": list, "kernel.entries[]": dict, "status": dict, "status.data": dict,
    "checkpoints": dict, "checkpoints.newest": dict, "metrics": dict, "metrics.last": dict, "gpu": dict,
    "gpu.gpus": list, "venv": dict, "venv.drift": list, "venv.drift[]": dict, "cgroup": dict,
    "cgroup.own": list, "disk": dict, "config": dict, "deaths": dict, "deaths.records": list,
    "servers": dict, "servers.units": list, "servers.units[]": dict,
}
JSON_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}


def shape_problem(evidence: dict) -> str | None:
    """The first field of `evidence` of the wrong JSON type, as 'field is X, not Y'; None if none."""
    for path, want in EVIDENCE_SHAPE.items():
        node, items = evidence, path.endswith("[]")
        for key in path.removesuffix("[]").split("."):
            node = node.get(key) if isinstance(node, dict) else None
        values = list(enumerate(node)) if items and isinstance(node, list) else [(None, node)]
        for i, v in values:
            if v is not None and not isinstance(v, want) or isinstance(v, bool):
                name = path.replace("[]", f"[{i}]")
                got = "a boolean" if isinstance(v, bool) else JSON_NAMES.get(type(v), type(v).__name__)
                wanted = JSON_NAMES[want[0] if isinstance(want, tuple) else want]
                return f"{name} is {got}, not {wanted}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if not argv or "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0 if argv else 2
    for arg in argv:
        if Path(arg).is_dir() and not _evidence_files([arg]):
            print(f"{arg}: no evidence.json there or in its host directories (fix: run diagnose.yml or "
                  "collect.yml for the run first, then pass runs/<run> or a host's evidence.json)", file=sys.stderr)
            return 2
    results = []
    for path in _evidence_files(argv):
        try:
            evidence = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read evidence: {exc}", file=sys.stderr)
            return 1
        if not isinstance(evidence, dict):
            print(f"{path}: not evidence: a JSON {type(evidence).__name__}, not an object (fix: collect it "
                  "again with diagnose.yml or collect.yml)", file=sys.stderr)
            return 1
        problem = shape_problem(evidence)
        if problem:
            print(f"{path}: not evidence: {problem} (fix: collect it again with diagnose.yml or collect.yml; "
                  "an edited file must keep the shape flashfleet_evidence writes)", file=sys.stderr)
            return 1
        result = classify(evidence)
        if not result.get("host"):
            result["host"] = path.parent.name
        results.append(result)
    if as_json:
        print(json.dumps(results if len(results) != 1 else results[0], indent=2, sort_keys=True))
    else:
        print(table(results))
        first = first_failure(results) if len(results) > 1 else None
        if first:
            print(f"\nwent first: {first['host']} ({first['verdict']})")
        for r in results:
            print(f"\n[{r['host']}] {r['verdict']}: {r['reason']}")
            for line in r.get("evidence") or []:
                print(f"    {line}")
            if r.get("next_step"):
                print(f"  next: {r['next_step']}")
            if r.get("action"):
                print(f"  action: {r['action']}")
            for w in r.get("warnings") or []:
                print(f"  warning: {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
