//! Transactions are atomic: a batch the kernel refuses changes nothing, the error
//! names the refused object, and the previous ruleset keeps serving.

mod common;

use common::*;
use kube_nft::core::node_config::NodeConfig;
use kube_nft::netlink::{NftError, NftSocket};
use kube_nft::nft::kernel;
use kube_nft::nft::names::CHAIN_SERVICES;
use kube_nft::ruleset::Ruleset;
use kube_nft::ruleset::{Rule, Stmt, Verdict};
use kube_nft::source::files::parse;
use kube_nft::testbed::netns::in_netns;
use std::time::Duration;

fn desired(manifests: &str) -> Ruleset {
    let loaded = parse(manifests, "test.yaml").unwrap();
    kube_nft::nft::translate::desired(&loaded.objects, None, &NodeConfig::default()).0
}

#[test]
fn refused_transaction_names_the_object_and_leaves_the_old_rules_serving() {
    let c = Cluster::new("txn", &[("pod-a", &["10.244.0.11"])], &[9376]);
    let good = desired(
        &(service("web", &["10.96.0.10"], &[tcp(80, 9376)])
            + &slice("web", "a", &[tcp(80, 9376)], &["10.244.0.11"])),
    );
    // The same ruleset plus a Service, and a rule that jumps to a chain that does not exist.
    let mut bad = desired(
        &(service("web", &["10.96.0.10"], &[tcp(80, 9376)])
            + &slice("web", "a", &[tcp(80, 9376)], &["10.244.0.11"])
            + &service("new", &["10.96.0.11"], &[tcp(80, 9376)])
            + &slice("new", "a", &[tcp(80, 9376)], &["10.244.0.11"])),
    );
    bad.tables[0]
        .chains
        .iter_mut()
        .find(|ch| ch.name == CHAIN_SERVICES)
        .unwrap()
        .rules
        .push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(
            "no-such-chain".into(),
        ))]));

    let (g, b) = (good.clone(), bad.clone());
    let (err, still_good) = in_netns(c.node(), move || {
        let mut sock = NftSocket::open().unwrap();
        kernel::apply(&mut sock, &g).unwrap();
        let err = kernel::apply(&mut sock, &b).unwrap_err();
        (err, kernel::kernel_matches(&mut sock, &g).unwrap())
    })
    .unwrap();
    match &err {
        NftError::Refused { what, source, .. } => {
            assert_eq!(what, "add rule to ip kube-nft chain services");
            assert_eq!(source.raw_os_error(), Some(2), "{err}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
    assert!(
        still_good,
        "the refused transaction changed the kernel's ruleset"
    );
    assert_eq!(
        tally(c.client(), "10.96.0.10:80", 5, false)
            .answers
            .get("pod-a"),
        Some(&5)
    );
    // The new Service of the refused transaction is not there.
    assert!(tally(c.client(), "10.96.0.11:80", 1, false)
        .answers
        .is_empty());
    let listed = nft_list(c.node());
    assert!(!listed.contains("10.96.0.11"), "{listed}");
}

#[test]
fn the_kernel_readback_decodes_every_object_we_wrote() {
    let c = Cluster::new("readback", &[], &[]);
    let rs = desired(
        &(service(
            "web",
            &["10.96.0.10", "fd00:10:96::10"],
            &[tcp(80, 9376), udp(53, 53)],
        ) + &slice(
            "web",
            "a",
            &[tcp(80, 9376), udp(53, 53)],
            &["10.244.0.11", "10.244.0.12"],
        ) + &slice(
            "web",
            "b",
            &[tcp(80, 9376), udp(53, 53)],
            &["fd00:10:244::11"],
        )),
    );
    let expected: Vec<_> = kernel::lowered(&rs);
    let names: Vec<_> = expected
        .iter()
        .map(|t| (t.family, t.name.clone()))
        .collect();
    let tables = in_netns(c.node(), move || {
        let mut sock = NftSocket::open().unwrap();
        kernel::apply(&mut sock, &rs).unwrap();
        names
            .iter()
            .map(|(f, n)| sock.read_table(*f, n).unwrap().unwrap())
            .collect::<Vec<_>>()
    })
    .unwrap();
    assert_eq!(tables.len(), expected.len());
    for (want, got) in expected.iter().zip(&tables) {
        assert!(
            got.chains
                .iter()
                .all(|ch| ch.rules.iter().all(|r| r.handle.is_some())),
            "rules come back with handles"
        );
        assert!(
            kernel::same_table(want, got),
            "readback differs:\nwant {want:#?}\ngot {got:#?}"
        );
    }
}

/// The benchmark against kube-proxy times a removal to the transaction after
/// which no packet can reach the address: one that deletes something else, or
/// adds, does not stop the clock; one that replaces a map so that the address's
/// chain is no longer jumped to does, though the chain is still there; so does
/// the deletion of an element.
#[test]
fn a_removal_is_seen_at_the_commit_after_which_the_address_is_unreachable_not_an_earlier_one() {
    use kube_nft::bench::reach::reaches;
    require_root();
    let ns = kube_nft::testbed::netns::Netns::create(&unique("mondel")).unwrap();
    let nft = |cmd: &str| exec_in(&ns.name, &["nft", cmd]);
    let gone = |addr: &str| {
        let (addr, ns) = (addr.parse().unwrap(), ns.name.clone());
        move || !reaches(&exec_in(&ns, &["nft", "list ruleset"]), addr)
    };
    // kube-proxy's shape: a chain per endpoint, named after it, that the
    // Service's anonymous map jumps to; and a named set of addresses.
    nft("add table ip t; add set ip t s { type ipv4_addr; }; add element ip t s { 10.9.9.9 }");
    nft("add chain ip t endpoint-x__10.1.2.30/80; add rule ip t endpoint-x__10.1.2.30/80 meta l4proto tcp dnat ip to 10.1.2.30:80");
    nft("add chain ip t endpoint-y__10.1.2.3/80; add rule ip t endpoint-y__10.1.2.3/80 meta l4proto tcp dnat ip to 10.1.2.3:80");
    nft("add chain ip t nat { type nat hook prerouting priority dstnat; }");
    nft("add rule ip t nat numgen random mod 2 vmap { 0 : goto endpoint-x__10.1.2.30/80, 1 : goto endpoint-y__10.1.2.3/80 }");
    let mut monitor = in_netns(&ns.name, kube_nft::netlink::monitor::Monitor::open)
        .unwrap()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let check = gone("10.1.2.3");
    std::thread::spawn(move || {
        let seen = monitor.next_commit_after_which(check);
        let _ = tx.send(seen.map_err(|e| e.to_string()));
    });
    nft("add element ip t s { 10.5.5.5 }");
    nft("delete element ip t s { 10.9.9.9 }");
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(500))
            .is_err(),
        "the monitor stopped at a transaction that left 10.1.2.3 reachable"
    );
    // Replaced as kube-proxy replaces it: the endpoint's chain stays, unreferenced.
    let before = std::time::Instant::now();
    nft("flush chain ip t nat; add rule ip t nat numgen random mod 1 vmap { 0 : goto endpoint-x__10.1.2.30/80 }");
    let after = std::time::Instant::now();
    let seen = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the replaced map was not seen")
        .unwrap()
        .expect("notifications were lost");
    assert!(before < seen, "the clock stopped before the commit");
    assert!(seen.duration_since(after) < std::time::Duration::from_secs(1));
    // An element of a named set.
    let mut monitor = in_netns(&ns.name, kube_nft::netlink::monitor::Monitor::open)
        .unwrap()
        .unwrap();
    let check = gone("10.5.5.5");
    let deleting = std::thread::spawn(move || {
        monitor
            .next_commit_after_which(check)
            .map(|seen| seen.is_some())
            .map_err(|e| e.to_string())
    });
    nft("delete element ip t s { 10.5.5.5 }");
    assert_eq!(deleting.join().unwrap(), Ok(true));
}

/// A monitor that is away during our commits hears none of them (the kernel
/// writes no notification of them), and hears another process's commit as
/// soon as ours is done. It is asked to report every commit as another's, so
/// that hearing one of ours would show.
#[test]
fn a_monitor_away_during_our_commits_hears_only_other_processes_commits() {
    use kube_nft::netlink::monitor::{Change, Monitor};
    require_root();
    let ns = kube_nft::testbed::netns::Netns::create(&unique("away")).unwrap();
    let web = desired(
        &(service("web", &["10.96.0.10"], &[tcp(80, 9376)])
            + &slice("web", "a", &[tcp(80, 9376)], &["10.244.0.11"])),
    );
    let mut monitor = in_netns(&ns.name, || {
        let m = Monitor::open()?;
        m.away_during_own_commits().map(|()| m)
    })
    .unwrap()
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(change) = monitor.next_foreign_change(|_| true, |_| false) {
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    in_netns(&ns.name, move || {
        let mut sock = NftSocket::open().unwrap();
        kernel::apply(&mut sock, &web).unwrap();
    })
    .unwrap();
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_millis(1500)).ok(),
        None,
        "our own commit was heard"
    );
    exec_in(&ns.name, &["nft", "add table ip someone-else"]);
    assert!(matches!(
        rx.recv_timeout(std::time::Duration::from_secs(5)),
        Ok(Change::Foreign { .. })
    ));
}

/// With another process subscribed to nf_tables in the namespace (`nft
/// monitor`), a transaction of more than `LISTENED_PART` objects goes in
/// parts, so that the kernel holds one part's notifications at a time (the
/// memory is measured by benches/foreign_listener.py). The parts leave the
/// same tables as one transaction does with nobody listening, and the
/// listener hears every object, once.
#[test]
fn a_listener_beside_a_large_sync_gets_it_in_parts_and_hears_every_object() {
    use kube_nft::netlink::nftables::LISTENED_PART;
    use kube_nft::testbed::netns::Netns;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};
    require_root();
    let sync = |ns: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_kube-nft"))
            .args(["bench-child", "--netns", ns, "--services", "1000"])
            .args(["--endpoints", "10000"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let tables = |ns: &str| {
        in_netns(ns, || {
            let mut sock = NftSocket::open().unwrap();
            kernel::all_tables()
                .filter_map(|t| sock.read_table(t.family, t.name()).unwrap())
                .collect::<Vec<_>>()
        })
        .unwrap()
    };

    let alone = Netns::create(&unique("alone")).unwrap();
    let log = sync(&alone.name);
    assert!(!log.contains("listens to nf_tables"), "{log}");
    let whole = tables(&alone.name);

    let heard = Netns::create(&unique("heard")).unwrap();
    let mut monitor = Command::new("ip")
        .args(["netns", "exec", &heard.name, "nft", "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (out, lines) = (monitor.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    wait_until(Duration::from_secs(5), "nft monitor to subscribe", || {
        exec_in(&heard.name, &["cat", "/proc/net/netlink"])
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("12"))
    });
    let log = sync(&heard.name);
    let objects: usize = log
        .split("a transaction of ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("not split:\n{log}"));
    let parts: usize = log
        .split(" objects goes as ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no parts:\n{log}"));
    assert!(
        objects > LISTENED_PART && parts >= objects.div_ceil(LISTENED_PART),
        "{log}"
    );
    let got = tables(&heard.name);
    assert_eq!(got.len(), whole.len());
    for (want, got) in whole.iter().zip(&got) {
        let d = kernel::difference(want, got);
        assert!(d.is_none(), "{}: {d:?}", want.name);
    }

    // One line per object, and one per transaction ("# new generation").
    let objects_heard = || {
        let lines = lines.lock().unwrap();
        let generations = lines.iter().filter(|l| l.starts_with('#')).count();
        (lines.len() - generations, generations)
    };
    wait_until(
        Duration::from_secs(60),
        "the monitor to print every object",
        || objects_heard().0 >= objects,
    );
    std::thread::sleep(Duration::from_millis(500));
    monitor.kill().unwrap();
    monitor.wait().unwrap();
    reader.join().unwrap();
    // And a commit after the parts: each family's ClusterIP reject verdict,
    // which a sync that creates the tables writes last (`Plan::then`).
    let (heard_objects, generations) = objects_heard();
    assert_eq!(heard_objects, objects + 2);
    assert_eq!(
        generations,
        parts + 1,
        "a generation per part, and the verdicts'"
    );
}

/// A read that `track_interruptions` notes the dumps that a commit came during
/// (the periodic verification judges nothing they found): none on a quiet
/// kernel; a large set's element dump, with commits going on all the while.
#[test]
fn a_read_notes_the_dumps_a_commit_came_during() {
    use kube_nft::core::net::Family;
    use kube_nft::netlink::nftables::Interrupted;
    use kube_nft::netlink::Batch;
    use std::sync::atomic::{AtomicBool, Ordering};
    require_root();
    let scratch = Scratch::new("interrupted");
    let addrs: Vec<String> = (0..50_000u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect();
    let ruleset = format!(
        "table ip t {{\n set big {{ type ipv4_addr; elements = {{ {} }}; }}\n set small {{ type ipv4_addr; elements = {{ 192.0.2.1 }}; }}\n}}\n",
        addrs.join(", ")
    );
    let file = scratch.write("t.nft", &ruleset);
    let ns = kube_nft::testbed::netns::Netns::create(&unique("interrupted")).unwrap();
    exec_in(&ns.name, &["nft", "-f", &file.display().to_string()]);
    in_netns(&ns.name, || {
        let mut sock = NftSocket::open().unwrap();
        sock.track_interruptions();
        let quiet = sock.read_table(Family::Ip, "t").unwrap().unwrap();
        assert_eq!(
            quiet.sets.iter().map(|s| s.elements.len()).sum::<usize>(),
            50_001
        );
        assert_eq!(sock.take_interruptions(), Some(Interrupted::default()));

        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let committer = scope.spawn(|| {
                let mut other = NftSocket::open().unwrap();
                let mut commits = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut b = Batch::new();
                    b.add_table(Family::Ip, "other", None);
                    b.delete_table(Family::Ip, "other");
                    other.commit(b).unwrap();
                    commits += 1;
                }
                commits
            });
            std::thread::sleep(Duration::from_millis(20));
            sock.track_interruptions();
            sock.read_table(Family::Ip, "t").unwrap().unwrap();
            stop.store(true, Ordering::Relaxed);
            let commits = committer.join().unwrap();
            let cut = sock.take_interruptions().unwrap();
            let big = (Family::Ip, "t".to_string(), "big".to_string());
            assert!(cut.sets.contains(&big), "{commits} commits, and {cut:?}");
        });
    })
    .unwrap();
}
