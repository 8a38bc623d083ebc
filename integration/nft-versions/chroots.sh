#!/usr/bin/env bash
# The nft of the Debian releases operators run, for the parity tests'
# readability check: Debian 11 (nft 0.9.8) and 13 (nft 1.1.x), each in a minimal
# chroot under /var/cache/kube-nft/chroots (outside the checkout, kept between
# runs; ~1 min each the first time). The host's own nft is Debian 12's 1.0.6.
# Needs root and Debian's archive.
set -euo pipefail
root=/var/cache/kube-nft/chroots
command -v debootstrap >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
# Two runs at once build one after the other: the second finds the chroots made.
mkdir -p "$root"
exec {lock}>"$root/.lock"
flock "$lock"
for suite in bullseye trixie; do
  dir=$root/$suite
  [ -x "$dir/usr/sbin/nft" ] && continue
  echo "building a $suite chroot with nftables in $dir"
  rm -rf "$dir.partial"
  mkdir -p "$root"
  # netbase: /etc/protocols, so that nft prints protocol names as on a real host.
  debootstrap --variant=minbase --include=nftables,netbase "$suite" "$dir.partial" \
    http://deb.debian.org/debian >"$root/$suite.log" 2>&1 ||
    { echo "debootstrap $suite failed, see $root/$suite.log" >&2; exit 1; }
  mv "$dir.partial" "$dir"
done
