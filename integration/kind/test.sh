#!/usr/bin/env bash
# The kind part of the test command: a cluster whose proxy is kube-nft, deployed
# as users deploy it, checked (checks.sh); the same checks against real
# kube-proxy in nftables mode, whose cluster is then moved to kube-nft and back
# under load (migrate.sh), as is one with kube-proxy in iptables mode; then
# everything deleted.
#
#   integration/kind/test.sh     # as root; prints "kind: ok: …" or "kind: FAILED: …" per check
#
# Where no registry answers (this project's machines), KUBE_NFT_KIND_IMAGES
# defaults to local here: everything is built from Go modules and Debian's
# packages and cached in /var/cache/kube-nft (node-image.sh, local-images.sh).
# The kubelet sets a few of the host's sysctls from inside its node (they are
# not namespaced); they are put back afterwards, and the dockerd this started
# is stopped.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export KUBE_NFT_KIND_IMAGES=${KUBE_NFT_KIND_IMAGES:-local}
name=kt$$-kind
# kind writes the cluster's credentials into $KUBECONFIG, else ~/.kube/config:
# a file of this run's own, so that the machine's is neither read nor changed.
kubeconfig_dir=$(mktemp -d)
export KUBECONFIG=$kubeconfig_dir/config
# shellcheck source=integration/kind/lib.sh
. "$here/lib.sh"

# The host-wide settings a kind cluster changes or needs: the kubelet's
# (pkg/kubelet/cm/container_manager_linux.go), and inotify instances, of which
# three nodes of systemd, containerd and kubelet need more than 128.
sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes fs.inotify.max_user_instances fs.inotify.max_user_watches)
saved=()
for s in "${sysctls[@]}"; do saved+=("$s=$(sysctl -n "$s")"); done
started_docker=0
docker info >/dev/null 2>&1 || started_docker=1
cleanup() {
  "$(kind_bin)" delete cluster --name "$name" >/dev/null 2>&1
  docker network rm kind >/dev/null 2>&1
  rm -rf "$kubeconfig_dir"
  for s in "${saved[@]}"; do sysctl -qw "$s"; done
  # Asked of the dockerd this started before it stops: after, docker answers nothing.
  local left
  left=$(docker ps -aq --filter "name=^$name-" 2>&1) ||
    left="docker could not say ($left)"
  [ -z "$left" ] || echo "kind: FAILED: containers left behind: $left" >&2
  [ "$started_docker" = 0 ] || bash "$here/docker.sh" stop
}
trap cleanup EXIT
sysctl -qw fs.inotify.max_user_instances=512 fs.inotify.max_user_watches=524288
bash "$here/docker.sh" start

# A run that was killed leaves its cluster running, and its nodes start again
# with dockerd: deleted here, as named by a process that is gone; so are its
# other containers (migrate.sh's client outside the cluster).
for cluster in $("$(kind_bin)" get clusters 2>/dev/null); do
  [[ $cluster =~ ^kt([0-9]+)-kind$ ]] && [ ! -d "/proc/${BASH_REMATCH[1]}" ] || continue
  log "deleting $cluster, left by an earlier run"
  "$(kind_bin)" delete cluster --name "$cluster" >/dev/null 2>&1
done
for container in $(docker ps -a --format '{{.Names}}'); do
  [[ $container =~ ^kt([0-9]+)-kind- ]] && [ ! -d "/proc/${BASH_REMATCH[1]}" ] || continue
  log "deleting container $container, left by an earlier run"
  docker rm -f "$container" >/dev/null
done

status=0
# kube-proxy in iptables mode is here for the move to kube-nft and back only.
# KUBE_NFT_KIND_PROXIES chooses some of them (a run of the e2e tests against
# kube-nft alone, say).
for proxy in ${KUBE_NFT_KIND_PROXIES:-kube-nft kube-proxy-nftables kube-proxy-iptables}; do
  started=$(date +%s)
  # kube-nft's own cluster is installed with its Helm chart; the clusters
  # moved from kube-proxy get deploy/ applied (migrate.sh): both ways are run.
  chart=()
  [ "$proxy" != kube-nft ] || chart=(--chart)
  # KUBE_NFT_E2E=zones: six workers in three zones, for the tests that need
  # them; =dual-stack: IPv4 and IPv6; =ipv6: IPv6 alone.
  shape=()
  case ${KUBE_NFT_E2E:-none} in zones | dual-stack | ipv6) shape=("--$KUBE_NFT_E2E") ;; esac
  if ! bash "$here/up.sh" --proxy "$proxy" "${chart[@]}" "${shape[@]}" "$name"; then
    echo "kind: FAILED: a cluster with $proxy did not come up" >&2
    status=1
  else
    if [ "$proxy" != kube-proxy-iptables ]; then
      bash "$here/checks.sh" --proxy "$proxy" "$name" || status=1
      # Kubernetes' own Services tests (integration/e2e/): KUBE_NFT_E2E=conformance
      # runs their [Conformance] ones, =all the whole selection, =zones those
      # that need zones, =dual-stack the dual-stack ones, =ipv6 the whole
      # selection on an IPv6-only cluster.
      case ${KUBE_NFT_E2E:-none} in
      conformance) bash "$here/../e2e/run.sh" --proxy "$proxy" "$name" || status=1 ;;
      all | zones | dual-stack | ipv6) bash "$here/../e2e/run.sh" --proxy "$proxy" "--$KUBE_NFT_E2E" "$name" || status=1 ;;
      esac
    fi
    if [ "$proxy" != kube-nft ]; then
      bash "$here/migrate.sh" --from "$proxy" "$name" || status=1
    else
      (upgrade_chart) || status=1
    fi
  fi
  bash "$here/up.sh" --down "$name" >/dev/null 2>&1
  log "$proxy: $(($(date +%s) - started)) s"
done
exit "$status"
