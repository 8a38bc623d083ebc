#!/usr/bin/env bash
# A real Kubernetes control plane in network namespaces: etcd, kube-apiserver
# and kube-controller-manager as build.sh builds them. Nothing runs in the
# host's namespace and nothing is left behind.
#
# KUBE_NFT_BIN names the kube-nft binary (default: target/debug/kube-nft).
#
#   integration/k8s/cluster.sh up DIR     # start; DIR gets the keys, logs, pids
#                                         # and env (APISERVER, KUBECONFIG, …)
#   integration/k8s/cluster.sh down DIR   # stop every process, delete the namespaces
#   integration/k8s/cluster.sh smoke      # up; deploy/ dry-run and its RBAC
#                                         # checked with `kubectl auth can-i`; one
#                                         # Service and two Pods made Ready by hand,
#                                         # the real EndpointSlice controller's
#                                         # slice; kube-nft, as the DaemonSet runs
#                                         # it, programming it in a node namespace;
#                                         # then down
#
# Layout: a fabric namespace with a bridge (10.100.0.0/24); the control plane's
# namespace at 10.100.0.1 on it; node namespaces join it at .11, .12, …
# Authentication is a static token (the harness's admin, system:masters) and
# service-account tokens signed with a key made here; authorization is RBAC, so
# kube-nft's ServiceAccount has only what deploy/'s ClusterRole grants.
# Exits non-zero on any failure; prints the versions it ran.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=${KUBE_NFT_CLUSTER_PREFIX:-kc}
fabric=${prefix}-fab
cp_ns=${prefix}-cp
cp_ip=10.100.0.1
kube_nft=${KUBE_NFT_BIN:-$here/../../target/debug/kube-nft}
# The bench widens it: 100k Services need more than a /16's 65k ClusterIPs.
service_cidr=${KUBE_NFT_SERVICE_CIDR:-10.96.0.0/16}

log() { echo "cluster: $*" >&2; }

ns_exec() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# Starts a process in a namespace, detached, its output in DIR/NAME.log.
start() {
  local dir=$1 ns=$2 name=$3; shift 3
  ip netns exec "$ns" setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo "$! $name" >>"$dir/pids"
}

# Polls a command until it succeeds, for at most $2 seconds.
wait_for() {
  local what=$1 limit=$2; shift 2
  local i
  for ((i = 0; i < limit * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  log "gave up after ${limit}s waiting for $what"
  return 1
}

keys() {
  local dir=$1
  local pki=$dir/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kube-nft-test-ca \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' "$cp_ip" >"$pki/san.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  admin_token=$(openssl rand -hex 16)
  echo "$admin_token,kube-nft-test-admin,kube-nft-test-admin,system:masters" >"$pki/tokens.csv"
  cat >"$dir/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://$cp_ip:6443", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {token: "$admin_token"}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
EOF
}

network() {
  ip netns add "$fabric"
  ip netns add "$cp_ns"
  ns_exec "$fabric" ip link add br0 type bridge
  ns_exec "$fabric" ip link set br0 up
  ns_exec "$fabric" ip link set lo up
  # Each end is made in its namespace, so its name needs to be unique only there.
  ip link add fabric0 netns "$cp_ns" type veth peer name cp netns "$fabric"
  ns_exec "$fabric" ip link set cp master br0 up
  ns_exec "$cp_ns" ip link set lo up
  ns_exec "$cp_ns" ip addr add "$cp_ip/24" dev fabric0
  ns_exec "$cp_ns" ip link set fabric0 up
}

start_controllers() {
  local dir=$1 bin=$2 pki=$1/pki
  start "$dir" "$cp_ns" kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/admin.kubeconfig" \
    --controllers endpointslice,endpointslicemirroring,namespace,serviceaccount,serviceaccount-token,garbagecollector,service-cidr-controller \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 10257 \
    --authentication-skip-lookup
  wait_for "kube-controller-manager /healthz" 60 ns_exec "$cp_ns" curl -skf https://127.0.0.1:10257/healthz
}

# Stops one of the processes `up` started, gracefully for five seconds, then not.
stop() {
  local dir=$1 name=$2
  local pid
  pid=$(awk -v n="$name" '$2 == n { p = $1 } END { print p }' "$dir/pids")
  [ -n "$pid" ] || { log "$name is not running"; return 1; }
  kill -TERM -- "-$pid"
  wait_for "$name to stop" 5 gone "$pid" 2>/dev/null || kill -KILL -- "-$pid"
  wait_for "$name to stop" 10 gone "$pid"
  sed -i "/^$pid $name\$/d" "$dir/pids"
}

start_apiserver() {
  local dir=$1 bin=$2 pki=$1/pki
  start "$dir" "$cp_ns" kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --bind-address "$cp_ip" --advertise-address "$cp_ip" --secure-port 6443 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range "$service_cidr" \
    --allow-privileged=true  # as kubeadm's: kube-nft's init container is privileged
  local token
  token=$(cut -d, -f1 "$pki/tokens.csv")
  wait_for "kube-apiserver /readyz" 90 ns_exec "$cp_ns" \
    curl -sf --cacert "$pki/ca.crt" -H "Authorization: Bearer $token" "https://$cp_ip:6443/readyz"
}

# Whether a process has ended (a zombie has: nobody may be left to reap it).
gone() {
  local state
  state=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true)
  [ -z "$state" ] || [ "$state" = Z ]
}

# Stops the API server and starts it again; with `compact`, etcd's history is
# compacted while it is down, so a watch that resumes from before gets 410 Gone.
restart_apiserver() {
  local dir=$1 compact=${2:-}
  # Its graceful shutdown waits on long-running requests for longer than a test
  # wants: `stop` gives it five seconds, then SIGKILL (a crash is a restart too).
  stop "$dir" kube-apiserver
  if [ "$compact" = compact ]; then
    local revision
    revision=$(ns_exec "$cp_ns" curl -sf http://127.0.0.1:2379/v3/kv/range -d '{"key":"AA=="}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])')
    ns_exec "$cp_ns" curl -sf http://127.0.0.1:2379/v3/kv/compaction -d "{\"revision\":\"$revision\",\"physical\":true}" >/dev/null
    log "etcd compacted at revision $revision"
  fi
  start_apiserver "$dir" "$BIN"
}

up() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local bin
  bin=$("$here/build.sh")
  : >"$dir/pids"
  keys "$dir"
  network
  local pki=$dir/pki
  start "$dir" "$cp_ns" etcd "$bin/etcd" --data-dir "$dir/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380
  wait_for "etcd" 30 ns_exec "$cp_ns" curl -sf http://127.0.0.1:2379/health
  start_apiserver "$dir" "$bin"
  start_controllers "$dir" "$bin"
  cat >"$dir/env" <<EOF
APISERVER=https://$cp_ip:6443
APISERVER_IP=$cp_ip
KUBECONFIG=$dir/admin.kubeconfig
CA=$pki/ca.crt
ADMIN_TOKEN=$admin_token
CONTROL_PLANE_NETNS=$cp_ns
FABRIC_NETNS=$fabric
BIN=$bin
EOF
  log "up: etcd $("$bin/etcd" --version | sed -n 's/^etcd Version: //p'), kube-apiserver $("$bin/kube-apiserver" --version | sed 's/^Kubernetes //'), kube-controller-manager $("$bin/kube-controller-manager" --version | sed 's/^Kubernetes //')"
}

down() {
  local dir=$1
  if [ -f "$dir/pids" ]; then
    # Last started first; each was started with setsid, so its group goes too.
    tac "$dir/pids" | while read -r pid _; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 1
    tac "$dir/pids" | while read -r pid _; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    rm -f "$dir/pids"
  fi
  for ns in $(ip netns list | awk -v p="$prefix-" 'index($1, p) == 1 { print $1 }'); do
    ip netns del "$ns"
  done
}

# Every request is bounded, so that a stuck API server fails the caller instead of hanging it.
kubectl() { ns_exec "$CONTROL_PLANE_NETNS" "$BIN/kubectl" --kubeconfig "$KUBECONFIG" --request-timeout 30s "$@"; }

# deploy/ against the real API server: every manifest passes a server-side dry
# run; the RBAC and ConfigMap are applied; kube-nft's ServiceAccount may read
# what it watches and nothing else.
deploy_manifests() {
  local deploy=$here/../../deploy
  kubectl apply --dry-run=server -f "$deploy/rbac.yaml" -f "$deploy/config.yaml" -f "$deploy/daemonset.yaml" >/dev/null
  kubectl apply -f "$deploy/rbac.yaml" -f "$deploy/config.yaml" >/dev/null
  local as=system:serviceaccount:kube-system:kube-nft check
  for check in "list services" "watch services" "get nodes" "watch endpointslices.discovery.k8s.io" "list servicecidrs.networking.k8s.io"; do
    # shellcheck disable=SC2086
    [ "$(kubectl auth can-i $check --as "$as" 2>/dev/null || true)" = yes ] || { log "kube-nft may not $check"; return 1; }
  done
  for check in "create services" "update endpointslices.discovery.k8s.io" "delete nodes" "patch nodes" \
    "get secrets" "list secrets" "list pods" "create events" "create serviceaccounts --subresource=token"; do
    # shellcheck disable=SC2086
    [ "$(kubectl auth can-i $check --as "$as" 2>/dev/null || true)" = no ] || { log "kube-nft may $check: more than it needs"; return 1; }
  done
}

# Runs kube-nft in a node's namespace as the DaemonSet runs it: deploy/'s
# ConfigMap as its config, KUBERNETES_SERVICE_HOST/PORT naming the API server,
# and a token of its ServiceAccount with the cluster's CA where client
# libraries look for them (a tmpfs on /run in a mount namespace of its own).
# Each call writes its files in a directory of its own, as each pod gets its
# own projected volume: nodes started at once must not share a file. With
# DAEMONSET_LIMIT set, kube-nft is stopped after that many seconds.
daemonset_run() {
  local dir=$1 node=$2 node_name=$3; shift 3
  local pod_dir
  pod_dir=$(mktemp -d "$dir/daemonset-$node_name.XXXXXX")
  local sa=$pod_dir/serviceaccount
  mkdir "$sa"
  kubectl create token kube-nft -n kube-system --duration 1h >"$sa/token"
  cp "$CA" "$sa/ca.crt"
  echo kube-system >"$sa/namespace"
  kubectl get configmap kube-nft -n kube-system -o jsonpath='{.data.config\.conf}' >"$pod_dir/config.conf"
  local bounded=()
  [ -z "${DAEMONSET_LIMIT:-}" ] || bounded=(timeout --kill-after 5 "$DAEMONSET_LIMIT")
  # The node is a network namespace, where nf_conntrack_max (the host's) is
  # read-only: left alone, as kind does for kube-proxy. The init container's
  # step first, then the daemon.
  local in_a_netns=--conntrack-max-per-core=0
  ip netns exec "$node" "$kube_nft" run --config="$pod_dir/config.conf" --init-only "$in_a_netns" >&2
  # exec: the caller's process becomes kube-nft, so that stopping it stops kube-nft.
  exec "${bounded[@]}" ip netns exec "$node" env -u KUBECONFIG KUBERNETES_SERVICE_HOST="${APISERVER_IP}" KUBERNETES_SERVICE_PORT=6443 \
    unshare --mount --propagation private sh -c '
      mount -t tmpfs tmpfs /run &&
      mkdir -p /run/secrets/kubernetes.io &&
      cp -r "$1" /run/secrets/kubernetes.io/serviceaccount &&
      shift && exec "$@"' sh "$sa" \
    "$kube_nft" run --config="$pod_dir/config.conf" --hostname-override="$node_name" "$in_a_netns" "$@"
}

# Wires a node's namespace to the fabric at this address (a /24 beside the API
# server's).
join() {
  local node=$1 ip=$2
  local n=${ip##*.}
  ip link add fabric0 netns "$node" type veth peer name "n${n}" netns "$FABRIC_NETNS"
  ns_exec "$FABRIC_NETNS" ip link set "n${n}" master br0 up
  ns_exec "$node" ip link set lo up
  ns_exec "$node" ip addr add "$ip/24" dev fabric0
  ns_exec "$node" ip link set fabric0 up
}

# A new node namespace on the fabric, for the benches. Service addresses route
# off the node, as on a real one: before a proxy's rules are in, a connection
# to a VIP leaves and is dropped upstream.
bench_node() {
  local node=$1 ip=$2
  ip netns add "$node"
  join "$node" "$ip"
  ns_exec "$node" ip route add default via "$cp_ip"
}

# Registers a Node as its kubelet would: its address, its pod CIDR, Ready. The
# EndpointSlice controller skips pods on a node it does not know.
register_node() {
  local name=$1 ip=$2 pod_cidr=$3
  api POST /api/v1/nodes \
    "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$name\"},\"spec\":{\"podCIDR\":\"$pod_cidr\",\"podCIDRs\":[\"$pod_cidr\"]}}" >/dev/null
  api PATCH "/api/v1/nodes/$name/status" \
    "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"$ip\"}],\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}" >/dev/null
}

# What a kubelet writes once a pod runs: its address, and Ready.
pod_ready() {
  local namespace=$1 pod=$2 ip=$3
  api PATCH "/api/v1/namespaces/$namespace/pods/$pod/status" \
    "{\"status\":{\"phase\":\"Running\",\"podIP\":\"$ip\",\"podIPs\":[{\"ip\":\"$ip\"}],\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}" >/dev/null
}

# Talks to the API server from the control plane's namespace, as the admin.
api() {
  local method=$1 path=$2 body=${3:-}
  local args=(-sf -m 30 --cacert "$CA" -H "Authorization: Bearer $ADMIN_TOKEN" -X "$method")
  if [ -n "$body" ]; then
    local type=application/json
    [ "$method" = PATCH ] && type=application/merge-patch+json
    args+=(-H "Content-Type: $type" --data-binary "$body")
  fi
  ns_exec "$CONTROL_PLANE_NETNS" curl "${args[@]}" "$APISERVER$path"
}

smoke() {
  smoke_dir=$(mktemp -d /var/tmp/kube-nft-cluster.XXXXXX)
  trap 'down "$smoke_dir"; rm -rf "$smoke_dir"' EXIT
  local dir=$smoke_dir
  up "$dir"
  # shellcheck disable=SC1091
  source "$dir/env"
  register_node node-a 10.100.0.11 10.244.1.0/24
  api POST /api/v1/namespaces/default/services \
    '{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"selector":{"app":"web"},"ports":[{"name":"http","port":80,"targetPort":9376}]}}' >/dev/null
  local ip
  for ip in 10.244.1.10 10.244.1.11; do
    local pod=web-${ip##*.}
    api POST /api/v1/namespaces/default/pods \
      "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"$pod\",\"labels\":{\"app\":\"web\"}},\"spec\":{\"nodeName\":\"node-a\",\"containers\":[{\"name\":\"web\",\"image\":\"none\",\"ports\":[{\"containerPort\":9376}]}]}}" >/dev/null
    pod_ready default "$pod" "$ip"
  done
  slice_has_both() {
    api GET "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io/service-name%3Dweb" |
      python3 -c 'import json,sys; eps=[a for s in json.load(sys.stdin)["items"] for e in s.get("endpoints") or [] if e["conditions"].get("ready") for a in e["addresses"]]; sys.exit(0 if sorted(eps)==["10.244.1.10","10.244.1.11"] else 1)'
  }
  wait_for "the EndpointSlice controller's slice for web" 30 slice_has_both
  local cluster_ip
  cluster_ip=$(api GET /api/v1/namespaces/default/services/web | python3 -c 'import json,sys; print(json.load(sys.stdin)["spec"]["clusterIP"])')
  # A node namespace on the fabric, and kube-nft synced once from the API server.
  local node=${prefix}-node-a
  ip netns add "$node"
  join "$node" 10.100.0.11
  deploy_manifests
  # --once waits for the API server as long as it takes: bounded here, so that
  # a kube-nft that never gets through fails the test instead of hanging it.
  (DAEMONSET_LIMIT=120 daemonset_run "$dir" "$node" node-a --once) >"$dir/kube-nft.log" 2>&1 ||
    { tail -50 "$dir/kube-nft.log" >&2; log "kube-nft run --once failed, or did not finish within 120 s"; exit 1; }
  local listing
  listing=$(ns_exec "$node" nft list ruleset)
  for want in "$cluster_ip . tcp . 80 comment \"default/web:http\" : goto pick-2" "$cluster_ip . tcp . 80 . 0 : 10.244.1.10 . 9376" \
    "$cluster_ip . tcp . 80 . 1 : 10.244.1.11 . 9376" "numgen random mod 2 map @endpoints-2"; do
    grep -qF -- "$want" <<<"$listing" || { echo "$listing" >&2; log "the node's ruleset lacks: $want"; exit 1; }
  done
  log "smoke passed: deploy/ accepted by the API server (dry run) and its RBAC least privilege; Service web ($cluster_ip) from the real API server and EndpointSlice controller, programmed by kube-nft running as the DaemonSet runs it"
}

# For tests that drive a cluster themselves: the subcommands after `up` take its DIR.
with_env() {
  # shellcheck disable=SC1091
  source "$1/env"
}

case ${1:-} in
up) up "${2:?usage: cluster.sh up DIR}" ;;
down) down "${2:?usage: cluster.sh down DIR}" ;;
smoke) smoke ;;
join) with_env "$2"; join "$3" "$4" ;;                      # DIR NETNS IP
bench-node) with_env "$2"; bench_node "$3" "$4" ;;          # DIR NETNS IP
node) with_env "$2"; register_node "$3" "$4" "$5" ;;        # DIR NAME IP POD_CIDR
pod-ready) with_env "$2"; pod_ready "$3" "$4" "$5" ;;       # DIR NAMESPACE POD IP
kubectl) with_env "$2"; shift 2; kubectl "$@" ;;            # DIR ARGS… (stdin passes)
deploy) with_env "$2"; deploy_manifests ;;                  # DIR
# DIR NETNS NODE_NAME [ARGS…]: kube-nft in the foreground, as the DaemonSet runs it.
restart-apiserver) with_env "$2"; restart_apiserver "$2" "${3:-}" ;;  # DIR [compact]
stop-apiserver) with_env "$2"; stop "$2" kube-apiserver ;;            # DIR
start-apiserver) with_env "$2"; start_apiserver "$2" "$BIN" ;;         # DIR
stop-controllers) with_env "$2"; stop "$2" kube-controller-manager ;;  # DIR
start-controllers) with_env "$2"; start_controllers "$2" "$BIN" ;;     # DIR
daemonset) with_env "$2"; dir=$2 node=$3 name=$4; shift 4; daemonset_run "$dir" "$node" "$name" "$@" ;;
*)
  echo "usage: cluster.sh up DIR | down DIR | smoke | join|node|pod-ready|kubectl|deploy|daemonset DIR …" >&2
  exit 2
  ;;
esac
