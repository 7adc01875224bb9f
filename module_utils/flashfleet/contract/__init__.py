"""The run's on-host contract: one owner for each fact the trainer writes and others read.

    layout      names inside a run's output directory, the unit name
    files       sha256 of a file, fsync, atomic writes (temp file, fsync, rename)
    status      status.json: phases, the record, atomic write, tolerant read
    checkpoint  checkpoint names, temp prefix, manifest, verification
    safetensors the safetensors header check (one parser for checkpoints and staged models)
    locks       lock files: parsing and comparison with an installed venv (one rule set)
    messages    the trainer's exit codes and the one-line messages readers match
    metrics     the metrics.jsonl record: its keys, written down once, and a tolerant reader

Host paths (/opt/flashfleet/venv, /var/lib/flashfleet/runs, /etc/flashfleet/runs) are Ansible
variables, set once in roles/flashfleet_contract/defaults/main.yml; the Python here takes them
as arguments.
"""
