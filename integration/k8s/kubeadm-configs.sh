#!/usr/bin/env bash
# Records the KubeProxyConfiguration that kubeadm of each minor version writes
# into the kube-proxy ConfigMap, into integration/fixtures/kubeadm/, for the
# config tests (src/config/tests.rs loads each one):
#
#   integration/k8s/kubeadm-configs.sh [VERSION ...]
#
# Each kubeadm is built from its module by integration/k8s/build.sh (alone, and
# cached like the others). `kubeadm config print init-defaults` prints the
# component config with every field at kubeadm's default, as `kubeadm init`
# marshals it; the ConfigMap of a real cluster differs only in clusterCIDR
# (from networking.podSubnet) and in what the user's own config sets.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/../fixtures/kubeadm
versions=("$@")
((${#versions[@]})) || versions=(1.33.13 1.34.4 1.35.4 1.36.3 1.37.2)
mkdir -p "$out"
for v in "${versions[@]}"; do
  bin=$(K8S_VERSION=$v K8S_COMPONENTS=kubeadm "$here/build.sh")
  "$bin/kubeadm" config print init-defaults --component-configs KubeProxyConfiguration |
    python3 -c '
import sys
docs = sys.stdin.read().split("\n---\n")
kept = [d for d in docs if "\nkind: KubeProxyConfiguration\n" in "\n" + d + "\n"]
assert len(kept) == 1, f"{len(kept)} KubeProxyConfiguration documents"
sys.stdout.write(kept[0].strip("-\n") + "\n")
' >"$out/kube-proxy-v$v.yaml"
  echo "kubeadm v$v: $out/kube-proxy-v$v.yaml" >&2
done
