#!/usr/bin/env python3
"""What another process subscribed to nf_tables notifications costs a cold sync.

With any subscriber in a network namespace (an operator's `nft monitor`, a
security agent), the kernel builds a notification of every object a
transaction touches and holds them all until the commit ends. This runs, in
fresh network namespaces, alternating, ROUNDS times each:

  kube-nft          `kube-nft bench-child` (one cold sync of N Services x E)
  kube-nft+monitor  the same with `nft monitor` running in the namespace
  nft -f+monitor    the ruleset kube-nft wrote, listed, loaded with `nft -f`
                    in a fresh namespace with `nft monitor` running

and prints, for each, the medians of: the kernel's slab growth over the sync
(/proc/meminfo's Slab sampled every 20 ms, peak minus the value before), the
sync's time, and the lines `nft monitor` printed (what it heard; "ENOBUFS"
if it said the kernel reported notifications lost to it).

  benches/foreign_listener.py KUBE_NFT [SERVICES [ENDPOINTS [ROUNDS [KINDS]]]]   # as root

KINDS: some of the three, comma-separated (at 100k, `nft -f` with a listener
needs ~10 GiB of kernel memory).
"""

import os
import statistics
import subprocess
import sys
import threading
import time


def slab_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Slab:"):
                return int(line.split()[1])
    raise RuntimeError("no Slab in /proc/meminfo")


class SlabPeak:
    """The highest Slab seen while running, sampled every 20 ms."""

    def __init__(self):
        self.base = slab_kib()
        self.peak = self.base
        self.running = True
        self.thread = threading.Thread(target=self.sample)
        self.thread.start()

    def sample(self):
        while self.running:
            self.peak = max(self.peak, slab_kib())
            time.sleep(0.02)

    def stop(self):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, slab_kib())
        return (self.peak - self.base) / 1024


class Monitor:
    """`nft monitor` in the namespace, counting the lines it prints."""

    def __init__(self, ns):
        self.lines = 0
        self.lost = False
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "nft", "monitor"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        # Subscribed before the sync starts.
        self.thread = threading.Thread(target=self.read)
        self.thread.start()
        time.sleep(0.3)

    def read(self):
        for line in self.proc.stdout:
            self.lines += 1
            # What nft says when the kernel reports ENOBUFS to it.
            if b"We lost some netlink events" in line:
                self.lost = True

    def stop(self):
        # It prints slower than the kernel sends: wait until it is quiet.
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            if self.lines != last:
                last, quiet_since = self.lines, time.monotonic()
            time.sleep(0.1)
        self.proc.terminate()
        self.proc.wait()
        self.thread.join()
        return f"{self.lines}" + (" (ENOBUFS)" if self.lost else "")


def netns(name):
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)


def drop(name):
    subprocess.run(["ip", "netns", "del", name], check=False)


def run(kind, kube_nft, services, endpoints, ruleset_file):
    ns = f"fl{os.getpid()}-{kind.replace('+', '-').replace(' ', '')}"
    netns(ns)
    try:
        monitor = Monitor(ns) if "monitor" in kind else None
        slab = SlabPeak()
        started = time.monotonic()
        if kind.startswith("nft -f"):
            subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", ruleset_file], check=True)
        else:
            subprocess.run(
                [kube_nft, "bench-child", "--netns", ns, "--services", str(services),
                 "--endpoints", str(services * endpoints)],
                check=True, stdout=subprocess.DEVNULL,
            )
        took = time.monotonic() - started
        grew = slab.stop()
        heard = monitor.stop() if monitor else "-"
        if kind.startswith("kube-nft") and not os.path.exists(ruleset_file):
            with open(ruleset_file, "w") as f:
                subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "ruleset"],
                               check=True, stdout=f)
        return grew, took, heard
    finally:
        drop(ns)


def main():
    kube_nft = sys.argv[1]
    services = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    endpoints = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    ruleset_file = f"/tmp/foreign-listener-{os.getpid()}.nft"
    kinds = ["kube-nft", "kube-nft+monitor", "nft -f+monitor"]
    if len(sys.argv) > 5:
        kinds = [k for k in kinds if k in sys.argv[5].split(",")]
    results = {k: [] for k in kinds}
    try:
        for r in range(rounds):
            for kind in kinds:
                grew, took, heard = run(kind, kube_nft, services, endpoints, ruleset_file)
                print(f"round {r + 1} {kind:18} slab +{grew:7.1f} MiB  {took:6.2f} s  heard {heard}",
                      flush=True)
                results[kind].append((grew, took, heard))
    finally:
        if os.path.exists(ruleset_file):
            os.remove(ruleset_file)
    print(f"\n{services} Services x {endpoints}, medians of {rounds}:")
    print(f"| | slab growth | sync | lines heard by `nft monitor` |")
    print(f"|---|---|---|---|")
    for kind in kinds:
        grew = statistics.median(g for g, _, _ in results[kind])
        took = statistics.median(t for _, t, _ in results[kind])
        heard = ", ".join(sorted({h for _, _, h in results[kind]}))
        print(f"| {kind} | {grew:.0f} MiB | {took:.2f} s | {heard} |")


if __name__ == "__main__":
    main()
