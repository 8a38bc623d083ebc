#!/usr/bin/env bash
# The docker daemon kind needs. A machine that already runs one (a user's) keeps
# it: nothing is installed or started. Otherwise Debian's docker.io is installed
# and its dockerd started here, with its state in /var/lib/docker as usual; where
# the machine's capability bounding set lacks capabilities (this project's
# machines lack CAP_SYS_RESOURCE), `docker run --privileged` would fail, so the
# daemon runs containers through runc-in-bounds, which leaves those out.
#
#   integration/kind/docker.sh start   # returns once `docker info` answers
#   integration/kind/docker.sh stop    # stops the dockerd that `start` started
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=integration/kind/lib.sh
. "$here/lib.sh"
state=/run/kube-nft-dockerd
log() { echo "docker: $*" >&2; }

start() {
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  if ! command -v dockerd >/dev/null; then
    log "installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  fi
  local args=()
  if lacks_capabilities; then
    args+=(--add-runtime "in-bounds=$here/runc-in-bounds" --default-runtime in-bounds)
  fi
  mkdir -p "$state"
  log "starting dockerd ${args[*]}"
  setsid dockerd "${args[@]}" >"$state/dockerd.log" 2>&1 </dev/null &
  echo $! >"$state/pid"
  local i
  for ((i = 0; i < 120; i++)); do
    docker info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  tail -20 "$state/dockerd.log" >&2
  log "dockerd did not answer within 60 s"
  return 1
}

stop() {
  [ -f "$state/pid" ] || return 0
  local pid
  pid=$(cat "$state/pid")
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 60; i++)); do
    [ -d "/proc/$pid" ] || break
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$state/pid"
}

case ${1:-} in
start) start ;;
stop) stop ;;
*) echo "usage: docker.sh start|stop" >&2; exit 2 ;;
esac
