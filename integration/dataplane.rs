//! Real packets through ClusterIPs, in namespaces each test creates and removes:
//! a node with a bridge, pods serving their names, and an outside client (see
//! `kube_nft::lab::topology`). kube-nft programs the node namespace through the
//! CLI (`run --once`, or the `run` daemon), as an operator would run it.

mod common;

use common::*;
use std::io::ErrorKind;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PODS: [(&str, &[&str]); 3] = [
    ("pod-a", &["10.244.0.11", "fd00:10:244::11"]),
    ("pod-b", &["10.244.0.12", "fd00:10:244::12"]),
    ("pod-c", &["10.244.0.13", "fd00:10:244::13"]),
];
const V4: [&str; 3] = ["10.244.0.11", "10.244.0.12", "10.244.0.13"];
const V6: [&str; 3] = ["fd00:10:244::11", "fd00:10:244::12", "fd00:10:244::13"];

fn web(endpoints: &[&str]) -> String {
    service("web", &["10.96.0.10"], &[tcp(80, 9376), udp(53, 9376)])
        + &slice("web", "a", &[tcp(80, 9376), udp(53, 9376)], endpoints)
}

fn assert_all_answer(t: &Tally, pods: &[&str], n: usize) {
    assert!(t.errors.is_empty(), "failed requests: {:?}", t.errors);
    assert_eq!(t.answers.values().sum::<usize>(), n);
    for p in pods {
        assert!(
            t.answers.get(*p).copied().unwrap_or(0) > 0,
            "{p} got no request: {:?}",
            t.answers
        );
    }
    assert_eq!(
        t.answers.len(),
        pods.len(),
        "unexpected answers: {:?}",
        t.answers
    );
}

#[test]
fn tcp_and_udp_to_a_cluster_ip_reach_every_endpoint() {
    let c = Cluster::new("tcpudp", &PODS, &[9376]);
    c.apply(&web(&V4));
    // P(some pod gets none of 45) = 3 * (2/3)^45 ≈ 4e-8.
    let t = tally(c.client(), "10.96.0.10:80", 45, false);
    assert_all_answer(&t, &["pod-a", "pod-b", "pod-c"], 45);
    let u = tally(c.client(), "10.96.0.10:53", 45, true);
    assert_all_answer(&u, &["pod-a", "pod-b", "pod-c"], 45);
}

#[test]
fn pods_and_node_processes_reach_the_service_too() {
    let c = Cluster::new("frompod", &PODS, &[9376]);
    c.apply(&web(&V4[..2]));
    // From pod-c (not an endpoint): pod-to-service through the node.
    let t = tally(&c.pod_ns("pod-c"), "10.96.0.10:80", 30, false);
    assert_all_answer(&t, &["pod-a", "pod-b"], 30);
    // From the node itself: the output hook path.
    let t = tally(c.node(), "10.96.0.10:80", 30, false);
    assert_all_answer(&t, &["pod-a", "pod-b"], 30);
}

#[test]
fn removing_an_endpoint_stops_traffic_to_it_while_the_daemon_runs() {
    let c = Cluster::new("remove", &PODS, &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&V4));
    let mut daemon = Command::new("ip")
        .args(["netns", "exec", c.node(), BIN, "run"])
        .args(IN_A_NETNS)
        .arg("--manifests")
        .arg(&manifests)
        .args([
            "--cluster-cidr",
            CLUSTER_CIDRS,
            "--service-cidr",
            SERVICE_CIDRS,
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = |pred: &dyn Fn(&Tally) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let t = tally(c.client(), "10.96.0.10:80", 30, false);
            if pred(&t) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon never applied the change: {t:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for(&|t| t.answers.len() == 3);
    // Remove pod-c from the EndpointSlice; the running daemon notices the file change.
    std::fs::write(&manifests, web(&V4[..2])).unwrap();
    let t = wait_for(&|t| !t.answers.contains_key("pod-c"));
    let _ = daemon.kill();
    let _ = daemon.wait();
    // And once removed it stays removed: another 60 new connections miss it too.
    let more = tally(c.client(), "10.96.0.10:80", 60, false);
    assert!(!more.answers.contains_key("pod-c"), "{more:?}");
    assert!(
        more.errors.is_empty() && t.errors.is_empty(),
        "{:?} {:?}",
        t.errors,
        more.errors
    );
    assert_all_answer(&more, &["pod-a", "pod-b"], 60);
}

#[test]
fn a_service_of_more_than_16_endpoints_reaches_each_through_its_blocks_as_its_count_changes() {
    // 21 endpoints are three blocks (16 + 4 + 1); 20 are two (16 + 4), so the
    // change deletes a block and makes the count's chain anew.
    let names: Vec<String> = (0..21).map(|i| format!("pod-{i}")).collect();
    let addrs: Vec<String> = (0..21).map(|i| format!("10.244.0.{}", 20 + i)).collect();
    let pods: Vec<(&str, Vec<&str>)> = names
        .iter()
        .zip(&addrs)
        .map(|(n, a)| (n.as_str(), vec![a.as_str()]))
        .collect();
    let pods: Vec<(&str, &[&str])> = pods.iter().map(|(n, a)| (*n, a.as_slice())).collect();
    let c = Cluster::new("blocks", &pods, &[9376]);
    let all: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let manifests = c.scratch.write("web.yaml", &web(&all));
    let mut daemon = Daemon::start(c.node(), &manifests, c.scratch.0.join("log"), &[]);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // Counted once the rules are in (in a slow guest the daemon's first sync
    // came after the first connections, which then timed out).
    let rules_for = |n: usize| {
        let line = format!("numgen random mod {n} < 16 goto pick-block-16-0");
        wait_until(Duration::from_secs(20), "the count's rules", || {
            nft_list(c.node()).contains(&line)
        });
    };
    rules_for(21);
    // P(some endpoint gets none of 400) ≤ 21 × (20/21)^400 ≈ 7e-8.
    let t = tally(c.client(), "10.96.0.10:80", 400, false);
    assert_all_answer(&t, &names, 400);
    std::fs::write(&manifests, web(&all[..20])).unwrap();
    rules_for(20);
    let t = tally(c.client(), "10.96.0.10:80", 400, false);
    assert_all_answer(&t, &names[..20], 400);
    let listing = nft_list(c.node());
    assert!(!listing.contains("endpoints-block-1-0"), "{listing}");
    assert!(!listing.contains("chain pick-21 "), "{listing}");
    daemon.assert_running();
    daemon.terminate();
}

/// Four pods, for Services of 4 endpoints.
const FOUR_PODS: [(&str, &[&str]); 4] = [
    ("pod-a", &["10.244.0.11"]),
    ("pod-b", &["10.244.0.12"]),
    ("pod-c", &["10.244.0.13"]),
    ("pod-d", &["10.244.0.14"]),
];

/// `n` Services of the four pods on eight TCP ports (80 to 87): 32 elements
/// each in the endpoint map of 3 to 4 endpoints. Few objects for many
/// elements, for the guests' slow parse. Service i's ClusterIP is
/// 10.96.(100 + i / 250).(i % 250 + 1).
fn many_services(n: usize) -> String {
    let names = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"];
    let ports: Vec<Port> = (0..)
        .zip(names)
        .map(|(k, name)| Port {
            name,
            ..tcp(80 + k, 9376)
        })
        .collect();
    let addrs: Vec<&str> = FOUR_PODS.iter().map(|(_, a)| a[0]).collect();
    (0..n)
        .map(|i| {
            let name = format!("many-{i}");
            let vip = format!("10.96.{}.{}", 100 + i / 250, i % 250 + 1);
            service(&name, &[&vip], &ports) + &slice(&name, "a", &ports, &addrs)
        })
        .collect()
}

/// An endpoint map of 4096 elements or more is made with a size, which the
/// kernel holds it to (`endpoint_map_size`). Packets reach every endpoint
/// through it; grown past its size, it is made again with room, in the full
/// sync the change makes way for, and every Service still answers.
#[test]
fn a_large_endpoint_map_is_made_with_a_size_and_again_with_room_as_it_grows() {
    let c = Cluster::new("sized", &FOUR_PODS, &[9376]);
    // 128 Services: 4,096 elements, in a map of size 8192.
    let manifests = c.scratch.write("many.yaml", &many_services(128));
    let mut daemon = Daemon::start(c.node(), &manifests, c.scratch.0.join("log"), &[]);
    // Slow in the guests' emulated CPUs, whose listings of 8,000 elements
    // take a while: looked at once a second, and what the daemon did told.
    let sized = |daemon: &Daemon, n: u32| {
        let line = format!("\t\tsize {n}\n");
        let deadline = Instant::now() + Duration::from_secs(300);
        while !nft_list(c.node()).contains(&line) {
            let log = daemon.log_text();
            assert!(
                Instant::now() < deadline,
                "no map of size {n} in 300 s:\n{log}"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    let pods = ["pod-a", "pod-b", "pod-c", "pod-d"];
    sized(&daemon, 8192);
    // P(some endpoint gets none of 80) ≤ 4 × (3/4)^80 ≈ 4e-10.
    let t = tally(c.client(), "10.96.100.128:87", 80, false);
    assert_all_answer(&t, &pods, 80);
    // 257 Services: 8,224 elements, past the size.
    std::fs::write(&manifests, many_services(257)).unwrap();
    sized(&daemon, 32768);
    for vip in ["10.96.100.1:80", "10.96.101.7:83"] {
        let t = tally(c.client(), vip, 80, false);
        assert_all_answer(&t, &pods, 80);
    }
    let log = daemon.log_text();
    assert!(log.contains("made again with room"), "{log}");
    daemon.assert_running();
    daemon.terminate();
}

#[test]
fn service_without_endpoints_is_refused_at_once() {
    let c = Cluster::new("noeps", &PODS, &[9376]);
    c.apply(
        &(web(&V4)
            + &service("empty", &["10.96.0.20"], &[tcp(80, 9376)])
            + &slice("empty", "a", &[tcp(80, 9376)], &[])),
    );
    let (err, took) = connect_error(c.client(), "10.96.0.20:80", Duration::from_secs(3));
    assert_eq!(err, Some(ErrorKind::ConnectionRefused), "took {took:?}");
    assert!(took < Duration::from_secs(1), "refusal took {took:?}");
    // From the node itself (output hook) as well.
    let (err, _) = connect_error(c.node(), "10.96.0.20:80", Duration::from_secs(3));
    assert_eq!(err, Some(ErrorKind::ConnectionRefused));
}

#[test]
fn wrong_port_on_a_live_cluster_ip_is_refused_and_unallocated_ips_are_dropped() {
    let c = Cluster::new("wrongport", &PODS, &[9376]);
    c.apply(&web(&V4));
    for from in [c.client(), c.node()] {
        let (err, took) = connect_error(from, "10.96.0.10:81", Duration::from_secs(3));
        assert_eq!(
            err,
            Some(ErrorKind::ConnectionRefused),
            "from {from}, took {took:?}"
        );
        assert!(took < Duration::from_secs(1));
    }
    // 10.96.0.99 is in the service CIDR but allocated to no Service: silently dropped.
    let (err, took) = connect_error(c.client(), "10.96.0.99:80", Duration::from_millis(1500));
    assert_eq!(err, Some(ErrorKind::TimedOut), "took {took:?}");
}

#[test]
fn ipv6_cluster_ip_works() {
    let c = Cluster::new("ipv6", &PODS, &[9376]);
    c.apply(
        &(service("web6", &["fd00:10:96::10"], &[tcp(80, 9376), udp(53, 9376)])
            + &slice("web6", "a", &[tcp(80, 9376), udp(53, 9376)], &V6)),
    );
    let t = tally(c.client(), "[fd00:10:96::10]:80", 45, false);
    assert_all_answer(&t, &["pod-a", "pod-b", "pod-c"], 45);
    let u = tally(c.client(), "[fd00:10:96::10]:53", 45, true);
    assert_all_answer(&u, &["pod-a", "pod-b", "pod-c"], 45);
    let (err, _) = connect_error(c.client(), "[fd00:10:96::10]:81", Duration::from_secs(3));
    assert_eq!(err, Some(ErrorKind::ConnectionRefused));
}

#[test]
fn dual_stack_service_answers_on_both_cluster_ips() {
    let c = Cluster::new("dual", &PODS, &[9376]);
    c.apply(
        &(service("dual", &["10.96.0.30", "fd00:10:96::30"], &[tcp(80, 9376)])
            + &slice("dual", "v4", &[tcp(80, 9376)], &V4[..1])
            + &slice("dual", "v6", &[tcp(80, 9376)], &V6[1..2])),
    );
    assert_all_answer(&tally(c.client(), "10.96.0.30:80", 5, false), &["pod-a"], 5);
    assert_all_answer(
        &tally(c.client(), "[fd00:10:96::30]:80", 5, false),
        &["pod-b"],
        5,
    );
}

#[test]
fn hairpin_connection_is_masqueraded() {
    let c = Cluster::new("hairpin", &PODS, &[9376]);
    // pod-a is the only endpoint: its connection to the Service comes back to itself.
    c.apply(&web(&V4[..1]));
    let t = tally(&c.pod_ns("pod-a"), "10.96.0.10:80", 10, false);
    assert_all_answer(&t, &["pod-a"], 10);
    let u = tally(&c.pod_ns("pod-a"), "10.96.0.10:53", 10, true);
    assert_all_answer(&u, &["pod-a"], 10);
}

#[test]
fn malformed_objects_are_named_and_the_other_services_still_work() {
    let c = Cluster::new("malformed", &PODS, &[9376]);
    let mut m = web(&V4);
    m += &service("bad-port", &["10.96.0.40"], &[tcp(0, 9376)]);
    m += "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan, namespace: default}\naddressType: IPv4\nendpoints: []\n";
    m += &service("bad-ip", &["10.96.0.999"], &[tcp(80, 9376)]);
    m += &service(
        "bad-proto",
        &["10.96.0.41"],
        &[Port {
            name: "x",
            protocol: "ICMP",
            port: 80,
            target: 80,
        }],
    );
    let out = c.apply(&m);
    let log = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "Service default/bad-port: spec.ports[0].port: 0 is not a valid port",
        "EndpointSlice default/orphan: metadata.labels: no kubernetes.io/service-name label",
        "Service default/bad-ip: spec.clusterIPs[0]: \"10.96.0.999\" is not an IP address",
        "Service default/bad-proto: spec.ports[0].protocol: \"ICMP\" is not a supported protocol",
    ] {
        assert!(log.contains(expected), "missing {expected:?} in:\n{log}");
    }
    assert_all_answer(
        &tally(c.client(), "10.96.0.10:80", 30, false),
        &["pod-a", "pod-b", "pod-c"],
        30,
    );
}

#[test]
fn cleanup_removes_our_tables_and_nothing_else() {
    let c = Cluster::new("cleanup", &PODS, &[9376]);
    c.apply(&web(&V4));
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            c.node(),
            "nft",
            "add table inet someone-else",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let out = kube_nft_in(c.node(), &["cleanup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = nft_list(c.node());
    assert!(listed.contains("table inet someone-else"), "{listed}");
    assert!(!listed.contains("kube-nft"), "{listed}");
    // Cleaning up twice is fine.
    assert!(kube_nft_in(c.node(), &["cleanup"]).status.success());
}

#[test]
fn render_prints_what_run_programs() {
    let c = Cluster::new("render", &PODS, &[9376]);
    let path = c.scratch.write("web.yaml", &web(&V4));
    let out = kube_nft_in(
        c.client(),
        &[
            "render",
            "--manifests",
            path.to_str().unwrap(),
            "--cluster-cidr",
            CLUSTER_CIDRS,
            "--service-cidr",
            SERVICE_CIDRS,
        ],
    );
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("0 : 10.244.0.11 . 9376"), "{script}");
    // Loading the rendered text with nft gives a working Service, like `run` does.
    let mut child = Command::new("ip")
        .args(["netns", "exec", c.node(), "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    assert_all_answer(
        &tally(c.client(), "10.96.0.10:80", 30, false),
        &["pod-a", "pod-b", "pod-c"],
        30,
    );
}

/// A flowtable that offloads the node's forwarded flows, written by another
/// tool beside ours, with its other tables (`parity` runs those with three nft
/// versions): our readback and sync are unaffected, and Services still answer
/// through the offload.
#[test]
#[ignore = "needs a kernel with flowtables (the host's has none): integration/vm/run.sh runs it"]
fn a_flowtable_beside_ours_breaks_neither_readback_nor_sync() {
    use common::foreign_tables::{beside_ours, Writer};
    beside_ours("dfx", &[Writer::host()], true);
}

/// One UDP socket's exchanges with a Service: `n` datagrams, each answered
/// (by the pod's name) before the next goes. One flow, as conntrack sees it.
struct UdpFlow {
    ns: String,
    sock: std::net::UdpSocket,
}

impl UdpFlow {
    fn open(ns: &str, target: &str) -> UdpFlow {
        let target: std::net::SocketAddr = target.parse().unwrap();
        let sock = kube_nft::testbed::netns::in_netns(ns, move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(target).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s
        })
        .unwrap();
        UdpFlow {
            ns: ns.to_string(),
            sock,
        }
    }

    /// The names that answered, in order; an unanswered datagram is an error.
    fn exchange(&self, n: usize) -> Result<Vec<String>, String> {
        let mut buf = [0u8; 64];
        (0..n)
            .map(|i| {
                self.sock.send(b"x").map_err(|e| e.to_string())?;
                let got = self
                    .sock
                    .recv(&mut buf)
                    .map_err(|e| format!("datagram {i} of the flow from {}: {e}", self.ns))?;
                Ok(String::from_utf8_lossy(&buf[..got]).into_owned())
            })
            .collect()
    }

    fn port(&self) -> u16 {
        self.sock.local_addr().unwrap().port()
    }
}

/// The conntrack entry of a client port's UDP flow to a VIP, as listed.
fn udp_entry(node: &str, vip: &str, sport: u16) -> String {
    exec_in(node, &["conntrack", "-L", "-p", "udp", "--orig-dst", vip])
        .lines()
        .find(|l| l.contains(&format!("sport={sport} ")))
        .unwrap_or_default()
        .to_string()
}

/// The fast path (`kube-nft.io/traffic-hint: LongLived`), with packets: an
/// annotated Service's flow is offloaded after a few packets each way and goes
/// on answering, another Service's is not; the fast path's table lists as
/// `nft -f` of the same text does; an interface that comes and goes joins and
/// leaves the flowtable; an endpoint removed moves its offloaded flow, as
/// without the fast path; a restart rewrites nothing and the flow goes on; a
/// forward rule added later that drops the pods' traffic stops new flows but
/// not the offloaded one; and the table goes with the last annotated Service,
/// the flow still answering.
#[test]
#[ignore = "needs a kernel with flowtables (the host's has none): integration/vm/run.sh runs it"]
fn long_lived_services_take_the_fast_path() {
    use kube_nft::node::fast_path;
    let c = Cluster::new("fastp", &PODS, &[9376]);
    let manifests = |bulk: &[&str], annotated: bool| {
        let hint = if annotated {
            ", annotations: {kube-nft.io/traffic-hint: LongLived}"
        } else {
            ""
        };
        service("bulk", &["10.96.0.30"], &[udp(53, 9376)]).replace(
            "{name: bulk, namespace: default}",
            &format!("{{name: bulk, namespace: default{hint}}}"),
        ) + &slice("bulk", "a", &[udp(53, 9376)], bulk)
            + &service("plain", &["10.96.0.31"], &[udp(53, 9376)])
            + &slice("plain", "a", &[udp(53, 9376)], &V4)
    };
    let path = c.scratch.write("fast.yaml", &manifests(&V4, true));
    let mut d = Daemon::start(c.node(), &path, c.scratch.0.join("log"), &[]);
    let table = || {
        Command::new("ip")
            .args(["netns", "exec", c.node(), "nft", "list", "table", "ip"])
            .arg(fast_path::TABLE)
            .output()
            .unwrap()
    };
    wait_until(Duration::from_secs(20), "the fast path's table", || {
        d.assert_running();
        table().status.success()
    });
    let links = || -> Vec<String> {
        let mut l: Vec<String> = exec_in(c.node(), &["ip", "-o", "link", "show"])
            .lines()
            .filter(|l| !l.contains("LOOPBACK"))
            .map(|l| {
                l.split(": ")
                    .nth(1)
                    .unwrap()
                    .split('@')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        l.sort();
        l
    };
    let listed = || String::from_utf8(table().stdout).unwrap();
    assert_eq!(
        listed(),
        fast_path::listing(kube_nft::core::net::Family::Ip, &links())
    );

    // `nft -f` of the same text, in a namespace with interfaces of the same names.
    let oracle = kube_nft::testbed::netns::Netns::create(&format!("{}-oracle", c.node())).unwrap();
    for l in links() {
        exec_in(&oracle.name, &["ip", "link", "add", &l, "type", "dummy"]);
    }
    let text = c.scratch.write(
        "fast.nft",
        &fast_path::listing(kube_nft::core::net::Family::Ip, &links()),
    );
    exec_in(&oracle.name, &["nft", "-f", text.to_str().unwrap()]);
    assert_eq!(
        exec_in(
            &oracle.name,
            &["nft", "list", "table", "ip", fast_path::TABLE]
        ),
        listed()
    );

    // Offloaded after more than two packets each way; the other Service's not.
    let bulk = UdpFlow::open(c.client(), "10.96.0.30:53");
    let plain = UdpFlow::open(c.client(), "10.96.0.31:53");
    let first = bulk.exchange(5).unwrap();
    plain.exchange(5).unwrap();
    assert!(
        udp_entry(c.node(), "10.96.0.30", bulk.port()).contains("[OFFLOAD]"),
        "not offloaded: {}",
        udp_entry(c.node(), "10.96.0.30", bulk.port())
    );
    assert!(!udp_entry(c.node(), "10.96.0.31", plain.port()).contains("[OFFLOAD]"));
    let later = bulk.exchange(20).unwrap();
    assert!(
        later.iter().all(|p| *p == first[0]),
        "an offloaded flow left its pod: {first:?} {later:?}"
    );

    // An interface that comes joins the flowtable, and leaves it when it goes.
    exec_in(c.node(), &["ip", "link", "add", "fp-new", "type", "dummy"]);
    wait_until(
        Duration::from_secs(10),
        "the new interface in the flowtable",
        || listed().contains("fp-new"),
    );
    exec_in(c.node(), &["ip", "link", "del", "fp-new"]);
    wait_until(
        Duration::from_secs(10),
        "the interface out of the flowtable",
        || !listed().contains("fp-new"),
    );

    // Its endpoint removed, the flow moves to another pod, as without the
    // fast path: the stale-flow cleanup deletes its conntrack entry, and the
    // flowtable lets go of a flow whose entry is gone.
    let gone = first[0].clone();
    let rest: Vec<&str> = PODS
        .iter()
        .filter(|(n, _)| **n != gone)
        .map(|(_, a)| a[0])
        .collect();
    std::fs::write(&path, manifests(&rest, true)).unwrap();
    let moved = wait_until(Duration::from_secs(15), "the flow to move", || {
        bulk.exchange(1).is_ok_and(|p| p[0] != gone)
    });
    println!("the offloaded flow moved {moved:?} after its endpoint was removed");
    let after = bulk.exchange(5).unwrap();
    assert!(after.iter().all(|p| *p != gone), "{after:?}");

    // A restart writes nothing, and the offloaded flow goes on.
    wait_until(Duration::from_secs(10), "offloaded again", || {
        bulk.exchange(1).is_ok()
            && udp_entry(c.node(), "10.96.0.30", bulk.port()).contains("[OFFLOAD]")
    });
    let pod = bulk.exchange(1).unwrap()[0].clone();
    d.terminate();
    assert_eq!(bulk.exchange(5).unwrap(), vec![pod.clone(); 5]);
    let d2 = Daemon::start(c.node(), &path, c.scratch.0.join("log2"), &[]);
    wait_until(Duration::from_secs(20), "the restart's first sync", || {
        d2.log_text().contains("synced")
    });
    assert_eq!(bulk.exchange(5).unwrap(), vec![pod.clone(); 5]);
    assert!(
        !d2.log_text().contains("created: true"),
        "the restart wrote the fast path again:\n{}",
        d2.log_text()
    );

    // A policy that checks every forwarded packet, added once the flow is
    // offloaded (as a NetworkPolicy isolating the pods would be): new flows
    // meet it, the offloaded one does not (docs/SERVICES.md says so).
    nft_in(
        c.node(),
        "add table inet isolate; add chain inet isolate forward { type filter hook forward priority 0; ip daddr 10.244.0.0/16 drop; }",
    );
    assert_eq!(bulk.exchange(5).unwrap(), vec![pod.clone(); 5]);
    assert!(UdpFlow::open(c.client(), "10.96.0.30:53")
        .exchange(1)
        .is_err());
    nft_in(c.node(), "delete table inet isolate");

    // Without the annotation the table goes; the flow takes the normal path.
    std::fs::write(&path, manifests(&rest, false)).unwrap();
    wait_until(
        Duration::from_secs(15),
        "the fast path's table to go",
        || !table().status.success(),
    );
    assert_eq!(bulk.exchange(5).unwrap(), vec![pod; 5]);
}

/// Whether this kernel takes a flowtable, tried in a namespace of its own.
fn kernel_has_flowtables() -> bool {
    let ns = kube_nft::testbed::netns::Netns::create(&unique("ftprobe")).unwrap();
    Command::new("ip")
        .args(["netns", "exec", &ns.name, "nft"])
        .arg("add table ip t; add flowtable ip t f { hook ingress priority 0; }")
        .output()
        .unwrap()
        .status
        .success()
}

/// `--fast-path` against the kernel, whichever this one is: without
/// flowtables, `all` stops the start with the reason and `long-lived` (the
/// default) serves an annotated Service on the normal path, saying so; with
/// them, both start and label the Service's flows. The guest runs the other
/// branch.
#[test]
fn the_fast_path_asks_the_kernel_for_flowtables() {
    let c = Cluster::new("fpk", &PODS, &[9376]);
    let path = c.scratch.write(
        "web.yaml",
        &web(&V4).replace(
            "{name: web, namespace: default}",
            "{name: web, namespace: default, annotations: {kube-nft.io/traffic-hint: LongLived}}",
        ),
    );
    let mut args = proxy_command("run", &path);
    args.extend(["--once", "--fast-path", "all"]);
    let all = kube_nft_in(c.node(), &args);
    let stderr = String::from_utf8_lossy(&all.stderr).into_owned();
    let has = kernel_has_flowtables();
    if has {
        assert!(all.status.success(), "{stderr}");
    } else {
        assert!(!all.status.success());
        assert!(
            stderr.contains("--fast-path all: this kernel has no flowtables"),
            "{stderr}"
        );
        assert!(
            !nft_list(c.node()).contains("kube-nft"),
            "programmed anyway"
        );
    }
    let out = sync_once(c.node(), &path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(!has, stderr.contains("keep the normal path"), "{stderr}");
    assert_eq!(has, nft_list(c.node()).contains("ct label set 127"));
    assert_eq!(
        has,
        nft_list(c.node()).contains("table ip kube-nft-fast-path")
    );
    assert_all_answer(
        &tally(c.client(), "10.96.0.10:80", 30, false),
        &["pod-a", "pod-b", "pod-c"],
        30,
    );
}

/// A long TCP connection through an annotated Service's ClusterIP: offloaded
/// once established with data under way, and answering on after that.
#[test]
#[ignore = "needs a kernel with flowtables (the host's has none): integration/vm/run.sh runs it"]
fn a_long_tcp_connection_takes_the_fast_path() {
    use std::io::{Read, Write};
    let c = Cluster::new("fptcp", &PODS, &[9376]);
    // An echo server on 7000 in every pod, its socket bound in the pod.
    for (name, _) in PODS {
        let listener = kube_nft::testbed::netns::in_netns(&c.pod_ns(name), || {
            std::net::TcpListener::bind("0.0.0.0:7000").unwrap()
        })
        .unwrap();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 || conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }
    let manifests = service("stream", &["10.96.0.40"], &[tcp(7000, 7000)]).replace(
        "{name: stream, namespace: default}",
        "{name: stream, namespace: default, annotations: {kube-nft.io/traffic-hint: LongLived}}",
    ) + &slice("stream", "a", &[tcp(7000, 7000)], &V4);
    c.apply(&manifests);
    let mut conn = kube_nft::testbed::netns::in_netns(c.client(), || {
        std::net::TcpStream::connect_timeout(
            &"10.96.0.40:7000".parse().unwrap(),
            Duration::from_secs(3),
        )
    })
    .unwrap()
    .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let sport = conn.local_addr().unwrap().port();
    let mut round_trips = |n: usize| {
        for i in 0..n {
            let sent = format!("message {i}");
            conn.write_all(sent.as_bytes()).unwrap();
            let mut buf = vec![0u8; sent.len()];
            conn.read_exact(&mut buf).unwrap();
            assert_eq!(buf, sent.as_bytes());
        }
    };
    round_trips(10);
    let entry = exec_in(
        c.node(),
        &["conntrack", "-L", "-p", "tcp", "--orig-dst", "10.96.0.40"],
    )
    .lines()
    .find(|l| l.contains(&format!("sport={sport} ")))
    .unwrap_or_default()
    .to_string();
    assert!(entry.contains("[OFFLOAD]"), "not offloaded: {entry}");
    round_trips(50);
}
