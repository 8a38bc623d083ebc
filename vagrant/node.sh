#!/usr/bin/env bash
# Every node: no iptables, containerd, kubelet and kubeadm, the bridge CNI with
# this node's pod CIDR, and static routes to the other nodes' pods.
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive

# nft-only: whatever pulled iptables in goes, and nothing may bring it back.
apt-get purge -y iptables arptables ebtables || true
apt-mark hold iptables
! command -v iptables

apt-get update
apt-get install -y nftables containerd conntrack socat ethtool curl gpg \
  containernetworking-plugins
systemctl enable --now nftables

modprobe br_netfilter || true
cat >/etc/sysctl.d/90-kubernetes.conf <<SYSCTL
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 0
SYSCTL
sysctl --system
swapoff -a
sed -i '/ swap / s/^/#/' /etc/fstab

mkdir -p /etc/containerd
containerd config default >/etc/containerd/config.toml
sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml
systemctl restart containerd

curl -fsSL "https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_MINOR}/deb/Release.key" |
  gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes.gpg
echo "deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_MINOR}/deb/ /" \
  >/etc/apt/sources.list.d/kubernetes.list
apt-get update
apt-get install -y kubelet kubeadm kubectl
apt-mark hold kubelet kubeadm kubectl
echo "KUBELET_EXTRA_ARGS=--node-ip=${NODE_IP}" >/etc/default/kubelet

mkdir -p /etc/cni/net.d
cat >/etc/cni/net.d/10-bridge.conflist <<CNI
{
  "cniVersion": "1.0.0",
  "name": "pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${POD_CIDR}"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"}
  ]
}
CNI
mkdir -p /opt/cni && ln -sfn /usr/lib/cni /opt/cni/bin

for route in ${ROUTES}; do
  ip route replace "${route%=*}" via "${route#*=}"
done
cat >/etc/network/if-up.d/pod-routes <<UP
#!/bin/sh
for route in ${ROUTES}; do ip route replace "\${route%=*}" via "\${route#*=}"; done
UP
chmod +x /etc/network/if-up.d/pod-routes
