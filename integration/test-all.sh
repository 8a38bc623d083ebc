#!/usr/bin/env bash
# Every check kube-nft has, on a fresh machine, as root: installs what is missing,
# then formatting, clippy, unit tests, nft parity, real-packet tests in network namespaces
# the tests create and remove, a real control plane, the fuzz targets briefly, the
# 6.1 guest, and a kind cluster. Ends with one line, "total: N passed, N failed", whatever failed: a step
# that is not a test (an install, a build, fmt, clippy, a leftover) counts as one
# failed test, by name.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "the tests create network namespaces: run them as root" >&2; exit 1; }

log=$(mktemp)
failed_steps=()
# The closing line, also when a step stops the script (set -e): one line over
# every test binary's "test result:" line, host and guest, the fuzz targets and
# the failed steps. The total never says 0 failed when the run failed.
finish() {
  local status=$?
  ((${#failed_steps[@]} == 0)) || status=1
  awk -v status="$status" -v steps="${#failed_steps[@]}" '
     /^(guest: )?test result:/ { sub(/^guest: /, ""); for (i = 1; i < NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     /^fuzz [a-z_]+: ok/ { p++ } /^fuzz [a-z_]+: FAILED/ { f++ }
     /^kind: ok: / { p++ } /^kind: FAILED: / { f++ }
     /^step timed out: / { f++ }
     END { f += steps
           if (status != 0 && f == 0) { print "\nthe run stopped outside the tests (see above): counted as 1 failed"; f = 1 }
           printf "\ntotal: %d passed, %d failed\n", p, f }' "$log"
  ((${#failed_steps[@]} == 0)) || printf 'failed steps: %s\n' "${failed_steps[*]}"
  rm -f "$log"
  exit "$status"
}
trap finish EXIT

# Runs a step that is not a test binary; a failure is recorded and the run goes on.
step() {
  local name=$1
  shift
  "$@" || { echo "step failed: $name" >&2; failed_steps+=("$name"); }
}

# Runs a stage with a time limit far above what it takes, so that a stage that
# hangs fails here, by name, rather than running into CI's own limit with
# nothing said. timeout signals the stage's whole process group.
bounded() {
  local limit=$1 what=$2 rc=0
  shift 2
  timeout --kill-after 30 "$limit" "$@" || rc=$?
  [ "$rc" != 124 ] || echo "step timed out: $what did not finish within $((limit / 60)) min" >&2
  return "$rc"
}

source integration/install-deps.sh

# A disk that fills mid-run fails the kind steps with little said (kind cannot
# load an image, helm cannot write its release): warn first. A run with warm
# caches writes about 12 GiB (the build, the kind nodes, the images: 9.5 GiB
# at its fullest in a run from a fresh clone); the first, which fills the
# caches too, about 30 (26 GiB at its fullest on a fresh machine, 2026-11-29).
disk_need=12
[ -d "${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind" ] || disk_need=30
for dir in . "${KUBE_NFT_CACHE:-/var/cache/kube-nft}" /var/lib/docker "${TMPDIR:-/tmp}"; do
  [ -d "$dir" ] || continue
  df -P -B1G "$dir" | awk 'NR == 2 { print $1, $4, $6 }'
done | sort -u -k1,1 | while read -r _ free mount; do
  ((free >= disk_need)) ||
    echo "warning: $free GiB free on $mount, where this run writes about $disk_need GiB: the kind steps may fail for want of space" >&2
done

# Kubernetes' own components for integration/cluster.rs, built from their Go
# modules when missing (cached outside the checkout; several minutes the first time).
bash integration/k8s/build.sh >/dev/null

step "cargo fmt" cargo fmt --check
step "cargo clippy" cargo clippy --all-targets --quiet -- -D warnings
# The tests turn on the `testing` and `fuzzing` features; the binary that ships has neither.
step "cargo clippy (the shipped build)" cargo clippy --quiet -- -D warnings
# The fuzz crate is a package of its own (it links libFuzzer).
step "fuzz crate fmt and clippy" bash -c 'cd integration/fuzz && cargo fmt --check &&
  CARGO_TARGET_DIR=/var/cache/kube-nft/fuzz-check cargo clippy --bins --quiet -- -D warnings'

# Every test names its namespaces kt<pid>-…, after its own process. A namespace
# whose process has ended was left behind; one whose process still runs belongs
# to a run going on beside this one, and is not this run's to judge.
left_namespaces() {
  local ns
  for ns in $(ip netns list | awk '{ print $1 }'); do
    [[ $ns =~ ^kt([0-9]+)- ]] || continue
    [ -d "/proc/${BASH_REMATCH[1]}" ] || echo "$ns"
  done
}
# What the tests start (a process name is cut at 15 characters:
# kube-controller-manager is "kube-controller"), still running in a network
# namespace other than the host's that no running test owns.
own_net=$(readlink /proc/$$/ns/net)
left_processes() {
  local comm pid net ns owner
  for comm in /proc/[0-9]*/comm; do
    pid=${comm#/proc/}
    pid=${pid%/comm}
    [[ $(cat "$comm" 2>/dev/null) =~ ^(etcd|kube-apiserver|kube-controller|kube-nft|kube-proxy)$ ]] || continue
    net=$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) || continue
    [ "$(readlink "/proc/$pid/ns/net")" != "$own_net" ] || continue
    owner=
    for ns in /run/netns/kt*; do
      [ -e "$ns" ] && [ "$(stat -L -c %i "$ns")" = "$net" ] && owner=${ns#/run/netns/}
    done
    [[ $owner =~ ^kt([0-9]+)- ]] && [ -d "/proc/${BASH_REMATCH[1]}" ] && continue
    echo "$(cat "/proc/$pid/comm" 2>/dev/null) ($pid, netns ${owner:-unnamed})"
  done
}
# An earlier run's leftovers are that run's failure, not this one's.
namespaces_before=$(left_namespaces)
processes_before=$(left_processes)
[ -z "$namespaces_before$processes_before" ] ||
  echo "left by an earlier run (not counted here): $namespaces_before $processes_before" >&2

status=0
bounded 1800 "cargo test" cargo test --no-fail-fast 2>&1 | tee -a "$log" || status=$?
# Every fuzz target for 15 s from its seeds (a longer run: integration/fuzz/run.sh
# SECONDS). Each "fuzz TARGET: ok/FAILED" line counts as a test.
bounded 1200 "the fuzz targets" bash integration/fuzz/run.sh 15 2>&1 | tee -a "$log" || status=$?
# The IPVS tests, and the packet tests again, in Debian's 6.1 kernel under qemu
# (this kernel has no IPVS). Its lines start with "guest: ".
bounded 1800 "the 6.1 guest" bash integration/vm/run.sh 2>&1 | tee -a "$log" || status=$?
# The same in Debian 11's 5.10, the oldest kernel kube-nft runs on, with the
# start's kernel probe (docs/OPERATIONS.md, "Kernel").
bounded 1800 "the 5.10 guest" env KUBE_NFT_VM_KERNEL=5.10 bash integration/vm/run.sh \
  ipvs dataplane features daemon:ipvs_mode_ daemon:the_kernel_probe 2>&1 | tee -a "$log" || status=$?
# kube-nft as users run it: its image built from deploy/Containerfile, deployed
# from deploy/ in a kind cluster (a control plane and two workers, real kubelet,
# containerd, CoreDNS), and the same checks against real kube-proxy; then the
# [Conformance] tests of Kubernetes' own Services e2e suite against each
# (integration/e2e/; KUBE_NFT_E2E=all runs the whole selection). Everything
# is built here the first time (integration/kind/node-image.sh,
# integration/e2e/build.sh, cached). Each "kind: ok:" or "kind: FAILED:" line
# counts as a test.
export KUBE_NFT_E2E=${KUBE_NFT_E2E:-conformance}
bounded 3000 "the kind clusters" bash integration/kind/test.sh 2>&1 | tee -a "$log" || status=$?

# Nothing the tests made may outlive them: their network namespaces (the
# control planes' included) and their processes.
only_new() { comm -13 <(sort <<<"$1") <(sort <<<"$2") | grep -v '^$' || true; }
leftover=$(only_new "$namespaces_before" "$(left_namespaces)")
[ -z "$leftover" ] || { echo "tests left network namespaces behind:" $leftover >&2; failed_steps+=("leftover namespaces"); }
leftover=$(only_new "$processes_before" "$(left_processes)")
[ -z "$leftover" ] || { echo "tests left processes running:" $leftover >&2; failed_steps+=("leftover processes"); }
exit "$status"
