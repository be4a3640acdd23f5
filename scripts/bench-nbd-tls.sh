#!/usr/bin/env bash
# NBD export over TLS benchmark (not a test): fio's nbd engine over
# nbds:// against our export of a RAID5 (BENCH_LEVEL) of 4 member files,
# its TLS connections served on the engine's shards (the default) and on
# threads of their own (RAIDCTL_NBD_ON_SHARDS=0), the two in turn, in the
# same run and the same build.
#
# The certificates are made here with openssl (a throwaway authority and a
# server certificate for 127.0.0.1); fio's nbd engine may not name a local
# file in its URI, so the client finds the authority where libnbd looks by
# default ($HOME/.pki/libnbd, HOME pointed at the run's directory).
# BENCH_SECONDS (default 4) per job, BENCH_ROUNDS (default 2),
# BENCH_SIZE (default 512M) per member, BENCH_DIR (default /dev/shm; a
# directory on a disk puts a device's latency under every member I/O).
# Needs fio, openssl (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cargo build --release -p raidctl >/dev/null
raidctl=$root/target/release/raidctl
work=$(mktemp -d "${BENCH_DIR:-/dev/shm}/raid-nbd-tls.XXXXXX")
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
stop() {
  "$raidctl" stop tb >/dev/null 2>&1 || true
  # The next start's daemon reads RAIDCTL_NBD_ON_SHARDS anew.
  pkill -9 -f -- "--state-dir $work/state daemon" || true
  while pgrep -f -- "--state-dir $work/state daemon" >/dev/null; do sleep 0.1; done
}
trap 'stop; rm -rf "$work"' EXIT

pki=$work/pki
mkdir -p "$pki/server" "$work/home/.pki/libnbd"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$pki/ca-key.pem" -out "$pki/ca-cert.pem" \
  -days 2 -subj "/CN=bench CA" 2>/dev/null
openssl req "${ec[@]}" -keyout "$pki/server/server-key.pem" -out "$pki/server.csr" \
  -subj "/CN=127.0.0.1" 2>/dev/null
openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca-cert.pem" -CAkey "$pki/ca-key.pem" \
  -CAcreateserial -out "$pki/server/server-cert.pem" -days 2 \
  -extfile <(echo "subjectAltName=IP:127.0.0.1") 2>/dev/null
cp "$pki/ca-cert.pem" "$pki/server/"
cp "$pki/ca-cert.pem" "$work/home/.pki/libnbd/"
export HOME=$work/home

size=${BENCH_SIZE:-512M}
for i in 0 1 2 3; do truncate -s "$size" "$work/m$i.img"; done
"$raidctl" create tb --level "${BENCH_LEVEL:-5}" --chunk 128K --sparse "$work"/m{0,1,2,3}.img >/dev/null
port=$((20000 + RANDOM % 20000))
uri="nbds://127.0.0.1:$port/tb"
start() { # on_shards (1 or 0)
  RAIDCTL_NBD_ON_SHARDS=$1 "$raidctl" start tb --nbd "tcp:127.0.0.1:$port" \
    --tls "$pki/server" >/dev/null
}
run() { # rw bs depth -> "iops MB/s p99"
  fio --name=j --ioengine=nbd --uri="$uri" --rw="$1" --bs="$2" --iodepth="$3" \
      --size=1G --time_based --runtime="${BENCH_SECONDS:-4}" --ramp_time=1 \
      --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f | %.1f | %.0f" % (d["iops"], d["bw_bytes"]/1e6, d["clat_ns"]["percentile"]["99.000000"]/1000))'
}

# Fill the members first, so reads read real data everywhere.
start 1
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G \
    --output-format=json >/dev/null
stop

echo "RAID${BENCH_LEVEL:-5} of 4 over TLS, fio QD 32, one connection:"
echo
echo "| round | TLS connection served on | job | IOPS | MB/s | p99 us |"
echo "|---|---|---|---|---|---|"
for r in $(seq "${BENCH_ROUNDS:-2}"); do
  for on in 0 1; do
    start "$on"
    where=$([ "$on" = 1 ] && echo "a shard" || echo "threads")
    for job in "randread 4k 32" "randwrite 4k 32" "read 128k 32" "write 128k 32"; do
      # shellcheck disable=SC2086
      echo "| $r | $where | $job | $(run $job) |"
    done
    stop
  done
done
