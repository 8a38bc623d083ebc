#!/usr/bin/env python3
# Copyright kube-nft authors. Licensed under the Apache License, Version 2.0.
"""Writes an nft script of N Services x 10 endpoints spread over T tables (16 by
default), in one of three rule shapes, to time with `nft -f` in an empty namespace and profile with
`perf record -g` (docs/BENCHMARKS.md, "Rule shapes over 16 tables"):

  cascade     one chain per Service: `numgen random mod K 0 dnat to ...` per
              endpoint (what kube-nft writes)
  named-map   one chain and one named `numgen` map per Service
  shared-map  one chain per Service, all looking up one map per table at an offset
  by-count    no chain or map per Service: per table, one chain and one map per
              endpoint count, the map keyed by the Service's address, protocol,
              port and slot; the dispatch element goes to the chain of its count

    benches/rule-shapes.py cascade 10000 [TABLES] > /tmp/c.nft
    ip netns add t && time ip netns exec t nft -f /tmp/c.nft; ip netns del t
"""
import sys

ENDPOINTS = 10


def addr(base, i):
    return f"10.{base + i // 65536}.{(i // 256) % 256}.{i % 256}"


def main():
    shape, services = sys.argv[1], int(sys.argv[2])
    tables = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    if shape not in ("cascade", "named-map", "shared-map", "by-count"):
        sys.exit(f"unknown shape {shape}")
    body, elements = [], []
    for t in range(tables):
        table = f"s{t:02d}"
        body.append(f"table ip {table} {{")
        body.append("  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }")
        if shape == "shared-map":
            body.append("  map endpoints { typeof numgen random mod 1 : ip daddr . tcp dport; }")
        if shape == "by-count":
            body.append(
                f"  map cluster-{ENDPOINTS} {{ typeof ip daddr . meta l4proto . th dport . "
                "numgen random mod 1 : ip daddr . tcp dport; }"
            )
            body.append(
                f"  chain pick-{ENDPOINTS} {{ meta l4proto tcp dnat ip to ip daddr . meta l4proto . "
                f"th dport . numgen random mod {ENDPOINTS} map @cluster-{ENDPOINTS}; }}"
            )
        body.append(
            "  chain pre { type nat hook prerouting priority -99; policy accept; "
            "ip daddr . meta l4proto . th dport vmap @service-ips; }"
        )
        dispatch, offset = [], 0
        for i in range(t, services, tables):
            chain = f"svc-{i:05d}"
            eps = [addr(128, i * ENDPOINTS + k) for k in range(ENDPOINTS)]
            if shape == "by-count":
                vip = addr(96, i)
                elements.append(
                    f"add element ip {table} cluster-{ENDPOINTS} {{ "
                    + ", ".join(f"{vip} . tcp . 80 . {k} : {a} . 8080" for k, a in enumerate(eps))
                    + " }"
                )
                dispatch.append(f"{vip} . tcp . 80 : goto pick-{ENDPOINTS}")
                continue
            if shape == "cascade":
                rules = [
                    f"meta l4proto tcp numgen random mod {ENDPOINTS - k} 0 dnat to {a}:8080"
                    for k, a in enumerate(eps[:-1])
                ] + [f"meta l4proto tcp dnat to {eps[-1]}:8080"]
            elif shape == "named-map":
                pairs = ", ".join(f"{k} : {a} . 8080" for k, a in enumerate(eps))
                body.append(
                    f"  map ep-{chain} {{ typeof numgen random mod 1 : ip daddr . tcp dport; "
                    f"elements = {{ {pairs} }} }}"
                )
                rules = [f"meta l4proto tcp dnat ip to numgen random mod {ENDPOINTS} map @ep-{chain}"]
            else:
                rules = [
                    f"meta l4proto tcp dnat ip to numgen random mod {ENDPOINTS} offset {offset} map @endpoints"
                ]
                # Elements after the rules: the kernel checks each element against
                # every rule bound to the map, or each new binding against every element.
                elements.append(
                    f"add element ip {table} endpoints {{ "
                    + ", ".join(f"{offset + k} : {a} . 8080" for k, a in enumerate(eps))
                    + " }"
                )
                offset += ENDPOINTS
            body.append(f"  chain {chain} {{")
            body.extend(f"    {r}" for r in rules)
            body.append("  }")
            dispatch.append(f"{addr(96, i)} . tcp . 80 : goto {chain}")
        body.append("}")
        for j in range(0, len(dispatch), 500):
            elements.append(f"add element ip {table} service-ips {{ {', '.join(dispatch[j:j + 500])} }}")
    print("\n".join(body + elements))


if __name__ == "__main__":
    main()
