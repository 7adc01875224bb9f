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

# The package, one module per concern (docs/diagnosis.md, "How the classifier is built"):
#   signatures  the knowledge as data: verdicts, actions, the Xid catalog, every signature table
#   journal     reader: the unit's record and journal, cut into invocations
#   kernel      reader: the kernel log (OOM kills, Xids, NVRM, filesystems, AER, segfaults), cgroups
#   output      reader: the trainer's output (exceptions, NCCL, native crashes, hints)
#   gpu         reader: nvidia-smi / NVML findings
#   disk        reader: free space
#   servers     reader: the run's vLLM target servers
#   finding     Finding, a candidate verdict
#   rules       the verdict on one death: RULES, an ordered tuple of rule(death) -> Finding | None
#   verdict     classify(): unit state, the rules, start-limit-hit / init-crash, servers
#   cli         flashfleet-classify, the verdict table, first_failure
# Everything callers used from the single module is re-exported here.

from __future__ import annotations

from .cli import NOT_FAILURES, first_failure, main, shape_problem, table
from .finding import Finding
from .gpu import gpu_findings
from .journal import (
                      Invocation,
                      as_float,
                      as_int,
                      field,
                      fmt_time,
                      message,
                      parse_systemd_time,
                      realtime,
                      split_invocations,
                      status_time,
)
from .kernel import host_memcg, kernel_events, kernel_scan, memcg_in_host, memcg_names_other_unit
from .output import app_signatures, exception_block, native_crash, nccl_block, strip_prefix
from .rules import RULES, Death
from .servers import server_deaths, with_servers
from .signatures import (
                      ACTIONS,
                      CLEAN_EXIT_SIGNALS,
                      CRASH_SIGNALS,
                      EXEC_STEP_ACTIONS,
                      GPU_ACTION_ORDER,
                      HINTS,
                      HOST_SIGNATURES,
                      KERNEL_SIGNATURES,
                      MID_FAILED,
                      MID_PROCESS_EXIT,
                      MID_RESULT,
                      MID_STARTED,
                      MID_STOPPING,
                      NCCL_LAST_ERROR_ACTIONS,
                      NEXT_STEPS,
                      RECOVERY_ACTIONS,
                      SCHEMA,
                      SERVER_SIGNATURES,
                      SIGNAL_NAMES,
                      SYSTEMD_EXIT_STEPS,
                      VERDICT_ACTIONS,
                      VERDICTS,
                      XID_APPLICATION,
                      XID_CATALOG,
                      XID_HARDWARE,
)
from .verdict import classify, death_rows, last_death

__all__ = [
    "ACTIONS", "CLEAN_EXIT_SIGNALS", "CRASH_SIGNALS", "EXEC_STEP_ACTIONS", "GPU_ACTION_ORDER", "HINTS",
    "HOST_SIGNATURES", "KERNEL_SIGNATURES", "MID_FAILED", "MID_PROCESS_EXIT", "MID_RESULT", "MID_STARTED",
    "MID_STOPPING", "NCCL_LAST_ERROR_ACTIONS", "NEXT_STEPS", "NOT_FAILURES", "RECOVERY_ACTIONS", "RULES", "SCHEMA",
    "SERVER_SIGNATURES", "SIGNAL_NAMES", "SYSTEMD_EXIT_STEPS", "VERDICTS", "VERDICT_ACTIONS", "XID_APPLICATION",
    "XID_CATALOG", "XID_HARDWARE",
    "Death", "Finding", "Invocation", "app_signatures", "as_float", "as_int", "classify", "death_rows",
    "exception_block", "field", "first_failure", "fmt_time", "gpu_findings", "host_memcg", "kernel_events",
    "kernel_scan", "last_death", "main", "memcg_in_host", "memcg_names_other_unit", "message", "native_crash",
    "nccl_block", "parse_systemd_time", "realtime", "server_deaths", "shape_problem", "split_invocations",
    "status_time", "strip_prefix", "table", "with_servers",
]
