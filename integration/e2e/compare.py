#!/usr/bin/env python3
"""The table of docs/CONFORMANCE.md from two runs of integration/e2e/run.sh:

    integration/e2e/compare.py KUBE_NFT_REPORT_DIR KUBE_PROXY_REPORT_DIR

One row per test of the selection that ran against either proxy: each proxy's
result and the seconds it took, and a last line of totals. Tests the run
filtered out are left out; a test that skipped itself says why.
"""
import sys
import xml.etree.ElementTree as ET

PREFIX = "[It] [sig-network] Services "


def results(report_dir):
    out = {}
    for case in ET.parse(f"{report_dir}/junit_01.xml").iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(PREFIX):
            continue
        status, secs = case.get("status"), float(case.get("time", 0))
        skipped = case.find("skipped")
        why = skipped.get("message", "") if skipped is not None else ""
        if status == "skipped" and why == "skipped":
            continue  # not selected
        if status == "skipped":
            status = why.replace("|", "/")
        out[name[len(PREFIX):]] = (status, secs)
    return out


def main():
    ours, theirs = results(sys.argv[1]), results(sys.argv[2])
    print("| test (`[sig-network] Services …`) | kube-nft | s | kube-proxy | s |")
    print("|---|---|---|---|---|")
    totals = {"kube-nft": [0, 0.0], "kube-proxy": [0, 0.0]}
    for name in sorted(set(ours) | set(theirs)):
        row = [name.replace("|", "/")]
        for who, r in (("kube-nft", ours.get(name)), ("kube-proxy", theirs.get(name))):
            status, secs = r if r else ("not run", 0.0)
            row += [status, f"{secs:.0f}"]
            totals[who][0] += status == "passed"
            totals[who][1] += secs
        print("| " + " | ".join(row) + " |")
    n = len(set(ours) | set(theirs))
    print(
        f"| **{n} tests** | **{totals['kube-nft'][0]} passed** | {totals['kube-nft'][1]:.0f} "
        f"| **{totals['kube-proxy'][0]} passed** | {totals['kube-proxy'][1]:.0f} |"
    )


if __name__ == "__main__":
    main()
