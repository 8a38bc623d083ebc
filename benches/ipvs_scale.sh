#!/usr/bin/env bash
# The IPVS backend's syncs at 1k and 10k Services of 10 endpoints (issue #50,
# item 4): `kube-nft bench-ipvs` in Debian's 6.1 kernel under qemu, the only
# kernel with IPVS here. Without KVM the guest runs many times slower than the
# host, so read the ratios within the run, not the times.
#
#   benches/ipvs_scale.sh [SIZES [RUNS]]     (default: 1000,10000 3)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile profiling --quiet
KUBE_NFT_VM_BIN=$PWD/target/profiling/kube-nft \
  KUBE_NFT_VM_COMMAND="bench-ipvs --sizes ${1:-1000,10000} --runs ${2:-3}" \
  KUBE_NFT_VM_TIMEOUT=${KUBE_NFT_VM_TIMEOUT:-3600} \
  exec bash integration/vm/run.sh
