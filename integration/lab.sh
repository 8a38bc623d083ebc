#!/usr/bin/env bash
# The main job on a fresh machine, as root: install what the demo needs, build,
# and run `kube-nft lab` (extra arguments are passed on, e.g. --keep or --manifests).
# The build is the debug profile the tests use too, so running both compiles once;
# cargo shows its progress.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "kube-nft lab creates network namespaces: run it as root" >&2; exit 1; }
source integration/install-deps.sh lab
echo "lab: building kube-nft (the first build takes a few minutes)"
cargo build
exec ./target/debug/kube-nft lab "$@"
