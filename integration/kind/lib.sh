# What the kind scripts share; sourced. The cluster's functions use $name.
# shellcheck shell=bash

kind_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "kind: $*" >&2; }
fail() {
  echo "kind: FAILED: $*" >&2
  exit 1
}

# Whether the machine's capability bounding set lacks any of the 41
# capabilities (CHECKPOINT_RESTORE is number 40): `--privileged` asks for all.
lacks_capabilities() {
  local bounding
  bounding=$((16#$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)))
  (((bounding & ((1 << 41) - 1)) != (1 << 41) - 1))
}

# Builds PACKAGES of MODULE@VERSION to OUT (a file, or a directory ending in /
# for each package by its name), in a module of its own that requires it, so
# that the module's own go.mod chooses every dependency. GO_REPLACE, if set, is
# one replace directive for that module (for a dependency the Go module proxy
# no longer serves); CGO_ENABLED is 0 unless set.
go_build() {
  local out=$1 module=$2 version=$3 tags=$4 ldflags=$5
  shift 5
  local work=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind/src/${module//\//_}@$version
  mkdir -p "$work"
  (
    cd "$work"
    printf 'module kube-nft.test/kind-node\n\ngo 1.26\n\nrequire %s v%s\n' "$module" "$version" >go.mod
    [ -z "${GO_REPLACE:-}" ] || printf '\nreplace %s\n' "$GO_REPLACE" >>go.mod
    GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=${CGO_ENABLED:-0} \
      go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$out" "$@"
  )
}

# kind itself: the one on PATH, or built from its Go module.
kind_bin() {
  if command -v kind >/dev/null; then
    echo kind
  else
    bash "$kind_dir/node-image.sh" --kind
  fi
}

# kubectl as the control-plane node runs it, with the cluster's admin config:
# no kubeconfig or kubectl is needed on the machine.
kubectl() { docker exec -i "$name-control-plane" kubectl --kubeconfig /etc/kubernetes/admin.conf "$@"; }

# The nodes' container names.
nodes() { docker ps --filter "label=io.x-k8s.kind.cluster=$name" --format '{{.Names}}' | sort; }

# The cluster's primary IP family, IPv4 or IPv6: its kubernetes Service's first.
primary_family() { kubectl get service kubernetes -o jsonpath='{.spec.ipFamilies[0]}' </dev/null; }

# A node's address on kind's network in the cluster's primary family (the one
# its kubelet reports), and a URL of it: an IPv6-only cluster's nodes have IPv4
# addresses on kind's network too, which no proxy serves.
node_ip() {
  local field=IPAddress
  [ "$(primary_family)" = IPv4 ] || field=GlobalIPv6Address
  docker inspect -f "{{range .NetworkSettings.Networks}}{{.$field}}{{end}}" "$1"
}
node_url() {
  local ip
  ip=$(node_ip "$1")
  case $ip in *:*) ip="[$ip]" ;; esac
  echo "http://$ip:$2"
}

# The image pods use for shells, clients and small servers: busybox (sh, wget,
# nslookup, httpd, timeout). Debian's busybox 1.35 crashes on `wget -T`: bound
# a request with `timeout` instead.
busybox_image() {
  if [ "${KUBE_NFT_KIND_IMAGES:-published}" = local ]; then
    bash "$kind_dir/local-images.sh" busybox
  else
    echo docker.io/library/busybox:1.36
  fi
}

# Waits up to $1 seconds for the command that follows to succeed.
retry() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  "$@"
}

# kube-nft's image as users build it, from deploy/Containerfile with the
# sources alone as its context, loaded into the cluster's nodes.
load_kube_nft_image() {
  local build_args=()
  if [ "${KUBE_NFT_KIND_IMAGES:-published}" = local ]; then
    build_args=(--build-arg "BUILDER=$(bash "$kind_dir/local-images.sh" builder)"
      --build-arg "BASE=$(bash "$kind_dir/local-images.sh" base)")
  fi
  (cd "$kind_dir/../.." && tar -c Cargo.toml Cargo.lock src nft-templates integration/*.rs deploy/Containerfile) |
    DOCKER_BUILDKIT=0 docker build -q --force-rm -f deploy/Containerfile "${build_args[@]}" -t kube-nft:latest - >/dev/null
  log "kube-nft:latest is $(docker image inspect -f '{{.Size}}' kube-nft:latest | awk '{ printf "%.1f MB", $1 / 1e6 }')"
  "$(kind_bin)" load docker-image --name "$name" kube-nft:latest
}

# The cluster's pod ranges, as kubeadm was given them (one per family). Not
# to be called inside a pipeline: kubectl's `docker exec -i` reads stdin.
pod_subnet() {
  kubectl -n kube-system get configmap kubeadm-config -o jsonpath='{.data.ClusterConfiguration}' </dev/null |
    sed -n 's/^ *podSubnet: *//p'
}

# deploy/'s kube-proxy configuration (on stdin, at any indentation) as a kind
# cluster needs it: the cluster's pod ranges $1 as clusterCIDR, and
# `conntrack.maxPerCore: 0` as kind writes it for kube-proxy: a node is a
# container, whose nf_conntrack_max is the host's and read-only.
for_kind() {
  sed -e 's/^\( *\)mode: nftables$/&\n\1conntrack: {maxPerCore: 0}/' -e "s|^\( *\)clusterCIDR: .*|\1clusterCIDR: $1|"
}

# deploy/ applied as it is but for the API server's address, one that works
# before any Service does, and its configuration for_kind. Returns once
# kube-nft's DaemonSet is rolled out.
deploy_kube_nft() {
  local deploy=$kind_dir/../../deploy cidr
  cidr=$(pod_subnet)
  kubectl apply -f - <"$deploy/rbac.yaml"
  for_kind "$cidr" <"$deploy/config.yaml" | kubectl apply -f -
  sed "s/API_SERVER_HOST/$(node_ip "$name-control-plane")/" "$deploy/daemonset.yaml" | kubectl apply -f -
  kubectl -n kube-system rollout status daemonset/kube-nft --timeout=300s
}

# kube-nft installed as users of a Helm chart install it: deploy/helm/kube-nft
# (made from deploy/), checked against deploy/ first (deploy/helm/check.sh),
# then installed with the API server's address and its configuration for_kind as
# values. Helm runs in the control-plane node, as kubectl does, on the chart
# copied there (not under /tmp: a kind node mounts a tmpfs there, and `docker
# cp` writes beneath it). Returns once the DaemonSet is rolled out.
install_chart() {
  local helm chart=$kind_dir/../../deploy/helm cidr
  cidr=$(pod_subnet)
  helm=$(bash "$kind_dir/helm.sh") || fail "helm could not be built"
  if bash "$chart/check.sh" "$helm"; then
    log "ok: the Helm chart renders deploy/ exactly with its defaults, lints, and needs apiServer.host"
  else
    log "FAILED: the Helm chart is not deploy/ (deploy/helm/check.sh)"
  fi
  docker cp -q "$helm" "$name-control-plane:/usr/local/bin/helm"
  docker exec "$name-control-plane" rm -rf /opt/kube-nft-chart
  docker cp -q "$chart/kube-nft" "$name-control-plane:/opt/kube-nft-chart"
  {
    echo "config: |"
    sed -n '/^  config.conf: |$/,$p' "$kind_dir/../../deploy/config.yaml" | tail -n +2 |
      sed 's/^  //' | for_kind "$cidr"
  } | docker exec -i "$name-control-plane" sh -c 'cat >/opt/kube-nft-kind.yaml'
  in_node_helm install kube-nft /opt/kube-nft-chart --namespace kube-system \
    --set apiServer.host="$(node_ip "$name-control-plane")" -f /opt/kube-nft-kind.yaml >/dev/null ||
    fail "helm install of deploy/helm/kube-nft failed"
  kubectl -n kube-system rollout status daemonset/kube-nft --timeout=300s >/dev/null ||
    fail "kube-nft's DaemonSet, installed by Helm, did not roll out"
  [ "$(kubectl -n kube-system get daemonset kube-nft -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" = Helm ] ||
    fail "kube-nft's DaemonSet is not Helm's"
  log "ok: kube-nft installed by helm install of deploy/helm/kube-nft, on every node"
}
in_node_helm() { docker exec "$name-control-plane" helm --kubeconfig /etc/kubernetes/admin.conf "$@"; }

# `helm upgrade` of one value, as a user changes one, in a cluster that
# install_chart made: every kube-nft pod is replaced with it, one node at a
# time, its rules serving throughout.
upgrade_chart() {
  in_node_helm upgrade kube-nft /opt/kube-nft-chart --namespace kube-system --reuse-values \
    --set resources.requests.memory=160Mi >/dev/null || fail "helm upgrade failed"
  kubectl -n kube-system rollout status daemonset/kube-nft --timeout=300s >/dev/null ||
    fail "kube-nft's DaemonSet, upgraded by Helm, did not roll out"
  local requests
  requests=$(kubectl -n kube-system get pods -l k8s-app=kube-nft \
    -o jsonpath='{range .items[*]}{.spec.containers[0].resources.requests.memory}{"\n"}{end}' | sort -u)
  if [ "$requests" = 160Mi ]; then
    log "ok: helm upgrade with a changed value rolled every kube-nft pod to it"
  else
    log "FAILED: after helm upgrade, kube-nft's pods request ${requests//$'\n'/, } (want 160Mi)"
    return 1
  fi
}

# upstream's `hostnames` example: 3 pods that each serve their own name on 9376
# (as serve_hostname does), behind a NodePort Service on 80. An earlier run's
# goes first, pods and all. Returns once the pods are ready and the
# EndpointSlice controller has published them: from there on it is the proxy's
# part.
deploy_hostnames() {
  local busybox
  busybox=$(busybox_image)
  kubectl delete deployment hostnames --ignore-not-found --cascade=foreground --wait >/dev/null
  kubectl delete service hostnames --ignore-not-found --wait >/dev/null
  kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: hostnames}
spec:
  replicas: 3
  selector: {matchLabels: {app: hostnames}}
  template:
    metadata: {labels: {app: hostnames}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: hostnames
        image: $busybox
        command: [sh, -c, 'mkdir -p /www && hostname >/www/index.html && exec httpd -f -p 9376 -h /www']
        ports: [{containerPort: 9376}]
        readinessProbe: {httpGet: {path: /, port: 9376}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: hostnames}
spec:
  type: NodePort
  selector: {app: hostnames}
  ports: [{port: 80, targetPort: 9376}]
EOF
  kubectl rollout status deployment/hostnames --timeout=300s >/dev/null
  retry 60 hostnames_slice_ready || fail "hostnames' EndpointSlice does not list its 3 pods as ready"
}

# Waits for CoreDNS's pods to be Ready, or fails with what a failure needs to
# be understood: CoreDNS's pods, their last words, and the proxy's on their
# nodes (CoreDNS is ready once it has listed the API server through the
# kubernetes Service's ClusterIP, which the proxy serves). PROXY is kube-nft
# or kube-proxy-MODE. The pods are waited for, not the Deployment's rollout:
# CoreDNS starts with the cluster, before any proxy, and becomes ready some
# time after the proxy serves the kubernetes Service (15 and 56 s, with
# kube-nft deployed 7 minutes after it). A Deployment not ready 600 s after it
# started is marked failed for good (progressDeadlineSeconds), and `rollout
# status` then fails at once: on a loaded machine a check failed so, with the
# pods Running at 10 minutes.
wait_for_coredns() {
  kubectl -n kube-system wait pod -l k8s-app=kube-dns --for=condition=Ready --timeout=300s >/dev/null ||
    fail "CoreDNS is not ready: $(coredns_story "$1" 2>&1)"
}

coredns_story() {
  local proxy=$1 pod node
  kubectl -n kube-system get pods -l k8s-app=kube-dns -o wide
  for pod in $(kubectl -n kube-system get pods -l k8s-app=kube-dns -o jsonpath='{.items[*].metadata.name}'); do
    echo "--- logs of $pod"
    kubectl -n kube-system logs "$pod" --tail=20 2>&1 || true
    node=$(kubectl -n kube-system get pod "$pod" -o jsonpath='{.spec.nodeName}')
    echo "--- $proxy on $node"
    kubectl -n kube-system logs --all-containers --tail=30 \
      "$(kubectl -n kube-system get pods -o wide --field-selector "spec.nodeName=$node" | awk -v p="${proxy%-*tables}" '$1 ~ "^"p {print $1; exit}')" 2>&1 || true
    echo "--- conntrack to the kubernetes Service on $node"
    docker exec "$node" sh -c "conntrack -L -d $(kubectl get service kubernetes -o jsonpath='{.spec.clusterIP}') 2>/dev/null | head -5" || true
  done
}

hostnames_slice_ready() {
  [ "$(kubectl get endpointslices -l kubernetes.io/service-name=hostnames \
    -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}x{end}')" = xxx ]
}
