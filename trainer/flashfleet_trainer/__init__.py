"""flashfleet's DFlash drafter trainer.

Modules, in reading order:
  config      the command line (every flag of the real run), --config JSON, ConfigError (exit 78)
  data        Parquet loading (its column names), deterministic shuffling, packing by token budget, anchors
  model       the target's hidden-state producer and the DFlash drafter
  loss        the one loss entry point (fused kernel when present, plain torch otherwise), weights
  checkpoint  saving and loading atomic checkpoints (what "complete" means: flashfleet.contract)
  metrics     the writers of metrics.jsonl and status.json (their format: flashfleet.contract)
  notify      sd_notify over $NOTIFY_SOCKET (one Notifier type, with a no-op variant)
  wandb_compat  a version-checked wandb wrapper that fails at --check, not an hour in
  preflight   everything --check validates, and the StartFacts a run starts from
  feed        where a drafter rank's hidden states come from (in-process or a queue)
  trainer     one drafter rank's training loop (Trainer), read top to bottom
  topology    target and drafter processes, nodes, rendezvous, heartbeats
  planner     --plan: measure both sides once and choose the split of a node's devices
  launch      check / plan / one process / a node;  cli  the console script
  evaluate    real acceptance length tau
  tiny        a tiny Qwen3 target and data set, so all of the above runs on a laptop CPU
  export      dflash-export: a checkpoint as the DFlash directory vLLM, SGLang and z-lab load
vLLM (docs/trainer.md, "The target in vLLM"; docs/export.md, "Serving"):
  vllm_target       --target-servers: the target computed by vLLM servers, a feed over them, the probe
  vllm_format       the hand-over file's keys and the layers a server extracts (standard library)
  vllm_connector    the KV connector the servers load (runs in vLLM's venv)
  vllm_serve_check  an export served by vLLM's own engine: its acceptance and outputs (vLLM's venv)
dflash-data, the training data from conversations (docs/data.md):
  conversations   ShareGPT / OpenAI-messages records (JSONL, Parquet) as one shape
  chat_template   the target's tokenizer and chat template: a conversation as ids and a loss mask
  data_build      rows, length cap, duplicates, atomic shards, the summary (`build`)
  data_regenerate the prompts answered by the target's vLLM server, the resumable ledger
  data_cli        the `dflash-data` console script
"""

__version__ = "0.1.0"
