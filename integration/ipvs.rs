//! The IPVS backend with real packets, in namespaces each test creates: virtual
//! services and real servers checked against `ipvsadm -Ln`, TCP and UDP through
//! the VIP to every backend, schedulers, persistence, incremental updates, and
//! the nftables table beside IPVS (masquerade, rejects, firewall).
//!
//! They need a kernel with IPVS. The development and CI machines have none, so
//! these are ignored on the host, and `integration/vm/run.sh` (which `.ci/run`
//! calls) runs them with `--include-ignored` inside Debian's 6.1 cloud kernel
//! under qemu.

mod common;

use common::services::*;
use common::*;
use kube_nft::core::net::Protocol;
use kube_nft::lab::topology::CLIENT_V4;
use kube_nft::netlink::ipvs::{IpvsSocket, VirtualKey};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

fn ipvs_flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec!["--proxy-mode", "ipvs", "--node-name", NODE];
    flags.extend_from_slice(extra);
    flags
}

/// `ipvsadm -Ln` as a map: each virtual service line ("TCP 10.96.5.30:80 rr")
/// to its real servers ("10.244.1.10:9376 Masq 1"), whitespace normalised.
fn ipvsadm(ns: &str) -> BTreeMap<String, Vec<String>> {
    let listing = exec_in(ns, &["ipvsadm", "-Ln"]);
    let mut table: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in listing.lines().skip(3) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"->") {
            let real = words[1..4].join(" ");
            table.get_mut(current.as_ref().unwrap()).unwrap().push(real);
        } else if !words.is_empty() {
            let service = words.join(" ");
            table.insert(service.clone(), Vec::new());
            current = Some(service);
        }
    }
    for reals in table.values_mut() {
        reals.sort();
    }
    table
}

fn expected(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    entries
        .iter()
        .map(|(s, reals)| {
            let mut r: Vec<String> = reals.iter().map(|r| format!("{r} Masq 1")).collect();
            r.sort();
            (s.to_string(), r)
        })
        .collect()
}

fn kube_ipvs0_addresses(ns: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "ip",
            "-o",
            "addr",
            "show",
            "dev",
            "kube-ipvs0",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn web(endpoints: &[&str]) -> String {
    let lines: Vec<String> = endpoints.iter().map(|a| ep(a, NODE, "")).collect();
    svc(
        "web",
        "  clusterIP: 10.96.5.30\n  ports: [{name: http, port: 80, targetPort: 9376}, {name: dns, protocol: UDP, port: 53, targetPort: 9376}]",
        "",
    ) + &eps("web", &lines)
}

const ALL: [&str; 3] = ["10.244.1.10", "10.244.1.11", "10.244.1.12"];

/// `web` over `ALL`, as `ipvsadm -Ln` lists it.
fn web_over_all() -> BTreeMap<String, Vec<String>> {
    let reals = ["10.244.1.10:9376", "10.244.1.11:9376", "10.244.1.12:9376"];
    expected(&[
        ("TCP 10.96.5.30:80 rr", &reals),
        ("UDP 10.96.5.30:53 rr", &reals),
    ])
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn cluster_ip_over_ipvs_reaches_every_endpoint_over_tcp_and_udp() {
    let c = Cluster::new("ipvs", &PODS, &[9376]);
    c.apply_with(
        &(node_object("zone-a") + &web(&ALL)),
        &ipvs_flags(&["--ipvs-strict-arp"]),
    );
    for (key, value) in [
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/conf/all/arp_ignore", "1"),
        ("net/ipv4/conf/all/arp_announce", "2"),
    ] {
        let path = format!("/proc/sys/{key}");
        assert_eq!(exec_in(c.node(), &["cat", &path]).trim(), value, "{key}");
    }
    assert_eq!(ipvsadm(c.node()), web_over_all());
    assert!(kube_ipvs0_addresses(c.node()).contains("10.96.5.30/32"));
    // IPVS rewrites the destination; the nftables table only knows what it serves.
    let listing = nft_list(c.node());
    assert!(!listing.contains(" dnat "), "{listing}");
    assert!(listing.contains("10.96.5.30 . tcp . 80"), "{listing}");

    let pods = ["pod-a", "pod-b", "pod-c"];
    assert_only(&tally(c.client(), "10.96.5.30:80", 45, false), &pods);
    assert_only(&tally(c.client(), "10.96.5.30:53", 45, true), &pods);
    assert_only(
        &tally(&c.pod_ns("pod-c"), "10.96.5.30:80", 30, false),
        &pods,
    );
    assert_only(&tally(c.node(), "10.96.5.30:80", 30, false), &pods);

    // The one-service read (the IPVS bench's): the kernel's ESRCH is `None`.
    let read = |port| {
        let key = VirtualKey {
            addr: "10.96.5.30".parse().unwrap(),
            protocol: Protocol::Tcp,
            port,
        };
        kube_nft::testbed::netns::in_netns(c.node(), move || {
            IpvsSocket::open().unwrap().unwrap().service(&key).unwrap()
        })
        .unwrap()
    };
    assert_eq!(read(80).map(|s| s.scheduler), Some("rr".to_string()));
    assert_eq!(read(81), None);
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn a_node_switched_from_nftables_to_ipvs_loses_its_service_tables_in_one_sync() {
    let c = Cluster::new("toipvs", &PODS, &[9376]);
    let manifests = node_object("zone-a") + &web(&ALL);
    let pods = ["pod-a", "pod-b", "pod-c"];
    c.apply_with(&manifests, &["--node-name", NODE]);
    let before = nft_list(c.node());
    assert!(before.contains("table ip kube-nft-services-"), "{before}");
    assert!(
        before.contains("dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 3 map @endpoints-3-4"),
        "{before}"
    );
    assert_only(&tally(c.client(), "10.96.5.30:80", 30, false), &pods);

    c.apply_with(&manifests, &ipvs_flags(&[]));
    let after = nft_list(c.node());
    assert!(!after.contains("kube-nft-services-"), "{after}");
    assert!(!after.contains(" dnat "), "{after}");
    assert!(after.contains("table ip kube-nft "), "{after}");
    assert_eq!(ipvsadm(c.node()), web_over_all());
    assert_only(&tally(c.client(), "10.96.5.30:80", 30, false), &pods);
    assert_only(&tally(c.client(), "10.96.5.30:53", 30, true), &pods);
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn changes_go_out_service_by_service_and_a_restart_writes_nothing() {
    let c = Cluster::new("ipvsinc", &PODS, &[9376]);
    let other = svc(
        "other",
        "  clusterIP: 10.96.5.31\n  ports: [{name: http, port: 80, targetPort: 9376}]",
        "",
    ) + &eps("other", &[ep("10.244.1.10", NODE, "")]);
    let manifests = |web_eps: &[&str]| node_object("zone-a") + &web(web_eps) + &other;
    let path = c.scratch.write("m.yaml", &manifests(&ALL));
    let mut daemon = Daemon::start(
        c.node(),
        &path,
        c.scratch.0.join("daemon.log"),
        &ipvs_flags(&["--min-sync-period", "0s", "--sync-period", "2s"]),
    );
    // No connection before pod-c leaves, so that its real server is idle.
    wait_until(Duration::from_secs(20), "web in IPVS", || {
        ipvsadm(c.node())
            .get("TCP 10.96.5.30:80 rr")
            .is_some_and(|r| r.len() == 3)
    });
    let before = ipvsadm(c.node());

    // pod-c leaves web: its two virtual services lose one real server each,
    // the UDP one at once, the TCP one after draining at weight 0 until a
    // full sync (every 2 s here) finds it idle.
    std::fs::write(&path, manifests(&ALL[..2])).unwrap();
    wait_until(Duration::from_secs(10), "pod-c leaves IPVS", || {
        ipvsadm(c.node())["UDP 10.96.5.30:53 rr"].len() == 2
    });
    wait_until(Duration::from_secs(5), "the partial sync is logged", || {
        daemon.syncs("Partial") >= 1
    });
    wait_until(
        Duration::from_secs(10),
        "pod-c's idle TCP real server to go",
        || ipvsadm(c.node())["TCP 10.96.5.30:80 rr"].len() == 2,
    );
    let log = daemon.log_text();
    // The NAT hold needs the owner flag of kernel 5.12: the 5.10 guest runs
    // without it and says so; the 6.1 guest holds it.
    let held = nat_holds(c.node());
    let warned = log.contains("it needs kernel 5.12");
    let expected = if kernel_at_least(5, 12) {
        (2, false)
    } else {
        (0, true)
    };
    assert_eq!((held, warned), expected, "{log}");
    let partial = log.lines().find(|l| l.contains("kind=Partial")).unwrap();
    assert!(
        partial.contains("services=1") && partial.contains("ipvs_commands=2"),
        "{partial}"
    );
    let after = ipvsadm(c.node());
    assert_eq!(
        after["TCP 10.96.5.31:80 rr"],
        before["TCP 10.96.5.31:80 rr"]
    );
    assert_eq!(after["UDP 10.96.5.30:53 rr"].len(), 2);
    assert_only(
        &tally(c.client(), "10.96.5.30:80", 20, false),
        &["pod-a", "pod-b"],
    );

    // A connection open across a restart over the same state keeps working,
    // and the new process writes nothing.
    let mut held = kube_nft::testbed::netns::in_netns(c.client(), || {
        std::net::TcpStream::connect("10.96.5.30:80".parse::<SocketAddr>().unwrap())
    })
    .unwrap()
    .unwrap();
    assert!(daemon.terminate().success());
    let out = c.apply_with(&manifests(&ALL[..2]), &ipvs_flags(&[]));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("messages=0")
            && log.contains("ipvs_commands=0")
            && log.contains("ipvs_addresses=0"),
        "{log}"
    );
    held.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    held.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("pod-"), "{answer}");
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn the_scheduler_comes_from_the_flag_or_the_service_annotation() {
    let c = Cluster::new("ipvssched", &PODS, &[9376]);
    let annotated = |scheduler: &str| {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: hashed, namespace: default, annotations: {{kube-nft.io/ipvs-scheduler: {scheduler}}}}}\nspec:\n  clusterIP: 10.96.5.32\n  ports: [{{name: http, port: 80, targetPort: 9376}}]\n")
            + &eps("hashed", &ALL.map(|a| ep(a, NODE, "")))
    };
    let manifests = |scheduler: &str| node_object("zone-a") + &web(&ALL) + &annotated(scheduler);
    c.apply_with(&manifests("sh"), &ipvs_flags(&["--ipvs-scheduler", "lc"]));
    let table = ipvsadm(c.node());
    assert!(table.contains_key("TCP 10.96.5.30:80 lc"), "{table:?}");
    assert!(table.contains_key("TCP 10.96.5.32:80 sh"), "{table:?}");
    // Source hashing: one client, one backend, connection after connection.
    let t = tally(c.client(), "10.96.5.32:80", 20, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(t.answers.len(), 1, "{:?}", t.answers);
    // Least-connection spreads the same client.
    let t = tally(c.client(), "10.96.5.30:80", 30, false);
    assert!(t.answers.len() > 1, "{:?}", t.answers);

    // A new annotation changes the virtual service in place.
    c.apply_with(&manifests("mh"), &ipvs_flags(&["--ipvs-scheduler", "lc"]));
    let table = ipvsadm(c.node());
    assert!(table.contains_key("TCP 10.96.5.32:80 mh"), "{table:?}");
    assert_eq!(table["TCP 10.96.5.32:80 mh"].len(), 3);
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn session_affinity_is_ipvs_persistence_with_its_timeout() {
    let c = Cluster::new("ipvsaff", &PODS, &[9376]);
    let spec = "  clusterIP: 10.96.5.33\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 30}}\n  ports: [{name: http, port: 80, targetPort: 9376}]";
    let manifests = node_object("zone-a")
        + &svc("sticky", spec, "")
        + &eps("sticky", &ALL.map(|a| ep(a, NODE, "")));
    c.apply_with(&manifests, &ipvs_flags(&[]));
    let table = ipvsadm(c.node());
    assert!(
        table.contains_key("TCP 10.96.5.33:80 rr persistent 30"),
        "{table:?}"
    );
    let t = tally(c.client(), "10.96.5.33:80", 20, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(t.answers.len(), 1, "{:?}", t.answers);
}

/// Graceful termination, as kube-proxy's: a removed endpoint's real server
/// stays at weight 0, its established connections still answering while new
/// ones go elsewhere, and goes once IPVS counts no connection on it.
#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn a_removed_endpoints_connections_live_on_and_its_real_server_goes_once_idle() {
    let c = Cluster::new("ipvsgt", &PODS, &[9376]);
    let manifests = |eps: &[&str]| node_object("zone-a") + &web(eps);
    let path = c.scratch.write("m.yaml", &manifests(&ALL));
    let _daemon = Daemon::start(
        c.node(),
        &path,
        c.scratch.0.join("daemon.log"),
        &ipvs_flags(&["--min-sync-period", "0s", "--sync-period", "3s"]),
    );
    // No other connection first: one that ended would stay counted on its
    // real server for TIME_WAIT's 2 minutes.
    let reals = || {
        ipvsadm(c.node())
            .get("TCP 10.96.5.30:80 rr")
            .cloned()
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(20), "web in IPVS", || {
        reals().len() == 3
    });
    // Six connections, two to each pod (rr), established and idle.
    let held = kube_nft::testbed::netns::in_netns(c.client(), || {
        (0..6)
            .map(|_| std::net::TcpStream::connect("10.96.5.30:80".parse::<SocketAddr>().unwrap()))
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap()
    .unwrap();

    // pod-c leaves: weight 0, and new connections go to the others.
    std::fs::write(&path, manifests(&ALL[..2])).unwrap();
    let draining = "10.244.1.12:9376 Masq 0".to_string();
    wait_until(
        Duration::from_secs(10),
        "pod-c to drain at weight 0",
        || reals().contains(&draining),
    );
    assert_only(
        &tally(c.client(), "10.96.5.30:80", 20, false),
        &["pod-a", "pod-b"],
    );
    // Full syncs (every 3 s) count its connections, and keep it.
    std::thread::sleep(Duration::from_secs(7));
    assert!(reals().contains(&draining), "{:?}", reals());

    // Every held connection answers, pod-c's included; each then ends with a
    // reset, which IPVS keeps 10 s (its CLOSE state) rather than TIME_WAIT's 2 min.
    let mut answered = Vec::new();
    for mut conn in held {
        conn.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answered.push(answer.lines().last().unwrap_or_default().to_string());
        rustix::net::sockopt::set_socket_linger(&conn, Some(Duration::ZERO)).unwrap();
    }
    let from_c = answered.iter().filter(|a| a.contains("pod-c")).count();
    assert_eq!(from_c, 2, "{answered:?}");
    assert!(answered.iter().all(|a| a.contains("pod-")), "{answered:?}");

    let gone = Duration::from_secs(60);
    let started = std::time::Instant::now();
    while reals().contains(&draining) {
        assert!(
            started.elapsed() < gone,
            "pod-c's real server did not go once idle: {:?}\n{}",
            reals(),
            exec_in(c.node(), &["ipvsadm", "-Lnc"])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(reals().len(), 2, "{:?}", reals());
}

/// `ipvsadm -L --timeout`'s three numbers: tcp, tcpfin, udp.
fn ipvs_timeouts(ns: &str) -> String {
    let out = exec_in(ns, &["ipvsadm", "-L", "--timeout"]);
    out.split_once("):")
        .map(|(_, t)| t.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or(out)
}

/// `--ipvs-tcp-timeout` and the others are set as kube-proxy sets them
/// (generic netlink IPVS_CMD_SET_CONFIG), a 0 keeping the kernel's, and a UDP
/// flow through the ClusterIP gets an IPVS connection that ends on the UDP
/// timeout rather than the kernel's 5 minutes.
#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn the_ipvs_timeouts_are_set_as_asked_and_a_udp_flow_ends_on_its_own() {
    let c = Cluster::new("ipvsto", &PODS, &[9376]);
    assert_eq!(ipvs_timeouts(c.node()), "900 120 300", "a new namespace's");
    c.apply_with(
        &(node_object("zone-a") + &web(&ALL)),
        &ipvs_flags(&["--ipvs-tcp-timeout=1h", "--ipvs-udp-timeout=7s"]),
    );
    assert_eq!(ipvs_timeouts(c.node()), "3600 120 7");

    let t = tally(c.client(), "10.96.5.30:53", 3, true);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    // `UDP 00:07 UDP 10.0.0.2:41234 10.96.5.30:53 10.244.1.10:9376`
    let conns = exec_in(c.node(), &["ipvsadm", "-Lnc"]);
    let expires: Vec<u32> = conns
        .lines()
        .filter(|l| l.starts_with("UDP") && l.contains("10.96.5.30:53"))
        .filter_map(|l| {
            let (m, s) = l.split_whitespace().nth(1)?.split_once(':')?;
            Some(m.parse::<u32>().ok()? * 60 + s.parse::<u32>().ok()?)
        })
        .collect();
    assert!(!expires.is_empty(), "{conns}");
    assert!(expires.iter().all(|e| *e <= 7), "{conns}");
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn nftables_masquerades_rejects_and_filters_beside_ipvs() {
    let c = Cluster::new("ipvsnft", &PODS, &[9376]);
    let hairpin = svc(
        "self",
        "  clusterIP: 10.96.5.34\n  ports: [{name: http, port: 80, targetPort: 9376}]",
        "",
    ) + &eps("self", &[ep("10.244.1.10", NODE, "")]);
    let empty = svc(
        "empty",
        "  clusterIP: 10.96.5.35\n  ports: [{name: http, port: 80, targetPort: 9376}]",
        "",
    ) + &eps("empty", &[]);
    let nodeport = svc(
        "np",
        "  type: NodePort\n  clusterIP: 10.96.5.36\n  ports: [{name: http, port: 80, targetPort: 9376, nodePort: 30080}]",
        "",
    ) + &eps("np", &[ep("10.244.1.11", NODE, "")]);
    let manifests = lb_manifests("203.0.113.0/24", "{ip: 198.51.100.8}")
        + &web(&ALL)
        + &hairpin
        + &empty
        + &nodeport;
    c.apply_with(&manifests, &ipvs_flags(&[]));

    // Masquerade: a client outside the cluster is hidden, a pod is not.
    assert_ne!(client_address_seen(c.client(), "10.96.5.30:80"), CLIENT_V4);
    assert_eq!(
        client_address_seen(&c.pod_ns("pod-c"), "10.96.5.30:80"),
        "10.244.1.12"
    );
    // A pod reaching itself through its Service (hairpin) is masqueraded too.
    assert_only(
        &tally(&c.pod_ns("pod-a"), "10.96.5.34:80", 5, false),
        &["pod-a"],
    );
    // NodePort, masqueraded (externalTrafficPolicy: Cluster).
    assert_only(&tally(c.client(), &node_port(30080), 5, false), &["pod-b"]);
    assert_ne!(
        client_address_seen(c.client(), &node_port(30080)),
        CLIENT_V4
    );

    // No endpoints: refused at once.
    assert_refused_at_once(c.client(), "10.96.5.35:80");
    // Another port of a Service address is refused, even where the node listens:
    // the address is local (on kube-ipvs0), but not a way into the node.
    let _listener = kube_nft::testbed::netns::in_netns(c.node(), || {
        std::net::TcpListener::bind("0.0.0.0:8081").unwrap()
    })
    .unwrap();
    assert_refused_at_once(c.client(), "10.96.5.30:8081");
    let (err, _) = connect_error(c.client(), &node_port(8081), Duration::from_secs(2));
    assert_eq!(
        err, None,
        "the node's own listener answers on its own address"
    );

    // loadBalancerSourceRanges: the load balancer IP drops the client, the
    // external IP does not filter.
    assert_dropped(c.client(), "198.51.100.8:80");
    assert_only(&tally(c.client(), "198.51.100.7:80", 5, false), &["pod-a"]);
    let kind = connect_error(c.client(), "198.51.100.8:80", Duration::from_millis(500)).0;
    assert_ne!(kind, Some(ErrorKind::ConnectionRefused));
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn removed_services_and_cleanup_leave_only_other_peoples_virtual_services() {
    let c = Cluster::new("ipvsdel", &PODS, &[9376]);
    c.apply_with(&(node_object("zone-a") + &web(&ALL)), &ipvs_flags(&[]));
    assert!(kube_ipvs0_addresses(c.node()).contains("10.96.5.30/32"));
    // Someone else's virtual service, on an address that is not this node's.
    exec_in(
        c.node(),
        &["ipvsadm", "-A", "-t", "203.0.113.50:80", "-s", "wlc"],
    );
    let theirs = expected(&[("TCP 203.0.113.50:80 wlc", &[])]);

    c.apply_with(&node_object("zone-a"), &ipvs_flags(&[]));
    assert_eq!(ipvsadm(c.node()), theirs);
    assert!(!kube_ipvs0_addresses(c.node()).contains("10.96.5.30"));
    assert!(!answers(c.client(), "10.96.5.30:80"));

    // Cleanup removes kube-ipvs0 and our virtual services, not theirs.
    c.apply_with(&(node_object("zone-a") + &web(&ALL)), &ipvs_flags(&[]));
    let out = kube_nft_in(c.node(), &["cleanup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ipvsadm(c.node()), theirs);
    assert_eq!(kube_ipvs0_addresses(c.node()), "");
    assert!(!nft_list(c.node()).contains("kube-nft"));
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn drift_in_ipvs_and_kube_ipvs0_is_repaired_by_the_periodic_sync() {
    let c = Cluster::new("ipvsdrift", &PODS, &[9376]);
    let path = c
        .scratch
        .write("m.yaml", &(node_object("zone-a") + &web(&ALL)));
    let daemon = Daemon::start(
        c.node(),
        &path,
        c.scratch.0.join("daemon.log"),
        &ipvs_flags(&["--sync-period", "2s"]),
    );
    wait_until(Duration::from_secs(20), "the VIP answers", || {
        answers(c.client(), "10.96.5.30:80")
    });
    let want = ipvsadm(c.node());
    for args in [
        &[
            "ipvsadm",
            "-d",
            "-t",
            "10.96.5.30:80",
            "-r",
            "10.244.1.10:9376",
        ][..],
        &["ipvsadm", "-D", "-u", "10.96.5.30:53"],
        &["ip", "addr", "del", "10.96.5.30/32", "dev", "kube-ipvs0"],
    ] {
        exec_in(c.node(), args);
    }
    assert_ne!(ipvsadm(c.node()), want);
    wait_until(Duration::from_secs(10), "IPVS repaired", || {
        ipvsadm(c.node()) == want && kube_ipvs0_addresses(c.node()).contains("10.96.5.30/32")
    });
    let pods = ["pod-a", "pod-b", "pod-c"];
    assert_only(&tally(c.client(), "10.96.5.30:80", 30, false), &pods);
    assert_only(&tally(c.client(), "10.96.5.30:53", 30, true), &pods);
    drop(daemon);
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn a_dual_stack_service_is_served_by_ipvs_in_both_families() {
    let pods: [(&str, &[&str]); 2] = [
        ("pod-a", &["10.244.1.10", "fd00:10:244:1::10"]),
        ("pod-b", &["10.244.1.11", "fd00:10:244:1::11"]),
    ];
    let c = Cluster::new("ipvs6", &pods, &[9376]);
    let spec = "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: 10.96.5.40\n  clusterIPs: [10.96.5.40, \"fd00:10:96::40\"]\n  ports: [{name: http, port: 80, targetPort: 9376}]";
    let v6 = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: dual-b, namespace: default, labels: {kubernetes.io/service-name: dual}}\naddressType: IPv6\nports: [{name: http, port: 9376}]\nendpoints:\n- {addresses: [\"fd00:10:244:1::10\"], nodeName: node-a}\n- {addresses: [\"fd00:10:244:1::11\"], nodeName: node-a}\n";
    let manifests = node_object("zone-a")
        + &svc("dual", spec, "")
        + &eps(
            "dual",
            &[ep("10.244.1.10", NODE, ""), ep("10.244.1.11", NODE, "")],
        )
        + v6;
    c.apply_with(&manifests, &ipvs_flags(&[]));
    let table = ipvsadm(c.node());
    assert_eq!(table["TCP [fd00:10:96::40]:80 rr"].len(), 2, "{table:?}");
    assert!(kube_ipvs0_addresses(c.node()).contains("fd00:10:96::40/128"));
    assert_only(
        &tally(c.client(), "10.96.5.40:80", 20, false),
        &["pod-a", "pod-b"],
    );
    assert_only(
        &tally(c.client(), "[fd00:10:96::40]:80", 20, false),
        &["pod-a", "pod-b"],
    );
}

/// `kube-nft ARGS` in this namespace, which must succeed: what it printed.
fn kube_nft_succeeds(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn the_lab_runs_on_the_ipvs_backend() {
    require_root();
    let prefix = unique("ipvslab");
    let text = kube_nft_succeeds(&[
        "lab",
        "--backend",
        "ipvs",
        "--requests",
        "12",
        "--prefix",
        &prefix,
    ]);
    assert!(text.contains("lab passed: every pod answered"), "{text}");
    assert!(text.contains("proxy: IPVS: "), "{text}");
    assert!(text.contains("TCP  10.0.1.175:80 rr"), "{text}");
    assert!(!text.contains(" dnat "), "{text}");
}

/// kube-proxy's IPVS mode serving `web`'s HTTP port, as it leaves a node when it
/// stops: the virtual service and its real servers, the VIP on `kube-ipvs0`,
/// and its ipsets with the iptables-nft rules that match on them.
fn kube_proxy_s_ipvs_mode(c: &Cluster) {
    let node = c.node();
    exec_in(node, &["ip", "link", "add", "kube-ipvs0", "type", "dummy"]);
    exec_in(
        node,
        &["ip", "addr", "add", "10.96.5.30/32", "dev", "kube-ipvs0"],
    );
    exec_in(
        node,
        &["sh", "-c", "echo 1 >/proc/sys/net/ipv4/vs/conntrack"],
    );
    exec_in(node, &["ipvsadm", "-A", "-t", "10.96.5.30:80", "-s", "rr"]);
    for pod in ALL {
        let real = format!("{pod}:9376");
        exec_in(
            node,
            &[
                "ipvsadm",
                "-a",
                "-t",
                "10.96.5.30:80",
                "-r",
                &real,
                "-m",
                "-w",
                "1",
            ],
        );
    }
    kube_proxy_ipvs::write(node, &c.scratch, "10.96.5.30", 80, ALL[0], 9376);
    assert_only(
        &tally(c.client(), "10.96.5.30:80", 15, false),
        &["pod-a", "pod-b", "pod-c"],
    );
}

/// kube-proxy's IPVS mode left as it stops, kube-nft started beside it with
/// `flags` until `serving`, then `kube-nft cleanup --kube-proxy` while a client
/// keeps connecting through web's ClusterIP: the cleanup's log, once every
/// connection answered and nothing of kube-proxy's iptables rules and ipsets
/// remains.
fn moved_from_kube_proxy_s_ipvs_mode(
    name: &str,
    flags: &[&str],
    serving: impl Fn(&Cluster) -> bool,
) -> (Cluster, Daemon, String) {
    let c = Cluster::new(name, &PODS, &[9376]);
    kube_proxy_s_ipvs_mode(&c);
    let path = c
        .scratch
        .write("m.yaml", &(node_object("zone-a") + &web(&ALL)));
    let daemon = Daemon::start(c.node(), &path, c.scratch.0.join("daemon.log"), flags);
    wait_until(Duration::from_secs(20), "kube-nft to serve web", || {
        serving(&c)
    });
    let log = cleanup_kube_proxy_while_connecting(c.node(), c.client(), "10.96.5.30:80");
    for line in [
        "removed 8 ipsets: KUBE-LOOP-BACK, KUBE-CLUSTER-IP, KUBE-EXTERNAL-IP, KUBE-LOAD-BALANCER, KUBE-NODE-PORT-TCP, KUBE-HEALTH-CHECK-NODE-PORT, KUBE-IPVS-IPS, KUBE-6-CLUSTER-IP",
        &format!(
            "removed kube-proxy's {} iptables chains (ip nat, ip filter), {} rules jumping to them",
            kube_proxy_ipvs::CHAINS,
            kube_proxy_ipvs::JUMPS
        ),
    ] {
        assert!(log.contains(line), "{line:?} not in:\n{log}");
    }
    assert_eq!(kube_proxy_ipvs::ipset_names(c.node()), Vec::<String>::new());
    let rules = exec_in(c.node(), &["iptables-nft-save"]);
    assert!(!rules.contains("KUBE-"), "{rules}");
    assert_only(
        &tally(c.client(), "10.96.5.30:80", 15, false),
        &["pod-a", "pod-b", "pod-c"],
    );
    (c, daemon, log)
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn from_kube_proxy_s_ipvs_mode_to_kube_nft_s_its_leftovers_go_and_the_cluster_ip_answers_throughout(
) {
    let (c, _daemon, log) = moved_from_kube_proxy_s_ipvs_mode("ipvskp", &ipvs_flags(&[]), |c| {
        ipvsadm(c.node()) == web_over_all()
    });
    // The virtual services and kube-ipvs0 are kube-nft's now.
    assert!(
        log.contains(
            "kube-nft serves this node with IPVS: its virtual services and kube-ipvs0 stay"
        ),
        "{log}"
    );
    assert_eq!(ipvsadm(c.node()), web_over_all());
    assert!(kube_ipvs0_addresses(c.node()).contains("10.96.5.30/32"));
}

#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn from_kube_proxy_s_ipvs_mode_to_kube_nft_s_nftables_mode_ipvs_goes_too_and_the_cluster_ip_answers_throughout(
) {
    let (c, _daemon, log) =
        moved_from_kube_proxy_s_ipvs_mode("ipvskpnft", &["--node-name", NODE], |c| {
            nft_list(c.node()).contains("10.96.5.30")
        });
    assert!(log.contains("removed 1 IPVS virtual services"), "{log}");
    assert_eq!(ipvsadm(c.node()), BTreeMap::new());
    assert_eq!(kube_ipvs0_addresses(c.node()), "");
}

/// `kube-nft bench-ipvs` (benches/ipvs_scale.sh) at a small size: it runs, its
/// cold sync left every real server (it checks), and the restart wrote nothing.
#[test]
#[ignore = "needs a kernel with IPVS: integration/vm/run.sh runs it"]
fn the_ipvs_bench_runs_and_its_restart_writes_nothing() {
    require_root();
    let prefix = unique("ipvsbench");
    let text = kube_nft_succeeds(&[
        "bench-ipvs",
        "--sizes",
        "50",
        "--runs",
        "1",
        "--prefix",
        &prefix,
    ]);
    let row = text
        .lines()
        .find(|l| l.starts_with("| 50 × 10 |"))
        .unwrap_or_else(|| panic!("no row for 50 × 10 in:\n{text}"));
    assert!(row.contains(" (0 B) |"), "{row}");
}
