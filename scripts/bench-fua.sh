#!/usr/bin/env bash
# A/B of two raidctl builds on an NBD client's FUA writes, alternating on
# the same array in one run: RAID5 of 4 member files of 256 MiB (chunk
# 64 KiB) in D (default /var/tmp/raid-fua: the VM's disk, where a durable
# write costs the disk's flush; AB_DIR=/dev/shm/... for members in
# memory). Each round sends N (default 2000) 4 KiB writes with FUA at
# random offsets, one at a time (qemu-io's `write -f`: a database's log),
# to each build's export in turn; the first round warms the members and
# is not counted. Prints writes per second by build and round.
#   OLD=/path/to/old/raidctl bash scripts/bench-fua.sh
set -euo pipefail
D=${AB_DIR:-/var/tmp/raid-fua}
ARRAY=fua
N=${N:-2000}
ROUNDS=${ROUNDS:-4}
. "$(dirname "$0")/two-builds.sh"
rm -rf $D; mkdir -p $D
M="$D/m0 $D/m1 $D/m2 $D/m3"
for i in 0 1 2 3; do truncate -s 256M $D/m$i; done
$NEW --state-dir $D/st create $ARRAY --level 5 --parity cpu $M >/dev/null
# One command file of N FUA writes at random 4 KiB blocks of the first
# 512 MiB (the array holds 768 MiB), the same for every round.
awk -v n=$N 'BEGIN { srand(7); for (i = 0; i < n; i++) printf "write -f -q -P %d %d 4k\n", i % 250, int(rand() * 131072) * 4096 }' > $D/cmds
now() { date +%s.%N; }
for round in $(seq 0 $ROUNDS); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    daemon_gone
    $bin --state-dir $D/st start $ARRAY --nbd unix:$D/fua.sock >/dev/null
    t0=$(now)
    qemu-io --image-opts "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$D/fua.sock,file.export=$ARRAY" < $D/cmds >/dev/null
    t1=$(now)
    $bin --state-dir $D/st stop $ARRAY >/dev/null
    [ $round = 0 ] && continue
    awk -v b=$b -v r=$round -v n=$N -v t0=$t0 -v t1=$t1 'BEGIN { printf "%s round %s: %d FUA writes in %.2f s, %.0f a second\n", b, r, n, t1 - t0, n / (t1 - t0) }'
  done
done
