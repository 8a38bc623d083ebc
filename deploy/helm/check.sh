#!/usr/bin/env bash
# Checks the Helm chart against deploy/, its source:
#   - the chart is what deploy/helm/generate.sh makes of deploy/ today;
#   - `helm lint` passes, and the chart refuses to render without apiServer.host;
#   - rendered with its defaults and an API server address, it is deploy/'s
#     rbac.yaml, config.yaml and daemonset.yaml with that address, line for
#     line (comments aside; Helm orders the objects by kind, so they are
#     compared as a sorted list of objects).
#
#   deploy/helm/check.sh HELM   # HELM: the helm binary
set -euo pipefail
helm=$1
here=$(cd "$(dirname "$0")" && pwd)
deploy=$here/..
chart=$here/kube-nft

bash "$here/generate.sh" --check
"$helm" lint --quiet --set apiServer.host=192.0.2.1 "$chart" >/dev/null
if "$helm" template kube-nft "$chart" >/dev/null 2>&1; then
  echo "check.sh: the chart rendered with no apiServer.host" >&2
  exit 1
fi

# One object per line (each starts with its apiVersion), sorted.
content() {
  grep -Ev '^[[:space:]]*(#.*)?$|^---$' |
    awk '/^apiVersion:/ && o != "" { print o; o = "" } { o = o $0 "\\n" } END { print o }' | sort |
    sed 's/\\n/\n/g'
}
diff -u --label deploy/ --label chart \
  <(cat "$deploy/rbac.yaml" "$deploy/config.yaml" "$deploy/daemonset.yaml" |
    sed 's/API_SERVER_HOST/192.0.2.1/' | content) \
  <("$helm" template kube-nft "$chart" --namespace kube-system --set apiServer.host=192.0.2.1 | content) >&2 || {
  echo "check.sh: the chart renders something other than deploy/" >&2
  exit 1
}
