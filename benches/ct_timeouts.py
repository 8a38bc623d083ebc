#!/usr/bin/env python3
"""What a Service's own conntrack timeouts cost a sync, at 10k and 30k Services.

Each annotated Service adds a `ct timeout` object per protocol and a
`timeout-` chain per port and target (docs/SERVICES.md). A new rule shape is
checked for the kernel's quadratic traps before it is built on: this writes N
Services of two ports (TCP and UDP) and 10 endpoints each, with every Service
annotated or none, ROUNDS times each in a fresh network namespace, and prints
the medians of

  kube-nft   `kube-nft run --once`: the commit of its full sync, from its
             debug line (`commit_ms`), which is the kernel's work
  nft -f     `kube-nft render` of the same manifests loaded by `nft -f`,
             timed as a process

per 1k Services (flat from 10k to 30k = linear), and annotated ÷ plain.

  benches/ct_timeouts.py KUBE_NFT [SIZES [ROUNDS]]   # as root
  SIZES: comma-separated (default 10000,30000); ROUNDS: default 3
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ANNOTATIONS = ("\n  annotations: {kube-nft.io/conntrack-udp-timeout: 5s, "
               "kube-nft.io/conntrack-tcp-established-timeout: 2h}")


def manifests(n, annotated):
    out = []
    for i in range(n):
        vip = f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"
        ann = ANNOTATIONS if annotated else ""
        out.append(
            f"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s{i}\n"
            f"  namespace: default{ann}\nspec:\n  clusterIP: {vip}\n"
            "  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]\n")
        addrs = ", ".join(
            f'{{addresses: ["10.244.{(i * 10 + j) // 256 % 256}.{(i * 10 + j) % 256}"]}}'
            for j in range(10))
        out.append(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata: {{name: s{i}-a, namespace: default, "
            f"labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\n"
            "ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]\n"
            f"endpoints: [{addrs}]\n")
    return "".join(out)


def in_fresh_ns(args, **kw):
    ns = f"ctt-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        return subprocess.run(["ip", "netns", "exec", ns, *args], check=True,
                              capture_output=True, text=True, **kw)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def kube_nft_commit_ms(kube_nft, path):
    out = in_fresh_ns(["env", "RUST_LOG=kube_nft=debug", kube_nft, "run", "--once",
                       "--manifests", path])
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    m = re.search(r"commit_ms=(\d+)", text)
    if not m:
        sys.exit(f"no full sync line in kube-nft's log:\n{text[-2000:]}")
    return float(m.group(1))


def nft_f_ms(script):
    started = time.monotonic()
    in_fresh_ns(["nft", "-f", script])
    return (time.monotonic() - started) * 1000


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    kube_nft = os.path.abspath(sys.argv[1])
    sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "10000,30000").split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    print("| Services | kube-nft commit, plain | annotated | annotated ÷ plain "
          "| `nft -f`, plain | annotated | per 1k Services, kube-nft plain / annotated |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            medians = {}
            for annotated in (False, True):
                d = os.path.join(tmp, f"{n}-{int(annotated)}")
                os.mkdir(d)
                with open(os.path.join(d, "m.yaml"), "w") as f:
                    f.write(manifests(n, annotated))
                script = os.path.join(tmp, f"{n}-{int(annotated)}.nft")
                with open(script, "w") as f:
                    rendered = subprocess.run([kube_nft, "render", "--manifests", d],
                                              check=True, capture_output=True, text=True)
                    f.write(rendered.stdout)
                ours, theirs = [], []
                for _ in range(rounds):
                    ours.append(kube_nft_commit_ms(kube_nft, d))
                    theirs.append(nft_f_ms(script))
                medians[annotated] = (statistics.median(ours), statistics.median(theirs))
            (p, pn), (a, an) = medians[False], medians[True]
            print(f"| {n} | {p:.0f} ms | {a:.0f} ms | {a / p:.2f} | {pn:.0f} ms | {an:.0f} ms "
                  f"| {p / n * 1000:.1f} / {a / n * 1000:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
