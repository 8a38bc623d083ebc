#!/usr/bin/env bash
# A kind cluster whose Service proxy is kube-nft, deployed from deploy/ as users
# deploy it (or, for comparison, kube-proxy as kubeadm deploys it):
#
#   integration/kind/up.sh [--proxy P] [--chart] [NAME]   # create it and deploy; it stays
#   integration/kind/up.sh --down [NAME]                  # delete it
#
# NAME defaults to kube-nft. P is kube-nft (the default), kube-proxy-nftables or
# kube-proxy-iptables. --chart installs kube-nft with its Helm chart
# (deploy/helm/kube-nft, made from deploy/) instead of applying deploy/. One control-plane node and two workers
# (integration/kind/kind-config.yaml). KUBE_NFT_KIND_IMAGES chooses where
# everything comes from:
#   published (default)  kind's published node image and CNI (kindnetd), and
#                        the public base images of deploy/Containerfile;
#   local                nothing from a registry: the node image, the images
#                        kubeadm asks for and the base images are built here from
#                        Go modules and Debian's packages (node-image.sh,
#                        local-images.sh), and pods are wired by a CNI config this
#                        script writes (ptp, host-local, a route per node).
# kind itself is the one on PATH, or built from its Go module. Needs root and a
# docker daemon (docker.sh starts Debian's where none runs).
set -euo pipefail
down=0 proxy=kube-nft chart=0
while [ $# -gt 0 ]; do
  case $1 in
  --down) down=1 ;;
  --proxy) proxy=$2 && shift ;;
  --chart) chart=1 ;;
  -*) echo "usage: up.sh [--proxy kube-nft|kube-proxy-nftables|kube-proxy-iptables] [--chart] [--down] [NAME]" >&2 && exit 2 ;;
  *) break ;;
  esac
  shift
done
name=${1:-kube-nft}
# shellcheck source=integration/kind/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$kind_dir/../.."
images=${KUBE_NFT_KIND_IMAGES:-published}
case $images in published | local) ;; *) fail "KUBE_NFT_KIND_IMAGES is published or local" ;; esac
case $proxy in
kube-nft) mode=none ;;
kube-proxy-nftables) mode=nftables ;;
kube-proxy-iptables) mode=iptables ;;
*) fail "--proxy is kube-nft, kube-proxy-nftables or kube-proxy-iptables" ;;
esac

bash "$kind_dir/docker.sh" start
kind=$(kind_bin)
if [ "$down" = 1 ]; then
  "$kind" delete cluster --name "$name"
  exit 0
fi

config=$(mktemp)
trap 'rm -f "$config"' EXIT
sed "s/kubeProxyMode: none/kubeProxyMode: $mode/" "$kind_dir/kind-config.yaml" >"$config"
node_image=()
if [ "$images" = local ]; then
  node_image=(--image "$(bash "$kind_dir/node-image.sh")")
  sed -i 's/^networking:$/networking:\n  disableDefaultCNI: true/' "$config"
fi
# kubelet 1.36 refuses cgroup v1 unless told otherwise.
if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  printf 'kubeadmConfigPatches:\n- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n' >>"$config"
fi
"$kind" create cluster --name "$name" --config "$config" "${node_image[@]}" --wait 0s

if [ "$images" = local ]; then
  # kindnetd's job, done once: each node's pods on its podCIDR (ptp veths,
  # host-local addresses), a route to every other node's, and masquerade for
  # what leaves the pod network.
  pod_subnet=$(sed -n 's/^ *podSubnet: *//p' "$config")
  for n in $(nodes); do
    cidr=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}')
    mtu=$(docker exec "$n" cat /sys/class/net/eth0/mtu)
    docker exec -i "$n" sh -c 'cat >/etc/cni/net.d/10-kube-nft-ptp.conflist' <<EOF
{"cniVersion": "0.3.1", "name": "kind", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": $mtu,
   "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state", "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "$cidr"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
    for m in $(nodes); do
      [ "$m" != "$n" ] || continue
      docker exec "$n" ip route replace "$(kubectl get node "$m" -o jsonpath='{.spec.podCIDR}')" via "$(node_ip "$m")"
    done
    docker exec -i "$n" nft -f - <<EOF
table ip kind-pod-network {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr $pod_subnet ip daddr != $pod_subnet masquerade
  }
}
EOF
  done
  # The images the checks' pods run.
  "$kind" load docker-image --name "$name" "$(busybox_image)"
fi

if [ "$proxy" = kube-nft ]; then
  load_kube_nft_image
  if [ "$chart" = 1 ]; then install_chart; else deploy_kube_nft; fi
else
  kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=300s
fi
log "$proxy runs on every node of $name"
