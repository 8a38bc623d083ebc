#!/usr/bin/env python3
"""Where a new connection's time goes: the same saved rulesets, in one stage.

`kube-nft bench-kube-proxy --dataplane-rounds N` keeps each proxy's ruleset
as `nft list ruleset` printed it (LOGS/<contender>-<size>-dataplane.nft).
This loads such files, one after the other and ROUNDS times over, into one
node namespace between a client namespace and a pod namespace (the probe's
ClusterIP answered by ten pod addresses on port 8080), and times N TCP
connects from the client through VIP:80 with each: the median and p99 of the
connect (SYN to SYN-ACK through the node's NAT), medians over the rounds. Each
round starts with the next ruleset, and each waits 3 s after its load.

A ruleset given as FILE:-TABLES is loaded without the tables whose names
match the shell pattern TABLES, except one that holds the VIP
(`kube-nft-1-dataplane.nft:-kube-nft-services-*` loads kube-nft's main tables
and the one Service table of the probe): what a packet's walk through the
others costs.

  benches/first_packet_tables.py VIP [ROUNDS [N]] FILE[:-PATTERN]...   # as root
"""

import fnmatch
import os
import re
import socket
import statistics
import subprocess
import sys
import time

PODS = [f"10.200.0.{k}" for k in range(1, 11)]
SETTLE_SECONDS = 3
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(4096)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def ns_exec(ns, *args, check=True):
    return sh("ip", "netns", "exec", ns, *args, check=check)


class Stage:
    def __init__(self, tag):
        self.node, self.client, self.pods = (f"fpt-{tag}-{n}" for n in ("node", "client", "pods"))
        for ns in (self.node, self.client, self.pods):
            sh("ip", "netns", "add", ns)
            ns_exec(ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "fpt-c", "netns", self.node, "type", "veth",
           "peer", "name", "eth0", "netns", self.client)
        sh("ip", "link", "add", "fpt-p", "netns", self.node, "type", "veth",
           "peer", "name", "eth0", "netns", self.pods)
        ns_exec(self.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ns_exec(self.node, "ip", "addr", "add", "10.99.0.1/24", "dev", "fpt-c")
        ns_exec(self.node, "ip", "addr", "add", "10.100.0.11/32", "dev", "lo")
        for dev in ("fpt-c", "fpt-p"):
            ns_exec(self.node, "ip", "link", "set", dev, "up")
        for a in PODS:
            ns_exec(self.node, "ip", "route", "add", f"{a}/32", "dev", "fpt-p")
            ns_exec(self.pods, "ip", "addr", "add", f"{a}/32", "dev", "eth0")
        ns_exec(self.client, "ip", "addr", "add", "10.99.0.2/24", "dev", "eth0")
        for ns in (self.client, self.pods):
            ns_exec(ns, "ip", "link", "set", "eth0", "up")
        ns_exec(self.client, "ip", "route", "add", "default", "via", "10.99.0.1")
        ns_exec(self.pods, "ip", "route", "add", "default", "dev", "eth0")
        self.server = subprocess.Popen(["ip", "netns", "exec", self.pods, "python3", "-c", SERVER],
                                       stdout=subprocess.PIPE, text=True)
        self.server.stdout.readline()

    def load(self, text):
        ns_exec(self.node, "nft", "flush", "ruleset")
        p = subprocess.run(["ip", "netns", "exec", self.node, "nft", "-f", "-"],
                           input=text, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"nft -f: {p.stderr[:2000]}")
        ns_exec(self.node, "conntrack", "-F", check=False)

    def connects(self, vip, n):
        code = f"""
import socket, struct, time
lat = []
for _ in range({n}):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    t = time.perf_counter_ns()
    s.connect(("{vip}", 80))
    lat.append(time.perf_counter_ns() - t)
    s.close()
lat.sort()
print(lat[len(lat) // 2] / 1000, lat[int(len(lat) * 0.99)] / 1000)
"""
        out = ns_exec(self.client, "python3", "-c", code).stdout.split()
        return float(out[0]), float(out[1])

    def close(self):
        self.server.kill()
        for ns in (self.node, self.client, self.pods):
            sh("ip", "netns", "del", ns, check=False)


def without(text, pattern, vip):
    """The listing without the tables whose names match `pattern`, but for
    the one that holds `vip` (which the connections go to)."""
    tables, depth = [], 0
    for line in text.splitlines(keepends=True):
        m = re.match(r"table \S+ (\S+) \{", line)
        if m and depth == 0:
            tables.append([m.group(1), ""])
        depth += line.count("{") - line.count("}")
        if tables:
            tables[-1][1] += line
    return "".join(body for name, body in tables
                   if not fnmatch.fnmatch(name, pattern) or f"{vip} . tcp . 80" in body)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    vip = args.pop(0)
    rounds = int(args.pop(0)) if args and args[0].isdigit() else 5
    n = int(args.pop(0)) if args and args[0].isdigit() else 3000
    rulesets = []
    for a in args:
        path, _, pattern = a.partition(":-")
        text = open(path).read()
        name = os.path.basename(path)
        if pattern:
            text, name = without(text, pattern, vip), f"{name} without {pattern}"
        ipv4 = "".join(re.findall(r"^table ip .*?^}", text, re.M | re.S))
        rulesets.append((name, text, len(re.findall(r"type nat hook prerouting", ipv4))))
    stage = Stage(str(os.getpid()))
    results = {name: [] for name, _, _ in rulesets}
    try:
        for r in range(rounds):
            # Each ruleset goes first in turn, and each waits for the kernel to
            # free the one before it (in work of its own, after the commit), so
            # that none is always the one measured beside that work.
            for name, text, _ in rulesets[r % len(rulesets):] + rulesets[:r % len(rulesets)]:
                stage.load(text)
                time.sleep(SETTLE_SECONDS)
                stage.connects(vip, 200)  # warm
                results[name].append(stage.connects(vip, n))
    finally:
        stage.close()
    print("| ruleset | IPv4 NAT prerouting chains | connect p50 µs | connect p99 µs |")
    print("|---|---|---|---|")
    for name, _, hooks in rulesets:
        p50 = statistics.median(r[0] for r in results[name])
        p99 = statistics.median(r[1] for r in results[name])
        print(f"| {name} | {hooks} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
