"""The run plan, below the trainer and the controller (standard library only).

    settings   RunConfig: every setting of dflash-train, in sections that own their fields
    defaults   the constants the drafter's and the loss's defaults follow
    gpus       the GPU-list grammar ("0,1", "cpu,cpu")
    entry      what is wrong with a run's entry of flashfleet_runs (the only refusal of one)
    run        plan_run: everything one host of a run receives, derived once
"""
