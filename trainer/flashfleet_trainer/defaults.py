"""The drafter's and the loss's default constants: defined in flashfleet.plan.defaults (below the
trainer and the controller, with the run's settings), named here for the trainer's modules."""

from flashfleet.plan.defaults import (  # noqa: F401
    BLOCK_SIZE,
    DECAY_GAMMAS,
    DFLASH2,
    DFLASH2_TARGET_LAYERS,
    DRAFTER_KINDS,
    HYBRID_DRAFTER,
    MOE_MLP_PER_HIDDEN,
    RANDOM_DRAFTER_LAYERS,
    SPARE_MASK_ROWS,
)
