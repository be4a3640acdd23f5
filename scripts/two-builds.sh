# Sourced by the benchmarks that time two raidctl builds, alternating, on
# one array in one state folder (bench-jobs.sh, bench-rebuild-two.sh,
# bench-fua.sh),
# after they set D (their folder) and ARRAY (the array's name): OLD
# (required) and NEW (default: this tree's release build), quiet daemons,
# env.sh, qemu-io checked for, the array stopped and D removed on exit, and
# `daemon_gone`.
OLD=${OLD:?set OLD to the raidctl binary to compare against (e.g. one built from an earlier commit)}
NEW=${NEW:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/release/raidctl}
export RAIDCTL_LOG=warn
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
command -v qemu-io >/dev/null || { echo "$(basename "$0"): needs qemu-io (qemu-utils)" >&2; exit 1; }
two_builds_cleanup() {
  for b in "$OLD" "$NEW"; do "$b" --state-dir $D/st stop $ARRAY >/dev/null 2>&1 || true; done
  rm -rf $D
}
trap two_builds_cleanup EXIT
# A stopped array's daemon lingers a few seconds for the next command: wait
# until it is gone (it holds daemon.lock while it lives), so that the next
# start runs the binary it names, not the other's daemon.
daemon_gone() {
  [ ! -e $D/st/daemon.lock ] || flock -w 60 $D/st/daemon.lock true ||
    { echo "$(basename "$0"): a daemon did not exit" >&2; exit 1; }
}
