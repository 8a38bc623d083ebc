#!/usr/bin/env bash
# Runs test binaries inside Debian's 6.1 cloud kernel under qemu (software
# emulation: KVM does not work on the development and CI machines). That kernel
# has IPVS, which the host's does not, and is the LTS many nodes run.
# KUBE_NFT_VM_KERNEL=5.10 boots Debian 11's instead (bullseye-security's
# newest linux-image-5.10.0-*-cloud-amd64), the oldest kernel kube-nft runs on.
#
#   integration/vm/run.sh [SUITE[:FILTER]...]
#
# (default: ipvs dataplane features, and daemon's ipvs_mode test, whose other
# branch the host runs: it checks IPVS mode on a kernel with IPVS and without.)
#
# The guest is an initramfs: busybox, the host's ip/nft/conntrack/ipvsadm/ipset
# and iptables-nft with their libraries, the kernel's netfilter/IPVS/veth/dummy
# modules, and the test binaries cargo built, at the same paths as on the host.
# Each suite runs as `<binary> --include-ignored --test-threads=1`: the IPVS
# tests are #[ignore]d on the host, where they cannot run. The guest prints the
# test binaries' own output, prefixed with "guest: ", then one line
# "kube-nft-guest: exit N".
# Exits non-zero if a test failed, if the guest never reported, or if qemu ran
# past its time limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
root_dir=$PWD
suites=("$@")
# KUBE_NFT_VM_COMMAND="ARGS" runs `kube-nft ARGS` in the guest instead of test
# suites (benches/ipvs_scale.sh), with KUBE_NFT_VM_BIN as kube-nft if set.
command=${KUBE_NFT_VM_COMMAND:-}
[ -n "$command" ] || ((${#suites[@]})) || suites=(ipvs dataplane features daemon:ipvs_mode_)
# Each SUITE[:FILTER] names a test binary, and optionally the tests of it to run.
binaries=()
for s in "${suites[@]}"; do binaries+=("${s%%:*}"); done
limit=${KUBE_NFT_VM_TIMEOUT:-900}
# KUBE_NFT_VM_KUBE_PROXY=PATH with KUBE_NFT_VM_KUBECONFIG=PATH (benches/
# ipvs_versus.sh): the guest joins a cluster. It gets a network card on qemu's
# user network (whose way out is the namespace qemu runs in, there the API
# server's), kube-proxy with the iptables commands its IPVS mode runs, and the
# kubeconfig with the CA it names, each at its host path.
kube_proxy=${KUBE_NFT_VM_KUBE_PROXY:-}
kubeconfig=${KUBE_NFT_VM_KUBECONFIG:-}
[ -z "$kube_proxy" ] || [ -f "$kubeconfig" ] || { echo "vm: KUBE_NFT_VM_KUBE_PROXY needs KUBE_NFT_VM_KUBECONFIG" >&2; exit 1; }
memory=${KUBE_NFT_VM_MEMORY:-2048}

work=$root_dir/target/vm
mkdir -p "$work"
kernel_choice=${KUBE_NFT_VM_KERNEL:-6.1}
kernel_dir=$work/kernel-$kernel_choice

# --- the kernel, downloaded once: Debian's linux-image-cloud-amd64 (6.1) from
# apt, or Debian 11's 5.10 straight from its archive ---
if [ ! -f "$kernel_dir/ok" ]; then
  rm -rf "$kernel_dir" "$work/debs"
  mkdir -p "$kernel_dir" "$work/debs"
  case $kernel_choice in
  6.1)
    image_name() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }'; }
    image=$(image_name)
    [ -n "$image" ] || { apt-get update -qq && image=$(image_name); }
    [ -n "$image" ] || { echo "vm: no linux-image-cloud-amd64 in apt's lists (apt-get update?)" >&2; exit 1; }
    (cd "$work/debs" && apt-get download "$image" 2> >(grep -v unsandboxed >&2))
    ;;
  5.10)
    archive=http://deb.debian.org/debian-security
    deb=$(curl -fsS "$archive/dists/bullseye-security/main/binary-amd64/Packages.xz" | xz -d |
      awk '/^Package: linux-image-5\.10\.0-[0-9]+-cloud-amd64$/ { p = 1; next }
           /^Package:/ { p = 0 } p && /^Filename:/ { print $2 }' | sort -V | tail -1)
    [ -n "$deb" ] || { echo "vm: no linux-image-5.10.0-*-cloud-amd64 in bullseye-security" >&2; exit 1; }
    curl -fsS -o "$work/debs/$(basename "$deb")" "$archive/$deb"
    ;;
  *) echo "vm: KUBE_NFT_VM_KERNEL=$kernel_choice: 6.1 or 5.10" >&2; exit 1 ;;
  esac
  dpkg-deb -x "$work"/debs/*.deb "$kernel_dir"
  touch "$kernel_dir/ok"
fi
kver=$(ls "$kernel_dir/lib/modules")
vmlinuz=$kernel_dir/boot/vmlinuz-$kver

# --- the test binaries, as cargo built them ---
declare -A exe
((${#binaries[@]})) && while IFS=$'\t' read -r name path; do exe[$name]=$path; done < <(
  cargo test --no-run --message-format=json "${binaries[@]/#/--test=}" 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"], sep="\t")
')
bin=${KUBE_NFT_VM_BIN:-$root_dir/target/debug/kube-nft}
[ -x "$bin" ] || cargo build --quiet
for s in "${binaries[@]}"; do
  [ -n "${exe[$s]:-}" ] || { echo "vm: no test binary for suite $s" >&2; exit 1; }
done

# --- the guest's root ---
stage=$work/root
rm -rf "$stage"
mkdir -p "$stage"/{bin,sbin,proc,sys,dev,tmp,run,etc,lib/modules,var}
ln -s ../run "$stage/var/run"
cp /bin/busybox "$stage/bin/busybox"
# Copies a program and the shared libraries it loads, at their own paths.
with_libs() {
  local f l
  for f in "$@"; do
    for l in "$f" $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*'); do
      mkdir -p "$stage$(dirname "$l")"
      cp -L "$l" "$stage$l"
    done
  done
}
with_libs "$(command -v ip)" "$(command -v nft)" "$(command -v conntrack)" "$(command -v ipvsadm)" "$bin"
# What kube-proxy's IPVS mode writes with, for the test that removes it:
# ipset, and iptables-nft with the extensions it loads (libxt_set, …).
with_libs "$(command -v ipset)" /usr/sbin/xtables-nft-multi
for name in iptables-nft iptables-nft-restore iptables-nft-save; do ln -s xtables-nft-multi "$stage/usr/sbin/$name"; done
if [ -n "$kube_proxy" ]; then
  with_libs "$kube_proxy"
  for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -s xtables-nft-multi "$stage/usr/sbin/$name"
  done
  ca=$(sed -n 's/.*certificate-authority: *"\{0,1\}\([^",}]*\).*/\1/p' "$kubeconfig")
  for f in "$kubeconfig" $ca; do
    mkdir -p "$stage$(dirname "$f")"
    cp "$f" "$stage$f"
  done
fi
xtables=$(dirname "$(dpkg -L iptables | grep -m1 '/xtables/libxt_set\.so$')")
with_libs "$xtables"/*.so
for s in "${binaries[@]}"; do with_libs "${exe[$s]}"; done
# Debug info is most of a test binary and the guest only needs symbols.
strip --strip-debug "$stage$bin"
for s in "${binaries[@]}"; do strip --strip-debug "$stage${exe[$s]}"; done
# The dynamic loader may be reached through /lib64.
[ -e "$stage/lib64" ] || ln -s lib "$stage/lib64"
for f in /etc/protocols /etc/services /etc/nsswitch.conf; do [ -f "$f" ] && cp "$f" "$stage/etc/"; done
echo "root:x:0:0:root:/:/bin/sh" >"$stage/etc/passwd"

# Modules: what a Kubernetes node's netfilter, IPVS and test links need. busybox
# depmod indexes them so the kernel's on-demand loading (nft_chain_nat, …) works.
mods=$kernel_dir/lib/modules/$kver
mkdir -p "$stage/lib/modules/$kver"
net_card=()
[ -z "$kube_proxy" ] || net_card=(kernel/drivers/virtio kernel/drivers/net/virtio_net.ko kernel/drivers/net/net_failover.ko)
(cd "$mods" && find kernel/net kernel/lib kernel/crypto kernel/drivers/net/veth.ko kernel/drivers/net/dummy.ko "${net_card[@]}" \
  -name '*.ko' | cpio -pdm --quiet "$stage/lib/modules/$kver")
cp "$mods"/modules.builtin* "$stage/lib/modules/$kver/" 2>/dev/null || true
busybox depmod -b "$stage" "$kver"

{
  echo '#!/bin/busybox sh'
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ RUST_BACKTRACE=1'
  cat "$root_dir/integration/vm/init.sh"
  [ -z "$kube_proxy" ] || echo 'network_card'
  for s in "${suites[@]}"; do
    b=${s%%:*}
    f=${s#"$b"}
    echo "run_suite $s '${exe[$b]}' '${f#:}'"
  done
  [ -z "$command" ] || echo "run_command '$bin' $command"
  echo 'finish'
} >"$stage/init"
chmod +x "$stage/init"
(cd "$stage" && find . | cpio -o -H newc --quiet) | gzip -1 >"$work/initrd.gz"

# --- boot ---
network=(-net none)
[ -z "$kube_proxy" ] || network=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0)
log=$work/console.log
echo "vm: booting $kver under qemu (TCG), suites: ${suites[*]}, time limit ${limit}s"
status=0
# Line by line (stdbuf), so that a long bench's progress shows as it comes.
timeout --kill-after=10 "$limit" qemu-system-x86_64 \
  -machine q35 -accel tcg,thread=multi -cpu max -smp 2 -m "$memory" \
  -kernel "$vmlinuz" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 loglevel=4" \
  -nographic -no-reboot -monitor none -serial stdio "${network[@]}" </dev/null |
  stdbuf -oL tr -d '\r' | tee "$log" | grep --line-buffered '^guest: ' || status=$?
# The harness failing counts as one failed test in test-all.sh's total.
harness_failed() {
  echo "vm: FAILED: $1" >&2
  echo "test result: FAILED. 0 passed; 1 failed; (integration/vm: $1)"
  exit 1
}
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  harness_failed "qemu ran past ${limit}s and was stopped (console: $log)"
fi
result=$(sed -n 's/^kube-nft-guest: exit \([0-9]*\)$/\1/p' "$log" | tail -1)
if [ -z "$result" ]; then
  tail -40 "$log" >&2
  harness_failed "the guest never reported (qemu status $status; console above and in $log)"
fi
# A suite that printed no result, or whose result counts no test, did not run
# (its binary missing, a crash before the harness, a filter that matches no
# test): it counts as failed, by name, in test-all.sh's total.
missing=0
for s in "${suites[@]}"; do
  if ! awk -v s="$s" '$0 == "guest: === " s " ===" { in_s = 1; next }
       /^guest: === / { in_s = 0 }
       in_s && /^guest: test result:/ && !/[^0-9]0 passed; 0 failed;/ { found = 1 }
       END { exit !found }' "$log"; then
    echo "test result: FAILED. 0 passed; 1 failed; (integration/vm: suite $s ran no test)"
    missing=1
  fi
done
if [ "$result" != 0 ] || [ "$missing" != 0 ]; then
  echo "vm: FAILED: a test failed or a suite did not run in the guest ($kver)" >&2
  exit 1
fi
echo "vm: all suites passed in the guest ($kver)"
