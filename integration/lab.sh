#!/usr/bin/env bash
# The main job on a fresh machine, as root: install what is missing, build, and
# run `kube-nft lab` (extra arguments are passed on, e.g. --keep or --manifests).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "kube-nft lab creates network namespaces: run it as root" >&2; exit 1; }
source integration/install-deps.sh
cargo build --release --quiet
exec ./target/release/kube-nft lab "$@"
