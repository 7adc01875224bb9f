#!/usr/bin/python
"""Ansible module flashfleet_stage: stage a dataset or a model onto a host, verified.

Its options are declared here; the logic is module_utils/flashfleet/stage.py, which Ansible ships
with the module (ansible.cfg: module_utils = module_utils) and tests import as flashfleet.stage.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.flashfleet.stage import run_module

DOCUMENTATION = r"""
module: flashfleet_stage
short_description: Stage files from S3, https, or a local directory, verified against a manifest
description:
  - Lists the source (S3 ListObjectsV2 under a prefix; for https the manifest's or I(files)' names),
    then fetches every file that is missing, short, or corrupt, C(concurrency) files at a time.
  - Resumes partial files with Range requests; verifies size and sha256; writes the manifest
    (C(.flashfleet-manifest.json) in the destination) after the first complete download.
  - With I(fallback_dest), chooses I(dest) only when its file system has room for the files plus a
    margin, else I(fallback_dest) with a warning (or a failure with I(fallback_policy=fail)).
  - With I(src) omitted, only verifies I(dest) against I(manifest) (and places, see I(fallback_dest));
    absent or short files are listed in C(missing), for a caller that copies them (rsync). Nothing is
    deleted; a file of other content fails the task unless I(repair=true) (then it is listed too).
  - Everything is checked before anything is written (options, that I(dest) is writable, the
    source's sizes against I(manifest)); a refused run creates nothing. Every failure is a JSON
    result with C(host), C(file), C(problem) and C(fix), never a traceback.
  - Only transient network errors are retried (I(retries)); a size or checksum mismatch fails at
    once and its partial file is removed.
  - With I(mode=manifest), only computes the manifest of the local directory I(src).
  - With I(verify=quick) (default), a file whose size and mtime match the record of its last
    verification in C(.flashfleet-manifest.json) is not hashed again; I(verify=full) hashes all.
options:
  src:
    description: C(s3://bucket/prefix), C(https://host/base/), or (mode=manifest) a local directory.
    type: str
  dest:
    description: Directory to stage into (preferred place).
    type: path
  fallback_dest:
    description: Where to stage when I(dest)'s file system lacks room.
    type: path
  verify:
    description: C(quick) trusts a file's last verification while its size and mtime are unchanged; C(full) re-hashes.
    type: str
    choices: [quick, full]
    default: quick
  fallback_policy:
    description: C(warn) stages to I(fallback_dest) with a warning; C(fail) makes it an error.
    type: str
    choices: [warn, fail]
    default: warn
  free_margin_ratio:
    description: Free space to keep on I(dest)'s file system, as a fraction of the total size.
    type: float
    default: 0.1
  free_margin_bytes:
    description: Free space to keep at least, in bytes (the larger margin wins).
    type: int
    default: 0
  manifest:
    description: 'Expected files, C({relative path: {size: int, sha256: hex}}); pins the content.'
    type: dict
  files:
    description: Relative names to fetch under an https base URL when no manifest is given.
    type: list
    elements: str
  concurrency:
    description: Files fetched at once (1-256).
    type: int
    default: 8
  endpoint_url:
    description: S3 endpoint (empty for AWS).
    type: str
  region:
    description: S3 region.
    type: str
    default: us-east-1
  access_key:
    description: S3 access key (empty for the host's own credential chain).
    type: str
    no_log: true
  secret_key:
    description: S3 secret key.
    type: str
    no_log: true
  session_token:
    description: S3 session token.
    type: str
    no_log: true
  verify_tls:
    description: Check the TLS certificate of S3 and https sources.
    type: bool
    default: true
  retries:
    description: Attempts per file on transient network errors (timeouts, resets, 5xx); a mismatch is never retried.
    type: int
    default: 3
  repair:
    description:
      - Replace a staged file whose content differs from the manifest (from the source; without
        I(src), list it in C(missing) for the caller's copy). Without it such a file fails the
        task, named, and is left as it is.
    type: bool
    default: false
  check_safetensors:
    description: Parse every *.safetensors header and check the shards against the index.
    type: bool
    default: false
  host_label:
    description: Name of the host in messages (the inventory name).
    type: str
  progress_file:
    description:
      - Where to write the transfer's progress while files download (JSON, rewritten atomically every
        few seconds; C(bytes_done), C(bytes_total), C(files_done), C(files_total), C(file),
        C(elapsed_s), C(done)), for a caller that runs the module async and prints it. Its directory
        should be private to the module's user (the dataset role uses a fresh temporary one).
    type: path
  mode:
    description: C(stage) stages (or, without I(src), verifies); C(manifest) only hashes I(src).
    type: str
    choices: [stage, manifest]
    default: stage
"""

RETURN = r"""
dest:
  description: Where the files are (I(dest) or I(fallback_dest)).
  type: str
placement:
  description: C(preferred) or C(fallback).
  type: str
counts:
  description: Files per action (skipped, downloaded, resumed, refetched).
  type: dict
bytes_transferred:
  description: Bytes moved from the source in this run.
  type: int
total_bytes:
  description: Bytes of all the files, staged or not.
  type: int
seconds:
  description: Seconds of the transfer phase.
  type: float
throughput_bps:
  description: Bytes transferred per second of the transfer phase (0 when nothing moved).
  type: float
manifest:
  description: 'The manifest, C({path: {size, sha256}}).'
  type: dict
missing:
  description: Verify-only mode, files to copy (absent, short, or with I(repair) of other content).
  type: list
mismatched:
  description: Verify-only mode, files of other content than the manifest (only with I(repair); else a failure).
  type: list
host:
  description: On failure, the host (I(host_label)).
  type: str
file:
  description: On failure, the file, directory or source URL concerned.
  type: str
problem:
  description: On failure, what is wrong.
  type: str
fix:
  description: On failure, what to do about it.
  type: str
"""

EXAMPLES = r"""
- name: Stage a tokenized dataset from S3 (the host fetches it, 16 files at once)
  flashfleet_stage:
    src: s3://datasets/tokenized_completions
    dest: /var/lib/flashfleet/data/tokenized_completions
    endpoint_url: https://s3.example.internal
    access_key: "{{ dataset_s3_access_key }}"
    secret_key: "{{ dataset_s3_secret_key }}"
    concurrency: 16
  vars:
    ansible_python_interpreter: /opt/flashfleet/venv/bin/python  # boto3

- name: A model to tmpfs when it fits with 10% to spare, else to disk with a warning
  flashfleet_stage:
    src: s3://models/Qwen3.6-27B
    dest: /dev/shm/models/Qwen3.6-27B
    fallback_dest: /var/lib/flashfleet/models/Qwen3.6-27B
    check_safetensors: true

- name: Hash a directory on the controller (the manifest a host copy is verified against)
  flashfleet_stage:
    mode: manifest
    src: /srv/models/tiny
  delegate_to: localhost
"""


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="str"),
            dest=dict(type="path"),
            fallback_dest=dict(type="path"),
            fallback_policy=dict(type="str", choices=["warn", "fail"], default="warn"),
            free_margin_ratio=dict(type="float", default=0.1),
            free_margin_bytes=dict(type="int", default=0),
            manifest=dict(type="dict"),
            files=dict(type="list", elements="str"),
            concurrency=dict(type="int", default=8),
            endpoint_url=dict(type="str"),
            region=dict(type="str", default="us-east-1"),
            access_key=dict(type="str", no_log=True),
            secret_key=dict(type="str", no_log=True),
            session_token=dict(type="str", no_log=True),
            verify_tls=dict(type="bool", default=True),
            retries=dict(type="int", default=3),
            repair=dict(type="bool", default=False),
            check_safetensors=dict(type="bool", default=False),
            host_label=dict(type="str"),
            mode=dict(type="str", choices=["stage", "manifest"], default="stage"),
            verify=dict(type="str", choices=["quick", "full"], default="quick"),
            progress_file=dict(type="path"),
        ),
        required_together=[["access_key", "secret_key"]],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
