#!/usr/bin/env bash
# Builds Kubernetes' components from their Go modules, for tests and benchmarks
# against the real ones: the control plane and the etcd kubeadm runs with it,
# kube-proxy, kubectl, and the kubelet and kubeadm of the kind node image
# (integration/kind/node-image.sh):
#
#   integration/k8s/build.sh            # prints the directory of the binaries
#
# The version is K8S_VERSION (default below); the binaries are cached outside the
# checkout, in $KUBE_NFT_CACHE/k8s-VERSION-static/bin (default /var/cache/kube-nft),
# so a second run builds nothing. K8S_COMPONENTS (space-separated) builds only
# those, and no etcd (integration/k8s/kubeadm-configs.sh wants kubeadm alone). The build uses the machine's Go (GOTOOLCHAIN=local):
# Go 1.27's JSON changes break the API server's /openapi/v2. Like upstream's
# release binaries they are static (CGO_ENABLED=0), so that the component images
# of the kind node can hold the binary alone.
#
# k8s.io/kubernetes names its staging modules (k8s.io/api, client-go, …) at
# v0.0.0 and replaces them with its own tree; a module that requires it must
# replace each with the published v0.MINOR.PATCH instead, which this writes.
set -euo pipefail
version=${K8S_VERSION:-1.36.3}
cache=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/k8s-$version-static
read -ra components <<<"${K8S_COMPONENTS:-kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kubelet kubeadm}"
with_etcd=${K8S_COMPONENTS:+no}
# What kubeadm v1.36.3 deploys (cmd/kubeadm/app/constants). Debian's etcd,
# 3.4.23, is older than the 3.4.31 and 3.5.13 whose watch progress the API
# server trusts: with it, consistent lists are read from etcd, not served from
# the API server's cache, which is not what a cluster of today does.
etcd_version=3.6.8
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# Two runs at once (two checkouts, a test and a bench) build one after the other:
# the second finds the binaries the first built.
mkdir -p "$cache"
exec {lock}>"$cache/.lock"
flock "$lock"
missing=()
for c in "${components[@]}"; do [ -x "$cache/bin/$c" ] || missing+=("$c"); done
if ((${#missing[@]} == 0)) && { [ "$with_etcd" = no ] || [ -x "$cache/bin/etcd" ]; }; then
  echo "$cache/bin"
  exit 0
fi

command -v go >/dev/null || { echo "k8s: building Kubernetes needs Go (1.26)" >&2; exit 1; }
mkdir -p "$cache/bin"
if [ "$with_etcd" != no ] && [ ! -x "$cache/bin/etcd" ]; then
  echo "k8s: building etcd $etcd_version" >&2
  # In a module of its own, so that etcd's go.mod chooses its dependencies.
  mkdir -p "$cache/etcd-module"
  (
    cd "$cache/etcd-module"
    printf 'module kube-nft.test/etcd-build\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' "$etcd_version" >go.mod
    go build -trimpath -ldflags "-s -w" -o "$cache/bin/etcd" go.etcd.io/etcd/server/v3
  )
fi
if ((${#missing[@]} == 0)); then
  echo "$cache/bin"
  exit 0
fi

module=$cache/module
mkdir -p "$module"
cd "$module"
staging_version="v0.${version#1.}"
kube_mod=$(go mod download -json "k8s.io/kubernetes@v$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module kube-nft.test/k8s-build"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0\s*$' "$kube_mod" | awk -v v="$staging_version" '{ print "replace " $1 " => " $1 " " v }'
} >go.mod
for c in "${missing[@]}"; do
  echo "k8s: building $c $version (the first build takes several minutes)" >&2
  # The version as upstream stamps it (hack/lib/version.sh), in both packages
  # that hold it: kubeadm compares its own with the cluster's.
  ldflags="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=v$version -X $pkg.gitMajor=${version%%.*}"
    ldflags+=" -X $pkg.gitMinor=$(echo "$version" | cut -d. -f2) -X $pkg.gitTreeState=clean"
  done
  go build -trimpath -ldflags "$ldflags" \
    -o "$cache/bin/$c" "k8s.io/kubernetes/cmd/$c"
done
echo "$cache/bin"
