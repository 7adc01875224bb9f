"""The errors a dflash-train process ends on, each mapped to one exit code by cli.main.

ConfigError -> 78 (EX_CONFIG: a human must fix it; the unit does not restart), NonFiniteLoss -> 65
(EX_NONFINITE), TargetServerError -> 1 (a vLLM server to wait for; the unit's restart resumes). The
codes and the one-line messages are owned by flashfleet.contract.messages, which the diagnosis reads
too.
"""

import argparse

from flashfleet.contract import messages


class ConfigError(Exception):
    """A deterministic configuration or start-up error: retrying cannot help, a human must fix it."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what, self.fix = what, fix

    def line(self) -> str:
        return messages.config_error(self.what, self.fix)


class CliParser(argparse.ArgumentParser):
    """argparse whose usage errors (unknown flag, missing or malformed value) are ConfigErrors: one
    line and exit 78 like every other refused start, not argparse's usage block and exit 2. Every
    entry point's parser (and its subcommands': argparse makes them of this class too)."""

    def error(self, message):
        raise ConfigError(message, f"see {self.prog.split()[0]} --help")

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for act in self._actions:  # `--flag=--`: Python 3.11's argparse gives [] for the one value
            v = getattr(ns, act.dest, None)
            if act.option_strings and act.nargs is None and v == [] and v is not self.get_default(act.dest):
                self.error(f"argument {act.option_strings[0]}: expected one value, got '--'")
        return ns, rest


class TargetServerError(RuntimeError):
    """A vLLM target server (--target-servers) is unreachable, failed, or handed back features the
    run must not train on: exit 1, so the unit's restart resumes once the server answers again."""


class UnreachableServerError(TargetServerError):
    """The server did not answer at all (not started yet, restarting, or dead)."""


class NonFiniteLoss(Exception):
    """The loss (or gradient norm) of an optimizer step was NaN or infinite: the run stops without
    saving that state; the CLI prints line() and exits EX_NONFINITE."""

    def __init__(self, step: int, value: float, what: str = "loss"):
        super().__init__(messages.nonfinite_loss(step, value, what))
        self.step, self.value, self.what = step, value, what

    def line(self) -> str:
        return str(self)
