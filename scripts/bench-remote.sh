#!/usr/bin/env bash
# What a member on another host costs (a benchmark, not a test): one RAID5
# of 3 members, 512 MiB each on tmpfs, built four ways and measured in the
# same run through our NBD export with fio's nbd engine:
#   local  - the member files opened directly;
#   nbd    - each file served by nbdkit on 127.0.0.1 (TCP loopback);
#   nbds   - the same over TLS (nbdkit --tls=require);
#   hosts  - each file served by nbdkit on its own "host", a network
#            namespace joined to the array's host by veth links on a
#            bridge (needs root; skipped otherwise).
# Jobs: 4 KiB random read and write at queue depth 1 (latency) and 32
# (IOPS), 1 MiB sequential read and write at depth 8 (throughput).
# BENCH_SECONDS (default 5) per job. Needs fio, nbdkit, openssl, iproute2.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=${BENCH_SECONDS:-5}
cargo build --release -p raidctl >/dev/null
raidctl=$root/target/release/raidctl
work=$(mktemp -d /dev/shm/raid-remote-bench.XXXXXX)
export RAIDCTL_LOG=warn
p=rb$$
pids=()
netns=0
cleanup() {
  for s in local nbd nbds hosts; do
    RAIDCTL_STATE_DIR=$work/state-$s "$raidctl" stop "r$s" >/dev/null 2>&1 || true
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$netns" = 1 ]; then
    for i in 0 1 2 3; do ip netns del "${p}n$i" 2>/dev/null || true; done
    ip netns del "${p}br" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

size=512M
wait_port() { # host port [netns]
  for _ in $(seq 100); do
    if ${3:+ip netns exec $3} nbdinfo --size "nbd://$1:$2/" >/dev/null 2>&1; then return; fi
    sleep 0.1
  done
  echo "nbdkit on $1:$2 did not come up" >&2; exit 1
}

# Certificates for the TLS setup (nbdkit reads ca-cert.pem, server-cert.pem
# and server-key.pem; our client ca-cert.pem).
pki=$work/pki; mkdir -p "$pki/client"
(
  cd "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca-key.pem \
    -out ca-cert.pem -days 2 -subj "/CN=bench CA" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server-key.pem \
    -out s.csr -subj "/CN=localhost" 2>/dev/null
  echo "subjectAltName=IP:127.0.0.1" > s.ext
  openssl x509 -req -in s.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial \
    -out server-cert.pem -days 2 -extfile s.ext 2>/dev/null
  cp ca-cert.pem client/
)

members=()
# local
for i in 0 1 2; do truncate -s $size "$work/local$i.img"; done
# nbd and nbds: nbdkit on loopback ports
port=$((20000 + RANDOM % 20000))
for s in nbd nbds; do
  for i in 0 1 2; do
    truncate -s $size "$work/$s$i.img"
    extra=()
    [ $s = nbds ] && extra=(--tls=require --tls-certificates="$pki")
    nbdkit -f -i 127.0.0.1 -p $((port + i)) "${extra[@]}" file "$work/$s$i.img" &
    pids+=($!)
  done
  port=$((port + 3))
done
port=$((port - 6))
for i in 0 1 2; do wait_port 127.0.0.1 $((port + i)); done

setups="local nbd nbds"
create() { # setup member... (run in the setup's own state dir)
  local s=$1; shift
  RAIDCTL_STATE_DIR=$work/state-$s ${wrap:-} "$raidctl" create "r$s" --level 5 --chunk 64K "$@" >/dev/null
  RAIDCTL_STATE_DIR=$work/state-$s ${wrap:-} "$raidctl" start "r$s" --nbd "unix:$work/$s.sock" >/dev/null
}
create local "$work"/local{0,1,2}.img
create nbd nbd://127.0.0.1:$port/ nbd://127.0.0.1:$((port + 1))/ nbd://127.0.0.1:$((port + 2))/
t="?tls-certificates=$pki/client"
create nbds "nbds://127.0.0.1:$((port + 3))/$t" "nbds://127.0.0.1:$((port + 4))/$t" \
  "nbds://127.0.0.1:$((port + 5))/$t"

if [ "$(id -u)" = 0 ] && ip netns add "${p}br" 2>/dev/null; then
  netns=1
  ip -n "${p}br" link add br0 type bridge && ip -n "${p}br" link set br0 up
  for i in 0 1 2 3; do
    ip netns add "${p}n$i"
    ip link add "${p}h$i" netns "${p}n$i" type veth peer name "${p}b$i" netns "${p}br"
    ip -n "${p}br" link set "${p}b$i" master br0 up
    ip -n "${p}n$i" addr add "192.0.2.$((i + 1))/24" dev "${p}h$i"
    ip -n "${p}n$i" link set "${p}h$i" up
    ip -n "${p}n$i" link set lo up
  done
  for i in 1 2 3; do
    truncate -s $size "$work/hosts$i.img"
    ip netns exec "${p}n$i" nbdkit -f -i "192.0.2.$((i + 1))" -p 10809 file "$work/hosts$i.img" &
    pids+=($!)
  done
  for i in 1 2 3; do wait_port "192.0.2.$((i + 1))" 10809 "${p}n0"; done
  wrap="ip netns exec ${p}n0" create hosts nbd://192.0.2.2/ nbd://192.0.2.3/ nbd://192.0.2.4/
  setups="$setups hosts"
else
  echo "(hosts: skipped, network namespaces need root)"
fi

run() { # setup rw bs depth -> "iops MB/s p50us p99us"
  fio --name=j --ioengine=nbd --uri="nbd+unix:///r$1?socket=$work/$1.sock" --rw="$2" --bs="$3" \
      --iodepth="$4" --size=1000M --time_based --runtime="$secs" --ramp_time=1 \
      --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
p=d["clat_ns"]["percentile"]
print("%.0f %.1f %.0f %.0f" % (d["iops"], d["bw_bytes"]/1e6, p["50.000000"]/1e3, p["99.000000"]/1e3))'
}

for s in $setups; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///r$s?socket=$work/$s.sock" --rw=write --bs=1M \
      --iodepth=8 --size=1000M --output-format=json >/dev/null 2>&1
done

echo "RAID5 of 3 members, 512 MiB each on tmpfs, through our NBD export (fio nbd engine), ${secs} s per job:"
echo
printf "| job |"; for s in $setups; do printf " %s |" "$s"; done; echo
printf "|---|"; for s in $setups; do printf -- "---|"; done; echo
job() { # label rw bs depth what
  printf "| %s |" "$1"
  local base=""
  for s in $setups; do
    read -r iops mbs p50 p99 < <(run "$s" "$2" "$3" "$4")
    case $5 in
      lat) v=$p50; cell="p50 ${p50} us, p99 ${p99} us" ;;
      iops) v=$iops; cell="${iops} IOPS" ;;
      mbs) v=$mbs; cell="${mbs} MB/s" ;;
    esac
    if [ -z "$base" ]; then base=$v; printf " %s |" "$cell"
    else printf " %s (%sx) |" "$cell" "$(python3 -c "print(round($v/$base,2))")"; fi
  done
  echo
}
job "4k randread QD1" randread 4k 1 lat
job "4k randwrite QD1" randwrite 4k 1 lat
job "4k randread QD32" randread 4k 32 iops
job "4k randwrite QD32" randwrite 4k 32 iops
job "1M read QD8" read 1M 8 mbs
job "1M write QD8" write 1M 8 mbs
echo
echo "Ratios are against local: for latency the p50's, otherwise the rate's."
