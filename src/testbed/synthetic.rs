//! A synthetic cluster, the same for the benchmarks and the tests: Service `i`
//! is `bench/svc-<i>`, TCP 80 → 8080 at `vip(i)`, with ready endpoints from
//! `10.128.0.0` on, spread over 100 nodes of which this node is the first.

use crate::core::model::{
    ClusterState, Conditions, Endpoint, EndpointPort, EndpointSlice, NodeInfo, Service, ServiceKey,
    ServicePort, Slices, TargetPort,
};
use crate::core::net::{Family, Protocol};
use crate::core::node_config::NodeConfig;
use crate::engine::Proxy;
use std::net::IpAddr;

pub fn node_config() -> NodeConfig {
    NodeConfig {
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        masquerade_bit: 14,
        ..NodeConfig::default()
    }
}

pub fn service_key(i: usize) -> ServiceKey {
    ServiceKey {
        namespace: "bench".into(),
        name: format!("svc-{i:05}"),
    }
}

pub fn vip(i: usize) -> IpAddr {
    IpAddr::from((0x0a60_0000u32 + 1 + i as u32).to_be_bytes())
}

/// The synthetic cluster's pods, from `FIRST_ENDPOINT` on.
pub const CLUSTER_CIDR: &str = "10.128.0.0/9";
const FIRST_ENDPOINT: u32 = 0x0a80_0000;

pub fn endpoint_addr(n: usize) -> IpAddr {
    IpAddr::from((FIRST_ENDPOINT + n as u32).to_be_bytes())
}

/// The address of endpoint `j` of Service `i`
/// (sixteen addresses per Service, from the benchmark's first endpoint on).
pub fn endpoint(i: usize, j: usize) -> IpAddr {
    endpoint_addr(i * 16 + j)
}

/// Sets Service `i`'s EndpointSlices to ready endpoints at `addrs`, as many
/// slices as the EndpointSlice controller would write for them.
pub fn set_endpoints(state: &mut ClusterState, i: usize, addrs: &[IpAddr]) {
    state.slices.insert(service_key(i), slices(i, addrs));
}

/// The EndpointSlice controller's default `--max-endpoints-per-slice`.
pub const ENDPOINTS_PER_SLICE: usize = 100;

/// Service `i`'s ready endpoints at `addrs`, `ENDPOINTS_PER_SLICE` to a slice
/// (at least one slice, `slice`'s, even when empty).
pub fn slices(i: usize, addrs: &[IpAddr]) -> Slices {
    let mut slices: Slices = addrs
        .chunks(ENDPOINTS_PER_SLICE)
        .enumerate()
        .map(|(k, chunk)| EndpointSlice {
            name: slice_name(i, k),
            ..slice(i, chunk)
        })
        .collect();
    if slices.is_empty() {
        slices.insert(slice(i, addrs));
    }
    slices
}

/// `svc-00007-a` for the first slice of Service 7, `svc-00007-a1` … after it.
fn slice_name(i: usize, k: usize) -> String {
    match k {
        0 => format!("svc-{i:05}-a"),
        k => format!("svc-{i:05}-a{k}"),
    }
}

/// Adds Service `i` (TCP 80 → 8080) with `n` ready endpoints (`endpoint`)
/// to a proxy's model.
pub fn add_service(p: &mut Proxy, i: usize, n: usize) {
    p.update(&service_key(i), |state| {
        state.put_service(service(i));
        let addrs: Vec<IpAddr> = (0..n).map(|j| endpoint(i, j)).collect();
        set_endpoints(state, i, &addrs);
    });
}

/// The synthetic cluster's nodes: its pods are spread over 100 (a node runs at
/// most 110 pods by default), and this node is the first.
const NODES: u32 = 100;
pub const THIS_NODE: &str = "node-00";

pub fn node_of(addr: IpAddr) -> String {
    format!("node-{:02}", node_number(addr))
}

/// Which of the `NODES` nodes the pod at `addr` runs on (0 to 99).
pub fn node_number(addr: IpAddr) -> u32 {
    let n = match addr {
        IpAddr::V4(a) => u32::from(a).wrapping_sub(FIRST_ENDPOINT),
        IpAddr::V6(a) => u128::from(a) as u32,
    };
    n % NODES
}

pub fn ready(addr: IpAddr) -> Endpoint {
    Endpoint {
        addr,
        conditions: Conditions {
            ready: true,
            serving: true,
            terminating: false,
        },
        node_name: Some(crate::core::model::name(&node_of(addr))),
        zone: None,
        hints: Default::default(),
    }
}

pub fn service(i: usize) -> Service {
    Service {
        key: service_key(i),
        cluster_ips: vec![vip(i)],
        ports: vec![ServicePort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            target_port: TargetPort::Number(8080),
            node_port: None,
        }],
        ..Service::default()
    }
}

pub fn slice(i: usize, addrs: &[IpAddr]) -> EndpointSlice {
    EndpointSlice {
        name: slice_name(i, 0),
        service: service_key(i),
        family: Family::Ip,
        ports: vec![EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        endpoints: addrs.iter().map(|a| ready(*a)).collect(),
    }
}

/// `services` Services (TCP 80 → 8080) sharing `endpoints` endpoints as evenly as
/// possible, every endpoint address distinct, in slices of 100.
pub fn state(services: usize, endpoints: usize) -> ClusterState {
    let mut state = ClusterState {
        node: Some(NodeInfo {
            name: THIS_NODE.into(),
            ..NodeInfo::default()
        }),
        ..ClusterState::default()
    };
    let mut next = 0;
    for i in 0..services {
        let n = endpoints / services + usize::from(i < endpoints % services);
        let addrs: Vec<IpAddr> = (next..next + n).map(endpoint_addr).collect();
        next += n;
        state.put_service(service(i));
        set_endpoints(&mut state, i, &addrs);
    }
    state
}
