//! Service manifests on one node ("node-a") and the assertions the Service
//! feature tests share (nftables and IPVS backends alike).

use super::*;
use kube_nft::lab::hostname_server::http_get_path;
use kube_nft::lab::topology::UPLINK_V4;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

pub const NODE: &str = "node-a";
pub const PODS: [(&str, &[&str]); 3] = [
    ("pod-a", &["10.244.1.10"]),
    ("pod-b", &["10.244.1.11"]),
    ("pod-c", &["10.244.1.12"]),
];

/// This node's Node object: its primary IP is the uplink address.
pub fn node_object(zone: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}, labels: {{topology.kubernetes.io/zone: {zone}}}}}\nstatus: {{addresses: [{{type: InternalIP, address: {UPLINK_V4}}}]}}\n"
    )
}

/// A Service from its spec lines (and status), ports `http` TCP 80 and `dns` UDP 53.
pub fn svc(name: &str, spec: &str, status: &str) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{spec}\nstatus: {{{status}}}\n")
}

/// An endpoint line of a slice: address, node, and extra fields (conditions, hints).
pub fn ep(addr: &str, node: &str, extra: &str) -> String {
    format!("- {{addresses: [{addr}], nodeName: {node}{extra}}}\n")
}

/// A slice for `svc`'s ports, with the endpoints given as `ep` lines.
pub fn eps(service: &str, endpoints: &[String]) -> String {
    format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {service}-a, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 9376}}, {{name: dns, protocol: UDP, port: 9376}}]\nendpoints:\n{}", endpoints.concat())
}

pub fn node_flag() -> [&'static str; 2] {
    ["--node-name", NODE]
}

/// Every request answered, by exactly these pods.
pub fn assert_only(t: &Tally, pods: &[&str]) {
    assert!(t.errors.is_empty(), "failed requests: {:?}", t.errors);
    let got: Vec<&str> = t.answers.keys().map(String::as_str).collect();
    assert_eq!(got, pods, "answers: {:?}", t.answers);
}

pub fn node_port(port: u16) -> String {
    format!("{UPLINK_V4}:{port}")
}

/// A connection attempt that must be dropped: no answer, not even a refusal.
pub fn assert_dropped(ns: &str, target: &str) {
    let (err, _) = connect_error(ns, target, Duration::from_millis(1500));
    assert_eq!(err, Some(ErrorKind::TimedOut), "{target} from {ns}");
}

/// The client address the pod saw for one request from `ns` (`GET /client`).
pub fn client_address_seen(ns: &str, target: &str) -> String {
    let target: SocketAddr = target.parse().unwrap();
    kube_nft::testbed::netns::in_netns(ns, move || {
        http_get_path(target, "/client", Duration::from_secs(2))
    })
    .unwrap()
    .unwrap()
}

pub fn assert_refused_at_once(ns: &str, target: &str) {
    let (err, took) = connect_error(ns, target, Duration::from_secs(3));
    assert_eq!(
        err,
        Some(ErrorKind::ConnectionRefused),
        "{target} from {ns}"
    );
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
}

/// A LoadBalancer Service with an external IP, the given source ranges and
/// ingress entries, and one endpoint (pod-a).
pub fn lb_manifests(ranges: &str, ingress: &str) -> String {
    node_object("zone-a")
        + &svc(
            "lb",
            &format!("  type: LoadBalancer\n  clusterIP: 10.96.5.3\n  externalIPs: [198.51.100.7]\n  loadBalancerSourceRanges: [{ranges}]\n  ports: [{{name: http, port: 80, targetPort: 9376, nodePort: 30081}}]"),
            &format!("loadBalancer: {{ingress: [{ingress}]}}"),
        )
        + &eps("lb", &[ep("10.244.1.10", NODE, "")])
}
