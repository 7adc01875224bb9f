#!/usr/bin/env bash
# Install the container platform flashfleet's local node and Molecule tests run on:
# podman (rootful), runc and debootstrap from Debian; rsync (staging, collect) and chromium (the
# report.html browser test). Idempotent: installs only what is missing.
# Never edits /etc/containers; the project's own settings live in platform/containers.conf.
set -euo pipefail
missing=()
for tool in podman runc debootstrap ssh-keygen rsync chromium; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "platform: podman, runc, debootstrap, ssh, rsync and chromium already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "platform: missing ${missing[*]}; run 'make platform' as root (apt-get install)" >&2
  exit 1
fi
echo "platform: installing podman runc debootstrap openssh-client rsync chromium (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends podman runc debootstrap openssh-client rsync chromium \
  uidmap slirp4netns fuse-overlayfs iptables netavark aardvark-dns >/dev/null \
  || apt-get install -y -qq --no-install-recommends podman runc debootstrap openssh-client rsync chromium >/dev/null
podman --version
