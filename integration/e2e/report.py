#!/usr/bin/env python3
"""What the JUnit report of integration/e2e/run.sh says, read in one place:

    integration/e2e/report.py lines DIR PROXY       # one line per test, as the test command counts them
    integration/e2e/report.py table KUBE_NFT_DIR KUBE_PROXY_DIR   # docs/CONFORMANCE.md's table

Only the tests of `[sig-network]` that ran or skipped themselves count: the
ones focus and skip filtered out are left out.
"""
import sys
import xml.etree.ElementTree as ET

PREFIX = "[It] [sig-network] "
SERVICES = "Services "


def results(report_dir):
    """Test name (after "[sig-network] ") -> (status, seconds);
    a test that skipped itself has its reason as status."""
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
            status = why
        out[name[len(PREFIX):]] = (status, secs)
    return out


def lines(report_dir, proxy):
    ran = results(report_dir)
    if not ran:
        # A selection that ran nothing has not passed.
        print(f"kind: FAILED: {proxy}: e2e: no test of the selection ran", file=sys.stderr)
        sys.exit(1)
    for name, (status, secs) in sorted(ran.items()):
        full = f"[sig-network] {name}"
        if status == "passed":
            print(f"kind: ok: {proxy}: e2e: {full} ({secs:.0f} s)", file=sys.stderr)
        elif status.startswith("skipped"):
            print(f"kind: {proxy}: e2e: {full}: {status}", file=sys.stderr)
        else:
            print(f"kind: FAILED: {proxy}: e2e: {full} ({status}, {secs:.0f} s)", file=sys.stderr)


def table(ours_dir, theirs_dir):
    ours, theirs = results(ours_dir), results(theirs_dir)
    print("| test (`[sig-network] Services …`, or its group) | kube-nft | s | kube-proxy | s |")
    print("|---|---|---|---|---|")
    totals = {"kube-nft": [0, 0.0], "kube-proxy": [0, 0.0]}
    for name in sorted(set(ours) | set(theirs)):
        # The Services tests by their own name, as the heading says; others
        # (the zones selection's) with their group.
        shown = name[len(SERVICES):] if name.startswith(SERVICES) else name
        row = [shown.replace("|", "/")]
        for who, r in (("kube-nft", ours.get(name)), ("kube-proxy", theirs.get(name))):
            status, secs = r if r else ("not run", 0.0)
            row += [status.replace("|", "/"), f"{secs:.0f}"]
            totals[who][0] += status == "passed"
            totals[who][1] += secs
        print("| " + " | ".join(row) + " |")
    n = len(set(ours) | set(theirs))
    print(
        f"| **{n} tests** | **{totals['kube-nft'][0]} passed** | {totals['kube-nft'][1]:.0f} "
        f"| **{totals['kube-proxy'][0]} passed** | {totals['kube-proxy'][1]:.0f} |"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "lines":
        lines(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
