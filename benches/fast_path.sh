#!/usr/bin/env bash
# The fast path (issue #49, item 2): `kube-nft bench-fast-path` in Debian's
# 6.1 kernel under qemu, the kernel here with flowtables. Without KVM the
# guest runs many times slower than the host, so read the ratios within the
# run, not the figures.
#
#   benches/fast_path.sh [ROUNDS [SECONDS]]     (default: 5 3)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
KUBE_NFT_VM_BIN=$PWD/target/release/kube-nft \
  KUBE_NFT_VM_COMMAND="bench-fast-path --rounds ${1:-5} --seconds ${2:-3}" \
  KUBE_NFT_VM_TIMEOUT=${KUBE_NFT_VM_TIMEOUT:-1800} \
  exec bash integration/vm/run.sh
