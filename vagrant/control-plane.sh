#!/usr/bin/env bash
# The control plane: kubeadm without the kube-proxy addon. kubeadm's preflight
# still looks for iptables on some versions: that check is the only one ignored.
set -euxo pipefail
kubeadm init \
  --apiserver-advertise-address="${NODE_IP}" \
  --pod-network-cidr=10.244.0.0/16 \
  --service-cidr=10.96.0.0/16 \
  --skip-phases=addon/kube-proxy \
  --ignore-preflight-errors=FileExisting-iptables
mkdir -p /root/.kube
cp /etc/kubernetes/admin.conf /root/.kube/config
kubectl taint nodes --all node-role.kubernetes.io/control-plane- || true

# For the workers, through the synced folder.
kubeadm token create --print-join-command >/kube-nft/target/join.sh

# kube-nft's identity: a client certificate bound to its read-only ClusterRole.
kubectl apply -f /kube-nft/deploy/rbac.yaml
kubectl create clusterrolebinding kube-nft-user --clusterrole=kube-nft --user=system:kube-nft \
  --dry-run=client -o yaml | kubectl apply -f -
kubeadm kubeconfig user --client-name=system:kube-nft >/kube-nft/target/kube-nft.kubeconfig
