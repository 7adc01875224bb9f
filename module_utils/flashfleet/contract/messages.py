"""The trainer's exit codes and the one-line messages its readers match.

The trainer prints these (stderr, hence the journal); the classifier, the train_unit role (its
start-failure message) and the unit template (RestartPreventExitStatus) read them from here.
"""

import re

PROGRAM = "flashfleet-train"
EX_CONFIG = 78  # a deterministic start-up error (BSD EX_CONFIG): the unit does not restart on it

CONFIG_ERROR_PREFIX = f"{PROGRAM}: config error: "
ERROR_PREFIX = f"{PROGRAM}: error: "


def config_error(what: str, fix: str) -> str:
    """The one line a refused start prints: what is wrong and how to fix it."""
    return f"{CONFIG_ERROR_PREFIX}{what} (fix: {fix})"


def error(text: str) -> str:
    """The one line a failed multi-process run prints (the node's own account of the failure)."""
    return f"{ERROR_PREFIX}{text}"


def went_first(node: int, first: int, why: str) -> str:
    """A node's account of a failure another node started."""
    return f"node {node}: stopping, node {first} went first: {why}"


def also_went_first(msg: str, first: int, why: str) -> str:
    """A node's own failure, with the node that failed before it."""
    return f"{msg}; node {first} went first: {why}"


CONFIG_ERROR_RE = re.compile(re.escape(CONFIG_ERROR_PREFIX) + r".*")
PEER_FAILURE_RE = re.compile(re.escape(ERROR_PREFIX) + r".*node \d+ went first: ")
# A journal line that states why a start failed: the config error line, or the last line of a
# Python traceback (`pkg.module.SomeError: message`). Python `re` syntax: Jinja's `search` uses it.
START_FAILURE_PATTERN = (r"^(" + re.escape(CONFIG_ERROR_PREFIX)
                         + r"|([A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_]*(Error|Exception|Interrupt|Exit)\b)")
