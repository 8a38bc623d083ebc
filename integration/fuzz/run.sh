#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 15) from its seed corpus in
# corpus/, on the stable toolchain: libFuzzer (from libfuzzer-sys) with the
# sanitizer-coverage instrumentation cargo-fuzz would ask for, minus the
# address sanitizer (which needs nightly), plus debug assertions and overflow
# checks. A panic, a crash, an allocation over 256 MiB or RSS over 1 GiB fails
# the run; the input that did it is kept under /var/tmp/kube-nft-fuzz/. New
# corpus entries stay in a scratch directory (the seeds in git do not grow).
#
#   integration/fuzz/run.sh             # what the test command runs
#   integration/fuzz/run.sh 3600        # an hour per target
#   integration/fuzz/run.sh 600 nftables
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=${1:-15}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(nftables conntrack ipvs rtnetlink api_objects api_protobuf manifests config_file)
host=$(rustc -vV | sed -n 's/^host: //p')
# With --target, these flags reach the crates but not the build scripts.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR=${KUBE_NFT_FUZZ_TARGET:-/var/cache/kube-nft/fuzz-target}
cd "$here"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo build --release --target "$host" "${bins[@]}" --quiet
bin=$CARGO_TARGET_DIR/$host/release
findings=/var/tmp/kube-nft-fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "$findings"
  log=$work/$t.log
  if "$bin/$t" "$work/$t" "corpus/$t" -max_total_time="$seconds" -rss_limit_mb=1024 \
    -malloc_limit_mb=256 -artifact_prefix="$findings/$t-" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $t: ok, $runs inputs in ${seconds}s, $cov"
  else
    echo "fuzz $t: FAILED (input kept under $findings/)"
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -20
    failed+=("$t")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: failed: ${failed[*]}"; exit 1; }
