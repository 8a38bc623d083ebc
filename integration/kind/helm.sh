#!/usr/bin/env bash
# Helm, built from its Go module and cached with kind's binaries in
# $KUBE_NFT_CACHE/kind/bin (default /var/cache/kube-nft); prints its path. It
# installs deploy/helm/kube-nft in the kube-nft cluster (lib.sh, install_chart).
# Apart from node-image.sh, whose cache key is that script's text: Helm's
# version moving must not rebuild the node image.
set -euo pipefail
# shellcheck source=integration/kind/lib.sh
. "$(dirname "$0")/lib.sh"
version=4.3.1
cache=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind
bin=$cache/bin/helm-$version
mkdir -p "$cache/bin"
exec {lock}>"$cache/.helm-lock"
flock "$lock"
if [ ! -x "$bin" ]; then
  log "building helm v$version"
  go_build "$bin" helm.sh/helm/v4 "$version" "" "-X helm.sh/helm/v4/internal/version.version=v$version" \
    helm.sh/helm/v4/cmd/helm
fi
echo "$bin"
