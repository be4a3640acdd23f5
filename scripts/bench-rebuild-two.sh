#!/usr/bin/env bash
# A RAID6 that lost two members, both replaced: how long until each new
# member is in sync, two raidctl binaries alternating on the same kind of
# array in one run. RAID6 of 6 files on the machine's own disk (members are
# opened with O_DIRECT), 4 x (member - 64 MiB) of data written through NBD
# first, two members failed (R2_LEVEL=10: a RAID10 of 6, 3 x (member - 64
# MiB) of data, slots 1 and 3 of two mirror pairs failed), then:
#   both: the second replaced right after the first (both pending at once);
#   mid:  the second replaced once the first's rebuild is half done (a
#         second failure during a rebuild).
# Prints, per round, the seconds from the first replace until the first
# new member is active and until the array is optimal.
#   OLD=/path/to/old/raidctl bash scripts/bench-rebuild-two.sh
#   (R2_DIR=/var/tmp/raid-r2 R2_SIZE=1G R2_ROUNDS=2 R2_MODES="both mid"
#    R2_LEVEL=6)
set -euo pipefail
D=${R2_DIR:-/var/tmp/raid-r2}
ARRAY=r2
SIZE=${R2_SIZE:-1G}
ROUNDS=${R2_ROUNDS:-2}
MODES=${R2_MODES:-both mid}
LEVEL=${R2_LEVEL:-6}
case $LEVEL in 6) DATA_MEMBERS=4 ;; 10) DATA_MEMBERS=3 ;; *) echo "bench-rebuild-two: R2_LEVEL is 6 or 10" >&2; exit 1 ;; esac
. "$(dirname "$0")/two-builds.sh"
# status exits 1 while degraded: its JSON is what counts.
json() { "$1" --state-dir $D/st status r2 --format json || true; }
slot_state() { json "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['members'][$2]['state'])"; }
percent() { json "$1" | python3 -c 'import json,sys; r=json.load(sys.stdin).get("rebuild") or {}; print(int(r.get("percent",0)))'; }
round() {
  local b=$1 mode=$2
  daemon_gone
  rm -rf $D; mkdir -p $D/st
  for i in 0 1 2 3 4 5; do truncate -s $SIZE $D/m$i; done
  for n in n1 n3; do
    truncate -s $SIZE $D/$n
    dd if=/dev/zero of=$D/$n bs=1M count=$(( $(stat -c %s $D/$n) / 1048576 )) conv=notrunc status=none
  done
  "$b" --state-dir $D/st create r2 --level $LEVEL --parity cpu --sparse $D/m0 $D/m1 $D/m2 $D/m3 $D/m4 $D/m5 >/dev/null
  "$b" --state-dir $D/st start r2 --nbd unix:$D/nbd.sock >/dev/null
  local cap=$(( ($(stat -c %s $D/m0) / 1048576 - 64) * DATA_MEMBERS )) o writes=()
  for ((o = 0; o < cap; o += 256)); do writes+=(-c "write -P 7 ${o}M $(( cap - o < 256 ? cap - o : 256 ))M"); done
  qemu-io --image-opts "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$D/nbd.sock,file.export=r2" \
    "${writes[@]}" >/dev/null
  "$b" --state-dir $D/st fail r2 $D/m1 >/dev/null
  "$b" --state-dir $D/st fail r2 $D/m3 >/dev/null
  local t0 t1="" t2
  t0=$(date +%s.%N)
  "$b" --state-dir $D/st replace r2 $D/m1 $D/n1 >/dev/null
  if [ "$mode" = mid ]; then
    while [ "$(percent "$b")" -lt 50 ]; do sleep 0.05; done
  fi
  "$b" --state-dir $D/st replace r2 $D/m3 $D/n3 >/dev/null
  while :; do
    if [ -z "$t1" ] && [ "$(slot_state "$b" 1)" = active ]; then t1=$(date +%s.%N); fi
    [ "$(json "$b" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" = optimal ] && break
    sleep 0.05
  done
  t2=$(date +%s.%N)
  [ -n "$t1" ] || t1=$t2
  "$b" --state-dir $D/st stop r2 >/dev/null
  printf "%-4s %-5s first member %6.2f s, optimal %6.2f s\n" "$3" "$mode" \
    "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t0" | bc)"
}
for mode in $MODES; do
  for ((r = 0; r < ROUNDS; r++)); do
    if (( r % 2 == 0 )); then round "$NEW" $mode new; round "$OLD" $mode old
    else round "$OLD" $mode old; round "$NEW" $mode new; fi
  done
done
