# flashfleet: every set-up step a fresh Debian 12 machine needs, and the test entry points.
#   make demo       the main job: platform, node image, local node, provision, train, diagnose, collect
#   make test       everything CI runs: lint, pytest (all), molecule test --all
#   make test-fast  lint + pytest without containers (minutes)
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
PYTEST_FAST := -m "not containers and not cuda"

.PHONY: help venv platform image node demo lint pytest-fast pytest-containers molecule test test-fast lock wheelhouse clean-node

help:
	@grep -E '^#   make' Makefile | sed 's/^#   //'

# The controller venv: pinned Ansible, test tools and the trainer's CPU stack, then the project
# itself (editable). Re-created when the lock changes.
$(VENV)/.installed: requirements/controller.lock pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/controller.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $@
venv: $(VENV)/.installed

platform:
	@bash platform/setup.sh

image: platform
	@bash platform/build-node-image.sh

node: venv image
	ansible-playbook playbooks/local_node.yml

demo: node
	@start=$$(date +%s); \
	ansible-playbook provision.yml; \
	echo "demo: provision took $$(( $$(date +%s) - start )) s"

lint: venv
	yamllint -s .
	ruff check .
	ansible-lint --profile production

pytest-fast: venv
	pytest -q $(PYTEST_FAST)

pytest-containers: venv image
	pytest -q -m containers

molecule: venv image
	molecule test --all

test-fast: lint pytest-fast

test: lint pytest-fast pytest-containers molecule

# Re-resolve the locks after editing requirements/*.in (needs the registries; not part of CI).
lock: venv
	uv pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  $(if $(FIND_LINKS),--find-links $(FIND_LINKS)) --no-header --annotation-style line \
	  -c requirements/controller.lock requirements/node-cpu.in -o requirements/node-cpu.lock

clean-node:
	ansible-playbook playbooks/local_node.yml -e local_node_state=absent
