#!/usr/bin/env bash
# How long an array stays degraded when the old device of a hot replace
# fails near the end of its copy (a benchmark, not a test): a RAID5 of 4
# files (TAKE_SIZE each, default 512M) written full through its NBD export,
# a hot replace of slot 1 paced at TAKE_RATE (default 100M per second), and
# `raidctl fail` of the old device once the copy passes TAKE_AT percent
# (default 75). Prints the seconds from the fail to optimal and the rows
# the rebuild wrote, of all rows. With OLD=/path/to/raidctl, that build
# runs the same round first.
#   bash scripts/bench-takeover.sh
#   (OLD=... TAKE_DIR=/var/tmp/raid-take TAKE_SIZE=512M TAKE_RATE=100M TAKE_AT=75)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$root/target/release/raidctl}
[ -n "${NEW_BUILT:-}" ] || (cd "$root" && cargo build --release -p raidctl >/dev/null)
OLD=${OLD:-}
D=${TAKE_DIR:-/var/tmp/raid-take}
SIZE=${TAKE_SIZE:-512M}
RATE=${TAKE_RATE:-100M}
AT=${TAKE_AT:-75}
export RAIDCTL_LOG=warn
cleanup() {
  for b in "$NEW" $OLD; do
    [ -d "$D/st" ] && RAIDCTL_STATE_DIR=$D/st "$b" stop tk >/dev/null 2>&1 || true
  done
  rm -rf "$D"
}
trap cleanup EXIT
one() { # binary label
  local b=$1
  rm -rf "$D"; mkdir -p "$D/st"
  export RAIDCTL_STATE_DIR=$D/st
  for i in 0 1 2 3 n; do truncate -s "$SIZE" "$D/m$i"; done
  "$b" create tk --level 5 --sparse "$D/m0" "$D/m1" "$D/m2" "$D/m3" >/dev/null
  "$b" start tk --nbd "unix:$D/tk.sock" >/dev/null
  local uri="nbd+unix:///tk?socket=$D/tk.sock"
  head -c "$(nbdinfo --size "$uri")" /dev/urandom | nbdcopy - "$uri"
  "$b" rate tk --rebuild "$RATE" >/dev/null
  "$b" replace tk "$D/m1" "$D/mn" >/dev/null
  while :; do
    p=$("$b" status tk --format json | python3 -c 'import json,sys; h=json.load(sys.stdin).get("hot_replace"); print(-1 if h is None else int(h["percent"]))' 2>/dev/null || echo 0)
    if [ "$p" -lt 0 ]; then echo "$2: the copy ended before $AT% (lower TAKE_RATE)" >&2; return 1; fi
    [ "$p" -ge "$AT" ] && break
    sleep 0.2
  done
  local t0; t0=$(date +%s.%N)
  "$b" fail tk "$D/m1" >/dev/null
  "$b" wait tk >/dev/null || true
  local t1; t1=$(date +%s.%N)
  local rows
  rows=$("$b" events tk --format json | python3 -c 'import json,sys; e=[x for x in json.load(sys.stdin) if x["event"]=="rebuild_finished"][-1]; print(e["message"])')
  printf '%s: degraded %.1f s after the fail at %s%%; %s\n' "$2" "$(echo "$t1 - $t0" | bc)" "$p" "$rows"
  "$b" stop tk >/dev/null
}
[ -n "$OLD" ] && one "$OLD" before
one "$NEW" now
