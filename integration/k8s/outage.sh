#!/usr/bin/env bash
# kube-nft and real kube-proxy through one API server outage (issue #19): a
# control plane with two nodes, kube-nft on node-a and kube-proxy v1.36.3 in
# nftables mode on node-b, both with the admin kubeconfig. The API server is
# stopped for SECONDS (default 300); at its end each one's /healthz is read; then
# the API server starts, a Service is created, and the time until each node's
# ruleset has its ClusterIP is printed. Each figure is one draw of the watches'
# jittered backoff (client-go's and kube-nft's alike: up to 60 s).
#
#   integration/k8s/outage.sh [SECONDS]        (as root, after integration/k8s/build.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
outage=${1:-300}
export KUBE_NFT_CLUSTER_PREFIX=kov
export KUBE_NFT_BIN=${KUBE_NFT_BIN:-$PWD/target/debug/kube-nft}
[ -x "$KUBE_NFT_BIN" ] || cargo build --quiet
cluster() { bash integration/k8s/cluster.sh "$@" 2>/dev/null; }
bin=/var/cache/kube-nft/k8s-1.36.3/bin
dir=$(mktemp -d /tmp/kube-nft-outage.XXXXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  cluster down "$dir" || true
  for n in kov-a kov-b; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

cluster up "$dir"
for n in a b; do ip netns add "kov-$n"; done
cluster join "$dir" kov-a 10.100.0.11 && cluster node "$dir" node-a 10.100.0.11 10.244.0.0/24
cluster join "$dir" kov-b 10.100.0.12 && cluster node "$dir" node-b 10.100.0.12 10.244.1.0/24
kubeconfig=$dir/admin.kubeconfig
ip netns exec kov-a "$KUBE_NFT_BIN" run --kubeconfig "$kubeconfig" --hostname-override node-a \
  --cluster-cidr 10.244.0.0/16 >"$dir/kube-nft.log" 2>&1 &
pids+=($!)
# Conntrack sysctls are the host's, not the namespace's: kube-proxy leaves them.
ip netns exec kov-b "$bin/kube-proxy" --kubeconfig "$kubeconfig" --hostname-override node-b \
  --cluster-cidr 10.244.0.0/16 --proxy-mode nftables --conntrack-max-per-core 0 >"$dir/kube-proxy.log" 2>&1 &
pids+=($!)

# Whether NETNS's ruleset has ADDRESS (listed to a file: a pipe into grep -q
# could fail on nft's SIGPIPE).
has() {
  ip netns exec "$1" nft list ruleset >"$dir/listing" 2>/dev/null && grep -qF "$2" "$dir/listing"
}
cluster kubectl "$dir" create service clusterip before --tcp=80:9376 >/dev/null
before=$(cluster kubectl "$dir" get service before -o 'jsonpath={.spec.clusterIP}')
for i in $(seq 600); do has kov-a "$before" && has kov-b "$before" && break; sleep 0.1; done
has kov-a "$before" && has kov-b "$before" || { echo "outage: the nodes never synced a first Service" >&2; exit 1; }

cluster stop-apiserver "$dir"
echo "outage: API server stopped for ${outage}s"
sleep "$outage"
health() { ip netns exec "$1" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10256/healthz || true; }
echo "outage: /healthz at the end: kube-nft $(health kov-a), kube-proxy $(health kov-b)"
cluster start-apiserver "$dir"
back=$(date +%s.%N)
cluster kubectl "$dir" create service clusterip after --tcp=80:9376 >/dev/null
after=$(cluster kubectl "$dir" get service after -o 'jsonpath={.spec.clusterIP}')
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
declare -A took
while [ -z "${took[kov-a]:-}" ] || [ -z "${took[kov-b]:-}" ]; do
  now=$(date +%s.%N)
  for n in kov-a kov-b; do
    [ -z "${took[$n]:-}" ] && has "$n" "$after" && took[$n]=$(since "$now" "$back")
  done
  awk -v a="$now" -v b="$back" 'BEGIN { exit !(a - b > 300) }' && break
  sleep 0.2
done
echo "outage: a Service created once the API server was back, in the ruleset after: kube-nft ${took[kov-a]:-never} s, kube-proxy ${took[kov-b]:-never} s"
