"""What one `dflash-train` does after parsing: check, plan, train in this process, or run a node.

    preflight   always first (preflight.py): the same checks for --check and for a real start
    --check     print what preflight found, exit 0
    --serve-config  print, as JSON, the arguments a vLLM target server needs for this run and its layers
    --plan      measure one target and one drafter, print the best split of the node (planner.py)
    otherwise   one target + one drafter on one device: this process is the one rank (trainer.py);
                anything else: this process starts and watches the node's workers (topology.py)
"""

import json
from pathlib import Path

from flashfleet.contract.layout import CHECKPOINTS

from .checkpoint import prepare as prepare_checkpoints
from .planner import run_plan
from .preflight import preflight
from .topology import supervise
from .trainer import run_rank


def run(args, log=print, on_step=None) -> int:
    """Preflight, then --check, --plan, or train. ConfigError propagates (the CLI turns it into exit 78)."""
    facts = preflight(args)
    if args.serve_config:
        from .vllm_format import server_layer_ids
        from .vllm_target import serve_argv

        log(json.dumps({"argv": serve_argv(facts.layer_ids, facts.num_target_layers),
                        "layers": server_layer_ids(facts.layer_ids, facts.num_target_layers)}))
        return 0
    if args.check:
        for line in facts.summary:
            log("check: " + line)
        log("check: ok")
        return 0
    if args.plan:
        return run_plan(args, facts, log)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)  # the start is known good: writes begin here
    # leftovers cleaned, broken newest moved aside (as preflight found them: nothing hashed again)
    prepare_checkpoints(Path(args.output_dir) / CHECKPOINTS, log, facts.checkpoints)
    if facts.in_process(args):
        run_rank(args, facts, log, on_step)
        return 0
    return supervise(args, facts, log)
