"""`dflash-train`: parse, run, and map failures to exit codes.

0 = finished or stopped by SIGTERM after saving; 78 = configuration/start-up error, printed as
ONE line on stderr (the unit does not restart on it), a malformed command line included;
65 = the loss or gradient norm became NaN or infinite (one line on stderr and in status.json's
last_error; the newest checkpoint is the last good one); 1 with one line = a vLLM target server
failed (--target-servers: the unit's restart resumes once it answers again; a server of another model
is 78); anything else propagates as a traceback
(for the journal) after the rank (trainer.run_rank) has recorded it in status.json.
What runs after parsing (check, plan, one process or a node) is launch.run's choice.
"""

import sys

from flashfleet.contract.messages import EX_CONFIG, EX_NONFINITE

from .config import parse_args
from .errors import ConfigError, NonFiniteLoss, TargetServerError


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        from .launch import run  # heavy imports (torch, transformers) after argument parsing

        return run(args, log=lambda s: print(s, flush=True))
    except ConfigError as e:
        print(e.line(), file=sys.stderr, flush=True)
        return EX_CONFIG
    except NonFiniteLoss as e:
        print(e.line(), file=sys.stderr, flush=True)
        return EX_NONFINITE
    except TargetServerError as e:  # a server to restart, not a bug: one line (a traceback's last), and a retry
        print(f"{type(e).__module__}.{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
