# Sourced by the NBD benchmarks: the single-file servers ours is held
# against. start_nbd_peers DIR [qemu-nbd options...] serves DIR/qemu.img
# with qemu-nbd on DIR/qemu.sock and DIR/nbdkit.img with nbdkit's file
# plugin on DIR/nbdkit.sock (both files made by the caller, of the size
# it wants), adds their pids to the caller's `pids` array, and returns once
# both sockets are there (10 s at most each; an error otherwise).
start_nbd_peers() {
  local dir=$1
  shift
  qemu-nbd -f raw --cache=writeback --aio=threads "$@" -t -k "$dir/qemu.sock" "$dir/qemu.img" &
  pids+=($!)
  nbdkit -f -U "$dir/nbdkit.sock" file "$dir/nbdkit.img" &
  pids+=($!)
  local s
  for s in qemu nbdkit; do
    for _ in $(seq 100); do [ -S "$dir/$s.sock" ] && break; sleep 0.1; done
    [ -S "$dir/$s.sock" ] || {
      echo "$s did not open $dir/$s.sock in 10 s: see its output above (is it installed? scripts/install-test-deps.sh)" >&2
      return 1
    }
  done
}
