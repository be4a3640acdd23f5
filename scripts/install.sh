#!/usr/bin/env bash
# Installs raidctl: the binary, shell completions (bash, zsh, fish), man
# pages, the systemd unit, a logrotate rule and an example config.
#
#   sudo bash scripts/install.sh            # into /usr/local, /etc
#   PREFIX=/usr DESTDIR=/tmp/pkg bash scripts/install.sh   # for a package
#
# RAIDCTL_BIN=PATH installs that binary instead of building one. Then:
#   systemctl daemon-reload && systemctl enable --now raidctl
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
SYSCONFDIR=${SYSCONFDIR:-/etc}
UNITDIR=${UNITDIR:-$SYSCONFDIR/systemd/system}

if [ -n "${RAIDCTL_BIN:-}" ]; then
  bin=$RAIDCTL_BIN
else
  . scripts/env.sh
  cargo build --release -p raidctl
  bin=target/release/raidctl
fi
if [ -z "$DESTDIR" ] && [ "$(id -u)" -ne 0 ]; then
  echo "error: installing into $PREFIX and $SYSCONFDIR needs root (sudo $0), or set DESTDIR" >&2
  exit 1
fi

d() { echo "$DESTDIR$1"; }
install -D -m 0755 "$bin" "$(d "$PREFIX/bin/raidctl")"
raidctl=$(d "$PREFIX/bin/raidctl")

"$raidctl" completions bash | install -D -m 0644 /dev/stdin "$(d "$PREFIX/share/bash-completion/completions/raidctl")"
"$raidctl" completions zsh | install -D -m 0644 /dev/stdin "$(d "$PREFIX/share/zsh/site-functions/_raidctl")"
"$raidctl" completions fish | install -D -m 0644 /dev/stdin "$(d "$PREFIX/share/fish/vendor_completions.d/raidctl.fish")"

man=$(mktemp -d)
trap 'rm -rf "$man"' EXIT
"$raidctl" manpages "$man" >/dev/null
install -d "$(d "$PREFIX/share/man/man1")"
for p in "$man"/*.1; do
  gzip -9n -c "$p" > "$(d "$PREFIX/share/man/man1/$(basename "$p").gz")"
done

sed "s|@BINDIR@|$PREFIX/bin|" dist/raidctl.service | install -D -m 0644 /dev/stdin "$(d "$UNITDIR/raidctl.service")"
install -D -m 0644 dist/logrotate.conf "$(d "$SYSCONFDIR/logrotate.d/raidctl")"
conf=$(d "$SYSCONFDIR/raidctl/raidctl.toml")
if [ ! -e "$conf" ]; then
  install -D -m 0600 dist/raidctl.toml "$conf"
fi

echo "installed raidctl into ${DESTDIR:-}$PREFIX (completions, $(ls "$man" | wc -l) man pages), the unit into ${DESTDIR:-}$UNITDIR"
if [ -z "$DESTDIR" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "start it with: systemctl enable --now raidctl"
fi
