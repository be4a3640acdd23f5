#!/usr/bin/env bash
# The main job on a fresh machine: build raidctl, prove the parity kernels,
# then run a RAID6 on member files in ./demo for real: create, start
# (serving NBD), write and read back data through the array, fail a member,
# show it degraded, replace the member, wait for the rebuild, show it
# optimal, verify the data again, stop.
#
# DEMO_DIR picks the folder (default ./demo); nothing outside it is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
root=$(pwd)
demo=${DEMO_DIR:-$root/demo}

cargo build --release -p raidctl
raidctl=$root/target/release/raidctl
export RAIDCTL_STATE_DIR=$demo/state
export RAIDCTL_LOG=${RAIDCTL_LOG:-warn}

step() { printf '\n== %s\n' "$*"; }

step "parity self-test"
"$raidctl" selftest

if command -v qemu-io >/dev/null; then :; else
  echo "qemu-io (Debian package qemu-utils) is needed to talk to the NBD export" >&2
  exit 1
fi

# A previous run may have left the array running.
"$raidctl" stop demo 2>/dev/null || true
rm -rf "$demo"
mkdir -p "$demo"
for i in 0 1 2 3 4 5; do truncate -s 1G "$demo/member$i.img"; done

step "create a RAID6 of 4 1 GiB files (create allocates them: a full filesystem never stops the array)"
"$raidctl" create demo --level 6 --chunk 64K "$demo"/member{0,1,2,3}.img

step "start it, serving NBD on $demo/demo.sock"
"$raidctl" start demo --nbd "unix:$demo/demo.sock"
"$raidctl" status demo

nbd="driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$demo/demo.sock,file.export=demo"
qio() { qemu-io --image-opts "$nbd" "$@"; }

step "write 256 MiB of patterns through the array, read them back"
qio -c 'write -P 0x5a 0 128M' -c 'write -P 0xa5 128M 128M' -c 'read -P 0x5a 0 128M' -c 'read -P 0xa5 128M 128M'

step "fail a member: the array runs degraded, data still reads back"
"$raidctl" fail demo "$demo/member1.img"
# status's exit code says the health: 0 optimal, 1 degraded, 2 failed.
"$raidctl" status demo || echo "(status exit code $?: degraded)"
qio -c 'read -P 0x5a 0 128M' -c 'read -P 0xa5 128M 128M'

step "what would corrupt it is refused: an active member as the replacement"
if "$raidctl" replace demo "$demo/member1.img" "$demo/member0.img"; then
  echo "replace onto an active member was accepted" >&2
  exit 1
fi

step "replace it with a new member and rebuild"
"$raidctl" replace demo "$demo/member1.img" "$demo/member4.img"
"$raidctl" wait demo
"$raidctl" status demo
qio -c 'read -P 0x5a 0 128M' -c 'read -P 0xa5 128M 128M'

if [ "$(id -u)" -eq 0 ] && [ -e /dev/fuse ] && command -v losetup mkfs.ext4 >/dev/null; then
  step "mount it as a block device (FUSE file + loop), put ext4 on it, use it"
  dev=$("$raidctl" mount demo --loop | head -1)
  echo "block device: $dev"
  mkfs.ext4 -q -F "$dev"
  mkdir -p "$demo/fs"
  mount "$dev" "$demo/fs"
  cp -r "$root/docs" "$demo/fs/"
  sync
  df -h "$demo/fs"
  ls -l "$demo/fs/docs"
  (cd "$demo/fs" && find . -type f -exec sha256sum {} + > "$demo/sums")
  step "fail another member under the mounted filesystem: every file still matches"
  "$raidctl" fail demo "$demo/member2.img"
  echo 3 > /proc/sys/vm/drop_caches
  (cd "$demo/fs" && sha256sum --quiet -c "$demo/sums") && echo "all files intact"
  "$raidctl" replace demo "$demo/member2.img" "$demo/member5.img"
  "$raidctl" wait demo
  (cd "$demo/fs" && sha256sum --quiet -c "$demo/sums") && echo "all files intact after the rebuild"
  umount "$demo/fs"
  "$raidctl" unmount demo
  "$raidctl" status demo
else
  echo "(skipping the filesystem part: it needs root, /dev/fuse, losetup and mkfs.ext4)"
fi

step "stop (flushed, clean); status now comes from the members' metadata"
"$raidctl" stop demo
"$raidctl" status demo
echo
echo "main job done: the demo array's members are in $demo"
