#!/usr/bin/env bash
# What a user of a kind cluster expects of its Service proxy, checked with real
# pods, the cluster's CoreDNS and real requests:
#
#   integration/kind/checks.sh [--proxy P] [NAME]   # after up.sh; exits 1 on the first failure
#
# 1. CoreDNS is ready and answers a pod through its ClusterIP;
# 2. `hostnames` (3 pods serving their name on 9376, a NodePort Service on 80)
#    answers a pod by DNS name, from all three pods;
# 3. the NodePort answers on every node, from another node;
# 4. a pod deleted leaves the rotation without a failed request;
# 5. the proxy's metrics answer on every node and count syncs, and (kube-nft)
#    its logs show them;
# 6. every node has kube-proxy's conntrack TCP timeouts (CLOSE_WAIT 1 h, as
#    upstream's e2e test "KubeProxy should set TCP CLOSE_WAIT timeout" expects;
#    established 24 h), and (kube-nft) its init container set them;
# 7. where flannel is the CNI (local images), its nftables tables are as it
#    wrote them after the proxy's syncs of checks 2-4, and a restart of flannel
#    under load fails no request and (kube-nft) is not taken for drift.
# Each check prints one line: "ok: …" or "FAILED: …".
set -euo pipefail
proxy=kube-nft
if [ "${1:-}" = --proxy ]; then
  proxy=$2
  shift 2
fi
name=${1:-kube-nft}
# shellcheck source=integration/kind/lib.sh
. "$(dirname "$0")/lib.sh"
busybox=$(busybox_image)
ok() { echo "kind: ok: $proxy: $*" >&2; }
fail() {
  echo "kind: FAILED: $proxy: $*" >&2
  exit 1
}
in_client() { kubectl exec client -- sh -c "$1"; }

# Requests to http://hostnames back to back from the client for $1 seconds, in
# the background (its pid in $load); load_counts, after `wait "$load"`, sets
# $sent and $failed (empty when none failed).
load_start() {
  in_client "rm -f /tmp/load; end=\$((\$(date +%s) + $1)); while [ \$(date +%s) -lt \$end ]; do
    timeout 2 wget -qO- http://hostnames >/dev/null && echo ok >>/tmp/load || echo FAILED >>/tmp/load; done" &
  load=$!
}
load_counts() {
  local counts
  counts=$(in_client 'sort /tmp/load | uniq -c')
  sent=$(awk '{ n += $1 } END { print n }' <<<"$counts")
  failed=$(awk '$2 == "FAILED" { print $1 }' <<<"$counts")
}

# Every nftables table of flannel's on node $1, listed (flannel.yaml).
flannel_tables() {
  local table
  docker exec "$1" nft list tables | grep ' flannel-' | while read -r table; do
    docker exec "$1" nft list "$table"
  done
}
declare -A flannel_before
flannel=0
if kubectl get namespace kube-flannel >/dev/null 2>&1; then
  flannel=1
  for n in $(nodes); do
    flannel_before[$n]=$(flannel_tables "$n")
    [ -n "${flannel_before[$n]}" ] || fail "flannel runs, but $n has no table of flannel's"
  done
fi

# 1. CoreDNS, through the kube-dns Service's ClusterIP.
wait_for_coredns "$proxy"
kubectl delete pod client --ignore-not-found --wait >/dev/null
kubectl run client --image="$busybox" --restart=Never --command -- sleep 86400 >/dev/null
kubectl wait --for=condition=Ready pod/client --timeout=120s >/dev/null
dns=$(kubectl -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')
answer=$(in_client "nslookup kubernetes.default.svc.cluster.local $dns") ||
  fail "CoreDNS at $dns did not answer: $answer"
grep -q "Address:.*$(kubectl get service kubernetes -o jsonpath='{.spec.clusterIP}')" <<<"$answer" ||
  fail "CoreDNS at $dns answered without the kubernetes Service's address: $answer"
ok "CoreDNS answers through its ClusterIP $dns"

# 2. hostnames: each pod serves its own name.
deploy_hostnames
# CoreDNS caches an answer for up to 30 s: after an earlier run, the name may
# still give the deleted Service's address. The proxy is what is checked here.
vip=$(kubectl get service hostnames -o jsonpath='{.spec.clusterIP}')
names_vip() {
  local answer
  answer=$(in_client 'nslookup hostnames.default.svc.cluster.local') && grep -q "Address: $vip\$" <<<"$answer"
}
retry 40 names_vip || fail "CoreDNS does not give hostnames' ClusterIP $vip"
pods=$(kubectl get pods -l app=hostnames -o jsonpath='{.items[*].metadata.name}' | tr ' ' '\n' | sort)
# The pods are in the Service's EndpointSlice; the proxy programs them within
# its sync (at most once a second, both proxies), and until then refuses a new
# Service's connections, as it should. So: a first answer within 10 s, then
# every request must answer, and within 10 s each pod must have answered one.
# (A first request sent at once was refused in one test run: the proxy had
# not yet synced the slice.)
first_answer() { in_client 'timeout 2 wget -qO- http://hostnames'; }
retry 10 first_answer || fail "hostnames does not answer 10 s after its EndpointSlice lists its pods"
seen=
for ((round = 1; round <= 10; round++)); do
  seen+=$(in_client 'for i in $(seq 30); do timeout 2 wget -qO- http://hostnames 2>/tmp/err || echo "FAILED: $(cat /tmp/err)"; done')$'\n'
  grep -q FAILED <<<"$seen" && fail "requests to http://hostnames failed: $(sort <<<"$seen" | uniq -c | tr '\n' ' ')"
  [ "$(grep . <<<"$seen" | sort -u)" = "$pods" ] && break
  sleep 1
done
[ "$(grep . <<<"$seen" | sort -u)" = "$pods" ] ||
  fail "$((round * 30 - 30)) requests to http://hostnames reached $(grep . <<<"$seen" | sort -u | xargs), not the 3 pods $(xargs <<<"$pods")"
ok "hostnames answers by DNS name from all 3 pods: $(grep . <<<"$seen" | sort | uniq -c | awk '{ print $1 }' | xargs) of $(grep -c . <<<"$seen")"

# 3. The NodePort on every node, from another node.
port=$(kubectl get service hostnames -o jsonpath='{.spec.ports[0].nodePort}')
mapfile -t all < <(nodes)
for ((i = 0; i < ${#all[@]}; i++)); do
  to=${all[$i]} from=${all[$(((i + 1) % ${#all[@]}))]}
  got=$(docker exec "$from" curl -sf --max-time 2 "$(node_url "$to" "$port")") ||
    fail "NodePort $port on $to did not answer $from"
  grep -qx "$got" <<<"$pods" || fail "NodePort $port on $to answered $from with '$got'"
done
ok "NodePort $port answers on each of ${#all[@]} nodes, from another node"

# 4. A pod deleted while a client sends requests back to back: every one answers.
load_start 25
sleep 5
gone=$(head -1 <<<"$pods")
kubectl delete pod "$gone" --wait=false >/dev/null || fail "could not delete pod $gone"
wait "$load"
load_counts
[ -z "$failed" ] || fail "$failed of $sent requests failed while pod $gone was deleted"
[ "${sent:-0}" -gt 100 ] || fail "the client sent only ${sent:-0} requests in 25 s"
in_client 'for i in $(seq 30); do timeout 2 wget -qO- http://hostnames; done' | grep -qx "$gone" &&
  fail "the deleted pod $gone still answers"
ok "pod $gone deleted under load: $sent requests, none failed"

# 5. Metrics on every node (kube-proxy's names and port), and kube-nft's logs.
# localhost: kube-proxy serves them on the loopback address of the node's
# primary family (::1 on an IPv6-only cluster's nodes); its syncs counted in
# that family.
family=$(primary_family)
for n in "${all[@]}"; do
  syncs=$(docker exec "$n" curl -sf --max-time 2 http://localhost:10249/metrics |
    awk -v family="$family" '$1 == "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"" family "\"}" { print $2 }') ||
    fail "no metrics on $n:10249"
  [ "${syncs%.*}" -gt 0 ] 2>/dev/null || fail "$n's proxy counts no $family syncs (${syncs:-no such metric})"
done
ok "metrics answer on every node and count syncs"
if [ "$proxy" = kube-nft ]; then
  for pod in $(kubectl -n kube-system get pods -l k8s-app=kube-nft -o jsonpath='{.items[*].metadata.name}'); do
    logs=$(kubectl -n kube-system logs "$pod" -c kube-nft)
    grep -q "synced in" <<<"$logs" || fail "kube-nft's log in $pod shows no sync"
    # Its own commits are not drift (a container has a pid namespace of its own).
    ! grep -q "changed outside kube-nft" <<<"$logs" || fail "kube-nft in $pod repairs its own commits: $(grep -m1 'changed outside' <<<"$logs")"
  done
  ok "kube-nft's logs show its syncs, and no drift"
fi

# 6. The conntrack sysctls, in each node's network namespace (a new one starts
#    at the kernel's 60 s and 5 days).
for n in "${all[@]}"; do
  timeouts=$(docker exec "$n" cat /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait \
    /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established | tr '\n' ' ')
  [ "$timeouts" = "3600 86400 " ] || fail "$n's conntrack TCP timeouts (CLOSE_WAIT, established) are $timeouts, not 3600 86400"
done
ok "every node's conntrack TCP timeouts are kube-proxy's: CLOSE_WAIT 3600 s, established 86400 s"
if [ "$proxy" = kube-nft ]; then
  # The privileged init container wrote them; the daemon, with NET_ADMIN only
  # and a read-only /proc/sys, found them set and wrote nothing.
  for pod in $(kubectl -n kube-system get pods -l k8s-app=kube-nft -o jsonpath='{.items[*].metadata.name}'); do
    init=$(kubectl -n kube-system logs "$pod" -c conntrack-sysctls)
    grep -q "set net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600" <<<"$init" ||
      fail "$pod's init container did not set the CLOSE_WAIT timeout: $init"
    ! kubectl -n kube-system logs "$pod" -c kube-nft | grep -q "set net.netfilter" ||
      fail "$pod's daemon wrote a sysctl the init container had set"
  done
  ok "kube-nft's init container set them, and the daemon found them set"
fi

# 7. Beside flannel, another writer of nftables in the same kernel.
if [ "$flannel" = 1 ]; then
  for n in "${all[@]}"; do
    [ "$(flannel_tables "$n")" = "${flannel_before[$n]}" ] ||
      fail "flannel's tables on $n changed while $proxy synced: $(diff <(echo "${flannel_before[$n]}") <(flannel_tables "$n"))"
  done
  ok "flannel's nftables tables on every node are as flannel wrote them, after $proxy's syncs"
  node=$(kubectl get pod client -o jsonpath='{.spec.nodeName}')
  old=$(kubectl -n kube-flannel get pods -l app=flannel --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
  load_start 20
  sleep 3
  kubectl -n kube-flannel delete pod "$old" --wait=false >/dev/null || fail "could not delete flannel's pod $old"
  kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout=120s >/dev/null ||
    fail "flannel did not come back on $node"
  wait "$load"
  load_counts
  [ -z "$failed" ] || fail "$failed of $sent requests through hostnames failed while flannel restarted on $node"
  [ -n "$(flannel_tables "$node")" ] || fail "flannel, restarted on $node, wrote no table"
  drift=
  if [ "$proxy" = kube-nft ]; then
    drift=", and kube-nft saw no drift"
    pod=$(kubectl -n kube-system get pods -l k8s-app=kube-nft --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
    ! kubectl -n kube-system logs "$pod" -c kube-nft | grep -q "changed outside kube-nft" ||
      fail "kube-nft on $node took flannel's restart for drift: $(kubectl -n kube-system logs "$pod" -c kube-nft | grep -m1 'changed outside')"
  fi
  ok "flannel restarted on $node under load: $sent requests through the ClusterIP, none failed$drift"
fi
kubectl delete pod client --wait=false >/dev/null
