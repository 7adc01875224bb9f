"""The classifier's knowledge, as data: verdicts and actions, NVIDIA's Xid catalog, systemd's
exit codes and signals, and the signature tables (HOST_SIGNATURES, KERNEL_SIGNATURES, HINTS,
SERVER_SIGNATURES, the native-crash and NCCL patterns). The readers search with them; the rules
(rules.py) decide with them. A new failure kind is usually one row here."""

from __future__ import annotations

import re

from ..contract import layout, messages
from .catalogues import systemd as systemd_catalogue
from .catalogues import xid as xid_catalogue

# diagnosis.json's schema. 2: `action` beside `next_step`; verdicts native-crash, driver-mismatch,
# driver-too-old, gpu-unavailable, toolchain-error, nccl-error, start-limit-hit, start-timeout,
# exec-failed; `xids` (every Xid of the window, the root first) on GPU verdicts.
SCHEMA = 2

VERDICTS = (
    "running", "completed", "not-started", "init-crash", "crash", "native-crash", "host-oom-kill",
    "cgroup-oom-kill", "cuda-oom", "gpu-xid-<n>", "gpu-unavailable", "driver-mismatch",
    "driver-too-old", "toolchain-error", "nccl-timeout", "nccl-error", "watchdog-hang", "disk-full",
    "killed-by-signal", "peer-failure", "start-limit-hit", "start-timeout", "exec-failed", "nonfinite-loss",
    "filesystem-error", "host-hardware-error", "stopped", "unknown",
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
    "host-hardware-error": "drain-contact-support",
    "server-oom": "fix-server", "server-kv-cache": "fix-server", "server-nccl": "investigate",
    "server-not-ready": "fix-server", "server-died": "check-target-server", "unknown": "investigate",
    "unreachable": "check-host",
    "no-evidence": "check-host",
}

# GPU actions, mildest first: with several Xids (or a Xid 154) the strongest one wins.
GPU_ACTION_ORDER = ("none", "restart-app", "reset-gpu", "reboot-node", "drain-contact-support")

# The Xids this classifier knows, code -> (kind, NVIDIA's immediate-action bucket, our action,
# mnemonic): NVIDIA's whole Xid catalog, whose one owner is catalogues/xid.py (its sources there).
# kind: "application" (the program's own fault: a crash verdict names it), "hardware" (outranks
# the crash it causes), "info" (IGNORE: listed, never the verdict), "recovery" (Xid 154 names the
# driver's recovery action itself).
XID_CATALOG = {e.number: (e.extra["kind"], e.extra["bucket"], e.action, e.extra["mnemonic"])
               for e in xid_catalogue.ENTRIES}
XID_APPLICATION = {c for c, (kind, *_rest) in XID_CATALOG.items() if kind == "application"}
XID_HARDWARE = {c for c, (kind, *_rest) in XID_CATALOG.items() if kind in ("hardware", "recovery")}

# Xid 154 "GPU recovery action changed from 0x0 (None) to 0xN (...)": NVML's
# nvmlDeviceGpuRecoveryAction_t (NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET,
# RECOVER_IMEX_DOMAIN, BUS_RESET, SYSTEM_REBOOT) as our action.
RECOVERY_ACTIONS = {0: "none", 1: "reset-gpu", 2: "reboot-node", 3: "reset-gpu", 4: "reset-gpu",
                    5: "drain-contact-support", 6: "reset-gpu", 7: "reboot-node"}

# systemd's own exit statuses (EXIT_CHDIR..EXIT_CREDENTIALS, systemd.exec(5) "Process Exit
# Codes"): the trainer never ran. EXEC means ExecStart= (the venv's dflash-train) is missing.
SYSTEMD_EXIT_STEPS = systemd_catalogue.EXIT_STEPS
EXEC_STEP_ACTIONS = {step: action for step, (action, _) in systemd_catalogue.EXIT_STEP_MEANINGS.items()}

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
MID_SUCCESS = "7ad2d189f7e94e70a38c781354912448"  # "<unit>: Deactivated successfully." (Result=success)

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

# A thread (or a process) that could not start: the unit's task or process limit, in the words of
# Python, libgomp, pyarrow ("Failed to launch worker thread"), OpenBLAS and glibc (pthread_create),
# Rust's std, the JVM and the pids cgroup. EAGAIN ("Resource temporarily unavailable", errno 11)
# counts only next to thread words: alone it is a non-blocking socket's or a lock's, not a limit.
RE_THREAD_LIMIT = re.compile(
    r"can't start new thread|Thread creation failed|fork rejected by pids controller"
    r"|(?:[Ff]ailed|[Uu]nable|[Cc]ould not|[Cc]annot|[Cc]an't)(?: to)? (?:launch|start|create|spawn) "
    r"(?:a |new |native |OS )?(?:worker )?thread"
    r"|pthread_create[^\n]{0,80}?(?:Resource temporarily unavailable|\bEAGAIN\b)"
    r"|\bthreads?\b[^\n]{0,40}?(?:Resource temporarily unavailable|\bEAGAIN\b)"
    r"|(?:Resource temporarily unavailable|\bEAGAIN\b)[^\n]{0,40}?\bthreads?\b")

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
    (RE_THREAD_LIMIT,
     "the unit's task limit is reached (TasksMax=, the cgroup's pids.max; `systemctl show -p TasksMax,TasksCurrent "
     "UNIT`) or its process limit (LimitNPROC=, ulimit -u): raise it for the run's unit, or lower DataLoader "
     "workers and thread counts (OMP_NUM_THREADS)", "fix-config"),
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
    "host-hardware-error": "the machine itself failed under the run (the kernel's line is in the reason): drain the "
                           "node and have its CPU, memory or kernel checked before it runs again",
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

# The next step where the run ended cleanly to systemd (Result=success) on a signal no stop job sent:
# Restart=on-failure does not restart it.
NEXT_OUTSIDE_CLEAN_EXIT = ("find who sent the signal (no `systemctl stop` asked for it), then start the run again "
                           "with train.yml: it resumes from the newest checkpoint")

RE_RESTART_COUNTER = re.compile(r"restart counter is at (?P<n>\d+)")

# vLLM target servers (the run's flashfleet-vllm@<run>-<i> units, evidence["servers"]).
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


# Verdicts that say how systemd's start itself went: never wrapped in init-crash.
START_OUTCOMES = {"start-timeout", "exec-failed", "start-limit-hit", "stopped", "completed"}

# Words that make a line more specific about a failure than the lines around it.
RE_SPECIFIC = re.compile(r"error|fail|fatal|exception|killed|abort|denied|timed out|unable|cannot|can't|refused"
                         r"|not found|invalid", re.IGNORECASE)
