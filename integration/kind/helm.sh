#!/usr/bin/env bash
# Helm, built from its Go module and cached with kind's binaries in
# $KUBE_NFT_CACHE/kind/bin (default /var/cache/kube-nft); prints its path. It
# installs deploy/helm/kube-nft in the kube-nft cluster (lib.sh, install_chart).
# Apart from node-image.sh, whose cache key is that script's text: Helm's
# version moving must not rebuild the node image.
set -euo pipefail
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
version=4.3.1
cache=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind
bin=$cache/bin/helm-$version
mkdir -p "$cache/bin"
exec {lock}>"$cache/.helm-lock"
flock "$lock"
if [ ! -x "$bin" ]; then
  echo "kind: building helm v$version" >&2
  # In a module of its own, so that Helm's go.mod chooses its dependencies.
  work=$cache/src/helm@$version
  mkdir -p "$work"
  cd "$work"
  printf 'module kube-nft.test/helm\n\ngo 1.26\n\nrequire helm.sh/helm/v4 v%s\n' "$version" >go.mod
  go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$version" \
    -o "$bin" helm.sh/helm/v4/cmd/helm
fi
echo "$bin"
