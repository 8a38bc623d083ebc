#!/usr/bin/env bash
# Every check kube-nft has, on a fresh machine, as root: installs what is missing,
# then formatting, clippy, unit tests, nft parity, real-packet tests in network namespaces
# the tests create and remove, a real control plane, the fuzz targets briefly, and the
# 6.1 guest. Ends with one line: "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "the tests create network namespaces: run them as root" >&2; exit 1; }
source integration/install-deps.sh

# Kubernetes' own components for integration/cluster.rs, built from their Go
# modules when missing (cached outside the checkout; several minutes the first time).
bash integration/k8s/build.sh >/dev/null

cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
# The fuzz crate is a package of its own (it links libFuzzer).
(cd integration/fuzz && cargo fmt --check &&
  CARGO_TARGET_DIR=/var/cache/kube-nft/fuzz-check cargo clippy --bins --quiet -- -D warnings)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --no-fail-fast 2>&1 | tee "$log" || status=$?
# Every fuzz target for 15 s from its seeds (a longer run: integration/fuzz/run.sh
# SECONDS). Each "fuzz TARGET: ok/FAILED" line counts as a test.
bash integration/fuzz/run.sh 15 2>&1 | tee -a "$log" || status=$?
# The IPVS tests, and the packet tests again, in Debian's 6.1 kernel under qemu
# (this kernel has no IPVS). Its lines start with "guest: ".
bash integration/vm/run.sh 2>&1 | tee -a "$log" || status=$?

leftover=$(ip netns list | grep -E '^kt[0-9]+-' || true)
if [ -n "$leftover" ]; then
  echo "tests left network namespaces behind: $leftover" >&2
  status=1
fi
# One closing line over every test binary's "test result:" line, host and guest.
# A run that failed without a failed test (a step that is not a test) still
# closes on a failure: the total never says 0 failed when the run failed.
awk -v status="$status" '/^(guest: )?test result:/ { sub(/^guest: /, ""); for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     /^fuzz [a-z_]+: ok/ { p++ } /^fuzz [a-z_]+: FAILED/ { f++ }
     END { if (status != 0 && f == 0) { print "\nthe run failed outside the tests (see above): counted as 1 failed"; f = 1 }
           printf "\ntotal: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
