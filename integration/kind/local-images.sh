#!/usr/bin/env bash
# Images made here from Debian's packages, for where no registry answers:
#
#   integration/kind/local-images.sh builder   # Debian bookworm with Debian's Rust (rustc-web), trusting this machine's CAs
#   integration/kind/local-images.sh base      # libc and libgcc, as distroless/cc has them
#   integration/kind/local-images.sh busybox   # Debian's busybox: a shell, wget, nslookup, httpd
#   integration/kind/local-images.sh agnhost   # Kubernetes' test image, under the name the e2e tests ask for
#   integration/kind/local-images.sh flannel   # flannel v0.28.10, with the CNI plugins it installs on a node
#
# Each prints the image's name; built once, kept in docker and saved under
# $KUBE_NFT_CACHE/kind (default /var/cache/kube-nft).
set -euo pipefail
# shellcheck source=integration/kind/lib.sh
. "$(dirname "$0")/lib.sh"
flannel_version=0.28.10
cache=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind
mkdir -p "$cache"
exec {lock}>"$cache/.images.lock"
flock "$lock"
log() { echo "local images: $*" >&2; }
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# NAME BUILD: the image NAME, from docker, from its saved copy, or built by BUILD
# (a function that imports it into docker).
image() {
  local name=$1 build=$2
  local saved=$cache/${name//[\/:]/_}.tar
  if ! docker image inspect "$name" >/dev/null 2>&1; then
    if [ -f "$saved" ]; then
      docker load -i "$saved" >/dev/null
    else
      log "building $name"
      "$build" "$name"
      docker save "$name" >"$saved.partial"
      mv "$saved.partial" "$saved"
    fi
  fi
  echo "$name"
}

# Debian packages unpacked into DIR, without their maintainer scripts.
unpack() {
  local dir=$1
  shift
  local debs
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download "$@" >/dev/null 2> >(grep -v unsandboxed >&2))
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dir"; done
  rm -rf "$debs"
}

# A minimal Debian bookworm with PACKAGES (comma-separated) in a new directory
# under the cache, named by WHAT; prints the directory. Its log is
# $cache/WHAT.log.
bookworm_root() {
  local what=$1 packages=$2 root
  root=$(mktemp -d "$cache/$what.XXXXXX")
  debootstrap --variant=minbase --include="$packages" \
    bookworm "$root" http://deb.debian.org/debian >"$cache/$what.log" 2>&1 ||
    { log "debootstrap failed, see $cache/$what.log"; exit 1; }
  echo "$root"
}

# The directory ROOT, without apt's downloads and lists, imported into docker as
# IMAGE with the `docker import -c` changes that follow; ROOT is then deleted.
import_root() {
  local root=$1 image=$2 changes=() change
  shift 2
  for change in "$@"; do changes+=(-c "$change"); done
  rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
  tar -C "$root" -c . | docker import "${changes[@]}" - "$image" >/dev/null
  rm -rf "$root"
}

build_builder() {
  local root
  root=$(bookworm_root builder gcc,libc6-dev,ca-certificates,pkg-config)
  # Debian's current Rust for bookworm (rustc-web, kept new for the browsers) is
  # in bookworm-security; the release's own is 1.85, older than our crates need.
  echo 'deb http://deb.debian.org/debian-security bookworm-security main' >"$root/etc/apt/sources.list.d/security.list"
  { chroot "$root" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends rustc-web cargo-web; } \
    >>"$cache/builder.log" 2>&1 || { log "installing rustc-web failed, see $cache/builder.log"; exit 1; }
  # cargo fetches crates inside it: it trusts what this machine trusts (here, an
  # egress proxy's own CA besides Debian's).
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  import_root "$root" "$1" 'ENV PATH=/usr/local/bin:/usr/bin:/bin' 'WORKDIR /'
}

build_base() {
  local root
  root=$(mktemp -d "$cache/base.XXXXXX")
  [ -n "$(apt-cache policy libc6 | sed -n 's/ *Candidate: //p')" ] || apt-get update -qq
  unpack "$root" libc6 libgcc-s1 gcc-12-base
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  import_root "$root" "$1"
}

build_busybox() {
  local root
  root=$(mktemp -d "$cache/busybox.XXXXXX")
  # The dynamic busybox, with its libc: a static glibc binary looking a name up
  # loads glibc's NSS modules, and crashes where they are missing.
  unpack "$root" busybox libc6
  mkdir -p "$root/bin" "$root/tmp" "$root/etc"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
  for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
  import_root "$root" "$1" 'ENV PATH=/bin' 'CMD ["sh"]'
}

# agnhost (integration/e2e/build.sh) with the tools its upstream Dockerfile
# installs that the Services tests call in its pods: curl, netcat-openbsd (nc
# -t/-u), iproute2 (ss), nslookup, wget, a shell and coreutils. Entry point and
# default command as upstream's: `/agnhost pause`.
build_agnhost() {
  local root bin
  bin=$(bash "$(dirname "$0")/../e2e/build.sh")
  root=$(bookworm_root agnhost curl,netcat-openbsd,iproute2,bind9-dnsutils,wget,procps,ca-certificates)
  install -m 0755 "$bin/agnhost" "$root/agnhost"
  ln -s agnhost "$root/agnhost-2"
  import_root "$root" "$1" 'ENTRYPOINT ["/agnhost"]' 'CMD ["pause"]' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
}

# flanneld as upstream's image has it (images/Dockerfile): nft for its nftables
# mode, and iptables, whose rules it clears at every start whatever its mode
# (it exits where iptables or ip6tables is missing). Beside it, the CNI plugins
# its init container copies to the node: flannel, from containernetworking/plugins
# v0.9.1, the last release that held it (its later home, flannel-io/cni-plugin,
# is not served by the Go module proxy), and bridge, to which it delegates.
build_flannel() {
  local root
  root=$(bookworm_root flannel nftables,iptables)
  mkdir -p "$root/opt/bin" "$root/opt/cni/bin"
  # Its udp backend is cgo, linked statically as upstream links it. The
  # tencentcloud SDK that flannel's go.mod asks for is not served; an older
  # one that is builds its tencentvpc backend (not used here).
  CGO_ENABLED=1 GO_REPLACE="github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc => github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc v1.0.1000" \
    go_build "$root/opt/bin/flanneld" github.com/flannel-io/flannel "$flannel_version" "netgo osusergo" \
    "-X github.com/flannel-io/flannel/pkg/version.Version=v$flannel_version -extldflags -static" github.com/flannel-io/flannel
  go_build "$root/opt/cni/bin/" github.com/containernetworking/plugins 0.9.1 "" "" \
    github.com/containernetworking/plugins/plugins/meta/flannel
  go_build "$root/opt/cni/bin/" github.com/containernetworking/plugins 1.9.1 "" "" \
    github.com/containernetworking/plugins/plugins/main/bridge
  import_root "$root" "$1" 'ENTRYPOINT ["/opt/bin/flanneld"]' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
}

case ${1:-} in
builder) image kube-nft.local/rust-bookworm:3 build_builder ;;
base) image kube-nft.local/cc-bookworm:1 build_base ;;
busybox) image kube-nft.local/busybox:2 build_busybox ;;
agnhost) image registry.k8s.io/e2e-test-images/agnhost:2.63.0 build_agnhost ;;
flannel) image "kube-nft.local/flannel:v$flannel_version-1" build_flannel ;;
*) echo "usage: local-images.sh builder|base|busybox|agnhost|flannel" >&2; exit 2 ;;
esac
