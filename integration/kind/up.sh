#!/usr/bin/env bash
# A kind cluster whose Service proxy is kube-nft, deployed from deploy/ as users
# deploy it (or, for comparison, kube-proxy as kubeadm deploys it):
#
#   integration/kind/up.sh [--proxy P] [--chart] [--zones] [--dual-stack | --ipv6] [NAME]   # create it and deploy; it stays
#   integration/kind/up.sh --down [NAME]                  # delete it
#
# NAME defaults to kube-nft. P is kube-nft (the default), kube-proxy-nftables or
# kube-proxy-iptables. --chart installs kube-nft with its Helm chart
# (deploy/helm/kube-nft, made from deploy/) instead of applying deploy/. One control-plane node and two workers
# (integration/kind/kind-config.yaml); with --zones, six workers in three
# zones instead, two to a zone (topology.kubernetes.io/zone zone-a, zone-b,
# zone-c), as upstream's Traffic Distribution and Topology Hints tests need.
# (Not the control plane as a sixth: the EndpointSlice controller leaves
# control-plane nodes out of its count of a zone's CPUs, so a zone holding one
# gets no hints.) With --dual-stack, IPv4 and IPv6: kind's ipFamily: dual, its
# default dual-stack ranges, flannel and the proxy in both families; with
# --ipv6, IPv6 alone (kind's ipFamily: ipv6 and its IPv6 ranges).
# KUBE_NFT_KIND_IMAGES chooses where
# everything comes from:
#   published (default)  kind's published node image and CNI (kindnetd), and
#                        the public base images of deploy/Containerfile;
#   local                nothing from a registry: the node image, the images
#                        kubeadm asks for and the base images are built here from
#                        Go modules and Debian's packages (node-image.sh,
#                        local-images.sh), and pods are wired by flannel in
#                        its nftables mode (flannel.yaml) in kindnetd's place.
# kind itself is the one on PATH, or built from its Go module. Needs root and a
# docker daemon (docker.sh starts Debian's where none runs).
set -euo pipefail
down=0 proxy=kube-nft chart=0 zones=0 family=ipv4
while [ $# -gt 0 ]; do
  case $1 in
  --down) down=1 ;;
  --proxy) proxy=$2 && shift ;;
  --chart) chart=1 ;;
  --zones) zones=1 ;;
  --dual-stack) family=dual ;;
  --ipv6) family=ipv6 ;;
  -*) echo "usage: up.sh [--proxy kube-nft|kube-proxy-nftables|kube-proxy-iptables] [--chart] [--zones] [--dual-stack | --ipv6] [--down] [NAME]" >&2 && exit 2 ;;
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
case $family in
dual) sed -i -e 's|^  podSubnet: .*|  podSubnet: 10.244.0.0/16,fd00:10:244::/56|' \
  -e 's|^  serviceSubnet: .*|  serviceSubnet: 10.96.0.0/16,fd00:10:96::/112|' \
  -e 's/^networking:$/networking:\n  ipFamily: dual/' "$config" ;;
ipv6) sed -i -e 's|^  podSubnet: .*|  podSubnet: fd00:10:244::/56|' \
  -e 's|^  serviceSubnet: .*|  serviceSubnet: fd00:10:96::/112|' \
  -e 's/^networking:$/networking:\n  ipFamily: ipv6/' "$config" ;;
esac
if [ "$zones" = 1 ]; then
  sed -i '/^nodes:$/,$d' "$config"
  {
    echo "nodes:"
    for role_zone in control-plane:a worker:a worker:a worker:b worker:b worker:c worker:c; do
      printf -- '- role: %s\n  labels: {topology.kubernetes.io/zone: zone-%s}\n' "${role_zone%:*}" "${role_zone#*:}"
    done
  } >>"$config"
fi
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
  # A CNI in kindnetd's place (whose Go module is not served here): flannel in
  # its nftables mode (flannel.yaml), which writes nftables tables of its own
  # beside the proxy's. It reaches the API server through a Service, so it
  # comes up once the proxy does.
  flannel=$(bash "$kind_dir/local-images.sh" flannel)
  "$kind" load docker-image --name "$name" "$flannel" "$(busybox_image)"
  families=()
  case $family in
  dual) families=(-e 's|"EnableNFTables": true,|&\n      "EnableIPv6": true, "IPv6Network": "fd00:10:244::/56",|') ;;
  ipv6) families=(-e 's|"EnableNFTables": true,|&\n      "EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00:10:244::/56",|') ;;
  esac
  sed -e "s|FLANNEL_IMAGE|$flannel|" "${families[@]}" "$kind_dir/flannel.yaml" | kubectl apply -f - >/dev/null
fi

if [ "$proxy" = kube-nft ]; then
  load_kube_nft_image
  if [ "$chart" = 1 ]; then install_chart; else deploy_kube_nft; fi
else
  kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=300s
fi
if [ "$images" = local ]; then
  kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout=300s >/dev/null ||
    fail "flannel did not come up on every node of $name"
  kubectl wait node --all --for=condition=Ready --timeout=120s >/dev/null ||
    fail "the nodes of $name are not Ready with flannel"
fi
log "$proxy runs on every node of $name"
