#!/usr/bin/env bash
# Moves a kind cluster's Service proxy from kube-proxy to kube-nft and back
# while clients send requests, with the commands of the runbook in
# docs/OPERATIONS.md ("Moving between kube-proxy and kube-nft"):
#
#   integration/kind/migrate.sh --from kube-proxy-nftables|kube-proxy-iptables [NAME]
#
# NAME is a cluster that `up.sh --proxy FROM` made. To kube-nft:
#   1. deploy/ applied; each kube-nft pod has synced once. Both proxies now
#      serve; kube-proxy's hooks (dstnat) act before kube-nft's (dstnat + 1).
#   2. kube-proxy stopped: its DaemonSet gets a nodeSelector that no node
#      matches (its manifest and ConfigMap stay, for the way back). Its rules
#      stay, and serve, until
#   3. deploy/migration/kube-proxy-cleanup.yaml runs `kube-nft cleanup
#      --kube-proxy` on every node. kube-nft's rules, already in place, serve
#      alone.
# And back:
#   4. kube-proxy's nodeSelector removed; each kube-proxy has programmed its rules.
#   5. kube-nft's DaemonSet deleted; its rules stay, and serve, until
#   6. deploy/migration/kube-nft-cleanup.yaml runs `kube-nft cleanup` on every node.
# Throughout, a pod asks http://hostnames (by DNS name, so CoreDNS is reached
# through the proxy too) and a container outside the cluster, on kind's
# network, asks a worker's NodePort, each every 50 ms with a 2 s limit. For each
# direction and client: requests, failed requests, and the longest time
# between two answers. A failed request fails the run.
set -euo pipefail
from=
if [ "${1:-}" = --from ]; then
  from=$2
  shift 2
fi
name=${1:-kube-nft}
# shellcheck source=integration/kind/lib.sh
. "$(dirname "$0")/lib.sh"
repo=$kind_dir/../..
case $from in
kube-proxy-nftables) mode=nftables ;;
kube-proxy-iptables) mode=iptables ;;
*) fail "--from is kube-proxy-nftables or kube-proxy-iptables" ;;
esac
fail() {
  echo "kind: FAILED: migration between $from and kube-nft: $*" >&2
  exit 1
}
busybox=$(busybox_image)
outside=$name-outside-client
trap 'docker rm -f "$outside" >/dev/null 2>&1 || true' EXIT
# The kernel's clock that every client and this script read alike (not
# namespaced): seconds since boot, to 10 ms.
now() { cut -d' ' -f1 /proc/uptime; }

# What each client runs: one line per request, "UPTIME ok NAME" or "UPTIME
# FAILED WHY". WHY is wget's message, or "no answer in 2 s" (timeout killed
# it); a client that asks by name also says whether the name resolves right
# after, so that a failure tells DNS from the Service path.
client_loop() {
  local dns=:
  case $1 in *//hostnames*)
    dns='if timeout 2 nslookup hostnames >/dev/null 2>&1; then out="$out; the name resolves after"; else out="$out; the name does not resolve after"; fi' ;;
  esac
  echo 'while :; do read up _ </proc/uptime
    if out=$(timeout 2 wget -qO- '"$1"' 2>&1); then echo "$up ok $out"; else
      [ -n "$out" ] || out="no answer in 2 s"; '"$dns"'; echo "$up FAILED $out"; fi
    usleep 50000; done'
}

# The Pods of a DaemonSet's label, one name a line.
pods_of() { kubectl -n kube-system get pods -l "k8s-app=$1" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }

# Runs OLD's cleanup DaemonSet of deploy/migration/ on every node, deletes it,
# and checks each node: OLD's rules gone, NEW's there.
run_cleanup() {
  local old=$1 new=$2 n
  local manifest=$repo/deploy/migration/$old-cleanup.yaml
  kubectl apply -f - <"$manifest" >/dev/null
  kubectl -n kube-system rollout status "daemonset/$old-cleanup" --timeout=180s >/dev/null ||
    fail "$old's cleanup did not finish on every node: $(kubectl -n kube-system get pods -l "k8s-app=$old-cleanup" -o wide)"
  kubectl delete -f - --wait <"$manifest" >/dev/null
  for n in $(nodes); do
    ! node_has "$n" "$old" || fail "$old's rules are still on $n after its cleanup"
    node_has "$n" "$new" || fail "$new's rules are not on $n"
  done
}

# Whether kube-nft in this pod has synced once: its log says so (its health
# port is kube-proxy's while both run, so its probes tell nothing yet).
kube_nft_synced() { kubectl -n kube-system logs "$1" | grep 'synced in' >/dev/null; }
# Whether kube-proxy in this pod has programmed its rules: they are there (it
# logs no sync by default, and kube-nft holds its health port).
kube_proxy_synced() {
  if [ "$mode" = nftables ]; then
    kubectl -n kube-system exec "$1" -- nft list table ip kube-proxy >/dev/null
  else
    kubectl -n kube-system exec "$1" -- iptables -t nat -S KUBE-SERVICES >/dev/null
  fi
}

# Whether a node's ruleset holds kube-proxy's rules (any mode) or kube-nft's.
# (grep reads all: with -q it would stop early, and pipefail see a SIGPIPE.)
node_has() {
  local node=$1 proxy=$2
  case $proxy in
  kube-nft) docker exec "$node" nft list tables | grep kube-nft >/dev/null ;;
  kube-proxy)
    docker exec "$node" nft list tables | grep -w kube-proxy >/dev/null ||
      docker exec "$node" sh -c 'iptables-save -t nat; iptables-legacy-save -t nat 2>/dev/null' | grep '^:KUBE-SERVICES' >/dev/null
    ;;
  esac
}

deploy_hostnames
port=$(kubectl get service hostnames -o jsonpath='{.spec.ports[0].nodePort}')
kubectl delete pod migrate-client --ignore-not-found --wait >/dev/null
kubectl run migrate-client --image="$busybox" --restart=Never --command -- sh -c "$(client_loop http://hostnames)" >/dev/null
kubectl wait --for=condition=Ready pod/migrate-client --timeout=120s >/dev/null
docker rm -f "$outside" >/dev/null 2>&1 || true
docker run -d --name "$outside" --network kind "$busybox" \
  sh -c "$(client_loop "$(node_url "$name-worker" "$port")")" >/dev/null
# kube-nft's image is ready before the move starts, as on a cluster with a registry.
load_kube_nft_image 2>/dev/null
# The reference opens once CoreDNS is ready and each client has had an answer.
# The kube-proxy-iptables cluster gets no checks before this, and its CoreDNS
# could become ready inside the reference (3 s into it, in a run that failed so).
wait_for_coredns "$from"
inside_answered() { kubectl logs migrate-client | grep ' ok ' >/dev/null; }
outside_answered() { docker logs "$outside" 2>&1 | grep ' ok ' >/dev/null; }
retry 60 inside_answered || fail "the client in the cluster had no answer in 60 s: $(kubectl logs --tail 3 migrate-client)"
retry 60 outside_answered || fail "the client outside had no answer in 60 s: $(docker logs --tail 3 "$outside" 2>&1)"
steady_start=$(now)
sleep 10
steady_end=$(now)

# --- to kube-nft ---
to_start=$(now)
deploy_kube_nft >/dev/null
for pod in $(pods_of kube-nft); do
  retry 120 kube_nft_synced "$pod" || fail "kube-nft in $pod has not synced"
done
kubectl -n kube-system patch daemonset kube-proxy \
  -p '{"spec":{"template":{"spec":{"nodeSelector":{"kube-nft.io/kube-proxy":"stopped"}}}}}' >/dev/null
kubectl -n kube-system wait --for=delete pod -l k8s-app=kube-proxy --timeout=300s >/dev/null ||
  fail "kube-proxy's pods did not go: $(pods_of kube-proxy | xargs)"
run_cleanup kube-proxy kube-nft
sleep 5
to_end=$(now)

# --- back to kube-proxy ---
back_start=$(now)
kubectl -n kube-system patch daemonset kube-proxy --type json \
  -p '[{"op": "remove", "path": "/spec/template/spec/nodeSelector/kube-nft.io~1kube-proxy"}]' >/dev/null
kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=300s >/dev/null
for pod in $(pods_of kube-proxy); do
  retry 120 kube_proxy_synced "$pod" || fail "kube-proxy in $pod has not programmed its rules"
done
kubectl -n kube-system delete daemonset kube-nft --cascade=foreground --wait >/dev/null
run_cleanup kube-nft kube-proxy
sleep 5
back_end=$(now)

# --- what the clients saw ---
inside=$(kubectl logs migrate-client)
outside_log=$(docker logs "$outside" 2>&1)
kubectl delete pod migrate-client --wait=false >/dev/null
# Requests, failed ones, and the longest time without an answer in [start, end]
# (from the start to the first answer, between answers, from the last to the end).
tally() {
  awk -v s="$2" -v e="$3" '$1 >= s && $1 <= e {
      n++
      if ($2 == "ok") { gap = $1 - last; if (gap > max) max = gap; last = $1 } else { f++; why = $0 }
    }
    BEGIN { last = s }
    END { gap = e - last; if (gap > max) max = gap
          printf "%d %d %d %s\n", n, f, max * 1000, why }' <<<"$1"
}
status=0
for direction in "$from, before any change (for reference):$steady_start:$steady_end" \
  "$from to kube-nft:$to_start:$to_end" "kube-nft back to $from:$back_start:$back_end"; do
  IFS=: read -r label start end <<<"$direction"
  line="$label in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }') s:"
  failed=0
  for client in inside outside; do
    if [ "$client" = inside ]; then log_text=$inside; else log_text=$outside_log; fi
    read -r n f gap why <<<"$(tally "$log_text" "$start" "$end")"
    line+=" $client $n requests, $f failed, longest gap $gap ms;"
    [ "$n" -gt 0 ] || { failed=1; why="no requests"; }
    [ "$f" = 0 ] || { failed=1; line+=" ($why)"; }
  done
  if [ "$failed" = 0 ]; then
    echo "kind: ok: $line" >&2
  else
    echo "kind: FAILED: $line" >&2
    status=1
  fi
done
exit "$status"
