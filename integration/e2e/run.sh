#!/usr/bin/env bash
# Kubernetes' own end-to-end tests of Services (e2e.test v1.36.3, built here),
# against the Service proxy of a kind cluster that integration/kind/up.sh made:
#
#   integration/e2e/run.sh [--proxy P] [--all | --zones | --dual-stack | --ipv6] [NAME]   # KUBECONFIG names the cluster
#
# Without --all, the [Conformance] tests of the selection (the test command's);
# with it, the whole selection (integration/e2e/selection.sh); with --zones,
# the tests that need a cluster in three zones (up.sh --zones); with
# --dual-stack, the dual-stack tests (up.sh --dual-stack); with --ipv6, the
# whole selection as an IPv6-only cluster runs it (up.sh --ipv6). One line per
# test that ran, "kind: ok: P: e2e: TEST (N s)" or "kind: FAILED: P: e2e: …",
# and one per test that skipped itself; the JUnit report and the log stay in
# $E2E_OUT (default $KUBE_NFT_CACHE/e2e-results/PROXY-TIME, printed). Ginkgo
# runs $E2E_PROCS tests at once (default 4: they mostly wait).
set -euo pipefail
proxy=kube-nft
selection=conformance
while [ $# -gt 0 ]; do
  case $1 in
  --proxy) proxy=$2; shift 2 ;;
  --all | --zones | --dual-stack | --ipv6) selection=${1#--}; shift ;;
  *) break ;;
  esac
done
name=${1:-kube-nft}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=integration/kind/lib.sh
. "$here/../kind/lib.sh"
# shellcheck source=integration/e2e/selection.sh
. "$here/selection.sh"
: "${KUBECONFIG:?names the kind cluster (integration/kind/test.sh sets it)}"
skip=$E2E_SKIP
case $selection in
conformance) focus=$E2E_CONFORMANCE_FOCUS what="its [Conformance] tests" ;;
all) focus=$E2E_FOCUS what="the whole selection" ;;
zones) focus=$E2E_ZONES_FOCUS what="the tests that need zones" ;;
dual-stack) focus=$E2E_DUAL_FOCUS skip=$E2E_DUAL_SKIP what="the dual-stack tests" ;;
ipv6) focus=$E2E_FOCUS skip=$E2E_IPV6_SKIP what="the whole selection, IPv6 alone" ;;
esac
out=${E2E_OUT:-${KUBE_NFT_CACHE:-/var/cache/kube-nft}/e2e-results/$proxy-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
bin=$(bash "$here/build.sh")
k8s_bin=$(bash "$here/../k8s/build.sh")

# The one image the selected tests run, under the name they ask for, in every
# node: nothing is pulled (every pod's image is IfNotPresent).
agnhost=$(bash "$kind_dir/local-images.sh" agnhost)
# Quiet when it works; on a failure kind's own words, and the free space of the
# disks it writes to (a full disk is what failed it before).
if ! loaded=$("$(kind_bin)" load docker-image --name "$name" "$agnhost" 2>&1); then
  echo "$loaded" >&2
  df -h "$(docker info -f '{{.DockerRootDir}}')" "${TMPDIR:-/tmp}" >&2 || true
  fail "$proxy: e2e: loading $agnhost into $name"
fi

log "$proxy: e2e: running $what, ${E2E_PROCS:-4} at a time; report in $out"
# The nodes that take pods: the suite is told how many.
schedulable=$(kubectl get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].effect}{"\n"}{end}' | grep -vc NoSchedule)
started=$(date +%s)
status=0
PATH=$k8s_bin:$PATH "$bin/ginkgo" --procs="${E2E_PROCS:-4}" --timeout=3h --no-color --silence-skips \
  --focus="$focus" --skip="$skip" "$bin/e2e.test" -- \
  --kubeconfig="$KUBECONFIG" --provider=skeleton --num-nodes="$schedulable" --report-dir="$out" \
  --disable-log-dump=true --prepull-images=false >"$out/e2e.log" 2>&1 || status=$?
[ -f "$out/junit_01.xml" ] || { tail -40 "$out/e2e.log" >&2; fail "$proxy: e2e: no report (ginkgo exited $status); log in $out/e2e.log"; }
# Each test that ran, or skipped itself, as the count of the test command has it.
python3 "$here/report.py" lines "$out" "$proxy"
log "$proxy: e2e: $(($(date +%s) - started)) s (ginkgo exited $status)"
exit "$status"
