//! Names in our tables: the fixed names of sets, maps and chains (kube-proxy's,
//! where it has them), and the names of each Service port's chains, hashed so
//! that they stay unique and stable when truncated to nftables' limits.

use crate::core::model::{Service, ServicePort};

pub const SET_CLUSTER_IPS: &str = "cluster-ips";
pub const MAP_CLUSTER_IPS_REJECT: &str = "cluster-ips-reject";
pub const MAP_SERVICE_IPS: &str = "service-ips";
pub const MAP_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const SET_HAIRPIN: &str = "hairpin";
pub const SET_NODEPORT_IPS: &str = "nodeport-ips";
pub const MAP_SERVICE_NODEPORTS: &str = "service-nodeports";
pub const MAP_NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const MAP_FIREWALL_IPS: &str = "firewall-ips";
pub const MAP_SERVICE_COUNTERS: &str = "service-counters";
pub const MAP_NODEPORT_COUNTERS: &str = "nodeport-counters";
pub const CHAIN_SERVICES: &str = "services";
pub const CHAIN_SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const CHAIN_NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const CHAIN_FIREWALL_CHECK: &str = "firewall-check";
pub const CHAIN_CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub const CHAIN_REJECT: &str = "reject-chain";
/// IPVS backend: Service address . protocol . port that IPVS serves.
pub const SET_SERVICE_PORTS: &str = "service-ports";
/// IPVS backend: external addresses and NodePorts whose traffic is masqueraded
/// (`externalTrafficPolicy: Cluster`).
pub const SET_MASQUERADE_SERVICES: &str = "masquerade-services";
pub const SET_MASQUERADE_NODEPORTS: &str = "masquerade-nodeports";
pub const CHAIN_SERVICE_PORTS_CHECK: &str = "service-ports-check";

/// FNV-1a, 64 bits: stable across versions and platforms, which chain names need.
pub(crate) fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Eight base32 characters of the hash of `s`.
fn short_hash(s: &str) -> String {
    let h = fnv1a(s.as_bytes());
    (0..8)
        .map(|i| BASE32[((h >> (59 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// nftables chain names may be up to 255 bytes.
const MAX_CHAIN_NAME: usize = 255;

/// `svc-<hash>-ns/name/proto/port`: readable, and unique through the hash even
/// when truncated. The chain that picks among all (cluster) endpoints.
pub fn service_chain_name(svc: &Service, port: &ServicePort) -> String {
    port_chain_name("svc", svc, port)
}

/// `<kind>-<hash>-ns/name/proto/port`, the chains of one Service port.
pub(super) fn port_chain_name(kind: &str, svc: &Service, port: &ServicePort) -> String {
    chain_name(kind, &port_id(svc, port))
}

/// `ns/name/proto/port` (the port's name, or its number when unnamed).
pub(super) fn port_id(svc: &Service, port: &ServicePort) -> String {
    let port_id = if port.name.is_empty() {
        port.port.to_string()
    } else {
        port.name.clone()
    };
    format!(
        "{}/{}/{}/{}",
        svc.key.namespace, svc.key.name, port.protocol, port_id
    )
}

pub(super) fn chain_name(kind: &str, id: &str) -> String {
    let mut name = format!("{kind}-{}-{id}", short_hash(id));
    if name.len() > MAX_CHAIN_NAME {
        let mut end = MAX_CHAIN_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// The conntrack label bit that marks a connection to a Service on the fast
/// path (`ct label 127`): the highest of the 128, where tools that number
/// their labels from 0 are least likely to reach.
pub const FAST_PATH_LABEL: u8 = 127;
