#!/usr/bin/env bash
# A/B of two raidctl binaries on the same members, alternating, in one run:
# RAID6 of 6 x 512 MiB sparse files on tmpfs (4+2, chunk 64 KiB), CPU
# parity engine; 1 GiB sequential write and a scrub through each, then a
# member failed and a 1 GiB degraded sequential read through each. Round 0
# warms the members and is not counted. OLD must read the same on-disk
# format. Needs qemu-io and bc.
#   OLD=/path/to/old/raidctl bash scripts/bench-ab.sh
set -euo pipefail
OLD=${OLD:?set OLD to the raidctl binary to compare against (e.g. one built from an earlier commit)}
NEW=${NEW:-$(cd "$(dirname "$0")/.." && pwd)/target/release/raidctl}
D=${AB_DIR:-/dev/shm/raid-ab}
export RAIDCTL_LOG=warn
. "$(dirname "$0")/env.sh"
rm -rf $D; mkdir -p $D
M="$D/m0 $D/m1 $D/m2 $D/m3 $D/m4 $D/m5"
for i in 0 1 2 3 4 5; do truncate -s 512M $D/m$i; done
$NEW --state-dir $D/st-new create ab --level 6 --parity cpu --sparse $M >/dev/null
$OLD --state-dir $D/st-old start ab --members $M >/dev/null; $OLD --state-dir $D/st-old stop ab >/dev/null
now() { date +%s.%N; }
bin_of() { if [ $1 = new ]; then echo $NEW; else echo $OLD; fi; }
io() { qemu-io --image-opts "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$D/$1.sock,file.export=ab" -c "$2"; }
for round in 0 1 2 3 4 5; do
  for b in old new; do
    bin=$(bin_of $b); st=$D/st-$b
    $bin --state-dir $st start ab --nbd unix:$D/$b.sock >/dev/null
    t0=$(now); io $b "write -P $round 0 1G" >/dev/null; t1=$(now)
    $bin --state-dir $st scrub ab | grep -q " 0 mismatches"; t2=$(now)
    $bin --state-dir $st stop ab >/dev/null
    printf "%s round %s: seq write 1 GiB %.2f s, scrub %.2f s\n" $b $round $(echo "$t1 - $t0" | bc) $(echo "$t2 - $t1" | bc)
  done
done
$NEW --state-dir $D/st-new start ab >/dev/null; $NEW --state-dir $D/st-new fail ab $D/m2 >/dev/null; $NEW --state-dir $D/st-new stop ab >/dev/null
for round in 0 1 2 3 4 5; do
  for b in old new; do
    bin=$(bin_of $b); st=$D/st-$b
    $bin --state-dir $st start ab --nbd unix:$D/$b.sock >/dev/null
    t0=$(now); io $b "read -P 5 0 1G" | grep -q "read 1073741824"; t1=$(now)
    $bin --state-dir $st stop ab >/dev/null
    printf "%s round %s: degraded seq read 1 GiB %.2f s\n" $b $round $(echo "$t1 - $t0" | bc)
  done
done
rm -rf $D
