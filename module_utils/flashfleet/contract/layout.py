"""Names inside a run's output directory (`--output-dir`, on hosts /var/lib/flashfleet/runs/<run>/).

    status.json        where the run stands now (status.py)
    metrics.jsonl      one record per optimizer step, evaluation or event (metrics.py)
    checkpoints/       step-NNNNNNNN/ directories (checkpoint.py)
    run.json           what the run keeps across restarts: invocation count, W&B id (starts.py)
    run_config.json    the trainer's settings as it started (the trainer writes it, dflash-export reads it)
    wandb/             wandb's own directory (offline-run-*/ when WANDB_MODE=offline)
    deaths/            one <UTC time>-<invocation>/ directory per death of the run's unit, written
                       on the host at that moment (flashfleet.death), never overwritten

and one name beside the runs, in the runs' parent directory (a run's `--output-dir`'s parent):

    .gpu-health/       the host's GPU health: quarantine.json (quarantine.py: the GPUs no run may
                       use until cleared) and one check-<UTC time>.json per health check (its
                       evidence). A dot-name: no run is called that (RUN_NAME_RE).

and one name inside a data directory (`--data-dir`):

    eval/prompts.jsonl held-out prompts, {"input_ids": [...]} per line: dflash-eval's and the
                       interval evaluation's default --eval-prompts (dflash-tiny writes one)
"""

import re

STATUS = "status.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
RUN_STATE = "run.json"
RUN_CONFIG = "run_config.json"
WANDB = "wandb"  # wandb.init(dir=<run dir>) makes it
# Inside a data directory, relative to it.
EVAL_PROMPTS = "eval/prompts.jsonl"

# Beside the runs (in their parent directory): the host's GPU health records (quarantine.py).
GPU_HEALTH = ".gpu-health"

# systemd: one template unit, the run's name is the instance.
UNIT_TEMPLATE = "flashfleet-train@.service"
# Word at death: flashfleet-verdict@<run>.service (root, oneshot) records each death of the run's
# unit into deaths/<record>/ (evidence.json, verdict.json, and webhook.json when one is configured).
# Records are made under a dot-name and renamed into place whole: readers skip dot-names.
DEATHS = "deaths"
DEATH_EVIDENCE = "evidence.json"
DEATH_VERDICT = "verdict.json"
DEATH_WEBHOOK = "webhook.json"
VERDICT_UNIT_TEMPLATE = "flashfleet-verdict@.service"
# The webhook's settings in the verdict unit's root-only EnvironmentFile (the token never on a
# command line, in the journal or in the trainer's environment).
WEBHOOK_URL_ENV = "FLASHFLEET_WEBHOOK_URL"
WEBHOOK_TOKEN_ENV = "FLASHFLEET_WEBHOOK_TOKEN"
WEBHOOK_TIMEOUT_ENV = "FLASHFLEET_WEBHOOK_TIMEOUT_S"
# A run whose target runs in vLLM (its `vllm:` entry): one server unit per server of a host,
# flashfleet-vllm@<run>-<i>.service, which the run's trainer unit Wants and starts After.
VLLM_UNIT_TEMPLATE = "flashfleet-vllm@.service"
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def unit_name(run: str) -> str:
    """The run's systemd unit, e.g. flashfleet-train@v2.service."""
    return UNIT_TEMPLATE.replace("@", "@" + run)


def vllm_unit_names(run: str, servers: int) -> list[str]:
    """The run's vLLM server units on a host, e.g. [flashfleet-vllm@v2-0.service, ...]."""
    return [VLLM_UNIT_TEMPLATE.replace("@", f"@{run}-{i}") for i in range(servers)]


def vllm_unit_glob(run: str) -> str:
    """The pattern `systemctl list-units` takes for the run's server units (wider than the run:
    v2's also matches v2-ada's; vllm_unit_index tells them apart)."""
    return VLLM_UNIT_TEMPLATE.replace("@", f"@{run}-*")


def vllm_list_units_argv(run: str) -> list[str]:
    """The command that lists the run's server units systemd has loaded (failed ones too), for
    vllm_units_listed to read."""
    return ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--full", "--no-pager", vllm_unit_glob(run)]


def vllm_unit_index(run: str, name: str) -> int | None:
    """i for the run's server unit flashfleet-vllm@<run>-<i>.service, else None."""
    prefix, suffix = VLLM_UNIT_TEMPLATE.split("@")
    m = re.fullmatch(re.escape(f"{prefix}@{run}-") + r"(\d+)" + re.escape(suffix), name)
    return int(m.group(1)) if m else None


def vllm_units_listed(run: str, list_units: str) -> list[str]:
    """The run's server units in vllm_list_units_argv's output, in order."""
    names = {word for line in list_units.splitlines() for word in line.split()[:2]}  # a failed one may lead with ●
    return sorted((n for n in names if vllm_unit_index(run, n) is not None), key=lambda n: vllm_unit_index(run, n))


def verdict_unit_name(run: str) -> str:
    """The unit that records the run's deaths, e.g. flashfleet-verdict@v2.service."""
    return VERDICT_UNIT_TEMPLATE.replace("@", "@" + run)
