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

# The nodes' container names, and a node's address on kind's network.
nodes() { docker ps --filter "label=io.x-k8s.kind.cluster=$name" --format '{{.Names}}' | sort; }
node_ip() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }

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
