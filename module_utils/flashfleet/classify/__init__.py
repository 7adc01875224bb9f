"""Turn one host's evidence (the JSON the flashfleet_evidence module gathers, flashfleet.evidence)
into a verdict: `classify(evidence)`. Standard library only, no Ansible import. The command line
(flashfleet-classify, `python -m flashfleet.classify`) and its usage are cli.py's; how a verdict is
decided is docs/diagnosis.md ("Verdicts and how they are decided"), which rules.RULES follows."""

# The package, one module per concern (docs/diagnosis.md has the same table):
#   signatures  the knowledge as data: verdicts, actions, the Xid catalog, every signature table
#   catalogues  each layer's own vocabulary as data (errno, signals, systemd, HTTP, kernel, ...)
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
