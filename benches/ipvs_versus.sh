#!/usr/bin/env bash
# kube-nft's IPVS backend against kube-proxy's IPVS mode (issue #50, item 4), in
# one run: `kube-nft bench-kube-proxy --contenders kube-nft-ipvs,ipvs` in
# Debian's 6.1 kernel under qemu (the only kernel with IPVS here), against a
# real control plane on the host (integration/k8s/cluster.sh). qemu runs in a
# node namespace on the control plane's fabric, so that the guest's user
# network reaches the API server; the guest is node-a, at qemu's 10.0.2.15.
# Without KVM the guest runs many times slower than the host: read the ratios
# within the run, not the times.
#
#   benches/ipvs_versus.sh [ARGS of bench-kube-proxy]   (default: --sizes 1000,10000 --runs 3)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
k8s=$root/integration/k8s
export KUBE_NFT_CLUSTER_PREFIX=${KUBE_NFT_CLUSTER_PREFIX:-kv}
export KUBE_NFT_SERVICE_CIDR=${KUBE_NFT_SERVICE_CIDR:-10.96.0.0/15}
cargo build --release --quiet
args=("$@")
((${#args[@]})) || args=(--sizes 1000,10000 --runs 3)
dir=$(mktemp -d /var/tmp/kube-nft-ipvs-versus.XXXXXX)
trap '"$k8s/cluster.sh" down "$dir"; rm -rf "$dir"' EXIT
"$k8s/cluster.sh" up "$dir"
# shellcheck disable=SC1091
source "$dir/env"
node=${KUBE_NFT_CLUSTER_PREFIX}-node-a
"$k8s/cluster.sh" bench-node "$dir" "$node" 10.100.0.11
"$k8s/cluster.sh" node "$dir" node-a 10.0.2.15 10.128.0.0/24
echo "ipvs-versus: kube-proxy $("$BIN/kube-proxy" --version | sed 's/^Kubernetes //')" >&2
ip netns exec "$node" env \
  KUBE_NFT_VM_BIN="$root/target/release/kube-nft" \
  KUBE_NFT_VM_KUBE_PROXY="$BIN/kube-proxy" KUBE_NFT_VM_KUBECONFIG="$KUBECONFIG" \
  KUBE_NFT_VM_MEMORY=4096 KUBE_NFT_VM_TIMEOUT="${KUBE_NFT_VM_TIMEOUT:-7200}" \
  KUBE_NFT_VM_COMMAND="bench-kube-proxy --kubeconfig $KUBECONFIG --kube-proxy $BIN/kube-proxy --node-name node-a --node-ip 10.0.2.15 --contenders kube-nft-ipvs,ipvs --logs /tmp/bench-logs ${args[*]}" \
  bash integration/vm/run.sh
