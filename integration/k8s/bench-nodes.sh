#!/usr/bin/env bash
# Many nodes on one API server (issue #48, item 5): a real control plane
# (cluster.sh), N node namespaces joined to it and registered as node-1 …
# node-N, then `kube-nft bench-nodes` in the control plane's namespace, which
# runs kube-nft on every node, then kube-proxy in nftables mode on every node,
# under the same churn of endpoint changes, and prints one table.
#
#   integration/k8s/bench-nodes.sh [--nodes N] [bench-nodes arguments …]
#   integration/k8s/bench-nodes.sh --nodes 20 --services 10000 --rate 2 --churn-seconds 300
#
# The Services go straight into etcd (see bench.sh); the slices and every
# change go through the API server. KUBE_NFT_BIN names the kube-nft binary
# (default: the release build, which this script builds when it is missing).
# Nothing is left behind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export KUBE_NFT_CLUSTER_PREFIX=${KUBE_NFT_CLUSTER_PREFIX:-kbn}
export KUBE_NFT_SERVICE_CIDR=${KUBE_NFT_SERVICE_CIDR:-10.96.0.0/15}
prefix=$KUBE_NFT_CLUSTER_PREFIX
nodes=20
if [ "${1:-}" = --nodes ]; then
  nodes=$2
  shift 2
fi
# Node k is 10.100.0.(10 + k) on the fabric's /24.
[ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || { echo "bench-nodes: --nodes is 1 to 200" >&2; exit 2; }
kube_nft=${KUBE_NFT_BIN:-$here/../../target/release/kube-nft}
if [ -z "${KUBE_NFT_BIN:-}" ]; then
  (cd "$here/../.." && cargo build --release)
fi
export KUBE_NFT_BIN=$kube_nft
dir=$(mktemp -d /var/tmp/kube-nft-bench-nodes.XXXXXX)
trap '"$here/cluster.sh" down "$dir"; rm -rf "$dir"' EXIT
"$here/cluster.sh" up "$dir"
# shellcheck disable=SC1091
source "$dir/env"
node_args=()
for ((k = 1; k <= nodes; k++)); do
  ns=${prefix}-node-$k ip=10.100.0.$((10 + k))
  "$here/cluster.sh" bench-node "$dir" "$ns" "$ip"
  "$here/cluster.sh" node "$dir" "node-$k" "$ip" "10.128.$k.0/24"
  node_args+=(--node "$ns:node-$k:$ip")
done
apiserver_pid=$(awk '$2 == "kube-apiserver" { p = $1 } END { print p }' "$dir/pids")
[ "$(cat "/proc/$apiserver_pid/comm")" = kube-apiserver ] ||
  { echo "bench-nodes: process $apiserver_pid is not kube-apiserver" >&2; exit 1; }
echo "bench-nodes: $nodes nodes; kube-proxy $("$BIN/kube-proxy" --version | sed 's/^Kubernetes //'), kube-nft $("$kube_nft" --version 2>/dev/null || echo '?'), kube-apiserver $("$BIN/kube-apiserver" --version | sed 's/^Kubernetes //'), nft $(nft --version | awk '{print $2}')" >&2
ip netns exec "$CONTROL_PLANE_NETNS" "$kube_nft" bench-nodes --kubeconfig "$KUBECONFIG" \
  --kube-proxy "$BIN/kube-proxy" --apiserver-pid "$apiserver_pid" \
  --etcd 127.0.0.1:2379 "${node_args[@]}" "$@"
