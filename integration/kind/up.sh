#!/usr/bin/env bash
# Creates a kind cluster without kube-proxy, builds and loads the kube-nft image,
# deploys it, and checks a Service end to end: a ClusterIP from a pod, and a
# NodePort from another node. Needs docker, kind and kubectl (not available on
# the development machines, which have no container engine).
#   integration/kind/up.sh [cluster-name]
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:-kube-nft}
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

kind create cluster --name "$name" --config integration/kind/kind-config.yaml
docker build -f deploy/Containerfile -t kube-nft:latest .
kind load docker-image --name "$name" kube-nft:latest

# The API server by an address that works before any Service does.
api_host=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name-control-plane")
kubectl apply -f deploy/rbac.yaml -f deploy/config.yaml
sed "s/API_SERVER_HOST/$api_host/" deploy/daemonset.yaml | kubectl apply -f -
kubectl -n kube-system rollout status daemonset/kube-nft --timeout=180s

# Until kube-nft runs, CoreDNS cannot reach the API server's ClusterIP.
kubectl -n kube-system rollout status deployment/coredns --timeout=180s

kubectl create deployment hostnames --image=registry.k8s.io/serve_hostname --replicas=3
kubectl expose deployment hostnames --port=80 --target-port=9376 --type=NodePort
kubectl rollout status deployment/hostnames --timeout=180s

echo "ClusterIP from a pod, by DNS name:"
kubectl run probe --rm -i --restart=Never --image=busybox:1.36 -- \
  sh -c 'for i in 1 2 3 4 5 6; do wget -qO- -T 2 http://hostnames; echo; done'

echo "NodePort on a worker, from the control-plane node:"
port=$(kubectl get service hostnames -o jsonpath='{.spec.ports[0].nodePort}')
worker_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$name-worker")
docker exec "$name-control-plane" curl -sf --max-time 2 "http://$worker_ip:$port"
echo
echo "kube-nft's sync metrics on a worker:"
docker exec "$name-worker" curl -sf http://127.0.0.1:10249/metrics | grep '^kubeproxy_sync_proxy_rules'
