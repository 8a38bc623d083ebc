#!/usr/bin/env bash
# Builds what Kubernetes' end-to-end tests need, from the Go modules, as
# upstream builds them (hack/lib/golang.sh, test/images/agnhost):
#
#   integration/e2e/build.sh     # prints the directory of e2e.test, ginkgo and agnhost
#
# - e2e.test v1.36.3: `go test -c` of suite/network_test.go, which is
#   k8s.io/kubernetes/test/e2e with its network tests alone (the other SIGs'
#   tests are most of a first build, and none is selected), its version
#   stamped as upstream stamps it, with upstream's build tags;
# - ginkgo, the CLI of the same version as the suite's library, which runs the
#   tests in parallel;
# - agnhost 2.63.0, the binary of the test image the Services tests run
#   (integration/kind/local-images.sh agnhost makes the image).
# Cached outside the checkout, beside integration/k8s/build.sh's binaries, in
# the same build module; a second run builds nothing.
set -euo pipefail
version=${K8S_VERSION:-1.36.3}
agnhost_version=2.63.0
# The module integration/k8s/build.sh writes (its staging replaces).
k8s_bin=$(bash "$(dirname "$0")/../k8s/build.sh")
module=$(dirname "$k8s_bin")/module
out=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/e2e-$version
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
mkdir -p "$out/bin"
exec {lock}>"$out/.lock"
flock "$lock"
suite=$(cd "$(dirname "$0")" && pwd)/suite/network_test.go
cd "$module"
# Built again when the suite's file changes (its copy is kept beside it).
if [ ! -x "$out/bin/e2e.test" ] || ! cmp -s "$suite" "$out/bin/network_test.go"; then
  echo "e2e: building e2e.test $version, with its network tests (the first build takes several minutes)" >&2
  mkdir -p e2e-network
  cp "$suite" e2e-network/
  ldflags=""
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=v$version -X $pkg.gitMajor=${version%%.*}"
    ldflags+=" -X $pkg.gitMinor=$(echo "$version" | cut -d. -f2) -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  done
  go test -c -vet=off -trimpath -tags selinux,notest,grpcnotrace -ldflags "all=$ldflags -s -w" \
    -o "$out/bin/e2e.test.partial" ./e2e-network
  mv "$out/bin/e2e.test.partial" "$out/bin/e2e.test"
  cp "$suite" "$out/bin/network_test.go"
fi
if [ ! -x "$out/bin/ginkgo" ]; then
  echo "e2e: building ginkgo" >&2
  go build -trimpath -o "$out/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
fi
if [ ! -x "$out/bin/agnhost" ]; then
  echo "e2e: building agnhost $agnhost_version" >&2
  go build -trimpath -ldflags "-s -w -X main.Version=$agnhost_version" \
    -o "$out/bin/agnhost" k8s.io/kubernetes/test/images/agnhost
fi
echo "$out/bin"
