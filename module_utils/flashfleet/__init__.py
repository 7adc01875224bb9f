"""flashfleet's own Python outside the trainer: the run's on-host contract and its readers.

Standard library only, so the same files run in three places:
  - on a GPU host, inside an Ansible module: Ansible ships this package with the module as
    `ansible.module_utils.flashfleet` (ansible.cfg's `module_utils = module_utils`); that is why
    every import inside it is relative;
  - in the trainer (`flashfleet_trainer` imports `flashfleet.contract` to write what it leaves);
  - on the controller: filter plugins and the console scripts `flashfleet-classify` and
    `flashfleet-report` import it from the installed project.

    contract/   what the trainer leaves on a host and how every reader reads it (see its __init__)
    evidence    gathering a host's evidence (the flashfleet_evidence module's logic)
    classify    evidence -> one verdict per host (diagnose.yml, flashfleet-classify)
    stage       dataset/model staging (the flashfleet_stage module's logic)
    envdrift    a venv against its lock (the python_env_drift module's logic)
    report      runs/<run>/report.html (collect.yml, flashfleet-report)
    cudacompat  the CUDA toolkit -> minimum NVIDIA driver table (the cuda_toolkit role's filters)
"""
