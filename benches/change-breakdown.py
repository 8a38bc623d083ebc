#!/usr/bin/env python3
# Copyright kube-nft authors. Licensed under the Apache License, Version 2.0.
"""Splits each change that `kube-nft bench-kube-proxy` timed (an endpoint
removed, a Service deleted) into where its time went, by setting the bench's own
log beside kube-nft's:

  api    the bench sends the change -> kube-nft's watch hands it on (the API
         server's write, its watch cache, the wire and the decoding)
  queue  -> kube-nft's partial sync starts
  sync   -> the partial sync has committed
  on_cpu, runnable   of the sync, the thread's time on a CPU and its time
         waiting for one (the rest of it, blocked: the kernel's locks, I/O)

Both logs must be at debug for these lines (docs/BENCHMARKS.md, "Against real
kube-proxy at 10k and 100k"):

    RUST_LOG=info,kube_nft::source::kubernetes=debug,kube_nft::engine=debug,kube_nft::bench::versus=debug \\
      integration/k8s/bench.sh ... 2> bench.log
    benches/change-breakdown.py bench.log /var/tmp/kube-nft-bench-kube-proxy/kube-nft-100000.log

Prints one line per change of kube-nft's run, in ms, then the medians.
"""
import re
import statistics
import sys
from datetime import datetime

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d+)Z")
# A change whose watch event comes later than this was not kube-nft's (the
# bench also changes things while kube-proxy runs).
MAX_API_SECONDS = 10


def events(path, pattern):
    """(seconds, line) of each line of `path` that matches `pattern`."""
    found = []
    with open(path, errors="replace") as f:
        for raw in f:
            line = ANSI.sub("", raw)
            stamp = STAMP.match(line)
            if stamp and re.search(pattern, line):
                whole, frac = stamp.groups()
                at = datetime.fromisoformat(f"{whole}.{frac[:6]}").timestamp()
                found.append((at, line))
    return found


def first_after(found, t):
    return next((e[0] for e in found if e[0] >= t), None)


def field_ms(line, name):
    """The value of `name=` in a log line, in ms (NaN where absent)."""
    found = re.search(rf"\b{name}=([0-9.e+-]+)", line)
    return float(found.group(1)) / 1e3 if found else float("nan")


def main(bench_log, kube_nft_log):
    sent = events(bench_log, r"change sent")
    watched = events(kube_nft_log, r"watch: (applied|deleted)")
    started = events(kube_nft_log, r"partial sync of")
    synced = events(kube_nft_log, r"dataplane synced")
    if not watched:
        sys.exit(f"{kube_nft_log}: no watch events (was it run at debug?)")
    rows = []
    for t0, _ in sent:
        if not watched[0][0] - 1 <= t0 <= watched[-1][0]:
            continue
        watch = first_after(watched, t0)
        if watch is None or watch - t0 > MAX_API_SECONDS:
            continue
        start = first_after(started, watch)
        done = start and next((e for e in synced if e[0] >= start), None)
        if done is None:
            continue
        done, line = done
        rows.append([
            watch - t0, start - watch, done - start,
            field_ms(line, "on_cpu_ms"), field_ms(line, "runnable_ms"), done - t0,
        ])
    if not rows:
        sys.exit("no change of the bench's log falls in kube-nft's log")
    print("api_ms\tqueue_ms\tsync_ms\ton_cpu\trunnable\ttotal_ms")
    for row in rows:
        print("\t".join(f"{x * 1e3:.1f}" for x in row))
    medians = [statistics.median(col) * 1e3 for col in zip(*rows)]
    print("median\n" + "\t".join(f"{m:.1f}" for m in medians))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
