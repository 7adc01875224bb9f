"""Per-GPU health before a launch: each evidence source in its own module, each check a small pure
function of what the sources parsed, each threshold a documented setting (settings.py).

    settings    the thresholds, their defaults and where each default comes from
    nvidia_smi  `nvidia-smi -q`: ECC, retired pages / row remapping, clock event (throttle) reasons,
                PCIe link generation and width, persistence mode, the driver, UUID and bus id
    xid         the kernel log since boot: NVRM Xid lines by GPU (the Xid catalogue's actions)
    dcgm        `dcgmi diag -r N`: each test's result per GPU
    probe       the matmul rate per GPU and the NCCL all-reduce's bus bandwidth (measured by
                flashfleet_trainer.gpu_probe with the trainer's own torch), judged here
    checks      the checks, in order (CHECKS), and one row per GPU by UUID
    gather      running the commands on the host, each within the check's time budget
    __main__    `python -m flashfleet.gpu_health`: gather (or read recorded outputs), judge, print

Standard library only (it runs inside an Ansible module on the host, like the rest of flashfleet).
"""
