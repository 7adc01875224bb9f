"""The trainer's exit codes and the one-line messages its readers match.

The trainer prints these (stderr, hence the journal); the classifier, the train_unit role (its
start-failure message) and the unit template (RestartPreventExitStatus) read them from here.
"""

import re

PROGRAM = "flashfleet-train"
EX_CONFIG = 78  # a deterministic start-up error (BSD EX_CONFIG): the unit does not restart on it
# The loss (or the gradient norm) became NaN or infinite: the run stopped without saving that state,
# the newest checkpoint is the last good one. 65 is BSD EX_DATAERR ("the input data was incorrect"):
# the numbers went bad, not the process or the host, and a restart from the same checkpoint with the
# same flags and data replays the same steps to the same NaN, so retrying cannot help either.
EX_NONFINITE = 65

CONFIG_ERROR_PREFIX = f"{PROGRAM}: config error: "
ERROR_PREFIX = f"{PROGRAM}: error: "
WARNING_PREFIX = f"{PROGRAM}: warning: "


def config_error(what: str, fix: str) -> str:
    """The one line a refused start prints: what is wrong and how to fix it."""
    return f"{CONFIG_ERROR_PREFIX}{what} (fix: {fix})"


def error(text: str) -> str:
    """The one line a failed multi-process run prints (the node's own account of the failure)."""
    return f"{ERROR_PREFIX}{text}"


def warning(text: str) -> str:
    """A decision the run took on its own that a human must hear of (a checkpoint moved aside)."""
    return f"{WARNING_PREFIX}{text}"


def nonfinite_loss(step: int, value: float, what: str = "loss") -> str:
    """The one line a run stopped by a NaN/infinite loss (or gradient norm) prints and records."""
    return (f"{ERROR_PREFIX}non-finite {what} {value} at optimizer step {step}: stopped without saving it, "
            "the newest checkpoint is the last good one (fix: lower --lr, check the data, or resume "
            "from an earlier checkpoint)")


def tau_gap(step: int, tau: float, train_tau: float, train_acc1: float, served_acc1: float) -> str:
    """Training accuracy high, tau low (SpecForge #455): the evaluation's warning line."""
    return warning(f"tau {tau:.2f} at step {step} while the training accuracy implies {train_tau:.2f}: block "
                   f"position 1 was right {train_acc1:.0%} of the time in training but is accepted {served_acc1:.0%} "
                   "served; the drafter learns its labels but not the tokens it is served at; likely cause: labels "
                   "shifted or misaligned by a position (block label k must be the token AT anchor+k)")


def went_first(node: int, first: int, why: str) -> str:
    """A node's account of a failure another node started."""
    return f"node {node}: stopping, node {first} went first: {why}"


def also_went_first(msg: str, first: int, why: str) -> str:
    """A node's own failure, with the node that failed before it."""
    return f"{msg}; node {first} went first: {why}"


# A vLLM target server (--target-servers) that failed the run: the messages of the trainer's
# TargetServerError (and UnreachableServerError) begin with TARGET_SERVER and the URL, printed as a
# traceback's last line is; the classifier reads them (TARGET_SERVER_RE).
TARGET_SERVER = "vLLM target server"
TARGET_SERVER_RE = re.compile(r"Error: " + re.escape(TARGET_SERVER) + r" (?P<url>https?://\S+)")
CONFIG_ERROR_RE = re.compile(re.escape(CONFIG_ERROR_PREFIX) + r".*")
ERROR_RE = re.compile(re.escape(ERROR_PREFIX) + r".*")  # error(): a failed run's own one-line account
NONFINITE_RE = re.compile(re.escape(ERROR_PREFIX) + r"non-finite (loss|grad norm) \S+ at optimizer step (\d+): ")
PEER_FAILURE_RE = re.compile(re.escape(ERROR_PREFIX) + r".*node \d+ went first: ")
# A journal line that states why a start failed: the config error line, or the last line of a
# Python traceback (`pkg.module.SomeError: message`). Python `re` syntax: Jinja's `search` uses it.
START_FAILURE_PATTERN = (r"^(" + re.escape(CONFIG_ERROR_PREFIX)
                         + r"|([A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_]*(Error|Exception|Interrupt|Exit)\b)")
