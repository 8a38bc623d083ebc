#!/usr/bin/env bash
# Installs, with apt, the system tools kube-nft's lab and tests use, where missing.
# Sourced by lab.sh (`source install-deps.sh lab`: only what the demo needs) and
# test-all.sh (everything); needs root. Installs nothing when nothing is missing.
set -euo pipefail
for_lab=$([ "${1:-}" = lab ] && echo 1 || echo 0)
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
command -v conntrack >/dev/null || missing+=(conntrack)
command -v cc >/dev/null || missing+=(gcc)  # ring (rustls, the API client's TLS) compiles C
if [ "$for_lab" = 0 ]; then
command -v iptables-legacy-restore >/dev/null || missing+=(iptables)  # kube-nft bench's comparison
# The IPVS tests' guest (integration/vm): qemu, busybox, ipvsadm, and cpio for its initramfs.
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
# grep reads the whole list: with -q it would stop early, and busybox would die of SIGPIPE under pipefail.
[ -x /bin/busybox ] && /bin/busybox --list | grep -x depmod >/dev/null || missing+=(busybox-static)
command -v ipvsadm >/dev/null || missing+=(ipvsadm)
# kube-proxy's IPVS-mode ipsets, written for `cleanup --kube-proxy` to remove (here and in the guest).
command -v ipset >/dev/null || missing+=(ipset)
command -v cpio >/dev/null || missing+=(cpio)
command -v xz >/dev/null || missing+=(xz-utils)  # the 5.10 guest's kernel, found in the archive's index
command -v python3 >/dev/null || missing+=(python3)
# The real control plane's keys (integration/k8s/cluster.sh).
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
# The fuzz targets (integration/fuzz): libfuzzer-sys compiles libFuzzer's C++.
command -v c++ >/dev/null || missing+=(g++)
fi
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "kube-nft needs a Rust toolchain (cargo): https://rustup.rs" >&2; exit 1; }
# Older and newer nft, to check that they read our ruleset (integration/parity.rs).
if [ "$for_lab" = 0 ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/nft-versions/chroots.sh"
fi
