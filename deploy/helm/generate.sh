#!/usr/bin/env bash
# The Helm chart (deploy/helm/kube-nft) is made from deploy/, which stays the
# one source: the chart's templates are deploy/'s manifests with the values a
# user sets put in place of their literal text, and values.yaml takes its
# defaults from them. With its defaults and an API server address, the chart
# renders exactly what deploy/ applies with that address (deploy/helm/check.sh).
#
#   deploy/helm/generate.sh          # writes the chart
#   deploy/helm/generate.sh --check  # fails if the chart is not what deploy/ makes
set -euo pipefail
deploy=$(cd "$(dirname "$0")/.." && pwd)
chart=$deploy/helm/kube-nft

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/templates"

# One line of deploy/daemonset.yaml, found by its key; fails if it is not
# there exactly once, so that a changed deploy/ cannot slip past.
field() {
  local pattern=$1 found
  found=$(grep -E "$pattern" "$deploy/daemonset.yaml" | sort -u)
  [ "$(wc -l <<<"$found")" = 1 ] && [ -n "$found" ] || {
    echo "generate.sh: deploy/daemonset.yaml has no single line like /$pattern/" >&2
    exit 1
  }
  echo "$found"
}
image=$(field '^ +image: ' | sed 's/^ *image: //')
pull_policy=$(field '^ +imagePullPolicy: ' | sed 's/^ *imagePullPolicy: //')
port=$(grep -A1 'name: KUBERNETES_SERVICE_PORT$' "$deploy/daemonset.yaml" | sed -n 's/^ *value: "\(.*\)"$/\1/p')
requests=$(field '^ +requests: \{cpu: ' | sed 's/^ *//')
limits=$(field '^ +limits: \{memory: ' | sed 's/^ *//')
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$deploy/../Cargo.toml")
[ -n "$port" ] && [ -n "$version" ] || { echo "generate.sh: no API server port or crate version found" >&2; exit 1; }

generated() { echo "# Generated from deploy/$1 by deploy/helm/generate.sh: edit deploy/ and run it."; }

cat >"$out/Chart.yaml" <<EOF
$(generated "(the crate's version)")
apiVersion: v2
name: kube-nft
description: >-
  kube-nft, a Service proxy in place of kube-proxy: Services and EndpointSlices
  programmed as nftables transactions over netlink.
type: application
version: $version
appVersion: "$version"
EOF

cat >"$out/values.yaml" <<EOF
$(generated "daemonset.yaml and config.yaml")
apiServer:
  # The API server's address as every node reaches it before any Service
  # works: not the \`kubernetes\` Service's ClusterIP, which only answers once
  # kube-nft runs. Required.
  host: ""
  port: $port
image:
  repository: ${image%:*}
  tag: ${image##*:}
  pullPolicy: $pull_policy
# docs/OPERATIONS.md, "Sizing": no CPU limit (a limit throttles every full
# sync), and a memory limit that only a leak meets up to 100k Services.
resources:
  $requests
  $limits
# kube-proxy's KubeProxyConfiguration, which kube-nft reads: set clusterCIDR
# to the cluster's pod CIDRs (docs/OPERATIONS.md, "Flags and the config file").
config: |
$(sed -n '/^  config.conf: |$/,$p' "$deploy/config.yaml" | tail -n +2 | sed 's/^  //')
EOF

{
  generated rbac.yaml
  cat "$deploy/rbac.yaml"
} >"$out/templates/rbac.yaml"

{
  generated config.yaml
  sed -n '1,/^  config.conf: |$/p' "$deploy/config.yaml"
  # shellcheck disable=SC2016
  echo '    {{- .Values.config | trimSuffix "\n" | nindent 4 }}'
} >"$out/templates/configmap.yaml"

# shellcheck disable=SC2016
required='{{ required "apiServer.host: the API server'"'"'s address, reachable from every node" .Values.apiServer.host }}'
{
  generated daemonset.yaml
  sed -e "s|^\( *\)image: $image\$|\1image: {{ .Values.image.repository }}:{{ .Values.image.tag }}|" \
    -e "s|^\( *\)imagePullPolicy: $pull_policy\$|\1imagePullPolicy: {{ .Values.image.pullPolicy }}|" \
    -e "s|^\( *\)value: API_SERVER_HOST\$|\1value: $required|" \
    -e "s|^\( *\)value: \"$port\"\$|\1value: \"{{ .Values.apiServer.port }}\"|" \
    -e 's|^\( *\)requests: {cpu: .*}$|\1requests: {cpu: {{ .Values.resources.requests.cpu }}, memory: {{ .Values.resources.requests.memory }}}|' \
    -e 's|^\( *\)limits: {memory: .*}$|\1limits: {memory: {{ .Values.resources.limits.memory }}}|' \
    "$deploy/daemonset.yaml"
} >"$out/templates/daemonset.yaml"
grep -q '{{ .Values.apiServer.port }}' "$out/templates/daemonset.yaml" || {
  echo "generate.sh: the API server port line of deploy/daemonset.yaml was not found" >&2
  exit 1
}

if [ "${1:-}" = --check ]; then
  diff -r "$out" "$chart" >&2 || {
    echo "generate.sh: deploy/helm/kube-nft is not what deploy/ makes: run deploy/helm/generate.sh" >&2
    exit 1
  }
  exit 0
fi
rm -rf "$chart"
mkdir -p "$chart"
cp -r "$out/." "$chart/"
