"""flashfleet's DFlash drafter trainer.

Modules, in reading order:
  config      the command line (every flag of the real run), --config JSON, ConfigError (exit 78)
  data        Parquet loading, deterministic shuffling, packing by token budget, anchor sampling
  model       the target's hidden-state producer and the DFlash drafter
  loss        the one loss entry point (fused kernel when present, plain torch otherwise), weights
  checkpoint  atomic checkpoints with a manifest; resume picks the newest complete one
  metrics     metrics.jsonl and status.json
  notify      sd_notify over $NOTIFY_SOCKET
  wandb_compat  a version-checked wandb wrapper that fails at --check, not an hour in
  train       the training loop;  cli  the console script;  evaluate  real acceptance length tau
  tiny        a tiny Qwen3 target and data set, so all of the above runs on a laptop CPU
"""

__version__ = "0.1.0"
