//! The `kube-nft run` daemon against a real kernel: drift repaired from nf_tables
//! notifications, restarts that write nothing and keep connections, and bursts of
//! changes coalesced into one transaction.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn drift_is_repaired_from_nftables_notifications() {
    let (c, _, d) = serve_web_on_notifications_only("drift");
    // Three endpoints: the Service table's `pick-3`, over `endpoints-3-4`.
    let (table, chain) = find_chain(c.node(), "pick-3").expect("the pick chain of 3");
    let slot2 = "10.96.0.10 . tcp . 80 . 2 : 10.244.0.13 . 9376".to_string();
    for (what, cmd, restored) in [
        (
            "an element deleted",
            format!("delete element {table} service-ips {{ 10.96.0.10 . tcp . 80 }}"),
            "10.96.0.10 . tcp . 80".to_string(),
        ),
        (
            "an endpoint deleted from the endpoint map",
            format!("delete element {table} endpoints-3-4 {{ 10.96.0.10 . tcp . 80 . 2 }}"),
            slot2.clone(),
        ),
        (
            "a pick chain flushed",
            format!("flush chain {table} {chain}"),
            "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 3 map @endpoints-3-4"
                .to_string(),
        ),
        (
            "the Service's table deleted",
            format!("delete table {table}"),
            slot2.clone(),
        ),
        (
            "the main table deleted",
            "delete table ip kube-nft".to_string(),
            "chain reject-chain".to_string(),
        ),
        (
            "the whole ruleset flushed (`nft flush ruleset`)",
            "flush ruleset".to_string(),
            slot2.clone(),
        ),
    ] {
        nft_in(c.node(), &cmd);
        let repaired = wait_until(Duration::from_secs(5), what, || {
            nft_list(c.node()).contains(&restored)
        });
        // A client whose first SYN met the broken ruleset retries after 1 s (TCP's initial RTO).
        let flowing = wait_until(Duration::from_secs(5), what, || {
            answers(c.client(), "10.96.0.10:80")
        });
        println!("{what}: repaired after {repaired:?}, traffic flowing {flowing:?} later");
        assert!(
            repaired < Duration::from_secs(1),
            "{what}: repair took {repaired:?}\n{}",
            d.log_text()
        );
    }
    let t = tally(c.client(), "10.96.0.10:80", 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "{t:?}");
    assert!(
        d.log_text().contains("changed outside kube-nft"),
        "{}",
        d.log_text()
    );
}

/// `nft flush ruleset` (what an old firewall does on reload, or an operator)
/// while a client opens a new connection every 20 ms through the ClusterIP and
/// another through the NodePort, three flushes 2 s apart. The repair comes
/// from the notification, within a second (30-45 ms here).
/// - No connection to the ClusterIP fails. One whose first SYN met the empty
///   ruleset was tracked without DNAT; after the repair kube-nft deletes such
///   entries, so the SYN's retransmission 1 s later is balanced like any new
///   connection (without that, it met the rule that rejects unknown ports of a
///   ClusterIP, and failed: one a flush or two). A SYN in the flush's or the
///   repair's own commit was refused too: about 1 run in 70 at this rate
///   (scaled from the flood below, which finds those: 18 in 100 flushes).
/// - A connection to the NodePort whose SYN comes in the gap is refused by the
///   node itself at once (the NodePort is the node's own address, where nothing
///   listens): no more than a new connection every 20 ms can bring in each
///   repair's time (one a flush or two, usually; 8 in 3 flushes repaired after
///   ~250 ms on a loaded machine), and only then.
/// - No established connection breaks: the flush passes kube-nft's owned NAT
///   hold by (`node::nat_hold`), so the kernel keeps translating them. Without
///   it, 5 of 34 runs under load broke one: a pod's answer came back in the gap
///   untranslated and the node reset it (the client then timed out), or the
///   node reset a NodePort client's request.
#[test]
fn a_flushed_ruleset_under_load_fails_no_cluster_ip_connection_and_only_node_ports_in_its_gap() {
    let c = Cluster::new("flushload", &WEB_PODS, &[9376]);
    let d = serve_web_with_node_port(&c);
    let node_port = services::node_port(WEB_NODE_PORT);
    let (repairs, loads) = under_load(c.client(), &[WEB_VIP, &node_port], 3, || {
        nft_in(c.node(), "flush ruleset");
        wait_until(Duration::from_secs(5), "the repair", || {
            nft_list(c.node()).contains("10.96.0.10 . tcp . 80 . 2 : 10.244.0.13 . 9376")
        })
    });
    let in_the_gap = |(e, after): &(String, Duration)| {
        e.contains("refused") && *after < Duration::from_millis(500)
    };
    for load in loads {
        println!("3 flushes, repaired after {repairs:?}: {}", load.summary());
        let failed = &load.failed;
        if load.target == WEB_VIP {
            assert!(failed.is_empty(), "{}\n{}", load.summary(), d.log_text());
        } else {
            // A SYN every 20 ms at most: a gap of g meets g / 20 ms + 1 of them.
            let in_the_gaps: usize = repairs
                .iter()
                .map(|r| (r.as_millis() / 20) as usize + 1)
                .sum();
            assert!(
                failed.len() <= in_the_gaps && failed.iter().all(in_the_gap),
                "{}\n{}",
                load.summary(),
                d.log_text()
            );
        }
        assert!(
            load.longest() < Duration::from_secs(3),
            "{}",
            load.summary()
        );
        assert!(load.times.len() > 100, "{}", load.summary());
    }
    assert!(
        repairs.iter().all(|r| *r < Duration::from_secs(1)),
        "{repairs:?}"
    );
    assert_eq!(nat_holds(c.node()), 2, "{:?}", nft_tables(c.node()));
}

/// `nft flush ruleset` a hundred times, each 100 ms after the last repair,
/// while eight clients open connections to the ClusterIP back to back
/// (1,500-2,500 a second here): none is refused. One whose SYN comes while
/// the rules are missing is not answered within its 300 ms (the SYN's
/// retransmission, 1 s later, would be balanced); that is counted, not failed.
///
/// Two instants refused connections before, both found with this flood:
/// - the flush's own commit: the kernel runs the deleted chains' old rules
///   until it unhooks each, and there a set's lookup still hits while a map's
///   misses, so the ClusterIP was not DNATed (its dispatch is a map) and was
///   rejected (`cluster-ips` is a set): 30 in 210 flushes. The reject now comes
///   from a map (`cluster-ips-reject`), which misses there too.
/// - the repair's commit: a SYN that met the NAT hook before it and the filter
///   hook after it: 7 in 1,029 flushes. The reject's verdict now comes a
///   commit later, once no packet is between two hooks (`Plan::then`).
#[test]
fn a_flood_of_new_connections_through_a_hundred_flushes_is_never_refused() {
    let c = Cluster::new("flushflood", &WEB_PODS, &[9376]);
    let d = serve_web_with_node_port(&c);
    let stop = Arc::new(AtomicBool::new(false));
    let flood = flood_connections(c.client(), WEB_VIP, 8, stop.clone());
    let started = std::time::Instant::now();
    let mut flushes = Vec::new();
    for _ in 0..100 {
        let at = std::time::SystemTime::now();
        nft_in(c.node(), "flush ruleset");
        wait_until(Duration::from_secs(5), "the repair", || {
            let listed = nft_list(c.node());
            listed.contains("10.96.0.10 . tcp . 80 . 2 : 10.244.0.13 . 9376")
                && listed.contains("new : goto reject-chain")
        });
        flushes.push(at.duration_since(std::time::UNIX_EPOCH).unwrap());
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let seen = flood.join().unwrap();
    let took = started.elapsed();
    let total = seen.answered + seen.unanswered + seen.refused.len() + seen.other.len();
    println!(
        "100 flushes in {took:?}: {total} connections ({:.0}/s), {} answered, {} unanswered in a gap, {} refused, {} other",
        total as f64 / took.as_secs_f64(),
        seen.answered,
        seen.unanswered,
        seen.refused.len(),
        seen.other.len()
    );
    // When each refused connection began, after the flush before it.
    let after_flush: Vec<_> = seen
        .refused
        .iter()
        .map(|(at, took)| {
            let flush = flushes.iter().rev().find(|f| *f <= at);
            (flush.map(|f| *at - *f), *took)
        })
        .collect();
    assert!(
        seen.refused.is_empty() && seen.other.is_empty(),
        "refused (began after its flush, refused in): {after_flush:?}; other: {:?}\n{}",
        seen.other,
        d.log_text()
    );
    assert!(seen.answered > 10_000, "{seen:?}");
}

/// A connection to a ClusterIP whose SYN comes before kube-nft's first sync
/// (a node booting, pods already sending) is answered on the SYN's
/// retransmission: the first sync deletes the entry conntrack kept without DNAT.
#[test]
fn a_connection_begun_before_the_first_sync_is_answered_on_its_retransmission() {
    let c = Cluster::new("beforesync", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write(
        "web.yaml",
        &web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]),
    );
    // Conntrack tracks a namespace's packets once something there uses it: on a
    // node, the CNI's or a firewall's rules, as this one.
    nft_in(
        c.node(),
        "add table inet firewall; add chain inet firewall forward { type filter hook forward priority 0; ct state established accept; }",
    );
    let early = {
        let ns = c.client().to_string();
        std::thread::spawn(move || {
            kube_nft::testbed::netns::in_netns(&ns, || {
                let started = std::time::Instant::now();
                let target: SocketAddr = WEB_VIP.parse().unwrap();
                let got = kube_nft::lab::hostname_server::http_get(target, Duration::from_secs(10));
                (got.map_err(|e| e.to_string()), started.elapsed())
            })
            .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let flows = exec_in(
        c.node(),
        &["conntrack", "-L", "-p", "tcp", "--orig-dst", "10.96.0.10"],
    );
    assert!(
        flows.contains("dport=80"),
        "the SYN was not tracked: {flows}"
    );
    let _d = Daemon::start(c.node(), &manifests, c.scratch.0.join("log"), &[]);
    let (got, took) = early.join().unwrap();
    assert!(got.is_ok(), "{got:?} after {took:?}");
    assert!(
        took >= Duration::from_millis(900),
        "answered at once, after {took:?}"
    );
}

/// The notification socket overflowing (ENOBUFS). While the daemon is stopped
/// (SIGSTOP), another process floods nf_tables with changes to a table of its
/// own until the kernel drops notifications for the daemon's socket, then
/// deletes one of our elements; that deletion's notification is dropped with
/// the rest. Only the loss itself can tell the daemon (the resync period is an
/// hour), so once resumed it must resync in full and repair.
#[test]
fn a_notification_socket_that_overflowed_leads_to_a_full_resync() {
    let (c, _, d) = serve_web_on_notifications_only("enobufs");
    let (table, _) = find_chain(c.node(), "pick-3").expect("the pick chain of 3");
    let elements: Vec<String> = (0..100_000)
        .map(|i| format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let flood = c.scratch.write(
        "flood.nft",
        &format!(
            "table inet flood {{\n  set s {{\n    type ipv4_addr\n    elements = {{ {} }}\n  }}\n}}\n",
            elements.join(", ")
        ),
    );
    assert_eq!(netfilter_netlink_drops(c.node()), 0);
    d.signal(rustix::process::Signal::STOP);
    let mut rounds = 0;
    while netfilter_netlink_drops(c.node()) == 0 {
        assert!(rounds < 30, "the daemon's socket never overflowed");
        exec_in(c.node(), &["nft", "-f", flood.to_str().unwrap()]);
        exec_in(c.node(), &["nft", "delete", "table", "inet", "flood"]);
        rounds += 1;
    }
    nft_in(
        c.node(),
        &format!("delete element {table} service-ips {{ 10.96.0.10 . tcp . 80 }}"),
    );
    let drops = netfilter_netlink_drops(c.node());
    d.signal(rustix::process::Signal::CONT);
    let repaired = wait_until(Duration::from_secs(10), "the repair", || {
        nft_list(c.node()).contains("10.96.0.10 . tcp . 80")
    });
    println!(
        "{rounds} rounds of 100k elements overflowed the socket ({drops} notifications dropped); \
         repaired {repaired:?} after SIGCONT"
    );
    let (_, metrics) = http_status(c.node(), "127.0.0.1:10249", "/metrics").expect("metrics");
    assert_eq!(
        metric(
            &metrics,
            "kubenft_drift_repairs_total{cause=\"notifications_lost\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        d.log_text().contains("(Lost); repairing"),
        "{}",
        d.log_text()
    );
    let t = tally(c.client(), "10.96.0.10:80", 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "{t:?}");
}

#[test]
fn a_long_lived_connection_survives_a_restart_that_writes_nothing() {
    let c = Cluster::new("restart", &WEB_PODS, &[9376]);
    c.apply(&web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]));
    let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    // Open a connection through the VIP and leave it idle across the restart.
    let mut conn = kube_nft::testbed::netns::in_netns(c.client(), move || {
        TcpStream::connect_timeout(&vip, Duration::from_secs(2))
    })
    .unwrap()
    .unwrap();
    let again = c.apply(&web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]));
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        log.contains("kind=Full") && log.contains("messages=0 bytes=0"),
        "the restart wrote something:\n{log}"
    );
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(conn, "GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.1 200") && resp.contains("pod-"),
        "{resp}"
    );
}

#[test]
fn a_burst_of_changes_goes_out_as_one_transaction() {
    let c = Cluster::new("burst", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("log"),
        &["--min-sync-period", "3s"],
    );
    wait_until(Duration::from_secs(10), "the first sync", || {
        d.syncs("Full") == 1
    });
    // Within the min sync period of the first sync: five edits.
    let sets: [&[&str]; 5] = [
        &["10.244.0.12"],
        &["10.244.0.11", "10.244.0.12"],
        &["10.244.0.13"],
        &["10.244.0.12", "10.244.0.13"],
        &["10.244.0.11", "10.244.0.12", "10.244.0.13"],
    ];
    for eps in sets {
        std::fs::write(&manifests, web(eps)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_until(Duration::from_secs(10), "the burst to be applied", || {
        d.syncs("Partial") >= 1
    });
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(d.syncs("Partial"), 1, "{}", d.log_text());
    let t = tally(c.client(), "10.96.0.10:80", 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "{t:?}");
}

/// In a container (its DaemonSet) kube-nft has a pid namespace of its own, and
/// the kernel's notifications name a committer by its pid in the initial one:
/// its own commits must still be known as its own, not repaired as drift. The
/// daemon runs here as pid 1 of a new pid namespace (`unshare --pid`).
#[test]
fn in_a_pid_namespace_of_its_own_the_daemon_knows_its_own_commits() {
    let c = Cluster::new("pidns", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let mut command = Command::new("ip");
    command
        .args([
            "netns",
            "exec",
            c.node(),
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            BIN,
        ])
        .args(proxy_command("run", &manifests))
        .args(["--sync-period", "1h", "--min-sync-period", "100ms"]);
    let mut d = Daemon::spawn_command(command, c.scratch.0.join("log"));
    wait_until(Duration::from_secs(10), "the first sync", || {
        d.assert_running();
        d.syncs("Full") == 1
    });
    std::fs::write(
        &manifests,
        web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]),
    )
    .unwrap();
    wait_until(Duration::from_secs(10), "the change to be applied", || {
        d.syncs("Partial") == 1
    });
    // A repair would follow within the min sync period.
    std::thread::sleep(Duration::from_secs(1));
    let log = d.log_text();
    assert!(
        !log.contains("changed outside kube-nft") && d.syncs("Full") == 1,
        "its own commits were taken for another process's:\n{log}"
    );
    let t = tally(c.client(), "10.96.0.10:80", 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "{t:?}");
}

/// The periodic verification (once an hour by default) runs beside the syncs
/// (`nft::verifier`): it finds our tables as synced, changes made while it
/// runs are applied by partial syncs as at any other time, and it is no full
/// sync.
#[test]
fn the_periodic_verification_runs_beside_changes_and_is_no_full_sync() {
    let c = Cluster::new("verify", &WEB_PODS, &[9376]);
    let all = ["10.244.0.11", "10.244.0.12", "10.244.0.13"];
    let manifests = c.scratch.write("web.yaml", &web(&all[..1]));
    let mut d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("log"),
        &[
            "--sync-period",
            "300ms",
            "--verification-period",
            "300ms",
            "--min-sync-period",
            "20ms",
        ],
    );
    let verified = |d: &Daemon| d.log_text().matches("verified: our tables hold").count();
    wait_until(Duration::from_secs(10), "a first verification", || {
        d.assert_running();
        verified(&d) >= 1
    });
    // A manifest is read once it has been still for a poll (250 ms).
    for n in [2, 3, 1, 2, 1, 3] {
        let partial = d.syncs("Partial");
        std::fs::write(&manifests, web(&all[..n])).unwrap();
        wait_until(Duration::from_secs(5), "the change to be synced", || {
            d.syncs("Partial") > partial
        });
    }
    let before = verified(&d);
    wait_until(Duration::from_secs(10), "three more verifications", || {
        verified(&d) >= before + 3
    });
    let log = d.log_text();
    assert_eq!(d.syncs("Full"), 1, "a full sync besides the first:\n{log}");
    assert!(!log.contains("changed outside kube-nft"), "{log}");
    let t = tally(c.client(), "10.96.0.10:80", 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "{t:?}");
}

#[test]
fn traffic_never_stops_while_its_manifest_is_rewritten_in_pieces_emptied_cut_or_garbled() {
    let c = Cluster::new("rewrite", &WEB_PODS, &[9376]);
    let good = web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]);
    let manifests = c.scratch.write("web.yaml", &good);
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("log"),
        &["--min-sync-period", "50ms"],
    );
    wait_until(Duration::from_secs(10), "the first sync", || {
        answers(c.client(), "10.96.0.10:80")
    });
    let stop = Arc::new(AtomicBool::new(false));
    let client = keep_connecting(
        c.client(),
        "10.96.0.10:80",
        Duration::from_secs(2),
        stop.clone(),
    );
    let settle = || std::thread::sleep(Duration::from_millis(1200));

    // Rewritten in 16-byte pieces, 20 ms apart, as a slow writer would.
    for _ in 0..3 {
        let mut f = std::fs::File::create(&manifests).unwrap();
        for piece in good.as_bytes().chunks(16) {
            f.write_all(piece).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    settle();
    // Left emptied (`cmd > file` before cmd writes), cut inside a quoted address,
    // and replaced with bytes that are not YAML, each for several polls.
    let cut = good.find("10.244.0.12").unwrap() + 4;
    let broken: [&[u8]; 3] = [
        b"",
        &good.as_bytes()[..cut],
        b"\xff\xfe}}} not: [yaml\n\x00",
    ];
    for bytes in broken {
        std::fs::write(&manifests, bytes).unwrap();
        settle();
        std::fs::write(&manifests, &good).unwrap();
        settle();
    }
    stop.store(true, Ordering::Relaxed);
    let load = client.join().unwrap();
    let (answered, failed) = (load.times.len(), &load.failed);
    println!("{answered} connections answered, {} failed", failed.len());
    assert!(failed.is_empty(), "{failed:?}\n{}", d.log_text());
    assert!(answered > 100, "only {answered} connections were tried");

    let log = d.log_text();
    for said in [
        "web.yaml: is empty",
        "web.yaml:",
        "not valid YAML",
        "cannot be read",
    ] {
        assert!(log.contains(said), "the log never said {said:?}:\n{log}");
    }
    assert!(log.contains("keeping the objects it had"), "{log}");
    let (_, metrics) = http_status(c.node(), "127.0.0.1:10249", "/metrics").expect("metrics");
    let errors = metric(&metrics, "kubenft_manifest_errors_total").unwrap_or(0.0);
    assert!(errors >= 3.0, "kubenft_manifest_errors_total = {errors}");
    assert_eq!(
        metric(&metrics, "kubenft_manifest_files_failing"),
        Some(0.0)
    );

    // The file still drives the rules once it reads well: pod-c leaves.
    std::fs::write(&manifests, web(&["10.244.0.11", "10.244.0.12"])).unwrap();
    wait_until(Duration::from_secs(5), "pod-c to leave", || {
        let t = tally(c.client(), "10.96.0.10:80", 12, false);
        t.errors.is_empty() && t.answers.len() == 2
    });
}

#[test]
fn a_manifest_that_does_not_parse_fails_once_and_render_and_deletes_nothing() {
    let c = Cluster::new("badonce", &WEB_PODS, &[9376]);
    c.apply(&web(&["10.244.0.11"]));
    assert!(answers(c.client(), "10.96.0.10:80"));
    let broken = c
        .scratch
        .write("broken.yaml", "apiVersion: v1\nkind: [Service\n");
    for command in ["run", "render"] {
        let mut args = proxy_command(command, &broken);
        if command == "run" {
            args.push("--once");
        }
        let out = kube_nft_in(c.node(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{command} succeeded on a broken file"
        );
        assert!(
            err.contains("broken.yaml:2: not valid YAML"),
            "{command}: {err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("table"),
            "{command} printed a ruleset"
        );
    }
    // The Service programmed before is still served.
    let t = tally(c.client(), "10.96.0.10:80", 5, false);
    assert!(t.errors.is_empty() && t.answers.len() == 1, "{t:?}");
}

#[test]
fn sigterm_stops_the_daemon_and_leaves_the_rules_serving_until_cleanup() {
    let c = Cluster::new("sigterm", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let mut d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("daemon.log"),
        &["--hostname-override", "node1"],
    );
    wait_until(Duration::from_secs(10), "the VIP to answer", || {
        answers(c.client(), "10.96.0.10:80")
    });
    wait_until(Duration::from_secs(5), "the NAT hold", || {
        nat_holds(c.node()) == 2
    });
    let status = d.terminate();
    assert!(status.success(), "{status:?}\n{}", d.log_text());
    assert!(d.log_text().contains("SIGTERM"), "{}", d.log_text());
    // The NAT hold went with the process's socket; our tables hold the hooks.
    let tables = nft_tables(c.node());
    assert_eq!(nat_holds(c.node()), 0, "{tables:?}");
    assert!(tables.iter().any(|t| t == "ip kube-nft"), "{tables:?}");
    let t = tally(c.client(), "10.96.0.10:80", 10, false);
    assert!(
        t.errors.is_empty(),
        "rules gone after SIGTERM: {:?}",
        t.errors
    );

    let out = kube_nft_in(c.node(), &["run", "--cleanup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!nft_list(c.node()).contains("kube-nft"));
    assert!(!answers(c.client(), "10.96.0.10:80"));
}

/// Issue #30 item 5: `kube-nft cleanup --kube-proxy` removes what kube-proxy
/// left, written here as kube-proxy writes it: its nftables mode's tables (with
/// `nft`), and its iptables mode's chains and jumps (with iptables-nft and
/// ip6tables-nft, kube-proxy's own commands and comments), whose DNAT still
/// serves the VIP. kube-nft serves it too, and requests keep being answered
/// while the leftovers go in one transaction. The kubelet's chain, another
/// program's chain and its jump, and kube-nft's tables stay. A second run
/// finds nothing to remove.
/// `web` on one pod, served by a kube-nft daemon in nftables mode.
fn web_served(name: &str) -> (Cluster, Daemon) {
    let c = Cluster::new(name, &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("daemon.log"),
        &["--hostname-override", "node1"],
    );
    wait_until(Duration::from_secs(10), "the VIP to answer", || {
        answers(c.client(), "10.96.0.10:80")
    });
    (c, d)
}

#[test]
fn cleanup_kube_proxy_removes_its_leftovers_in_one_transaction_while_kube_nft_serves() {
    let (c, d) = web_served("kpclean");
    let leftovers = c.scratch.write(
        "kube-proxy.nft",
        "table ip kube-proxy {\n chain nat-prerouting {\n  type nat hook prerouting priority dstnat; policy accept;\n }\n}\ntable ip6 kube-proxy {\n chain nat-prerouting {\n  type nat hook prerouting priority dstnat; policy accept;\n }\n}\n",
    );
    exec_in(c.node(), &["nft", "-f", leftovers.to_str().unwrap()]);
    let portals = ["-m", "comment", "--comment", "kubernetes service portals"];
    for args in [
        &["-t", "nat", "-N", "KUBE-SERVICES"][..],
        &["-t", "nat", "-N", "KUBE-SVC-WEB"],
        &["-t", "nat", "-N", "KUBE-SEP-WEB"],
        &["-t", "nat", "-N", "KUBE-MARK-MASQ"],
        &["-t", "nat", "-N", "KUBE-POSTROUTING"],
        &["-t", "nat", "-N", "DOCKER"],
        &["-t", "filter", "-N", "KUBE-FORWARD"],
        &["-t", "filter", "-N", "KUBE-FIREWALL"],
        &["-t", "mangle", "-N", "KUBE-PROXY-CANARY"],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SEP-WEB",
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            "10.244.0.11:9376",
        ],
        &["-t", "nat", "-A", "KUBE-SVC-WEB", "-j", "KUBE-SEP-WEB"],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "10.96.0.10/32",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "KUBE-SVC-WEB",
        ],
        &["-t", "nat", "-A", "KUBE-POSTROUTING", "-j", "MASQUERADE"],
        &["-t", "nat", "-A", "PREROUTING", "-j", "DOCKER"],
        &["-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"],
        &["-t", "filter", "-A", "FORWARD", "-j", "KUBE-FORWARD"],
        &["-t", "nat", "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING"],
    ] {
        let mut command = vec!["iptables-nft"];
        command.extend(args);
        exec_in(c.node(), &command);
    }
    for chain in ["PREROUTING", "OUTPUT"] {
        let mut command = vec!["iptables-nft", "-t", "nat", "-A", chain];
        command.extend(portals);
        command.extend(["-j", "KUBE-SERVICES"]);
        exec_in(c.node(), &command);
    }
    exec_in(
        c.node(),
        &["ip6tables-nft", "-t", "nat", "-N", "KUBE-SERVICES"],
    );
    exec_in(
        c.node(),
        &[
            "ip6tables-nft",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-j",
            "KUBE-SERVICES",
        ],
    );
    let before = exec_in(c.node(), &["iptables-nft-save"]);
    assert!(before.contains("-A KUBE-SEP-WEB"), "{before}");

    let log = cleanup_kube_proxy_while_connecting(c.node(), c.client(), "10.96.0.10:80");
    for line in [
        "removed kube-proxy's table ip kube-proxy, 7 iptables chains (ip nat, ip filter, ip mangle), 4 rules jumping to them",
        "removed kube-proxy's table ip6 kube-proxy, 1 iptables chains (ip6 nat), 1 rules jumping to them",
    ] {
        assert!(log.contains(line), "{line:?} not in:\n{log}");
    }

    let after = exec_in(c.node(), &["iptables-nft-save"]);
    let kube: Vec<&str> = after.lines().filter(|l| l.contains("KUBE-")).collect();
    assert_eq!(
        kube,
        [":KUBE-FIREWALL - [0:0]", "-A INPUT -j KUBE-FIREWALL"],
        "only the kubelet's chain stays:\n{after}"
    );
    assert!(after.contains("-A PREROUTING -j DOCKER"), "{after}");
    assert!(!exec_in(c.node(), &["ip6tables-nft-save"]).contains("KUBE-"));
    let tables = exec_in(c.node(), &["nft", "list", "tables"]);
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(tables.contains("kube-nft"), "{tables}");
    assert!(answers(c.client(), "10.96.0.10:80"));

    let again = kube_nft_in(c.node(), &["cleanup", "--kube-proxy"]);
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{log}");
    assert!(
        log.contains("no kube-proxy nftables or iptables-nft rules here"),
        "{log}"
    );
    drop(d);
}

#[test]
fn cleanup_kube_proxy_removes_its_ipvs_ipsets_after_the_rules_that_use_them() {
    let (c, _d) = web_served("kpipset");
    kube_proxy_ipvs::write(c.node(), &c.scratch, "10.96.0.10", 80, "10.244.0.11", 9376);
    // Someone else's set, used by their rule; and one of kube-proxy's names
    // held by an iptables-legacy rule, which only `kube-proxy --cleanup` sees.
    exec_in(c.node(), &["ipset", "create", "ALLOWED", "hash:net"]);
    exec_in(
        c.node(),
        &[
            "iptables-nft",
            "-A",
            "INPUT",
            "-m",
            "set",
            "--match-set",
            "ALLOWED",
            "src",
            "-j",
            "ACCEPT",
        ],
    );
    exec_in(
        c.node(),
        &["ipset", "create", "KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port"],
    );
    exec_in(
        c.node(),
        &[
            "iptables-legacy",
            "-A",
            "INPUT",
            "-m",
            "set",
            "--match-set",
            "KUBE-EXTERNAL-IP-LOCAL",
            "dst,dst",
            "-j",
            "RETURN",
        ],
    );

    let log = cleanup_kube_proxy_while_connecting(c.node(), c.client(), "10.96.0.10:80");

    let chains = format!(
        "removed kube-proxy's {} iptables chains (ip nat, ip filter), {} rules jumping to them",
        kube_proxy_ipvs::CHAINS,
        kube_proxy_ipvs::JUMPS
    );
    // In ipset_names' order: IPv4's, then the IPv6 twins.
    let sets = "removed 8 ipsets: KUBE-LOOP-BACK, KUBE-CLUSTER-IP, KUBE-EXTERNAL-IP, KUBE-LOAD-BALANCER, KUBE-NODE-PORT-TCP, KUBE-HEALTH-CHECK-NODE-PORT, KUBE-IPVS-IPS, KUBE-6-CLUSTER-IP";
    for line in [
        chains.as_str(),
        sets,
        "ipsets still in use by rules kube-nft cannot see or did not write (KUBE-EXTERNAL-IP-LOCAL)",
    ] {
        assert!(log.contains(line), "{line:?} not in:\n{log}");
    }
    assert_eq!(
        kube_proxy_ipvs::ipset_names(c.node()),
        ["ALLOWED", "KUBE-EXTERNAL-IP-LOCAL"]
    );
    let after = exec_in(c.node(), &["iptables-nft-save"]);
    let kept: Vec<&str> = after.lines().filter(|l| l.contains("-m set")).collect();
    assert_eq!(
        kept,
        ["-A INPUT -m set --match-set ALLOWED src -j ACCEPT"],
        "{after}"
    );
    assert!(!after.contains("KUBE-"), "{after}");
    assert!(answers(c.client(), "10.96.0.10:80"));
}

/// While kube-proxy still runs on a node (a move to kube-nft), it holds the
/// health and metrics ports. kube-nft serves them once they are free, as
/// kube-proxy tries a taken port again every 5 s: otherwise its probes would
/// fail from the moment kube-proxy goes, and the kubelet would restart it.
#[test]
fn a_health_port_held_by_another_process_is_served_once_it_is_free() {
    let c = Cluster::new("ports", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let healthz = "127.0.0.1:10256";
    let held =
        kube_nft::testbed::netns::in_netns(c.node(), move || std::net::TcpListener::bind(healthz))
            .unwrap()
            .expect("binding the port first");
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("daemon.log"),
        &[
            "--hostname-override",
            "node1",
            "--healthz-bind-address",
            healthz,
        ],
    );
    wait_until(Duration::from_secs(10), "the VIP to answer", || {
        answers(c.client(), "10.96.0.10:80")
    });
    assert!(
        d.log_text().contains("trying again every 5 s"),
        "{}",
        d.log_text()
    );
    drop(held);
    wait_until(
        Duration::from_secs(12),
        "kube-nft to serve /healthz on the freed port",
        || http_status(c.node(), healthz, "/healthz").is_some_and(|(code, _)| code == 200),
    );
}

/// `/healthz` answers 200 as soon as the kernel serves the node's Services, and
/// not before: at once over the tables an earlier run left (a restart), while
/// the first sync has still to come; on a node with none, only after it. Here
/// the first sync never comes: the manifest does not parse.
#[test]
fn healthz_is_200_over_an_earlier_runs_rules_before_the_first_sync_and_not_on_a_fresh_node() {
    let c = Cluster::new("healthz", &WEB_PODS[..1], &[9376]);
    let healthz = "127.0.0.1:10256";
    let garbled = c.scratch.write("garbled.yaml", "kind: Service\nspec: [\n");
    let status = |d: &Daemon| {
        wait_until(Duration::from_secs(10), "/healthz to answer", || {
            http_status(c.node(), healthz, "/healthz").is_some()
        });
        let (code, _) = http_status(c.node(), healthz, "/healthz").unwrap();
        assert!(
            !d.log_text().contains("programming"),
            "a sync was started:\n{}",
            d.log_text()
        );
        code
    };
    let args = ["--healthz-bind-address", healthz];
    let d = Daemon::start(c.node(), &garbled, c.scratch.0.join("fresh.log"), &args);
    assert_eq!(status(&d), 503, "nothing serves on a fresh node");
    drop(d);

    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    sync_once(c.node(), &manifests);
    let d = Daemon::start(c.node(), &garbled, c.scratch.0.join("restart.log"), &args);
    assert_eq!(status(&d), 200, "the earlier run's rules serve");
    assert!(answers(c.client(), "10.96.0.10:80"));
    assert!(
        d.log_text().contains("in place from an earlier run"),
        "{}",
        d.log_text()
    );
}

/// A node upgraded from a kube-nft of the layout before issue #31 (a chain and
/// an endpoint map per Service port in each Service table): the first sync
/// replaces each Service table whole (its comment names the old layout), in
/// its one transaction, while requests through the VIP go on answering.
#[test]
fn a_ruleset_of_the_per_service_layout_is_replaced_in_one_sync_while_requests_answer() {
    let c = Cluster::new("upgrade", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write(
        "web.yaml",
        &web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]),
    );
    let text = std::fs::read_to_string(&manifests).unwrap();
    let loaded = kube_nft::source::files::parse(&text, "web.yaml").unwrap();
    let state = kube_nft::core::convert::validate(&loaded.objects, None).state;
    let old = c.scratch.write(
        "old.nft",
        &kube_nft::bench::dataplane::per_service_layout(&state),
    );
    exec_in(c.node(), &["nft", "-f", old.to_str().unwrap()]);
    let before = nft_list(c.node());
    assert!(before.contains("map @ep-"), "the old layout:\n{before}");
    let t = tally(c.client(), WEB_VIP, 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "before: {t:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let requests = keep_connecting(c.client(), WEB_VIP, Duration::from_secs(2), stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let out = sync_once(c.node(), &manifests);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let load = requests.join().unwrap();
    let (answered, failed) = (load.times.len(), &load.failed);
    assert!(
        answered > 10 && failed.is_empty(),
        "{answered} answered, failed: {failed:?}"
    );

    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(log.matches("synced in").count(), 1, "one sync:\n{log}");
    let after = nft_list(c.node());
    assert!(
        !after.contains("map ep-") && !after.contains("chain svc-"),
        "the old layout is gone:\n{after}"
    );
    assert!(after.contains("chain pick-3 {"), "{after}");
    let again = sync_once(c.node(), &manifests);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("messages=0 bytes=0"),
        "a second sync finds nothing to do"
    );
    let t = tally(c.client(), WEB_VIP, 30, false);
    assert!(t.errors.is_empty() && t.answers.len() == 3, "after: {t:?}");
}

/// kubeadm's kube-proxy ConfigMap, every field present, in nftables mode.
const KUBEADM_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection: {acceptContentTypes: '', burst: 0, contentType: '', kubeconfig: /var/lib/kube-proxy/kubeconfig.conf, qps: 0}
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack: {maxPerCore: null, min: null, tcpBeLiberal: false, tcpCloseWaitTimeout: null, tcpEstablishedTimeout: null, udpStreamTimeout: 0s, udpTimeout: 0s}
detectLocal: {bridgeInterface: '', interfaceNamePrefix: ''}
detectLocalMode: ''
enableProfiling: false
healthzBindAddress: ''
hostnameOverride: ''
iptables: {localhostNodePorts: null, masqueradeAll: false, masqueradeBit: null, minSyncPeriod: 0s, syncPeriod: 0s}
ipvs: {excludeCIDRs: null, minSyncPeriod: 0s, scheduler: '', strictARP: false, syncPeriod: 0s, tcpFinTimeout: 0s, tcpTimeout: 0s, udpTimeout: 0s}
logging: {flushFrequency: 0, options: {json: {infoBufferSize: '0'}, text: {infoBufferSize: '0'}}, verbosity: 0}
metricsBindAddress: ''
mode: nftables
nftables: {masqueradeAll: true, masqueradeBit: null, minSyncPeriod: 0s, syncPeriod: 0s}
nodePortAddresses: null
oomScoreAdj: -999
portRange: ''
showHiddenMetricsForVersion: ''
winkernel: {enableDSR: false, forwardHealthCheckVip: false, networkName: '', rootHnsEndpointName: '', sourceVip: ''}
";

#[test]
fn a_kube_proxy_config_file_is_applied_and_a_bad_one_stops_the_start_naming_the_field() {
    let c = Cluster::new("config", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let manifests = manifests.to_str().unwrap();
    // As kind writes it: the node is a network namespace, where the host's
    // nf_conntrack_max cannot be written.
    let good = c.scratch.write(
        "good.yaml",
        &KUBEADM_CONFIG.replace("maxPerCore: null", "maxPerCore: 0"),
    );
    let run = |config: &std::path::Path| {
        kube_nft_in(
            c.node(),
            &[
                "run",
                "--config",
                config.to_str().unwrap(),
                "--manifests",
                manifests,
                "--hostname-override",
                "node1",
                "--once",
            ],
        )
    };
    let out = run(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ruleset = nft_list(c.node());
    assert!(
        ruleset.contains("masquerade all traffic to ClusterIPs"),
        "nftables.masqueradeAll not applied:\n{ruleset}"
    );
    assert!(answers(c.client(), "10.96.0.10:80"));

    let cleanup = kube_nft_in(c.node(), &["cleanup"]);
    assert!(cleanup.status.success());

    // A field the schema does not have (a newer kube-proxy's, or this typo)
    // starts kube-nft with a warning naming it, as kube-proxy's lenient
    // decoding does; the file's logging.format is taken as --logging-format is.
    let typo = c.scratch.write(
        "typo.yaml",
        &KUBEADM_CONFIG
            .replace("maxPerCore: null", "maxPerCore: 0")
            .replace("masqueradeAll: true", "masqueradeAl: true")
            .replace("verbosity: 0}", "verbosity: 0, format: json}"),
    );
    let out = run(&typo);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let warned: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| {
            l["level"] == "WARN"
                && l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("nftables.masqueradeAl: not a field"))
        })
        .collect();
    assert_eq!(warned.len(), 1, "one warning naming the field:\n{err}");
    assert!(
        !nft_list(c.node()).contains("masquerade all traffic to ClusterIPs"),
        "the misspelt field was applied"
    );
    assert!(kube_nft_in(c.node(), &["cleanup"]).status.success());

    for (bad, field) in [
        (
            KUBEADM_CONFIG.replace("maxPerCore: null", "maxPerCore: -1"),
            "conntrack.maxPerCore",
        ),
        (
            KUBEADM_CONFIG.replace(
                "detectLocalMode: ''",
                "detectLocalMode: InterfaceNamePrefix",
            ),
            "detectLocalMode",
        ),
    ] {
        let path = c.scratch.write("bad.yaml", &bad);
        let out = run(&path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a bad file was accepted: {bad}");
        assert!(
            err.contains(field),
            "the error does not name {field}: {err}"
        );
        assert!(
            !nft_list(c.node()).contains("kube-nft"),
            "programmed anyway"
        );
    }
}

/// Whether this kernel has IPVS or can load it.
fn kernel_has_ipvs() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    std::path::Path::new("/sys/module/ip_vs").exists()
        || std::path::Path::new(&format!(
            "/lib/modules/{}/kernel/net/netfilter/ipvs",
            release.trim()
        ))
        .exists()
}

/// `--proxy-mode ipvs` serves through IPVS where the kernel has it, and where it
/// has none says so and programs nothing. Each branch checks what it names: the
/// host's kernel (no IPVS) takes the second, and `integration/vm/run.sh` runs this
/// test again in the 6.1 guest (IPVS as modules) for the first.
#[test]
fn ipvs_mode_serves_through_ipvs_or_says_this_kernel_has_none_and_programs_nothing() {
    let c = Cluster::new("noipvs", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let out = kube_nft_in(
        c.node(),
        &proxy_command("run", &manifests)
            .into_iter()
            .chain(["--once", "--proxy-mode", "ipvs", "--node-name", "node1"])
            .collect::<Vec<_>>(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    if kernel_has_ipvs() {
        assert!(out.status.success(), "{err}");
        let listing = exec_in(c.node(), &["ipvsadm", "-Ln"]);
        let words: Vec<Vec<&str>> = listing
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert!(
            words
                .iter()
                .any(|w| w[..] == ["TCP", "10.96.0.10:80", "rr"]),
            "no IPVS virtual service for web:\n{listing}"
        );
        assert!(
            words
                .iter()
                .any(|w| w.len() > 2 && w[..3] == ["->", "10.244.0.11:9376", "Masq"]),
            "no real server for pod-a:\n{listing}"
        );
        let t = tally(c.client(), WEB_VIP, 5, false);
        assert_eq!(t.answers.get("pod-a"), Some(&5), "{t:?}");
        return;
    }
    assert!(!out.status.success());
    assert!(err.contains("this kernel has no IPVS"), "{err}");
    assert!(
        !nft_list(c.node()).contains("kube-nft"),
        "programmed anyway"
    );
}

/// kube-proxy's logging flags carry over from a DaemonSet's args: `--v` sets the
/// level, `--logging-format json` writes JSON lines, `--vmodule` and
/// `--log-flush-frequency` are accepted, the alpha split-stream flags are
/// refused by name.
#[test]
fn kube_proxy_logging_flags_are_taken_or_refused_by_name() {
    let c = Cluster::new("logflags", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let mut args = proxy_command("run", &manifests);
    args.extend([
        "--once",
        "--v=4",
        "--vmodule=proxier=5",
        "--logging-format",
        "json",
        "--log-flush-frequency",
        "5s",
    ]);
    let out = kube_nft_in(c.node(), &args);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "DEBUG"),
        "--v=4 logs debug:\n{log}"
    );
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("synced in"))),
        "{log}"
    );
    let mut refused = proxy_command("run", &manifests);
    refused.extend(["--once", "--log-json-split-stream"]);
    let out = kube_nft_in(c.node(), &refused);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--log-json-split-stream: not supported"),
        "{err}"
    );
}

/// Every flag of kube-proxy 1.36's `--help` is known: the ones that mean the
/// same are taken, the ones without meaning here are accepted with a warning,
/// and the ones asking for what kube-nft does not do are refused by name.
#[test]
fn a_kube_proxy_daemonsets_flags_are_taken_ignored_or_refused_by_name() {
    let c = Cluster::new("kpflags", &WEB_PODS, &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let mut args = proxy_command("run", &manifests);
    args.extend([
        "--once",
        "--iptables-masquerade-bit=14",
        "--iptables-min-sync-period=1s",
        "--oom-score-adj=-999",
        "--conntrack-tcp-timeout-established=48h",
        "--conntrack-tcp-timeout-close-wait=2h",
        "--conntrack-tcp-be-liberal",
        "--conntrack-udp-timeout=45s",
        "--conntrack-udp-timeout-stream=150s",
        "--kube-api-qps=5",
        "--feature-gates=AllAlpha=false",
    ]);
    let out = kube_nft_in(c.node(), &args);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    for warned in [
        "--kube-api-qps is kube-proxy's",
        "--feature-gates is kube-proxy's",
    ] {
        assert!(log.contains(warned), "{warned:?} not in:\n{log}");
    }
    assert!(answers(c.client(), "10.96.0.10:80"));
    // The conntrack flags, set in the node's namespace (the kernel's defaults
    // are 432000, 60, 0, 30 and 120).
    for (sysctl, value) in [
        ("nf_conntrack_tcp_timeout_established", "172800"),
        ("nf_conntrack_tcp_timeout_close_wait", "7200"),
        ("nf_conntrack_tcp_be_liberal", "1"),
        ("nf_conntrack_udp_timeout", "45"),
        ("nf_conntrack_udp_timeout_stream", "150"),
    ] {
        assert_eq!(netfilter_sysctl(c.node(), sysctl), value, "{sysctl}");
    }
    let mut refused = proxy_command("run", &manifests);
    refused.extend(["--once", "--log-json-split-stream"]);
    let out = kube_nft_in(c.node(), &refused);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--log-json-split-stream: not supported"),
        "{err}"
    );
}

/// `/proc/sys/net/netfilter/NAME` as the namespace `ns` sees it.
fn netfilter_sysctl(ns: &str, name: &str) -> String {
    let path = format!("/proc/sys/net/netfilter/{name}");
    kube_nft::testbed::netns::in_netns(ns, move || std::fs::read_to_string(path))
        .unwrap()
        .unwrap()
        .trim()
        .to_string()
}

/// kube-proxy's conntrack sysctls by default (issue #30 item 1): the TCP
/// CLOSE_WAIT timeout is 1 h and the established one 24 h, as kube-proxy's e2e
/// test `KubeProxy should set TCP CLOSE_WAIT timeout` expects; written only
/// where they differ. A `nf_conntrack_max` that cannot be written (a network
/// namespace's is the host's, read-only) stops the start, as it stops
/// kube-proxy's, naming the file, before anything is programmed.
#[test]
fn conntrack_sysctls_are_kube_proxy_s_and_one_that_cannot_be_set_stops_the_start() {
    let c = Cluster::new("sysctl", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    assert_eq!(
        netfilter_sysctl(c.node(), "nf_conntrack_tcp_timeout_close_wait"),
        "60",
        "a new namespace starts at the kernel's default"
    );
    let out = sync_once_with(c.node(), &manifests, &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    for (sysctl, value) in [
        ("nf_conntrack_tcp_timeout_close_wait", "3600"),
        ("nf_conntrack_tcp_timeout_established", "86400"),
        ("nf_conntrack_tcp_be_liberal", "0"),
    ] {
        assert_eq!(netfilter_sysctl(c.node(), sysctl), value, "{sysctl}");
    }
    assert!(
        log.contains("set net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600"),
        "{log}"
    );
    // The second start finds them set and writes none.
    let out = sync_once_with(c.node(), &manifests, &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("set net.netfilter"), "{log}");
    kube_nft_in(c.node(), &["cleanup"]);

    // A maximum unlike the host's (one entry per CPU, so --conntrack-min
    // decides), without the namespace's flags.
    let host_max: u64 = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let min = (host_max + 4).to_string();
    let mut args = proxy_command("run", &manifests);
    args.truncate(args.len() - IN_A_NETNS.len());
    args.extend([
        "--once",
        "--conntrack-max-per-core=1",
        "--conntrack-min",
        &min,
    ]);
    let out = kube_nft_in(c.node(), &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "could not set conntrack parameters: setting /proc/sys/net/netfilter/nf_conntrack_max to {min}: Permission denied"
        )),
        "{err}"
    );
    assert!(
        !nft_list(c.node()).contains("kube-nft"),
        "programmed anyway"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
            .unwrap()
            .trim(),
        host_max.to_string(),
        "the host's value is untouched"
    );
}

/// SIGKILL at several moments of a large first sync, then a restart: the
/// restart adopts whatever the killed process left (the kernel commits a
/// transaction whole or not at all) and ends on exactly the desired ruleset: a
/// further restart writes nothing, and the Service answers. The kill times are
/// fractions of a measured sync, and one comes just after the daemon reports
/// its first sync; the test requires having seen both sides of the commit.
#[test]
fn sigkill_during_a_large_sync_then_a_restart_adopts_what_it_left() {
    let c = Cluster::new("kill9", &WEB_PODS, &[9376]);
    // 3,000 keeps a debug build short; KUBE_NFT_KILL9_SERVICES=10000 is the
    // documented run.
    let services: usize = std::env::var("KUBE_NFT_KILL9_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    assert!(services <= 12_000, "the VIPs and endpoints below run out");
    let mut manifests = web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]);
    for i in 0..services {
        let name = format!("s{i}");
        let vip = format!("10.96.{}.{}", 10 + i / 250, i % 250 + 1);
        let eps: Vec<String> = (0..3)
            .map(|k| format!("10.245.{}.{}", i / 80, (i % 80) * 3 + k + 1))
            .collect();
        let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
        manifests += &service(&name, &[&vip], &[tcp(80, 8080)]);
        manifests += &slice(&name, "a", &[tcp(80, 8080)], &eps);
    }
    let path = c.scratch.write("big.yaml", &manifests);
    let start = std::time::Instant::now();
    sync_once(c.node(), &path);
    let whole = start.elapsed();
    let tables = || {
        nft_list(c.node())
            .lines()
            .filter(|l| l.starts_with("table "))
            .count()
    };
    // The first sync is one transaction: a kill leaves none of it or all of it.
    let all = tables();
    assert!(all > 2, "the whole sync wrote {all} tables");
    let mut seen = Vec::new();
    // The last kill comes once the daemon has logged its first sync.
    for fraction in [0.05, 0.3, 0.6, 0.9, f64::INFINITY] {
        exec_in(c.node(), &["nft", "flush", "ruleset"]);
        let d = Daemon::start(c.node(), &path, c.scratch.0.join("kill9.log"), &[]);
        if fraction.is_finite() {
            std::thread::sleep(whole.mul_f64(fraction));
        } else {
            wait_until(Duration::from_secs(60), "the first sync", || {
                d.syncs("Full") >= 1
            });
        }
        drop(d); // SIGKILL
        let left = tables();
        assert!(
            left == 0 || left == all,
            "a kill at {fraction} of a sync left {left} of {all} tables: the kernel held part of a transaction\n{}",
            nft_list(c.node())
        );
        seen.push((fraction, left));
        let adopt = sync_once(c.node(), &path);
        let again = sync_once(c.node(), &path);
        let log = String::from_utf8_lossy(&again.stderr);
        assert!(
            log.contains("messages=0 bytes=0"),
            "after a kill at {fraction} of a sync and a restart, the next restart wrote:\n{log}\n{}",
            String::from_utf8_lossy(&adopt.stderr)
        );
        let t = tally(c.client(), "10.96.0.10:80", 9, false);
        assert!(t.errors.is_empty(), "{t:?}");
    }
    println!(
        "a whole sync of {services} Services took {whole:?}; tables left by each kill: {seen:?}"
    );
    assert!(
        seen.iter().any(|(_, left)| *left == 0) && seen.iter().any(|(_, left)| *left > 0),
        "no kill landed on each side of the commit: {seen:?}"
    );
}

/// `run` executes itself again with one malloc arena (`malloc_arena`), under
/// its own name (`ps` shows kube-nft), and an arena count the operator set is
/// kept as it is.
#[test]
fn the_daemon_runs_with_one_malloc_arena_unless_told_otherwise() {
    let c = Cluster::new("arena", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let tunables_of = |d: &mut Daemon| {
        // Its own sync, not the VIP: the first daemon's rules outlive it.
        wait_until(Duration::from_secs(10), "a full sync", || {
            d.assert_running();
            d.syncs("Full") > 0
        });
        assert!(answers(c.client(), "10.96.0.10:80"));
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", d.pid())).unwrap();
        assert_eq!(comm.trim(), "kube-nft");
        let environ = std::fs::read(format!("/proc/{}/environ", d.pid())).unwrap();
        let found = environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(b"GLIBC_TUNABLES=".as_slice()))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        d.terminate();
        found
    };
    let mut d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("default.log"),
        &["--hostname-override", "node1"],
    );
    assert_eq!(
        tunables_of(&mut d).as_deref(),
        Some("glibc.malloc.arena_max=1")
    );
    let mut args = proxy_command("run", &manifests);
    args.extend(["--hostname-override", "node1"]);
    let mut command = Daemon::command(c.node(), &args);
    command.env("GLIBC_TUNABLES", "glibc.malloc.arena_max=2");
    let mut d = Daemon::spawn_command(command, c.scratch.0.join("set.log"));
    assert_eq!(
        tunables_of(&mut d).as_deref(),
        Some("glibc.malloc.arena_max=2")
    );
}

/// One value in a Service that does not parse (an external IP here, as old
/// objects hold) is skipped alone, as kube-proxy skips it: named in the log
/// and counted, while the Service keeps its ClusterIP and its other external
/// IP, both answering. The same daemon's metrics port serves the process
/// metrics that the kubernetes-mixin dashboards read, of this daemon.
#[test]
fn a_bad_value_is_skipped_alone_and_the_metrics_port_serves_the_process_metrics() {
    let c = Cluster::new("badvalue", &WEB_PODS[..1], &[9376]);
    let text = web(&["10.244.0.11"]).replacen(
        "  ports:\n",
        "  externalIPs: [198.51.100.31, 198.51.100.300, 0198.051.100.032]\n  ports:\n",
        1,
    );
    let manifests = c.scratch.write("web.yaml", &text);
    let d = Daemon::start(c.node(), &manifests, c.scratch.0.join("log"), &[]);
    wait_until(Duration::from_secs(10), "the first sync", || {
        answers(c.client(), WEB_VIP)
    });
    for external in ["198.51.100.31:80", "198.51.100.32:80"] {
        assert!(answers(c.client(), external), "{external} does not answer");
    }
    let log = d.log_text();
    assert_eq!(
        log.matches("skipped: Service default/web: spec.externalIPs[1]: \"198.51.100.300\" is not an IP address")
            .count(),
        1,
        "{log}"
    );
    let (_, metrics) = http_status(c.node(), "127.0.0.1:10249", "/metrics").expect("metrics");
    assert_eq!(
        metric(
            &metrics,
            "kubenft_skipped_values_total{kind=\"Service\",field=\"spec.externalIPs\"}"
        ),
        Some(1.0),
        "{metrics}"
    );

    // The process metrics are the daemon's, read beside its /proc.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    let vm_rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap()
        * 1024.0;
    let rss = metric(&metrics, "process_resident_memory_bytes").expect("RSS");
    assert!(
        (rss - vm_rss).abs() < vm_rss * 0.25,
        "RSS {rss} against /proc's {vm_rss}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = metric(&metrics, "process_start_time_seconds").expect("start time");
    assert!(
        started <= now + 1.0 && started > now - 60.0,
        "started {started}, now {now}"
    );
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count() as f64;
    let open = metric(&metrics, "process_open_fds").expect("open fds");
    assert!((open - fds).abs() <= 4.0, "{open} open, /proc has {fds}");
    assert!(metric(&metrics, "process_max_fds").is_some_and(|m| m >= open));
    assert!(metric(&metrics, "process_cpu_seconds_total").is_some_and(|s| s > 0.0));
    assert!(metric(&metrics, "process_virtual_memory_bytes").is_some_and(|v| v >= rss));
}

/// deploy/daemonset.yaml as docs/OPERATIONS.md's "Sizing" explains it: no CPU
/// limit (it would throttle every full sync), and a memory limit at least 1.25
/// times the largest peak RSS of the table there, so that a healthy kube-nft
/// at the largest size measured is never killed.
#[test]
fn the_daemonset_is_sized_by_the_table_of_operations_md() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let ds: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("deploy/daemonset.yaml")).unwrap(),
    )
    .unwrap();
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let kube_nft = containers
        .iter()
        .find(|c| c["name"] == "kube-nft")
        .expect("the kube-nft container");
    let limits = &kube_nft["resources"]["limits"];
    assert!(limits.get("cpu").is_none(), "a CPU limit: {limits}");
    let mebibytes = |q: &str| -> f64 {
        let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
        let n: f64 = n.parse().unwrap();
        match unit {
            "Mi" => n,
            "Gi" => n * 1024.0,
            other => panic!("unit {other:?} of {q}"),
        }
    };
    let limit = mebibytes(limits["memory"].as_str().expect("a memory limit"));
    let ops = std::fs::read_to_string(root.join("docs/OPERATIONS.md")).unwrap();
    let sizing = ops
        .split("## Sizing")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let peaks: Vec<f64> = sizing
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" MiB |"))
        .map(|l| {
            l.split('|')
                .nth(2)
                .unwrap()
                .trim()
                .trim_end_matches(" MiB")
                .parse()
                .unwrap()
        })
        .collect();
    assert!(peaks.len() >= 3, "the table of peaks: {sizing}");
    let largest = peaks.iter().cloned().fold(0.0, f64::max);
    assert!(
        limit >= 1.25 * largest,
        "a limit of {limit} MiB under 1.25 × the largest peak, {largest} MiB"
    );
}

/// The start's kernel probe (node::kernel_probe) writes its scratch tables,
/// reads them back and deletes them, a leftover of a probe that died
/// included: after the start the node holds kube-nft's tables and no probe's.
#[test]
fn the_kernel_probe_leaves_no_table_behind() {
    let c = Cluster::new("probe", &WEB_PODS[..1], &[9376]);
    nft_in(
        c.node(),
        "add table ip kube-nft-probe-kube-nft; add chain ip kube-nft-probe-kube-nft leftover",
    );
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    let out = sync_once(c.node(), &manifests);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let ruleset = nft_list(c.node());
    assert!(!ruleset.contains("kube-nft-probe"), "{ruleset}");
    assert!(answers(c.client(), WEB_VIP));
}
