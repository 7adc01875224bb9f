"""flashfleet's DFlash drafter trainer.

Modules, in reading order (docs/trainer.md, "Modules (reading order)", says what each owns; a test
keeps both lists equal to the package's files):
dflash-train, from the command line down:
  cli           the console script: parse, launch.run, exit codes (78 ConfigError, 65 NonFiniteLoss)
  config        the command line from RunConfig (flashfleet.plan.settings): parsed once, --config JSON
                under the flags given, checks; a frozen RunConfig out
  errors        ConfigError, NonFiniteLoss, TargetServerError: the errors cli maps to exit codes
  defaults      the constants the drafter's and the loss's defaults follow (from flashfleet.plan.defaults)
  launch        check / plan / one process / a node
  preflight     everything --check validates, as ordered checks (CHECKS), and the StartFacts a run starts from
  transport     which transport the drafter ranks' collectives will use, for --check to say
  planner       --plan: measure both sides once and choose the split of a node's devices
  topology      target and drafter processes, nodes, rendezvous, heartbeats
  trainer       one drafter rank's training loop (Trainer), read top to bottom
  feed          where a drafter rank's hidden states come from (in-process or a queue)
  target        supported targets, their loading, the target layer ids, the HiddenStateProducer
  compilation   the target's decoder layers compiled; the recompile limit every compiled path raises
  short_conv    a hybrid target's short convolution through flash-linear-attention's kernel
  loadwatch     the target's load watched: progress in status.json, systemd's start timeout extended
  data          Parquet loading (its column names), deterministic shuffling, packing by token budget, anchors
  drafter       the DFlash drafter: DrafterConfig, its modules, its forward over a micro-batch's blocks
  dflash2       DFlash 2's convolution and candidate selector, the selector's loss, its refusals
  attention     the drafter's attention masks: the dense reference and the flex BlockMask
  optim         the drafter's AdamW and clipped_step
  loss          the one loss entry point (fused kernel when present, plain torch otherwise), weights
  checkpoint    saving and loading atomic checkpoints (what "complete" means: flashfleet.contract)
  metrics       the writers of metrics.jsonl and status.json (their format: flashfleet.contract)
  notify        sd_notify over $NOTIFY_SOCKET (one Notifier type, with a no-op variant)
  wandb_compat  a version-checked wandb wrapper that fails at --check, not an hour in
evaluation and export:
  evaluate      dflash-eval: real acceptance length tau (speculative decoding, greedy or sampled)
  sampling      the draft-verify loop's acceptance rule, greedy or sampled
  hybrid_cache  a hybrid target's linear-attention state kept at the committed position
  export        dflash-export: a checkpoint as the DFlash directory vLLM, SGLang and z-lab load
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
targets and measurements without a download:
  tiny        dflash-tiny: a tiny Qwen3 (or hybrid) target and data set, so all of the above runs on a CPU
  tinytext    dflash-tiny-text: a tiny target trained on Python stdlib source, its data and prompts
  shapes      random-weight targets at real shapes, and random-token data, for throughput measurements
  gpu_probe   the GPU health check's measurements (matmul, all-reduce) with the trainer's torch
"""

__version__ = "0.1.0"
