#!/usr/bin/env bash
# A kind node image built with no container registry: kind's own base files (from
# its Go module), a Debian bookworm root (debootstrap), and every binary and
# image a node runs built here from Go modules and Debian's packages.
#
#   integration/kind/node-image.sh         # prints the image's name once it is in docker
#   integration/kind/node-image.sh --kind  # builds only kind; prints its path
#
# What kind's `build node-image` pulls, this builds: containerd, runc (Debian's),
# crictl and the CNI plugins in the node; kubelet, kubeadm and kubectl; and the
# images kubeadm v1.36.3 asks for (kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, etcd, CoreDNS, pause), imported into the node's
# containerd under the names and tags kubeadm uses, so nothing is ever pulled.
# Everything is cached in $KUBE_NFT_CACHE/kind (default /var/cache/kube-nft), keyed
# by the versions below, this script and the machine's capabilities; the image
# is also saved there, so a docker that lost it loads it instead of rebuilding. Needs root, docker (see
# docker.sh), Go and Debian's archive.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=integration/kind/lib.sh
. "$here/lib.sh"
repo=$here/../..
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

k8s_version=${K8S_VERSION:-1.36.3}
kind_version=0.32.0
# What kubeadm v1.36.3 asks for (cmd/kubeadm/app/constants: CoreDNS, pause;
# etcd is integration/k8s/build.sh's, the control plane's tests run it too);
# kind's containerd config names pause 3.10 as its sandbox image: both tags.
coredns_version=1.14.2
pause_version=3.10.2
# What kind v0.32.0's base image ships (images/base/Dockerfile).
containerd_version=2.3.1
crictl_version=1.36.0
cni_plugins_version=1.9.1

cache=${KUBE_NFT_CACHE:-/var/cache/kube-nft}/kind
log() { echo "kind node image: $*" >&2; }

mkdir -p "$cache"
exec {lock}>"$cache/.lock"
flock "$lock"

bin=$cache/bin
mkdir -p "$bin"

if [ ! -x "$bin/kind-$kind_version" ]; then
  log "building kind v$kind_version"
  go_build "$bin/kind-$kind_version" sigs.k8s.io/kind "$kind_version" "" "" sigs.k8s.io/kind
fi
if [ "${1:-}" = --kind ]; then
  echo "$bin/kind-$kind_version"
  exit 0
fi

# Kubernetes' own and etcd: built as integration/k8s/build.sh builds the control plane.
k8s_bin=$(bash "$repo/integration/k8s/build.sh")
etcd_version=$("$k8s_bin/etcd" --version | sed -n 's/^etcd Version: //p')
# The key holds what the image is made of: this script, the versions, and
# whether the machine lacks capabilities (containerd's config differs).
restricted=$(lacks_capabilities && echo restrict_oom_score_adj || true)
key=$(cat "$0" <(echo "$restricted $k8s_version $kind_version $etcd_version $coredns_version $pause_version $containerd_version $crictl_version $cni_plugins_version") | sha256sum | cut -c1-12)
image=kube-nft.local/kind-node:v$k8s_version-$key
saved=$cache/node-$key.tar

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
if [ -f "$saved" ]; then
  log "loading $saved"
  docker load -i "$saved" >/dev/null
  echo "$image"
  exit 0
fi

missing_tools=()
for tool in debootstrap jq gcc; do
  command -v "$tool" >/dev/null || missing_tools+=("$tool")
done
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing_tools+=(libc6-dev)
if ((${#missing_tools[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap jq gcc libc6-dev >/dev/null
fi

if [ ! -x "$bin/containerd" ]; then
  log "building containerd v$containerd_version"
  go_build "$bin/" github.com/containerd/containerd/v2 "$containerd_version" "no_aufs no_zfs no_btrfs no_devmapper" \
    "-X github.com/containerd/containerd/v2/version.Version=v$containerd_version" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
fi
[ -x "$bin/crictl" ] || { log "building crictl v$crictl_version"; go_build "$bin/crictl" sigs.k8s.io/cri-tools "$crictl_version" "" "" sigs.k8s.io/cri-tools/cmd/crictl; }
if [ ! -x "$bin/ptp" ]; then
  log "building the CNI plugins v$cni_plugins_version"
  go_build "$bin/" github.com/containernetworking/plugins "$cni_plugins_version" "" "" \
    github.com/containernetworking/plugins/plugins/main/ptp github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap
fi
if [ ! -x "$bin/coredns" ]; then
  log "building CoreDNS v$coredns_version (the plugins of kubeadm's Corefile)"
  work=$cache/src/coredns@$coredns_version
  mkdir -p "$work"
  cat >"$work/main.go" <<'EOF'
// CoreDNS with only the plugins kubeadm's Corefile uses (CoreDNS's own main
// links every plugin, cloud SDKs included). Their order is CoreDNS's own list.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
EOF
  (
    cd "$work"
    printf 'module kube-nft.test/coredns\n\ngo 1.26\n\nrequire github.com/coredns/coredns v%s\n' "$coredns_version" >go.mod
    go build -trimpath -ldflags "-s -w" -o "$bin/coredns" .
  )
fi
if [ ! -x "$bin/pause" ]; then
  log "building pause $pause_version"
  kube_dir=$(go mod download -json "k8s.io/kubernetes@v$k8s_version" | jq -r .Dir)
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_version-kube-nft" -o "$bin/pause" "$kube_dir/build/pause/linux/pause.c"
fi

# --- the node's root ---
kind_module=$(go mod download -json "sigs.k8s.io/kind@v$kind_version" | jq -r .Dir)
# A Debian bookworm root with PACKAGES in $cache/bookworm-NAME, made once.
bookworm_root() {
  local dir=$cache/bookworm-$1 packages=$2
  if [ ! -d "$dir" ]; then
    log "debootstrap of $dir (a minute or two)"
    rm -rf "$dir.partial"
    debootstrap --variant=minbase --include="$packages" bookworm "$dir.partial" http://deb.debian.org/debian \
      >"$dir.log" 2>&1 || { log "debootstrap failed, see $dir.log"; exit 1; }
    rm -rf "$dir.partial/var/cache/apt/archives"/*.deb "$dir.partial/var/lib/apt/lists"/*
    mv "$dir.partial" "$dir"
  fi
  echo "$dir"
}
base=$(bookworm_root node systemd,dbus,runc,libseccomp2,iptables,nftables,conntrack,iproute2,ethtool,kmod,ca-certificates,curl,jq,procps,netbase,util-linux,mount)
root=$cache/root-$key
rm -rf "$root"
cp -a "$base" "$root"
files=$kind_module/images/base/files
install -m 0755 "$files"/usr/local/bin/* "$root/usr/local/bin/"
mkdir -p "$root/kind/bin" "$root/etc/containerd" "$root/etc/default" "$root/etc/sysctl.d" "$root/etc/systemd/system/kubelet.service.d"
install -m 0644 "$files/kind/README.txt" "$root/kind/"
install -m 0755 "$files"/kind/bin/* "$root/kind/bin/"
install -m 0644 "$files"/etc/crictl.yaml "$root/etc/"
install -m 0644 "$files"/etc/containerd/config.toml "$root/etc/containerd/"
install -m 0644 "$files"/etc/default/kubelet "$root/etc/default/"
install -m 0644 "$files"/etc/sysctl.d/* "$root/etc/sysctl.d/"
install -m 0644 "$files"/etc/systemd/system/*.service "$files"/etc/systemd/system/*.slice "$root/etc/systemd/system/"
install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
# The node cannot grant what the machine lacks either: a pod's negative
# oom_score_adj needs CAP_SYS_RESOURCE, which machines like this one do not
# have. containerd then leaves a pod's score as it finds it.
if lacks_capabilities; then
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$root/etc/containerd/config.toml"
fi
install -m 0755 "$bin/containerd" "$bin/containerd-shim-runc-v2" "$bin/ctr" "$bin/crictl" "$root/usr/local/bin/"
mkdir -p "$root/opt/cni/bin" "$root/etc/cni/net.d"
install -m 0755 "$bin/ptp" "$bin/loopback" "$bin/host-local" "$bin/portmap" "$root/opt/cni/bin/"
install -m 0755 "$k8s_bin/kubelet" "$k8s_bin/kubeadm" "$k8s_bin/kubectl" "$root/usr/bin/"
"$bin/ctr" oci spec |
  jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  jq 'del(.process.rlimits)' >"$root/etc/containerd/cri-base.json"
echo "v$k8s_version" >"$root/kind/version"
mkdir -p "$root/etc/kubernetes/manifests"
# systemd in a container: as kind's base image trims and enables it.
find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$root/sbin/init"
systemctl --root="$root" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
systemctl --root="$root" mask systemd-binfmt.service >/dev/null 2>&1

# --- the images kubeadm asks for ---
images=$cache/images-$key
rm -rf "$images"
mkdir -p "$images"
# An image FROM scratch holding DIR's files.
from_scratch() {
  local name=$1 dir=$2
  shift 2
  tar -C "$dir" -c . | docker import "$@" - "$name" >/dev/null
}
component_image() {
  local name=$1 binary=$2
  shift 2
  local dir=$images/$(basename "$binary")
  mkdir -p "$dir/usr/local/bin" "$dir/tmp"
  cp "$binary" "$dir/usr/local/bin/"
  from_scratch "$name" "$dir" -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$@"
}
component_image "registry.k8s.io/kube-apiserver:v$k8s_version" "$k8s_bin/kube-apiserver"
component_image "registry.k8s.io/kube-controller-manager:v$k8s_version" "$k8s_bin/kube-controller-manager"
component_image "registry.k8s.io/kube-scheduler:v$k8s_version" "$k8s_bin/kube-scheduler"
component_image "registry.k8s.io/etcd:$etcd_version-0" "$k8s_bin/etcd"
mkdir -p "$images/coredns-root"
cp "$bin/coredns" "$images/coredns-root/coredns"
from_scratch "registry.k8s.io/coredns/coredns:v$coredns_version" "$images/coredns-root" -c 'ENTRYPOINT ["/coredns"]'
mkdir -p "$images/pause-root"
cp "$bin/pause" "$images/pause-root/pause"
from_scratch "registry.k8s.io/pause:$pause_version" "$images/pause-root" -c 'ENTRYPOINT ["/pause"]' -c 'USER 65535:65535'
docker tag "registry.k8s.io/pause:$pause_version" registry.k8s.io/pause:3.10
# kube-proxy calls nft, iptables and conntrack: a Debian root with them.
proxy_root=$(bookworm_root kube-proxy iptables,nftables,conntrack,kmod,netbase)
cp "$k8s_bin/kube-proxy" "$proxy_root/usr/local/bin/"
from_scratch "registry.k8s.io/kube-proxy:v$k8s_version" "$proxy_root"
preloaded=(
  "registry.k8s.io/kube-apiserver:v$k8s_version" "registry.k8s.io/kube-controller-manager:v$k8s_version"
  "registry.k8s.io/kube-scheduler:v$k8s_version" "registry.k8s.io/kube-proxy:v$k8s_version"
  "registry.k8s.io/etcd:$etcd_version-0" "registry.k8s.io/coredns/coredns:v$coredns_version"
  "registry.k8s.io/pause:$pause_version" registry.k8s.io/pause:3.10
)
docker save "${preloaded[@]}" >"$images/images.tar"

# --- the node image: the root, then the images imported into its containerd as
# kind's own build does (containerd started in a plain container, `ctr import`,
# the container committed) ---
rootfs=$images/rootfs.tar
tar -C "$root" -c . >"$rootfs"
cat >"$images/Dockerfile" <<'EOF'
FROM scratch
ADD rootfs.tar /
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
EOF
DOCKER_BUILDKIT=0 docker build -q --force-rm -t "$image-base" -f "$images/Dockerfile" "$images" >/dev/null 2>&1
container=$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "$image-base" infinity)
trap 'docker rm -f -v "$container" >/dev/null 2>&1 || true' EXIT
docker exec "$container" sh -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
for ((i = 0; i < 60; i++)); do
  docker exec "$container" ctr version >/dev/null 2>&1 && break
  sleep 0.5
done
docker exec -i "$container" ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
  --all-platforms --no-unpack --digests - <"$images/images.tar" >/dev/null
docker exec "$container" pkill containerd
for ((i = 0; i < 60; i++)); do
  docker exec "$container" pgrep -x containerd >/dev/null 2>&1 || break
  sleep 0.5
done
docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$container" "$image" >/dev/null
docker rm -f -v "$container" >/dev/null
trap - EXIT
docker rmi "$image-base" >/dev/null
docker save "$image" >"$saved.partial"
rm -f "$cache"/node-*.tar
mv "$saved.partial" "$saved"
rm -rf "$root" "$images"
log "built $image ($(du -h "$saved" | cut -f1) saved in $saved)"
echo "$image"
