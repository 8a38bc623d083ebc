#!/usr/bin/env bash
# Records the protobuf fixtures (integration/fixtures/kube-apiserver/protobuf/):
# a real control plane (cluster.sh), the objects of objects.yaml applied and a
# load balancer's status set, then each list asked for in protobuf and in JSON,
# one right after the other; then watches of each, streaming their initial
# state, in both encodings at once. The tests decode both and compare them.
#
#   integration/k8s/record-protobuf.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export KUBE_NFT_CLUSTER_PREFIX=${KUBE_NFT_CLUSTER_PREFIX:-krp}
out=$here/../fixtures/kube-apiserver/protobuf
dir=$(mktemp -d /var/tmp/kube-nft-record.XXXXXX)
trap '"$here/cluster.sh" down "$dir"; rm -rf "$dir"' EXIT
"$here/cluster.sh" up "$dir"
# shellcheck disable=SC1091
source "$dir/env"
kubectl() { ip netns exec "$CONTROL_PLANE_NETNS" "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }
kubectl apply -f "$out/objects.yaml" >&2
kubectl -n fixtures patch service lb --subresource status --type merge \
  -p '{"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.7","ipMode":"Proxy"},{"hostname":"lb.example.org"}]}}}' >&2
# The EndpointSlice controller's own slices (empty: there are no pods) settle.
sleep 5
get() {
  local accept=$1 path=$2 file=$3
  ip netns exec "$CONTROL_PLANE_NETNS" curl -sf --cacert "$CA" -H "Authorization: Bearer $ADMIN_TOKEN" \
    -A kube-nft -H "Accept: $accept" "$APISERVER$path" -o "$out/$file"
}
pb=application/vnd.kubernetes.protobuf
for kind in services:/api/v1 endpointslices:/apis/discovery.k8s.io/v1; do
  name=${kind%%:*} group=${kind#*:}
  get "$pb" "$group/namespaces/fixtures/$name" "$name.pb"
  get application/json "$group/namespaces/fixtures/$name" "$name.json"
done
get "$pb" "/api/v1/namespaces/fixtures/services?limit=2" services-page1.pb
# A refusal, as the API server encodes its Status (curl -f would drop it).
ip netns exec "$CONTROL_PLANE_NETNS" curl -s --cacert "$CA" -H "Authorization: Bearer $ADMIN_TOKEN" \
  -H "Accept: $pb" "$APISERVER/api/v1/namespaces/fixtures/services?limit=1&continue=bm90LWEtdG9rZW4" \
  -o "$out/status-bad-continue.pb"
# Watches that stream their initial state (WatchList), in both encodings at
# once, so that both see the same events: the objects, the bookmark that ends
# them, then a change and a deletion made meanwhile.
watch_params="watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion="
watchers=()
for kind in services:/api/v1 endpointslices:/apis/discovery.k8s.io/v1; do
  name=${kind%%:*} group=${kind#*:}
  for enc in "$pb:pb" "application/json:json"; do
    ip netns exec "$CONTROL_PLANE_NETNS" curl -sN --max-time 6 --cacert "$CA" -H "Authorization: Bearer $ADMIN_TOKEN" \
      -A kube-nft -H "Accept: ${enc%:*}" "$APISERVER$group/namespaces/fixtures/$name?$watch_params" \
      -o "$out/watch-$name.${enc#*:}" &
    watchers+=($!)
  done
done
sleep 2
kubectl -n fixtures label service lb changed=yes >&2
kubectl -n fixtures label endpointslice lb-empty changed=yes >&2
kubectl -n fixtures delete service np >&2
kubectl -n fixtures delete endpointslice ext-fqdn >&2
# curl ends each at its --max-time (exit 28), the watch still open.
for w in "${watchers[@]}"; do wait "$w" || [ $? = 28 ]; done
"$BIN/kube-apiserver" --version >"$out/VERSION"
ls -l "$out" >&2
