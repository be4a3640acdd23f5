#!/usr/bin/env bash
# Installs what the test suite needs on a Debian/Ubuntu machine.
# - libisal-dev, pkg-config: ISA-L, the independent P/Q the tests cross-check
#   and the benchmark compares against.
# - libnbd-bin (nbdinfo, nbdcopy), fio (its nbd engine), qemu-utils (qemu-io,
#   qemu-nbd), nbdkit: NBD clients and servers nobody here wrote, for the
#   export tests and the export benchmark.
# - fuse3, util-linux (losetup), e2fsprogs (mkfs.ext4): raidctl mount --loop
#   and a real filesystem on the array; btrfs-progs: the in-kernel RAID5 the
#   mount benchmark (scripts/bench-mount.sh) compares with.
# - python3-aiosmtpd, openssl: a real SMTP server (with STARTTLS and a
#   self-signed certificate) for the alert tests.
# - prometheus (promtool and the server), man-db (man), systemd
#   (systemd-analyze, nothing started): the metrics endpoint, man pages and
#   unit checked by the tools that read them.
# - iproute2 (ip netns, veth): hosts as network namespaces for the tests of
#   members on other hosts.
# - mesa-vulkan-drivers (pulls libvulkan1, the loader): lavapipe, Vulkan on
#   the CPU, so every GPU test runs the real WGSL shaders without a GPU.
set -euo pipefail
pkgs=(iproute2 libisal-dev pkg-config libnbd-bin fio nbdkit fuse3 e2fsprogs btrfs-progs util-linux qemu-utils python3-aiosmtpd openssl procps mesa-vulkan-drivers prometheus man-db systemd)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "test dependencies present: ${pkgs[*]}"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: missing packages ${missing[*]}; run this script as root (sudo $0) or install them with apt-get" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
