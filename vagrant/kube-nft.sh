#!/usr/bin/env bash
# kube-nft as a systemd unit: the host's release build, kube-proxy's config
# format, and a kubeconfig for the read-only identity the control plane made.
set -euxo pipefail
install -m 0755 /kube-nft/target/release/kube-nft /usr/local/bin/kube-nft
mkdir -p /etc/kube-nft
install -m 0600 /kube-nft/target/kube-nft.kubeconfig /etc/kube-nft/kubeconfig
# The kubeconfig names the API server by its node address, never by the
# `kubernetes` Service, which works only once kube-nft does.
sed -i "s|server: .*|server: ${API_SERVER}|" /etc/kube-nft/kubeconfig
cat >/etc/kube-nft/config.conf <<CONF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: /etc/kube-nft/kubeconfig
clusterCIDR: 10.244.0.0/16
CONF
cat >/etc/systemd/system/kube-nft.service <<UNIT
[Unit]
Description=kube-nft: Kubernetes Services on nftables
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/local/bin/kube-nft run --config /etc/kube-nft/config.conf --hostname-override $(hostname)
# SIGTERM leaves the rules serving; the next start adopts them.
KillSignal=SIGTERM
Restart=always
RestartSec=2
CapabilityBoundingSet=CAP_NET_ADMIN
AmbientCapabilities=CAP_NET_ADMIN
NoNewPrivileges=true

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now kube-nft
for _ in $(seq 60); do
  curl -sf http://127.0.0.1:10256/healthz && break
  sleep 2
done
nft list table ip kube-nft | head -20
