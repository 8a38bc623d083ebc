#!/usr/bin/env bash
# kube-nft against real kube-proxy, in one run (issue #17): a real control plane
# (cluster.sh), one node namespace joined to it and registered as node-a, then
# `kube-nft bench-kube-proxy` in that namespace, which runs kube-nft, kube-proxy
# in nftables mode and kube-proxy in iptables mode in turn against the same API
# server and prints a table per size. Arguments go to bench-kube-proxy, e.g.
#
#   integration/k8s/bench.sh --sizes 1000,10000 --runs 5
#
# The Services go straight into etcd (`--etcd`, from the control plane's
# namespace): kube-apiserver's create path costs N² in the Services (1.7 hours
# for 100k here); the slices and every change go through the API server.
# KUBE_NFT_BIN names the kube-nft binary (default: the release build, which
# this script builds when it is missing). Nothing is left behind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export KUBE_NFT_CLUSTER_PREFIX=${KUBE_NFT_CLUSTER_PREFIX:-kb}
# Service i is 10.96.1.0 + i: past 65,280 Services a /16 has no room. A /15
# holds 131k, and stays clear of the fabric's 10.100.0.0/24 (both proxies drop
# what is sent to an unallocated address of a Service range).
export KUBE_NFT_SERVICE_CIDR=${KUBE_NFT_SERVICE_CIDR:-10.96.0.0/15}
prefix=$KUBE_NFT_CLUSTER_PREFIX
kube_nft=${KUBE_NFT_BIN:-$here/../../target/release/kube-nft}
if [ -z "${KUBE_NFT_BIN:-}" ]; then
  (cd "$here/../.." && cargo build --release)
fi
export KUBE_NFT_BIN=$kube_nft
dir=$(mktemp -d /var/tmp/kube-nft-bench-cluster.XXXXXX)
trap '"$here/cluster.sh" down "$dir"; rm -rf "$dir"' EXIT
"$here/cluster.sh" up "$dir"
# shellcheck disable=SC1091
source "$dir/env"
node=${prefix}-node-a
"$here/cluster.sh" bench-node "$dir" "$node" 10.100.0.11
"$here/cluster.sh" node "$dir" node-1 10.100.0.11 10.128.0.0/24
echo "bench: kube-proxy $("$BIN/kube-proxy" --version | sed 's/^Kubernetes //'), kube-nft $("$kube_nft" --version 2>/dev/null || echo '?'), nft $(nft --version | awk '{print $2}'), $(iptables --version)" >&2
ip netns exec "$node" "$kube_nft" bench-kube-proxy --kubeconfig "$KUBECONFIG" \
  --kube-proxy "$BIN/kube-proxy" --node-name node-1 --node-ip 10.100.0.11 \
  --etcd 127.0.0.1:2379 --etcd-netns "$CONTROL_PLANE_NETNS" "$@"
