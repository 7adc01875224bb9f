"""A small wandb wrapper that is checked before a run starts.

The incident this exists for: a script passed private `_stats_*` settings to
`wandb.init(settings=...)`; wandb 0.19 renamed/removed them and, once pydantic v2 became
mandatory (wandb 0.27), the strict Settings model rejected them 60 s into a launch. Whether a
settings dict is accepted depends on two packages' versions together, so the only reliable
check is to build `wandb.Settings(**settings)` with the installed pair, offline, at `--check`
time, and report both versions when it fails. The trainer itself passes no private settings.
"""

import importlib.metadata as md
import json

from .errors import ConfigError


def versions() -> str:
    parts = []
    for pkg in ("wandb", "pydantic"):
        try:
            parts.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            parts.append(f"{pkg} not installed")
    return ", ".join(parts)


def parse_settings(text) -> dict:
    if text in (None, ""):
        return {}
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--wandb-settings is not JSON ({e})", "pass a JSON object, e.g. '{\"x_label\": \"a\"}'") from e
    if not isinstance(value, dict):
        raise ConfigError("--wandb-settings must be a JSON object", "pass a JSON object of wandb.Settings fields")
    return value


def check(project: str | None, run_name: str | None, settings: dict) -> str:
    """Validate the wandb configuration offline; return a one-line summary or raise ConfigError."""
    if not project:
        if run_name or settings:
            what = "--wandb-run-name" if run_name else "--wandb-settings"
            raise ConfigError(f"{what} given without --wandb-project", "add --wandb-project or drop it")
        return "wandb off (no --wandb-project)"
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(f"--wandb-project given but wandb cannot be imported ({e}; {versions()})",
                          "install the pinned wandb and pydantic from the lock file") from e
    try:
        wandb.Settings(**settings)
    except Exception as e:  # pydantic.ValidationError, TypeError from older wandb, ...
        keys = _rejected_keys(e) or sorted(settings)
        first = str(e).strip().splitlines()[-1].strip() if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"wandb setting(s) {', '.join(keys)} rejected by the installed {versions()}: {first}",
            "remove the setting(s) or use public wandb.Settings fields of this wandb version") from e
    return f"wandb project {project!r} ({versions()}; {len(settings)} setting(s) accepted)"


def _rejected_keys(exc) -> list[str]:
    try:
        return [".".join(str(p) for p in err["loc"]) for err in exc.errors()]
    except Exception:
        return []


class WandbRun:
    """wandb.init/log/finish behind three methods; a no-op when no project is configured.

    run_id: the run's stable W&B id (run.json, contract.starts), passed with resume="allow" so
    every restart continues the same W&B run (online; offline, each start writes its own
    wandb/offline-run-<time>-<id>[-n]/ directory with that id (wandb adds -n to a second start
    within the same second), and `wandb sync` sends them to the one run)."""

    def __init__(self, project, run_name, settings: dict, config: dict, directory, run_id: str | None = None):
        self.run = None
        if not project:
            return
        import wandb

        resume = {"id": run_id, "resume": "allow"} if run_id else {}
        # allow_val_change: a restart may change a flag (e.g. --max-steps); the config follows it
        self.run = wandb.init(project=project, name=run_name, dir=str(directory),
                              settings=wandb.Settings(**settings), **resume)
        self.run.config.update(config, allow_val_change=True)

    def log(self, record: dict, step: int) -> None:
        if self.run is not None:
            flat = {k: v for k, v in record.items() if isinstance(v, int | float)}
            for i, a in enumerate(record.get("acc") or []):
                flat[f"acc/pos{i + 1}"] = a
            self.run.log(flat, step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
