#!/usr/bin/env bash
# The array's long jobs on the machine's own disk, timed, two raidctl
# binaries alternating on the same members in one run: a check-only scrub,
# a hot replace (an active member copied onto a new file, then switched in)
# and a rebuild (a member failed, replaced by a new file, `raidctl wait`).
# RAID5 of 4 files (chunk 64 KiB; JOBS_LEVEL=6, 10 or 1 another level of
# four) filled with data through NBD first, so that every read reaches the
# disk (members are opened with O_DIRECT).
# Rounds alternate which binary goes first; the disk's own caching swings
# single rounds by tens of percent, so compare several.
#   OLD=/path/to/old/raidctl bash scripts/bench-jobs.sh
#   (JOBS_DIR=/var/tmp/raid-jobs JOBS_SIZE=1G JOBS_ROUNDS=2 JOBS="scrub hot rebuild")
# JOBS_FILL_MIB=256 writes only the first 256 MiB of the array: the rest
# stays holes on the members (an array mostly never written).
# OLD must read the same on-disk format and state records.
set -euo pipefail
D=${JOBS_DIR:-/var/tmp/raid-jobs}
ARRAY=jobs
SIZE=${JOBS_SIZE:-1G}
ROUNDS=${JOBS_ROUNDS:-2}
JOBS=${JOBS:-scrub hot rebuild}
# The daemon logs each job's own time at level info (`raidctl wait` polls,
# in steps of tenths of a second): a hot replace's and a rebuild's are
# taken from there.
. "$(dirname "$0")/two-builds.sh"
rm -rf $D; mkdir -p $D/st
for i in 0 1 2 3; do truncate -s $SIZE $D/m$i; done
truncate -s $SIZE $D/spare
# The spare written through once, so no round pays for allocating it.
dd if=/dev/zero of=$D/spare bs=1M count=$(( $(stat -c %s $D/spare) / 1048576 )) conv=notrunc status=none
now() { date +%s.%N; }
# Lines of the daemon's log that say "$1".
said() { local n; n=$(grep -c "$1" $D/st/daemon.log 2>/dev/null) || true; echo "${n:-0}"; }
# The secs= of the daemon log line that says "$1" after the first $2 such
# lines: waited for (the daemon logs a job's end just after `wait` sees it).
logged() {
  local t=$(( $(date +%s) + 60 ))
  while [ "$(said "$1")" -le "$2" ]; do
    [ $(date +%s) -lt $t ] || { echo "bench-jobs: the daemon never logged '$1'" >&2; exit 1; }
    sleep 0.1
  done
  grep "$1" $D/st/daemon.log | sed -n "$(( $2 + 1 ))p" | sed -n 's/.*secs=\([0-9.]*\).*/\1/p'
}
secs() { echo "$2 - $1" | bc; }
LEVEL=${JOBS_LEVEL:-5}
case $LEVEL in
  5) data=3 engine="--parity cpu" ;;
  6) data=2 engine="--parity cpu" ;;
  10) data=2 engine= ;;
  1) data=1 engine= ;;
  *) echo "JOBS_LEVEL must be 5, 6, 10 or 1 (four members each), not $LEVEL: set one of those" >&2; exit 2 ;;
esac
$NEW --state-dir $D/st create jobs --level $LEVEL $engine --sparse $D/m0 $D/m1 $D/m2 $D/m3 >/dev/null
$NEW --state-dir $D/st start jobs --nbd unix:$D/nbd.sock >/dev/null
# The first data members x (member - 64 MiB) of the array written (or JOBS_FILL_MIB), 256 MiB a request.
cap=$(( ($(stat -c %s $D/m0) / 1048576 - 64) * data ))
[ -n "${JOBS_FILL_MIB:-}" ] && [ "$JOBS_FILL_MIB" -lt $cap ] && cap=$JOBS_FILL_MIB
writes=(); for ((o = 0; o < cap; o += 256)); do writes+=(-c "write -P 7 ${o}M $(( cap - o < 256 ? cap - o : 256 ))M"); done
# JOBS_FILL_EVERY=2: 64 KiB at the start of every second stripe instead
# (rows of data and rows of holes in turn: the worst case for jobs that
# skip holes, each run of holes one row long).
if [ -n "${JOBS_FILL_EVERY:-}" ]; then
  stripe=$(( data * 64 ))
  writes=(); for ((k = 0; k * stripe < cap * 1024; k += JOBS_FILL_EVERY)); do writes+=(-c "write -P 7 $(( k * stripe ))k 64k"); done
fi
qemu-io --image-opts "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=$D/nbd.sock,file.export=jobs" \
  "${writes[@]}" >/dev/null
$NEW --state-dir $D/st stop jobs >/dev/null
daemon_gone
# The member in slot 3 and the file not in the array (they trade places).
cur=$D/m3; free=$D/spare
for round in $(seq 1 $ROUNDS); do
  # Which goes first alternates, so that neither always follows the other's writes.
  order="old new"; [ $((round % 2)) = 0 ] && order="new old"
  for b in $order; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    RAIDCTL_LOG=info $bin --state-dir $D/st start jobs >/dev/null
    line="$b round $round:"
    for job in $JOBS; do
      t0=$(now); took=
      case $job in
        scrub)
          $bin --state-dir $D/st scrub jobs | grep -q " 0 mismatches" || { echo "bench-jobs: scrub found mismatches" >&2; exit 1; } ;;
        hot)
          before=$(said "hot replace finished")
          $bin --state-dir $D/st replace jobs $cur $free >/dev/null
          $bin --state-dir $D/st wait jobs >/dev/null
          took=$(logged "hot replace finished" $before)
          t=$cur; cur=$free; free=$t ;;
        rebuild)
          before=$(said "rebuild finished")
          $bin --state-dir $D/st fail jobs $cur >/dev/null
          $bin --state-dir $D/st replace jobs $cur $free >/dev/null
          $bin --state-dir $D/st wait jobs >/dev/null
          took=$(logged "rebuild finished" $before)
          t=$cur; cur=$free; free=$t ;;
      esac
      # The file that left the array: its superblocks wiped, so it can come back as new.
      dd if=/dev/zero of=$free bs=4096 count=2 conv=notrunc status=none
      line="$line $job $(printf %.2f ${took:-$(secs $t0 $(now))}) s,"
    done
    $bin --state-dir $D/st stop jobs >/dev/null
    daemon_gone
    echo "${line%,}"
  done
done
