//! Every kind of Service traffic kube-proxy handles, proven with real packets in
//! namespaces: NodePorts, external and load balancer IPs with source ranges, both
//! traffic policies with the health-check server, topology hints, terminating
//! endpoints, the Services a proxy leaves alone, and UDP flows moving off an
//! endpoint that left. Clients: outside the node, on the node, and in a pod.

mod common;

use common::sctp::{self, Capture};
use common::services::*;
use common::*;
use kube_nft::lab::topology::{CLIENT_V4, CLIENT_V6, GATEWAY_V4, UPLINK_V4, UPLINK_V6};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

const NODEPORT_SPEC: &str = "  type: NodePort\n  clusterIP: 10.96.5.1\n  ports: [{name: http, port: 80, targetPort: 9376, nodePort: 30080}, {name: dns, protocol: UDP, port: 53, targetPort: 9376, nodePort: 30053}]";

fn nodeport_manifests() -> String {
    node_object("zone-a")
        + &svc("np", NODEPORT_SPEC, "")
        + &eps(
            "np",
            &[
                ep("10.244.1.10", NODE, ""),
                ep("10.244.1.11", NODE, ""),
            ],
        )
        + &svc(
            "np-empty",
            "  type: NodePort\n  clusterIP: 10.96.5.2\n  ports: [{name: http, port: 80, nodePort: 30090}]",
            "",
        )
}

#[test]
fn node_ports_answer_outside_node_and_pod_clients_over_tcp_and_udp() {
    let c = Cluster::new("np", &PODS, &[9376]);
    c.apply_with(&nodeport_manifests(), &node_flag());
    // P(one of two pods gets none of 30) = 2 * 2^-30.
    assert_only(
        &tally(c.client(), &node_port(30080), 30, false),
        &["pod-a", "pod-b"],
    );
    assert_only(
        &tally(c.client(), &node_port(30053), 30, true),
        &["pod-a", "pod-b"],
    );
    let on_node = tally(c.node(), &node_port(30080), 10, false);
    assert!(on_node.errors.is_empty(), "{:?}", on_node.errors);
    let from_pod = tally(&c.pod_ns("pod-c"), &node_port(30080), 10, false);
    assert!(from_pod.errors.is_empty(), "{:?}", from_pod.errors);
    // externalTrafficPolicy: Cluster masquerades: the pod sees the node, not the client.
    let seen = client_address_seen(c.client(), &node_port(30080));
    assert_ne!(seen, CLIENT_V4);
    // No endpoints: refused at once, from outside and from the node.
    assert_refused_at_once(c.client(), &node_port(30090));
    assert_refused_at_once(c.node(), &node_port(30090));
}

#[test]
fn nodeport_addresses_select_the_node_addresses_and_never_loopback() {
    let c = Cluster::new("npaddr", &PODS, &[9376]);
    let m = nodeport_manifests();
    c.apply_with(
        &m,
        &[
            "--node-name",
            NODE,
            "--nodeport-addresses",
            "169.254.1.0/24",
        ],
    );
    let t = tally(c.client(), &format!("{GATEWAY_V4}:30080"), 5, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    // Not a NodePort address now: nothing listens there, the node refuses.
    assert_refused_at_once(c.client(), &node_port(30080));

    c.apply_with(
        &m,
        &["--node-name", NODE, "--nodeport-addresses", "0.0.0.0/0"],
    );
    assert!(answers(c.client(), &node_port(30080)));
    assert!(answers(c.client(), &format!("{GATEWAY_V4}:30080")));
    let (err, _) = connect_error(c.node(), "127.0.0.1:30080", Duration::from_secs(2));
    assert_eq!(
        err,
        Some(ErrorKind::ConnectionRefused),
        "loopback must not serve NodePorts"
    );
    let listing = nft_list(c.node());
    assert!(!listing.contains("127.0.0.1"), "{listing}");
}

#[test]
fn load_balancer_source_ranges_filter_the_load_balancer_ip_only() {
    let c = Cluster::new("lbfw", &PODS, &[9376]);
    let ingress = "{ip: 198.51.100.8}, {ip: 198.51.100.9, ipMode: Proxy}";
    c.apply_with(&lb_manifests("203.0.113.0/24", ingress), &node_flag());
    // The client (192.0.2.2) is outside the ranges: the load balancer IP drops it...
    assert_dropped(c.client(), "198.51.100.8:80");
    // ...but the external IP and the NodePort are not filtered.
    assert_only(&tally(c.client(), "198.51.100.7:80", 5, false), &["pod-a"]);
    assert_only(&tally(c.client(), &node_port(30081), 5, false), &["pod-a"]);
    // An ingress IP the load balancer proxies itself is not captured.
    assert!(!nft_list(c.node()).contains("198.51.100.9"));

    c.apply_with(&lb_manifests("192.0.2.2/32", ingress), &node_flag());
    assert_only(&tally(c.client(), "198.51.100.8:80", 5, false), &["pod-a"]);
}

/// A LoadBalancer Service with `externalTrafficPolicy: Local` (and, if asked,
/// `internalTrafficPolicy: Local`): ClusterIP 10.96.5.4, external IP
/// 198.51.100.30, load balancer IP 198.51.100.20, NodePort 30082, health
/// check 32100; pod-a on `a_node`, pod-b on node-b.
fn etp_local_manifests(a_node: &str, internal_local: bool) -> String {
    let itp = if internal_local {
        "  internalTrafficPolicy: Local\n"
    } else {
        ""
    };
    node_object("zone-a")
        + &svc(
            "web",
            &format!("  type: LoadBalancer\n  clusterIP: 10.96.5.4\n  externalIPs: [198.51.100.30]\n  externalTrafficPolicy: Local\n{itp}  healthCheckNodePort: 32100\n  ports: [{{name: http, port: 80, targetPort: 9376, nodePort: 30082}}]"),
            "loadBalancer: {ingress: [{ip: 198.51.100.20}]}",
        )
        + &eps(
            "web",
            &[
                ep("10.244.1.10", a_node, ""),
                ep("10.244.1.11", "node-b", ""),
            ],
        )
}

/// One health-check request: status code and JSON body.
fn health(ns: &str, target: &str) -> (u16, serde_json::Value) {
    let target: SocketAddr = target.parse().unwrap();
    kube_nft::testbed::netns::in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(s, "GET /healthz HTTP/1.0\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        let code = head.split(' ').nth(1).unwrap().parse().unwrap();
        (code, serde_json::from_str(body).unwrap())
    })
    .unwrap()
}

#[test]
fn external_traffic_policy_local_keeps_the_client_address_and_local_endpoints() {
    let c = Cluster::new("etp", &PODS, &[9376]);
    let path = c.scratch.write("m.yaml", &etp_local_manifests(NODE, false));
    let log = c.scratch.write("daemon.log", "");
    let _d = Daemon::start(c.node(), &path, log, &node_flag());
    wait_until(
        Duration::from_secs(10),
        "the health check answers 200",
        || answers_status(c.client(), 200),
    );
    let (_, body) = health(c.client(), &node_port(32100));
    assert_eq!(body["localEndpoints"], 1);
    assert_eq!(body["service"]["name"], "web");

    // Outside clients reach only this node's endpoint, with their address kept.
    assert_only(&tally(c.client(), &node_port(30082), 20, false), &["pod-a"]);
    assert_only(
        &tally(c.client(), "198.51.100.20:80", 20, false),
        &["pod-a"],
    );
    let seen = client_address_seen(c.client(), &node_port(30082));
    assert_eq!(seen, CLIENT_V4);
    // Pods reach every endpoint.
    assert_only(
        &tally(&c.pod_ns("pod-c"), "198.51.100.20:80", 30, false),
        &["pod-a", "pod-b"],
    );
    let on_node = tally(c.node(), "198.51.100.20:80", 5, false);
    assert!(on_node.errors.is_empty(), "{:?}", on_node.errors);

    // No endpoint on this node: outside traffic is dropped, the health check
    // fails, and pods still reach the Service through this node.
    std::fs::write(&path, etp_local_manifests("node-b", false)).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the health check answers 503",
        || answers_status(c.client(), 503),
    );
    let (_, body) = health(c.client(), &node_port(32100));
    assert_eq!(body["localEndpoints"], 0);
    assert_dropped(c.client(), &node_port(30082));
    assert_dropped(c.client(), "198.51.100.20:80");
    let from_pod = tally(&c.pod_ns("pod-c"), &node_port(30082), 10, false);
    assert!(from_pod.errors.is_empty(), "{:?}", from_pod.errors);
    // The node's own processes too (checked after DNAT, so not dropped).
    let on_node = tally(c.node(), "198.51.100.20:80", 5, false);
    assert!(on_node.errors.is_empty(), "{:?}", on_node.errors);
}

/// Issue #30 item 8 (kubernetes#131765): an `externalTrafficPolicy: Local`
/// Service's external IP and load balancer IP, from a pod on this node, from
/// the node itself and from outside, with and without an endpoint here, and
/// with `internalTrafficPolicy: Local` too. Outside clients reach this node's
/// endpoints only, with their address kept, and are dropped when there is none.
/// A pod and the node reach every endpoint, whatever either policy says: their
/// traffic is handled as if it had gone out to the load balancer and come back
/// to a node with an endpoint (kube-proxy's short-circuit, fixed for nftables
/// mode by kubernetes#132456). The pod keeps its address; the node's traffic is
/// masqueraded, as the address it would pick may be the Service's own.
#[test]
fn external_traffic_policy_local_external_addresses_serve_pods_and_the_node_from_any_node() {
    let c = Cluster::new("etpx", &PODS, &[9376]);
    let pod_c = c.pod_ns("pod-c");
    let external = ["198.51.100.30:80", "198.51.100.20:80"];

    // No endpoint on this node: the case kubernetes#131765 reports.
    c.apply_with(&etp_local_manifests("node-b", false), &node_flag());
    for dst in external {
        assert_dropped(c.client(), dst);
        assert_only(&tally(&pod_c, dst, 30, false), &["pod-a", "pod-b"]);
        assert_eq!(client_address_seen(&pod_c, dst), "10.244.1.12", "{dst}");
        assert_only(&tally(c.node(), dst, 30, false), &["pod-a", "pod-b"]);
        assert_eq!(client_address_seen(c.node(), dst), GATEWAY_V4, "{dst}");
    }

    // One here: outside clients reach it alone, with their address kept.
    c.apply_with(&etp_local_manifests(NODE, false), &node_flag());
    for dst in external {
        assert_only(&tally(c.client(), dst, 20, false), &["pod-a"]);
        assert_eq!(client_address_seen(c.client(), dst), CLIENT_V4, "{dst}");
        assert_only(&tally(&pod_c, dst, 30, false), &["pod-a", "pod-b"]);
        assert_only(&tally(c.node(), dst, 30, false), &["pod-a", "pod-b"]);
    }

    // internalTrafficPolicy: Local binds the ClusterIP, not the external
    // addresses.
    c.apply_with(&etp_local_manifests(NODE, true), &node_flag());
    assert_only(&tally(&pod_c, "10.96.5.4:80", 20, false), &["pod-a"]);
    for dst in external {
        assert_only(&tally(c.client(), dst, 20, false), &["pod-a"]);
        assert_only(&tally(&pod_c, dst, 30, false), &["pod-a", "pod-b"]);
    }
    c.apply_with(&etp_local_manifests("node-b", true), &node_flag());
    assert_dropped(&pod_c, "10.96.5.4:80");
    for dst in external {
        assert_dropped(c.client(), dst);
        assert_only(&tally(&pod_c, dst, 30, false), &["pod-a", "pod-b"]);
        assert_only(&tally(c.node(), dst, 30, false), &["pod-a", "pod-b"]);
    }
}

fn answers_status(ns: &str, code: u16) -> bool {
    let target: SocketAddr = node_port(32100).parse().unwrap();
    let r = kube_nft::testbed::netns::in_netns(ns, move || {
        TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_ok()
    })
    .unwrap();
    r && health(ns, &node_port(32100)).0 == code
}

fn itp_local_manifests(a_node: &str) -> String {
    node_object("zone-a")
        + &svc(
            "web",
            "  clusterIP: 10.96.5.5\n  internalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 9376}]",
            "",
        )
        + &eps(
            "web",
            &[
                ep("10.244.1.10", a_node, ""),
                ep("10.244.1.11", "node-b", ""),
            ],
        )
}

#[test]
fn internal_traffic_policy_local_uses_local_endpoints_or_drops() {
    let c = Cluster::new("itp", &PODS, &[9376]);
    c.apply_with(&itp_local_manifests(NODE), &node_flag());
    assert_only(
        &tally(&c.pod_ns("pod-c"), "10.96.5.5:80", 20, false),
        &["pod-a"],
    );
    c.apply_with(&itp_local_manifests("node-b"), &node_flag());
    assert_dropped(&c.pod_ns("pod-c"), "10.96.5.5:80");
}

fn hinted(zone_a: &str, zone_b: &str) -> String {
    node_object("zone-a")
        + &svc(
            "web",
            "  clusterIP: 10.96.5.6\n  trafficDistribution: PreferClose\n  ports: [{name: http, port: 80, targetPort: 9376}]",
            "",
        )
        + &eps(
            "web",
            &[
                ep("10.244.1.10", "node-x", zone_a),
                ep("10.244.1.11", "node-y", zone_b),
            ],
        )
}

#[test]
fn topology_hints_are_honoured_only_when_every_endpoint_has_them() {
    let c = Cluster::new("topo", &PODS, &[9376]);
    let zone = |z: &str| format!(", hints: {{forZones: [{{name: {z}}}]}}");
    let nodes = |n: &str| format!(", hints: {{forNodes: [{{name: {n}}}]}}");
    c.apply_with(&hinted(&zone("zone-a"), &zone("zone-b")), &node_flag());
    assert_only(&tally(c.client(), "10.96.5.6:80", 20, false), &["pod-a"]);
    // One endpoint without hints: hints are ignored.
    c.apply_with(&hinted(&zone("zone-a"), ""), &node_flag());
    assert_only(
        &tally(c.client(), "10.96.5.6:80", 30, false),
        &["pod-a", "pod-b"],
    );
    // Same-node hints (PreferSameNode) win over zones.
    c.apply_with(&hinted(&nodes("node-b"), &nodes(NODE)), &node_flag());
    assert_only(&tally(c.client(), "10.96.5.6:80", 20, false), &["pod-b"]);
}

#[test]
fn terminating_endpoints_serve_only_when_none_is_ready() {
    let c = Cluster::new("term", &PODS, &[9376]);
    let spec = "  clusterIP: 10.96.5.7\n  ports: [{name: http, port: 80, targetPort: 9376}]";
    let terminating = ", conditions: {ready: false, serving: true, terminating: true}";
    let gone = ", conditions: {ready: false, serving: false, terminating: true}";
    c.apply(
        &(svc("web", spec, "")
            + &eps(
                "web",
                &[
                    ep("10.244.1.10", NODE, ""),
                    ep("10.244.1.11", NODE, terminating),
                ],
            )),
    );
    assert_only(&tally(c.client(), "10.96.5.7:80", 20, false), &["pod-a"]);
    c.apply(
        &(svc("web", spec, "")
            + &eps(
                "web",
                &[
                    ep("10.244.1.10", NODE, gone),
                    ep("10.244.1.11", NODE, terminating),
                ],
            )),
    );
    assert_only(&tally(c.client(), "10.96.5.7:80", 20, false), &["pod-b"]);
}

#[test]
fn services_a_proxy_must_leave_alone_get_no_rules() {
    let c = Cluster::new("skip", &PODS, &[9376]);
    let m = svc(
        "other",
        "  clusterIP: 10.96.5.9\n  ports: [{name: http, port: 80, targetPort: 9376}]",
        "",
    )
    .replace(
        "namespace: default}",
        "namespace: default, labels: {service.kubernetes.io/service-proxy-name: other-proxy}}",
    ) + &eps("other", &[ep("10.244.1.10", NODE, "")])
        + &svc(
            "headless",
            "  clusterIP: None\n  ports: [{name: http, port: 80}]",
            "",
        )
        + &eps("headless", &[ep("10.244.1.11", NODE, "")])
        + &svc(
            "ext",
            "  type: ExternalName\n  externalName: example.org",
            "",
        )
        + &svc(
            "mine",
            "  clusterIP: 10.96.5.10\n  ports: [{name: http, port: 80, targetPort: 9376}]",
            "",
        )
        + &eps("mine", &[ep("10.244.1.12", NODE, "")]);
    c.apply(&m);
    assert_only(&tally(c.client(), "10.96.5.10:80", 5, false), &["pod-c"]);
    // Not ours: not DNATed; inside the service CIDR and unallocated here, so dropped.
    assert_dropped(c.client(), "10.96.5.9:80");
    let listing = nft_list(c.node());
    for absent in [
        "10.96.5.9",
        "10.244.1.10",
        "10.244.1.11",
        "default/headless",
        "default/ext",
    ] {
        assert!(!listing.contains(absent), "{absent} in:\n{listing}");
    }
}

/// One UDP flow (one source port) from `client` to `vip` that asks every 50 ms
/// for `lasting`, and sends each answer's pod, with when it came, until the
/// receiver is dropped.
fn one_udp_flow(
    client: &str,
    vip: &'static str,
    lasting: Duration,
) -> (
    std::thread::JoinHandle<()>,
    std::sync::mpsc::Receiver<(Instant, String)>,
) {
    let client = client.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let asker = std::thread::spawn(move || {
        kube_nft::testbed::netns::in_netns(&client, move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.connect(vip).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 64];
            let started = Instant::now();
            while started.elapsed() < lasting {
                let _ = sock.send(b"?");
                if let Ok(n) = sock.recv(&mut buf) {
                    let name = String::from_utf8_lossy(&buf[..n]).trim().to_string();
                    if tx.send((Instant::now(), name)).is_err() {
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .unwrap();
    });
    (asker, rx)
}

#[test]
fn a_udp_flow_reaches_the_new_endpoint_within_a_second_of_the_change() {
    let c = Cluster::new("udpct", &PODS, &[9376]);
    let spec = "  clusterIP: 10.96.5.11\n  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 9376}]";
    let manifests = |a: &str| svc("dns", spec, "") + &eps("dns", &[ep(a, NODE, "")]);
    let path = c.scratch.write("m.yaml", &manifests("10.244.1.10"));
    let log = c.scratch.write("daemon.log", "");
    let d = Daemon::start(c.node(), &path, log, &["--min-sync-period", "0s"]);
    wait_until(Duration::from_secs(10), "first sync", || {
        d.syncs("Full") > 0
    });

    // One flow (one source port) that keeps asking, as a DNS client would.
    let (asker, rx) = one_udp_flow(c.client(), "10.96.5.11:53", Duration::from_secs(8));
    let first = rx.recv_timeout(Duration::from_secs(3)).unwrap();
    assert_eq!(first.1, "pod-a");
    std::thread::sleep(Duration::from_millis(500));
    let changed = Instant::now();
    std::fs::write(&path, manifests("10.244.1.11")).unwrap();
    // pod-a still runs and would keep answering a stale conntrack entry.
    let moved = loop {
        let (at, name) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the flow stopped getting answers");
        if name == "pod-b" {
            break at;
        }
    };
    drop(rx);
    asker.join().unwrap();
    let took = moved - changed;
    assert!(took < Duration::from_secs(1), "moved after {took:?}");
    assert!(
        d.log_text().contains("stale UDP conntrack entries"),
        "{}",
        d.log_text()
    );
}

/// kube-proxy's rule for stale UDP flows: a flow lives as long as its endpoint
/// serves, whatever chooses endpoints for new flows. pod-a starts terminating
/// (still serving) as pod-b comes: the flow it has stays with it while it
/// drains, and a new flow goes to pod-b.
#[test]
fn a_udp_flow_stays_with_an_endpoint_that_terminates_while_it_still_serves() {
    let c = Cluster::new("udpterm", &PODS, &[9376]);
    let spec = "  clusterIP: 10.96.5.13\n  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 9376}]";
    let terminating = ", conditions: {ready: false, serving: true, terminating: true}";
    let path = c.scratch.write(
        "m.yaml",
        &(svc("dns", spec, "") + &eps("dns", &[ep("10.244.1.10", NODE, "")])),
    );
    let log = c.scratch.write("daemon.log", "");
    let d = Daemon::start(c.node(), &path, log, &["--min-sync-period", "0s"]);
    wait_until(Duration::from_secs(10), "first sync", || {
        d.syncs("Full") > 0
    });
    // One flow (one source port) that keeps asking; every answer's pod, in order.
    let (asker, rx) = one_udp_flow(c.client(), "10.96.5.13:53", Duration::from_secs(6));
    std::thread::sleep(Duration::from_secs(1));
    let syncs = d.syncs("");
    std::fs::write(
        &path,
        svc("dns", spec, "")
            + &eps(
                "dns",
                &[
                    ep("10.244.1.10", NODE, terminating),
                    ep("10.244.1.11", NODE, ""),
                ],
            ),
    )
    .unwrap();
    wait_until(Duration::from_secs(5), "the change to be synced", || {
        d.syncs("") > syncs
    });
    // A new flow goes to the ready endpoint.
    let t = tally(c.client(), "10.96.5.13:53", 5, true);
    assert_only(&t, &["pod-b"]);
    asker.join().unwrap();
    let names: Vec<String> = rx.iter().map(|(_, name)| name).collect();
    assert!(names.len() > 50, "{} answers", names.len());
    assert!(
        names.iter().all(|n| n == "pod-a"),
        "the flow left its terminating endpoint: {names:?}\n{}",
        d.log_text()
    );
}

fn sticky(timeout: u32, endpoints: &[&str]) -> String {
    let spec = format!("  clusterIP: 10.96.5.12\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}\n  ports: [{{name: http, port: 80, targetPort: 9376}}]");
    let eps_lines: Vec<String> = endpoints.iter().map(|a| ep(a, NODE, "")).collect();
    svc("sticky", &spec, "") + &eps("sticky", &eps_lines)
}

#[test]
fn session_affinity_keeps_a_client_on_one_live_endpoint_until_the_timeout() {
    let c = Cluster::new("aff", &PODS, &[9376]);
    let all = ["10.244.1.10", "10.244.1.11", "10.244.1.12"];
    c.apply(&sticky(30, &all));
    // 30 new connections, one endpoint: by chance that would be 3 * 3^-30.
    let t = tally(c.client(), "10.96.5.12:80", 30, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(t.answers.len(), 1, "{:?}", t.answers);
    let chosen = t.answers.keys().next().unwrap().clone();

    // Its endpoint leaves (the pod still runs): never chosen again, and the
    // client sticks to one of the others.
    let idx = PODS.iter().position(|(n, _)| *n == chosen).unwrap();
    let rest: Vec<&str> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != idx)
        .map(|(_, a)| *a)
        .collect();
    c.apply(&sticky(30, &rest));
    let t = tally(c.client(), "10.96.5.12:80", 20, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(t.answers.len(), 1, "{:?}", t.answers);
    assert!(!t.answers.contains_key(&chosen), "{:?}", t.answers);

    // With a 1 s timeout, a client that waits longer is balanced afresh each time.
    c.apply(&sticky(1, &all));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let t = tally(c.client(), "10.96.5.12:80", 2, false);
        assert!(t.errors.is_empty(), "{:?}", t.errors);
        assert_eq!(
            t.answers.len(),
            1,
            "sticky within the timeout: {:?}",
            t.answers
        );
        seen.extend(t.answers.into_keys());
        std::thread::sleep(Duration::from_millis(1300));
    }
    // P(8 fresh picks all equal) = 3 * 3^-8 < 0.05%.
    assert!(seen.len() > 1, "the affinity never expired: {seen:?}");
}

/// The timeout (seconds left) of each conntrack entry of `proto` to `vip` in
/// the node: the third field of `conntrack -L`.
fn conntrack_timeouts(c: &Cluster, proto: &str, vip: &str) -> Vec<u32> {
    let listed = exec_in(
        c.node(),
        &["conntrack", "-L", "-p", proto, "--orig-dst", vip],
    );
    listed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect()
}

#[test]
fn a_services_own_conntrack_timeouts_govern_its_flows_and_no_others() {
    let c = Cluster::new("cttime", &PODS, &[9376]);
    let ports = "[{name: http, port: 80, targetPort: 9376, nodePort: 30081}, {name: dns, protocol: UDP, port: 53, targetPort: 9376, nodePort: 30054}]";
    let own = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: short\n  namespace: default\n  annotations: {{kube-nft.io/conntrack-udp-timeout: 3s, kube-nft.io/conntrack-tcp-established-timeout: 2h}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.5.21\n  ports: {ports}\n"
    );
    let plain = svc(
        "plain",
        "  clusterIP: 10.96.5.22\n  ports: [{name: http, port: 80, targetPort: 9376}, {name: dns, protocol: UDP, port: 53, targetPort: 9376}]",
        "",
    );
    let manifests = node_object("zone-a")
        + &own
        + &eps("short", &[ep("10.244.1.10", NODE, "")])
        + &plain
        + &eps("plain", &[ep("10.244.1.11", NODE, "")]);
    c.apply_with(&manifests, &node_flag());

    // UDP through the ClusterIP and the NodePort, and through the other
    // Service: only the first two flows take the Service's 3 s.
    for target in ["10.96.5.21:53", node_port(30054).as_str(), "10.96.5.22:53"] {
        let t = tally(c.client(), target, 1, true);
        assert!(t.errors.is_empty(), "{target}: {:?}", t.errors);
    }
    let short = conntrack_timeouts(&c, "udp", "10.96.5.21");
    let through_node_port = conntrack_timeouts(&c, "udp", UPLINK_V4);
    let plain = conntrack_timeouts(&c, "udp", "10.96.5.22");
    assert!(
        matches!(short[..], [t] if t <= 3),
        "the Service's flow: {short:?}"
    );
    assert!(
        matches!(through_node_port[..], [t] if t <= 3),
        "through its NodePort: {through_node_port:?}"
    );
    // The node's: 30 s for a flow just answered.
    assert!(
        matches!(plain[..], [t] if t > 10),
        "another Service's flow: {plain:?}"
    );
    // And they expire on it, while the other Service's flow stays.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(
        conntrack_timeouts(&c, "udp", "10.96.5.21"),
        Vec::<u32>::new()
    );
    assert_eq!(conntrack_timeouts(&c, "udp", UPLINK_V4), Vec::<u32>::new());
    assert_eq!(conntrack_timeouts(&c, "udp", "10.96.5.22").len(), 1);

    // An established TCP connection (the pod waits 20 s for its request):
    // 2 h idle for the Service's, the node's 5 days for the other's.
    let hold = |vip: &str| {
        let to: SocketAddr = vip.parse().unwrap();
        kube_nft::testbed::netns::in_netns(c.client(), move || {
            TcpStream::connect_timeout(&to, Duration::from_secs(3))
        })
        .unwrap()
        .unwrap()
    };
    let (_a, _b) = (hold("10.96.5.21:80"), hold("10.96.5.22:80"));
    let short = conntrack_timeouts(&c, "tcp", "10.96.5.21");
    let plain = conntrack_timeouts(&c, "tcp", "10.96.5.22");
    assert!(
        matches!(short[..], [t] if (7100..=7200).contains(&t)),
        "the Service's connection: {short:?}"
    );
    assert!(
        matches!(plain[..], [t] if t > 7200),
        "another Service's: {plain:?}"
    );

    // A bad value is skipped, with its reason, and the Service still served.
    let bad = manifests.replace("conntrack-udp-timeout: 3s", "conntrack-udp-timeout: soon");
    let out = c.apply_with(&bad, &node_flag());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("conntrack-udp-timeout") && log.contains("soon"),
        "{log}"
    );
    let t = tally(c.client(), "10.96.5.21:53", 1, true);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    let short = conntrack_timeouts(&c, "udp", "10.96.5.21");
    assert!(matches!(short[..], [t] if t > 10), "{short:?}");
    assert!(!nft_list(c.node()).contains("unreplied-3s"));
}

#[test]
fn sctp_cluster_ip_and_node_port_are_natted_to_every_endpoint_with_valid_checksums() {
    assert_eq!(sctp::crc32c(b"123456789"), 0xE306_9283, "RFC check value");
    let c = Cluster::new("sctp", &PODS, &[9376]);
    let spec = "  type: NodePort\n  clusterIP: 10.96.5.20\n  ports: [{name: assoc, protocol: SCTP, port: 7777, targetPort: 9377, nodePort: 30777}]";
    let slice = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: assoc-a, namespace: default, labels: {kubernetes.io/service-name: assoc}}\naddressType: IPv4\nports: [{name: assoc, protocol: SCTP, port: 9377}]\nendpoints: [{addresses: [10.244.1.10]}, {addresses: [10.244.1.11]}]\n";
    c.apply_with(
        &(node_object("zone-a") + &svc("assoc", spec, "") + slice),
        &node_flag(),
    );
    let pods = ["pod-a", "pod-b"].map(|p| (p, Capture::open(&c.pod_ns(p))));

    let vip = "10.96.5.20:7777".parse().unwrap();
    let node_port = node_port(30777).parse().unwrap();
    // One tag range per client: outside → NodePort, pod → ClusterIP, node → ClusterIP.
    let outside: Vec<u32> = (1000..1020).collect();
    let from_pod: Vec<u32> = (2000..2020).collect();
    let on_node: Vec<u32> = (3000..3010).collect();
    sctp::send_inits(c.client(), node_port, outside.clone());
    sctp::send_inits(&c.pod_ns("pod-c"), vip, from_pod.clone());
    sctp::send_inits(c.node(), vip, on_node.clone());

    let mut arrived = Vec::new();
    for (pod, capture) in &pods {
        let own: std::net::Ipv4Addr = PODS.iter().find(|(n, _)| n == pod).unwrap().1[0]
            .parse()
            .unwrap();
        let got = capture.drain(Duration::from_millis(700));
        for a in &got {
            assert_eq!((a.dst, a.dst_port), (own, 9377), "{pod} got {a:?}");
            assert!(a.checksum_ok, "NAT left a bad CRC32c: {a:?}");
            if outside.contains(&a.tag) {
                // externalTrafficPolicy: Cluster masquerades outside clients.
                assert_ne!(a.src.to_string(), CLIENT_V4, "{a:?}");
            }
            if from_pod.contains(&a.tag) {
                assert_eq!(
                    a.src.to_string(),
                    "10.244.1.12",
                    "pod traffic is not masqueraded"
                );
            }
        }
        // P(one pod gets none of the 50 flows) = 2 * 2^-50.
        assert!(!got.is_empty(), "{pod} got no SCTP flow");
        arrived.extend(got.into_iter().map(|a| a.tag));
    }
    arrived.sort();
    let sent: Vec<u32> = outside.into_iter().chain(from_pod).chain(on_node).collect();
    assert_eq!(arrived, sent, "every INIT reaches exactly one endpoint");
}

/// `kube-nft top` in `ns`: (packets, bytes) by Service port, in the listed order.
fn top(ns: &str) -> Vec<(String, u64, u64)> {
    let out = kube_nft_in(ns, &["top"]);
    assert!(
        out.status.success(),
        "kube-nft top: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

fn counted(rows: &[(String, u64, u64)], port: &str) -> (u64, u64) {
    rows.iter()
        .find(|r| r.0 == port)
        .map(|r| (r.1, r.2))
        .unwrap_or_else(|| panic!("{port} not in {rows:?}"))
}

#[test]
fn counters_count_every_packet_both_ways_and_top_ranks_the_ports() {
    let c = Cluster::new("count", &PODS, &[9376]);
    let quiet = svc(
        "quiet",
        "  clusterIP: 10.96.5.3\n  ports: [{name: dns, protocol: UDP, port: 53, targetPort: 9376}]",
        "",
    ) + &eps("quiet", &[ep("10.244.1.12", NODE, "")]);
    let manifests = nodeport_manifests() + &quiet;
    let with_counters = ["--node-name", NODE, "--counters"];
    c.apply_with(&manifests, &with_counters);

    // UDP: one request and one reply per flow, so the counts are exact, and they
    // prove both directions on each path: forwarded from a pod, to a NodePort from
    // outside (masqueraded), and from a process on the node (output and input).
    for (ns, target, n) in [
        (c.pod_ns("pod-c"), "10.96.5.1:53".to_string(), 5),
        (c.client().to_string(), node_port(30053), 4),
        (c.node().to_string(), "10.96.5.1:53".to_string(), 3),
        (c.client().to_string(), "10.96.5.3:53".to_string(), 1),
    ] {
        let t = tally(&ns, &target, n, true);
        assert!(t.errors.is_empty(), "{target} from {ns}: {:?}", t.errors);
    }
    let http = tally(&c.pod_ns("pod-c"), "10.96.5.1:80", 10, false);
    assert!(http.errors.is_empty(), "{:?}", http.errors);
    assert_refused_at_once(c.client(), &node_port(30090));

    let rows = top(c.node());
    assert_eq!(
        counted(&rows, "default/np:dns").0,
        2 * (5 + 4 + 3),
        "{rows:?}"
    );
    assert_eq!(counted(&rows, "default/quiet:dns").0, 2, "{rows:?}");
    // Ten HTTP exchanges: handshakes, requests, answers and closes, both ways.
    let (http_packets, http_bytes) = counted(&rows, "default/np:http");
    assert!(http_packets >= 10 * 8, "{rows:?}");
    // The refused attempt counts too (the SYN and the reset sent back for it).
    assert!(counted(&rows, "default/np-empty:http").0 >= 1, "{rows:?}");
    let bytes: Vec<u64> = rows.iter().map(|r| r.2).collect();
    assert!(
        bytes.windows(2).all(|w| w[0] >= w[1]),
        "not ranked: {rows:?}"
    );
    assert_eq!(rows[0].0, "default/np:http");
    assert_eq!(rows[0].2, http_bytes);

    // A new sync (a fresh process, another endpoint) keeps the counts.
    let more = manifests.replace(
        &ep("10.244.1.11", NODE, ""),
        &(ep("10.244.1.11", NODE, "") + &ep("10.244.1.12", NODE, "")),
    );
    assert_ne!(more, manifests);
    c.apply_with(&more, &with_counters);
    assert_eq!(counted(&top(c.node()), "default/np:dns").0, 24);

    // Without --counters the counters go, and top says why it has nothing.
    c.apply_with(&more, &node_flag());
    let out = kube_nft_in(c.node(), &["top"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--counters"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!nft_list(c.node()).contains("counter"));
    let after = tally(c.client(), "10.96.5.1:80", 6, false);
    assert!(after.errors.is_empty(), "{:?}", after.errors);
}

/// `kube-nft explain` in the node namespace, with the flags the sync used: the
/// end of each path it predicts (`endpoint A:P[, masqueraded]`, `rejected: …`,
/// `dropped: …`), and its whole output. Asked twice, of the same node: from the
/// manifests, and from the ruleset the node's kernel holds (no `--manifests`);
/// both must say the same.
fn explain(c: &Cluster, src: &str, dst: &str) -> (Vec<String>, String) {
    let manifests = c.scratch.0.join("manifests.yaml");
    let mut args = proxy_command("explain", &manifests);
    args.extend(["--node-name", NODE, src, dst]);
    let text = explain_output(c, &args);
    let from_kernel = explain_output(c, &["explain", src, dst]);
    let without_notes: String = text
        .lines()
        .filter(|l| !l.starts_with("note: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        from_kernel, without_notes,
        "from the kernel, and from the manifests"
    );
    // Path lines: "<share>%  <end>".
    let ends = text
        .lines()
        .filter_map(|l| l.split_once("%  "))
        .filter(|(share, _)| share.trim().parse::<f64>().is_ok())
        .map(|(_, end)| end.to_string())
        .collect();
    (ends, text)
}

fn explain_output(c: &Cluster, args: &[&str]) -> String {
    let out = kube_nft_in(c.node(), args);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The one end explain predicts for a packet from the outside client, and the
/// whole output.
fn only_end(c: &Cluster, dst: &str) -> (String, String) {
    let (ends, text) = explain(c, CLIENT_V4, dst);
    assert_eq!(ends.len(), 1, "{text}");
    (ends[0].clone(), text)
}

/// `A:P` of an explain destination `A:P/PROTO`.
fn socket_of(dst: &str) -> &str {
    dst.rsplit_once('/').unwrap().0
}

fn pod_ip(pod: &str) -> &'static str {
    PODS.iter().find(|(n, _)| *n == pod).unwrap().1[0]
}

#[test]
fn explain_predicts_what_real_packets_meet() {
    let c = Cluster::new("explain", &PODS, &[9376]);
    let lb = lb_manifests("203.0.113.0/24", "{ip: 198.51.100.8}").replacen(
        &node_object("zone-a"),
        "",
        1,
    );
    c.apply_with(&(nodeport_manifests() + &lb), &node_flag());
    let pod_c = c.pod_ns("pod-c");

    // Served: the endpoints it names are the pods that answer, each with its share.
    for (ns, src, dst, masqueraded) in [
        (pod_c.as_str(), pod_ip("pod-c"), "10.96.5.1:80/tcp", false),
        (c.client(), CLIENT_V4, "192.0.2.1:30080/tcp", true),
        (c.node(), UPLINK_V4, "10.96.5.1:53/udp", true),
    ] {
        let (ends, text) = explain(&c, src, dst);
        assert!(text.contains("service: default/np:"), "{text}");
        assert!(text.contains(" 50.0%  endpoint "), "{text}");
        let suffix = if masqueraded { ", masqueraded" } else { "" };
        let mut want = vec![
            format!("endpoint {}:9376{suffix}", pod_ip("pod-a")),
            format!("endpoint {}:9376{suffix}", pod_ip("pod-b")),
        ];
        want.sort();
        let mut got = ends.clone();
        got.sort();
        assert_eq!(got, want, "{text}");
        // P(one of two pods gets none of 30) = 2 * 2^-30.
        let t = tally(ns, socket_of(dst), 30, dst.ends_with("udp"));
        assert_only(&t, &["pod-a", "pod-b"]);
        if dst.ends_with("tcp") && masqueraded {
            assert_ne!(client_address_seen(ns, socket_of(dst)), CLIENT_V4);
        }
    }

    // Refused: a NodePort and a ClusterIP without endpoints, a ClusterIP's wrong port.
    for (dst, why) in [
        (
            "192.0.2.1:30090/tcp",
            "default/np-empty:http has no endpoints",
        ),
        ("10.96.5.2:80/tcp", "default/np-empty:http has no endpoints"),
        ("10.96.5.1:81/tcp", "invalid ports of ClusterIPs"),
    ] {
        let (end, text) = only_end(&c, dst);
        assert!(end.starts_with("rejected: ") && end.contains(why), "{text}");
        assert_refused_at_once(c.client(), socket_of(dst));
    }

    // Dropped: an unallocated service address, and a load balancer IP from a
    // source outside its ranges (whose externalIP still serves).
    for (dst, why) in [
        ("10.96.9.9:80/tcp", "unallocated ClusterIPs"),
        ("198.51.100.8:80/tcp", "loadBalancerSourceRanges"),
    ] {
        let (end, text) = only_end(&c, dst);
        assert!(end.starts_with("dropped: ") && end.contains(why), "{text}");
        assert_dropped(c.client(), socket_of(dst));
    }
    let (ends, text) = explain(&c, CLIENT_V4, "198.51.100.7:80/tcp");
    assert_eq!(
        ends,
        vec![format!("endpoint {}:9376, masqueraded", pod_ip("pod-a"))],
        "{text}"
    );
    assert_only(&tally(c.client(), "198.51.100.7:80", 3, false), &["pod-a"]);
}

#[test]
fn ipv6_node_ports_answer_outside_and_pod_clients_over_tcp_and_udp() {
    const DUAL_PODS: [(&str, &[&str]); 3] = [
        ("pod-a", &["10.244.1.10", "fd00:10:244::10"]),
        ("pod-b", &["10.244.1.11", "fd00:10:244::11"]),
        ("pod-c", &["10.244.1.12", "fd00:10:244::12"]),
    ];
    let c = Cluster::new("np6", &DUAL_PODS, &[9376]);
    let node = format!(
        "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\nstatus: {{addresses: [{{type: InternalIP, address: {UPLINK_V4}}}, {{type: InternalIP, address: \"{UPLINK_V6}\"}}]}}\n"
    );
    let spec = "  type: NodePort\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: 10.96.5.40\n  clusterIPs: [10.96.5.40, \"fd00:10:96::40\"]\n  ports: [{name: http, port: 80, targetPort: 9376, nodePort: 30400}, {name: dns, protocol: UDP, port: 53, targetPort: 9376, nodePort: 30453}]";
    let v6_slice = eps(
        "np6",
        &[
            ep("\"fd00:10:244::10\"", NODE, ""),
            ep("\"fd00:10:244::11\"", NODE, ""),
        ],
    )
    .replace("name: np6-a", "name: np6-v6")
    .replace("addressType: IPv4", "addressType: IPv6");
    let v4_slice = eps(
        "np6",
        &[ep("10.244.1.10", NODE, ""), ep("10.244.1.11", NODE, "")],
    );
    c.apply_with(
        &(node + &svc("np6", spec, "") + &v4_slice + &v6_slice),
        &node_flag(),
    );

    let v6 = |port: u16| format!("[{UPLINK_V6}]:{port}");
    // P(one of two pods gets none of 30) = 2 * 2^-30.
    assert_only(
        &tally(c.client(), &v6(30400), 30, false),
        &["pod-a", "pod-b"],
    );
    assert_only(
        &tally(c.client(), &v6(30453), 30, true),
        &["pod-a", "pod-b"],
    );
    assert_only(
        &tally(&c.pod_ns("pod-c"), &v6(30400), 30, false),
        &["pod-a", "pod-b"],
    );
    // Masqueraded like IPv4 (externalTrafficPolicy: Cluster).
    let seen = client_address_seen(c.client(), &v6(30400));
    assert!(seen.contains(':') && seen != CLIENT_V6, "{seen}");
    // Both families' NodePorts at once.
    assert_only(
        &tally(c.client(), &node_port(30400), 30, false),
        &["pod-a", "pod-b"],
    );
}

/// The README's order, `explain --manifests PATH SRC DST`: `--manifests` takes
/// several paths, and the packet is still found after them.
#[test]
fn explain_takes_the_packet_after_the_manifests_as_the_readme_writes_it() {
    require_root();
    let ns = kube_nft::testbed::netns::Netns::create(&unique("xorder")).unwrap();
    // Written out: the guest that runs these tests again has no source tree.
    let scratch = Scratch::new("xorder");
    let manifests = scratch.write("hostnames.yaml", kube_nft::lab::DEFAULT_MANIFESTS);
    let out = kube_nft_in(
        &ns.name,
        &[
            "explain",
            "--manifests",
            manifests.to_str().unwrap(),
            "10.0.0.5",
            "10.0.1.175:80/tcp",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("service: default/hostnames:default"),
        "{text}"
    );
    assert_eq!(text.matches("endpoint 10.244.0.").count(), 3, "{text}");
}

/// Without a Node object, NodePorts are served on no address; `explain` says so
/// and names what is missing instead of leaving "service: none" unexplained.
#[test]
fn explain_names_the_missing_node_when_nodeports_have_no_address() {
    require_root();
    let ns = kube_nft::testbed::netns::Netns::create(&unique("xnode")).unwrap();
    let scratch = Scratch::new("xnode");
    let manifests = scratch.write(
        "np.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{port: 80, nodePort: 30080}]\n",
    );
    let out = kube_nft_in(
        &ns.name,
        &[
            "explain",
            "--manifests",
            manifests.to_str().unwrap(),
            "--node-name",
            "node-a",
            "192.0.2.9",
            "192.0.2.1:30080/tcp",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("note: NodePorts are served on no address") && text.contains("\"node-a\""),
        "{text}"
    );
}

/// `explain` without `--manifests` reads this namespace's kernel: it says so
/// when kube-nft has programmed nothing here, and names a rule someone added to
/// our tables rather than guessing what it does.
#[test]
fn explain_from_the_kernel_refuses_what_kube_nft_did_not_write() {
    require_root();
    let ns = kube_nft::testbed::netns::Netns::create(&unique("xkern")).unwrap();
    let ask = || kube_nft_in(&ns.name, &["explain", "10.0.0.5", "10.0.1.175:80/tcp"]);
    let out = ask();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no kube-nft tables"), "{err}");

    let scratch = Scratch::new("xkern");
    let manifests = scratch.write("hostnames.yaml", kube_nft::lab::DEFAULT_MANIFESTS);
    let out = kube_nft_in(
        &ns.name,
        &[
            "run",
            "--once",
            IN_A_NETNS[0],
            IN_A_NETNS[1],
            "--manifests",
            manifests.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ask();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("endpoint 10.244.0.").count(), 3, "{text}");

    let status = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "nft", "insert", "rule", "ip", "kube-nft",
        ])
        .args(["services", "meta", "mark", "0x1", "log"])
        .status()
        .unwrap();
    assert!(status.success());
    let out = ask();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("table ip kube-nft: chain services, rule (handle")
            && err.contains("not written by kube-nft"),
        "{err}"
    );
}
