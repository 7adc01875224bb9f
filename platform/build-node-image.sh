#!/usr/bin/env bash
# Build localhost/flashfleet-node:bookworm, the systemd container every local node and Molecule
# scenario runs: Debian 12 minbase with systemd as PID 1, python3 and sshd (Ansible reaches it
# over SSH on a loopback-published port, like a real fleet). No registry is reachable, so the
# root filesystem comes from debootstrap and is imported with `podman import`.
#
# The image carries a label with the hash of this recipe; it is rebuilt only when the recipe
# changes (or FORCE=1). No SSH key is baked in: the node's authorized_keys is mounted at run time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=${FLASHFLEET_NODE_IMAGE:-localhost/flashfleet-node:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=systemd,systemd-sysv,dbus,python3,python3-apt,openssh-server,iproute2,procps,ca-certificates,rsync,sudo
recipe_hash=$( { cat "$0"; echo "$packages"; } | sha256sum | cut -c1-16)

current=$(podman image inspect --format '{{ index .Labels "flashfleet.recipe" }}' "$image" 2>/dev/null || true)
if [ "$current" = "$recipe_hash" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "node image: $image is up to date (recipe $recipe_hash)"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/flashfleet-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
echo "node image: debootstrap bookworm into $rootfs (recipe $recipe_hash)"
start=$(date +%s)
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2; echo "node image: debootstrap failed (log above)" >&2; exit 1; }

# Configure for a container: no getty, no hostname/kernel units that fail without privileges,
# sshd with key-only root login (the key is mounted at run time), an apt source for role installs.
chroot "$rootfs" /bin/sh -eu <<'CHROOT'
systemctl mask getty@tty1.service serial-getty@.service systemd-logind.service \
  systemd-remount-fs.service sys-kernel-debug.mount sys-kernel-tracing.mount \
  systemd-firstboot.service >/dev/null 2>&1 || true
systemctl enable ssh.service >/dev/null
mkdir -p /root/.ssh && chmod 700 /root/.ssh
printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' \
  > /etc/ssh/sshd_config.d/flashfleet.conf
echo 'deb http://deb.debian.org/debian bookworm main' > /etc/apt/sources.list
apt-get clean
apt-get update -qq  # fresh lists, so roles' cache_valid_time has a real stamp to compare
CHROOT
# Host keys generated at package install time would be shared by every node: regenerate them
# at each container's first boot instead.
rm -f "$rootfs"/etc/ssh/ssh_host_*
mkdir -p "$rootfs/etc/systemd/system/ssh.service.d"
cat > "$rootfs/etc/systemd/system/ssh.service.d/hostkeys.conf" <<'UNIT'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
UNIT

# A local node is a container sharing the controller's cores, which are busy with the controller's
# own work (Ansible, a test suite beside it): its units start with one OpenMP thread per process.
# A pool of two on a shared 2-core machine waits on a descheduled thread at every op (the demo's
# 20-step CPU run: 9.5 s with 2 threads and 10.2 s with 1 on a quiet machine, 23.2 s and 10.2 s
# with one core kept busy). A real GPU host's units are unaffected: this is the local image only.
mkdir -p "$rootfs/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultEnvironment=OMP_NUM_THREADS=1\n' > "$rootfs/etc/systemd/system.conf.d/flashfleet-local.conf"
tar -C "$rootfs" -c . | podman import \
  --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' \
  --change "LABEL flashfleet.recipe=$recipe_hash" - "$image" >/dev/null
echo "node image: built $image in $(( $(date +%s) - start )) s"
