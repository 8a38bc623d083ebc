#!/usr/bin/env bash
# The nft of the Debian releases operators run, for the parity tests'
# readability check: Debian 11 (nft 0.9.8) and 13 (nft 1.1.x), each in a minimal
# chroot under /var/cache/kube-nft/chroots (outside the checkout, kept between
# runs; ~1 min each the first time). The host's own nft is Debian 12's 1.0.6.
# And a chroot with Debian 12's firewalld (below).
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

# firewalld (Debian 12's, nftables backend) for the tests of kube-nft beside a
# host firewall (integration/neighbours.rs), run from its chroot in a test's
# network namespace with a system bus of its own: never a service of the host.
# debootstrap cannot choose between firewalld's dependency alternatives (polkitd
# wants a logind), so its Python libraries come from debootstrap and firewalld
# itself is unpacked over them; as root it needs no polkit.
dir=$root/firewalld
if [ ! -x "$dir/usr/sbin/firewalld" ]; then
  echo "building a bookworm chroot with firewalld in $dir"
  rm -rf "$dir.partial"
  debootstrap --variant=minbase \
    --include=python3-firewall,python3-nftables,python3-dbus,python3-gi,gir1.2-glib-2.0,dbus,netbase \
    bookworm "$dir.partial" http://deb.debian.org/debian >"$root/firewalld.log" 2>&1 ||
    { echo "debootstrap bookworm failed, see $root/firewalld.log" >&2; exit 1; }
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download firewalld >>"$root/firewalld.log" 2>&1) ||
    { echo "apt-get download firewalld failed, see $root/firewalld.log" >&2; exit 1; }
  # Unpacked over the chroot's merged /usr: /lib must stay a link to usr/lib.
  dpkg-deb --fsys-tarfile "$debs"/firewalld_*.deb | tar -x --keep-directory-symlink -C "$dir.partial"
  rm -rf "$debs"
  mv "$dir.partial" "$dir"
fi
