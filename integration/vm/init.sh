# The guest's /init (integration/vm/run.sh adds the PATH line before this and
# the run_suite calls after it). Runs as PID 1 in the initramfs.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# No tmpfs on /tmp: the initramfs is in memory already, and a checkout under /tmp
# has its test binaries staged there, at their host paths.
mount -t tmpfs run /run
# `ip netns` bind-mounts namespaces under /run/netns: the root must be shared-capable.
mount --make-rshared / 2>/dev/null || true
echo /bin/modprobe >/proc/sys/kernel/modprobe
for m in veth dummy ip_vs nf_conntrack nf_nat nf_tables; do modprobe "$m" || echo "guest: modprobe $m failed"; done
ip link set lo up
echo "guest: kernel $(uname -r), $(nproc) CPUs"

# qemu's user network (KUBE_NFT_VM_KUBE_PROXY): its fixed addresses, the
# host's side at 10.0.2.2 the way out.
network_card() {
  modprobe virtio_pci && modprobe virtio_net || echo "guest: no network card module"
  ip link set eth0 up
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
  echo "guest: eth0 10.0.2.15/24, default via 10.0.2.2"
}

failed=0
run_suite() {
  echo "guest: === $1 ==="
  # The test binary's output as it comes, prefixed so that the host can tell it
  # from the kernel's; ash has no PIPESTATUS, so the status goes through a file.
  # $3, if set, is a filter: only the tests whose names contain it.
  { "$2" $3 --include-ignored --test-threads=1 2>&1; echo $? >/tmp/rc; } | sed 's/^/guest: /'
  [ "$(cat /tmp/rc)" = 0 ] || failed=1
}

# A kube-nft command instead of suites (KUBE_NFT_VM_COMMAND).
run_command() {
  echo "guest: === kube-nft $* ==="
  { "$@" 2>&1; echo $? >/tmp/rc; } | sed 's/^/guest: /'
  [ "$(cat /tmp/rc)" = 0 ] || failed=1
}

finish() {
  echo "kube-nft-guest: exit $failed"
  sync
  poweroff -f
}
