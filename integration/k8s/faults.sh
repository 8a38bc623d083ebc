#!/usr/bin/env bash
# kube-nft and real kube-proxy through the same fault (issue #19): a control
# plane with two nodes, kube-nft on node-a and kube-proxy v1.36.3 in nftables
# mode on node-b, both with the admin kubeconfig; once both have a first
# Service, the fault, then a Service is created and the time until each node's
# ruleset has its ClusterIP is printed.
#
#   integration/k8s/faults.sh outage [SECONDS]   the API server stopped for SECONDS
#                                                (default 300); each one's /healthz
#                                                at the end. Each time is one draw of
#                                                the watches' jittered backoff
#                                                (client-go's and kube-nft's alike:
#                                                up to 60 s)
#   integration/k8s/faults.sh newer-nft          Debian 13's nft (1.1.3, from the
#                                                chroot install-deps builds) writes
#                                                a set beside ours on each node
#
# As root, after integration/k8s/build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
fault=${1:?usage: faults.sh outage [SECONDS] | newer-nft}
outage=${2:-300}
trixie=/var/cache/kube-nft/chroots/trixie
[ "$fault" != newer-nft ] || [ -x "$trixie/usr/sbin/nft" ] ||
  { echo "faults: no $trixie: run integration/nft-versions/chroots.sh" >&2; exit 1; }
export KUBE_NFT_CLUSTER_PREFIX=kov
export KUBE_NFT_BIN=${KUBE_NFT_BIN:-$PWD/target/debug/kube-nft}
[ -x "$KUBE_NFT_BIN" ] || cargo build --quiet
cluster() { bash integration/k8s/cluster.sh "$@" 2>/dev/null; }
bin=$(bash "$(dirname "$0")/build.sh")
dir=$(mktemp -d /tmp/kube-nft-faults.XXXXXX)
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
  --cluster-cidr 10.244.0.0/16 --conntrack-max-per-core 0 >"$dir/kube-nft.log" 2>&1 &
pids+=($!)
# Conntrack sysctls are the host's, not the namespace's: kube-proxy leaves them.
ip netns exec kov-b "$bin/kube-proxy" --kubeconfig "$kubeconfig" --hostname-override node-b \
  --cluster-cidr 10.244.0.0/16 --proxy-mode nftables --conntrack-max-per-core 0 >"$dir/kube-proxy.log" 2>&1 &
pids+=($!)

# Whether NETNS's ruleset has ADDRESS (listed to a file: a pipe into grep -q
# could fail on nft's SIGPIPE). Once nft 1.1.3 has written to a node, only it
# can list there.
lister=(nft)
has() {
  ip netns exec "$1" "${lister[@]}" list ruleset >"$dir/listing" 2>/dev/null && grep -qF "$2" "$dir/listing"
}
cluster kubectl "$dir" create service clusterip before --tcp=80:9376 >/dev/null
before=$(cluster kubectl "$dir" get service before -o 'jsonpath={.spec.clusterIP}')
for i in $(seq 600); do has kov-a "$before" && has kov-b "$before" && break; sleep 0.1; done
has kov-a "$before" && has kov-b "$before" || { echo "faults: the nodes never synced a first Service" >&2; exit 1; }

case $fault in
outage)
  cluster stop-apiserver "$dir"
  echo "faults: API server stopped for ${outage}s"
  sleep "$outage"
  health() { ip netns exec "$1" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:10256/healthz || true; }
  echo "faults: /healthz at the end: kube-nft $(health kov-a), kube-proxy $(health kov-b)"
  cluster start-apiserver "$dir"
  ;;
newer-nft)
  # A set declared with `type`: what nft 1.1.3 writes with it crashes older nft.
  echo 'table inet other { set s { type ipv4_addr; elements = { 192.0.2.1 }; }; }' >"$trixie/tmp/other.nft"
  for n in kov-a kov-b; do ip netns exec "$n" chroot "$trixie" nft -f /tmp/other.nft; done
  rm -f "$trixie/tmp/other.nft"
  lister=(chroot "$trixie" nft)
  echo "faults: nft 1.1.3 wrote a set on each node; the host's nft $(nft --version | awk '{print $2}') now says: $(ip netns exec kov-a nft list tables >/dev/null 2>&1 && echo 'listed' || echo "exit $?")"
  ;;
*)
  echo "faults: unknown fault $fault" >&2
  exit 2
  ;;
esac
# kube-proxy retries a failed sync every 30 s: two minutes is four chances.
limit=120
[ "$fault" != outage ] || limit=300
start=$(date +%s.%N)
cluster kubectl "$dir" create service clusterip after --tcp=80:9376 >/dev/null
after=$(cluster kubectl "$dir" get service after -o 'jsonpath={.spec.clusterIP}')
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }
declare -A took
while [ -z "${took[kov-a]:-}" ] || [ -z "${took[kov-b]:-}" ]; do
  now=$(date +%s.%N)
  for n in kov-a kov-b; do
    [ -z "${took[$n]:-}" ] && has "$n" "$after" && took[$n]=$(since "$now" "$start")
  done
  awk -v a="$now" -v b="$start" -v l="$limit" 'BEGIN { exit !(a - b > l) }' && break
  sleep 0.2
done
echo "faults: a Service created after the fault, in the ruleset after: kube-nft ${took[kov-a]:-not within $limit} s, kube-proxy ${took[kov-b]:-not within $limit} s"
for n in kube-nft kube-proxy; do
  echo "faults: $n's log has $(grep -ci 'segmentation fault\|sync failed' "$dir/$n.log" || true) lines on a segmentation fault or a failed sync"
done
