#!/usr/bin/env python3
"""What kube-nft's conntrack cleanup costs when the conntrack table is full.

After its first sync, and after each sync that repaired drift, kube-nft reads
the node's conntrack table once: for UDP flows whose endpoint went away, and
for flows that met none of its rules. The kernel cannot filter a dump by a
set of destinations, so the read grows with the table, while the daemon's
loop waits for it. In fresh network namespaces, ROUNDS times for each size N:

  kube-nft      `kube-nft run --once` of one Service (TCP and UDP ports) on a
                node whose conntrack holds N UDP entries that are not to it:
                its "conntrack cleaned" debug line (entries read, time)
  conntrack -L  the same table listed by conntrack-tools, timed as a process

and prints the medians, and their ratio. N is bounded by the host's
nf_conntrack_max, which all namespaces share (131072 here): run it alone.

  benches/conntrack_cleanup.py KUBE_NFT [SIZES [ROUNDS]]   # as root
  SIZES: comma-separated (default 0,30000,120000); ROUNDS: default 5
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

MANIFESTS = """apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: udp, port: 53, protocol: UDP, targetPort: 5353}
  - {name: tcp, port: 53, protocol: TCP, targetPort: 5353}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-a, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports:
- {name: udp, port: 5353, protocol: UDP}
- {name: tcp, port: 5353, protocol: TCP}
endpoints:
- {addresses: [10.244.0.11], conditions: {ready: true}}
- {addresses: [10.244.0.12], conditions: {ready: true}}
"""

# N datagrams from the client to the node's address, each its own flow:
# source ports 40000.. times destination ports 1..50000.
FILL = """
import socket, sys
n = int(sys.argv[1])
socks = {}
for i in range(n):
    sport, dport = 40000 + i // 50000, 1 + i % 50000
    s = socks.get(sport)
    if s is None:
        s = socks[sport] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("10.9.0.1", sport))
    s.sendto(b"x", ("10.9.0.2", dport))
"""


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def in_ns(ns, *args, **kw):
    return sh("ip", "netns", "exec", ns, *args, **kw)


class Node:
    """A node namespace and a client namespace on one veth pair, with
    conntrack tracking in the node."""

    def __init__(self, tag):
        self.node, self.client = f"ccb-{tag}-node", f"ccb-{tag}-client"
        for ns in (self.node, self.client):
            sh("ip", "netns", "add", ns)
            in_ns(ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "ccb-c", "netns", self.client, "type", "veth",
           "peer", "name", "ccb-n", "netns", self.node)
        in_ns(self.client, "ip", "addr", "add", "10.9.0.1/24", "dev", "ccb-c")
        in_ns(self.node, "ip", "addr", "add", "10.9.0.2/24", "dev", "ccb-n")
        in_ns(self.client, "ip", "link", "set", "ccb-c", "up")
        in_ns(self.node, "ip", "link", "set", "ccb-n", "up")
        in_ns(self.node, "sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=600")
        # Conntrack tracks a namespace's packets once a rule there uses it.
        in_ns(self.node, "nft", "add table ip ccb; add chain ip ccb in "
              "{ type filter hook input priority 0; }; add rule ip ccb in ct state new")

    def fill(self, n):
        in_ns(self.client, "python3", "-c", FILL, str(n))
        time.sleep(0.2)
        return int(in_ns(self.node, "cat", "/proc/sys/net/netfilter/nf_conntrack_count").stdout)

    def close(self):
        for ns in (self.node, self.client):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def kube_nft_cleanup(kube_nft, node, manifests):
    out = in_ns(node, "env", "RUST_LOG=kube_nft=debug", kube_nft, "run", "--once",
                "--manifests", manifests, "--node-name", "n1",
                "--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/12",
                "--conntrack-max-per-core", "0")
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"conntrack cleaned read=(\d+) deleted=(\d+) took_ms=([0-9.]+)", text)
    if not m:
        sys.exit(f"no 'conntrack cleaned' line in kube-nft's log:\n{text}")
    return int(m.group(1)), float(m.group(3))


def conntrack_list(node):
    started = time.monotonic()
    in_ns(node, "sh", "-c", "conntrack -L >/dev/null 2>&1")
    return (time.monotonic() - started) * 1000


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    kube_nft = os.path.abspath(sys.argv[1])
    sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "0,30000,120000").split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(MANIFESTS)
        manifests = f.name
    print("| entries in conntrack | kube-nft: entries its filter kept | kube-nft: cleanup (median) "
          "| conntrack -L (median, a process) | kube-nft / conntrack -ns |")
    print("|---|---|---|---|---|")
    try:
        for n in sizes:
            ours, tools, counts, reads = [], [], [], []
            for r in range(rounds):
                node = Node(f"{os.getpid()}")
                try:
                    counts.append(node.fill(n))
                    tools.append(conntrack_list(node.node))
                    read, took = kube_nft_cleanup(kube_nft, node.node, manifests)
                    reads.append(read)
                    ours.append(took)
                finally:
                    node.close()
            a, b = statistics.median(ours), statistics.median(tools)
            print(f"| {statistics.median(counts):.0f} | {statistics.median(reads):.0f} "
                  f"| {a:.1f} ms | {b:.1f} ms | {a / b:.2f} |", flush=True)
    finally:
        os.unlink(manifests)


if __name__ == "__main__":
    main()
