//! Endpoint policy, kube-proxy's rules for which endpoints take new connections:
//! ready before serving-terminating, topology hints, and traffic policies
//! (`Cluster` or `Local`). Every dataplane picks endpoints through here.

use crate::core::model::{ClusterState, NodeInfo, PortEndpoint, Service, ServicePort};
use crate::core::net::Family;

/// The endpoints of one Service port in one family, merged over its slices.
pub fn port_endpoints(
    state: &ClusterState,
    svc: &Service,
    port: &ServicePort,
    family: Family,
) -> Vec<PortEndpoint> {
    let mut eps = state.endpoints_for(svc, port);
    eps.retain(|e| Family::of(&e.addr) == family);
    eps
}

/// Endpoints that receive new connections: the ready ones, or, when none is
/// ready, the ones still serving while terminating (kube-proxy's fallback).
pub fn usable_endpoints(eps: &[PortEndpoint]) -> Vec<&PortEndpoint> {
    usable(eps.iter())
}

fn usable<'a>(eps: impl Iterator<Item = &'a PortEndpoint> + Clone) -> Vec<&'a PortEndpoint> {
    let ready: Vec<&PortEndpoint> = eps.clone().filter(|e| e.conditions.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    eps.filter(|e| e.conditions.serving_terminating()).collect()
}

/// The endpoints of one Service port, as each traffic policy sees them.
#[derive(Debug, Default)]
pub struct Categorized<'a> {
    /// For `Cluster` policies, topology hints applied.
    pub cluster: Vec<&'a PortEndpoint>,
    /// This node's, for `Local` policies.
    pub local: Vec<&'a PortEndpoint>,
    /// Whether the Service port has any usable endpoint anywhere.
    pub has_any: bool,
}

/// Which topology hints apply on this node.
enum HintFilter<'a> {
    Any,
    SameNode(&'a str),
    SameZone(&'a str),
}

impl HintFilter<'_> {
    fn allows(&self, e: &PortEndpoint) -> bool {
        match self {
            HintFilter::Any => true,
            HintFilter::SameNode(n) => e.hints.for_nodes().iter().any(|h| h == n),
            HintFilter::SameZone(z) => e.hints.for_zones().iter().any(|h| h == z),
        }
    }
}

/// kube-proxy's rules: hints count only when every ready endpoint has them, and
/// some endpoint is hinted for this node (or zone); same-node before same-zone.
fn hint_filter<'a>(eps: &[PortEndpoint], node: Option<&'a NodeInfo>) -> HintFilter<'a> {
    let Some(node) = node else {
        return HintFilter::Any;
    };
    let ready: Vec<&PortEndpoint> = eps.iter().filter(|e| e.conditions.ready).collect();
    let applies = |t: &HintFilter, hinted: fn(&PortEndpoint) -> bool| {
        !ready.is_empty() && ready.iter().all(|e| hinted(e)) && ready.iter().any(|e| t.allows(e))
    };
    let same_node = HintFilter::SameNode(&node.name);
    if applies(&same_node, |e| !e.hints.for_nodes().is_empty()) {
        return same_node;
    }
    if let Some(zone) = &node.zone {
        let same_zone = HintFilter::SameZone(zone);
        if applies(&same_zone, |e| !e.hints.for_zones().is_empty()) {
            return same_zone;
        }
    }
    HintFilter::Any
}

/// kube-proxy's endpoint categorisation: cluster endpoints (ready, topology
/// hints honoured, else serving-terminating), local ones (this node's ready,
/// else its serving-terminating), and whether any endpoint is usable at all.
pub fn categorize<'a>(
    svc: &Service,
    eps: &'a [PortEndpoint],
    node: Option<&'a NodeInfo>,
) -> Categorized<'a> {
    let mut out = Categorized::default();
    if svc.uses_cluster_endpoints() {
        let hints = hint_filter(eps, node);
        out.cluster = eps
            .iter()
            .filter(|e| e.conditions.ready && hints.allows(e))
            .collect();
        if out.cluster.is_empty() {
            out.cluster = eps
                .iter()
                .filter(|e| e.conditions.serving_terminating())
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if svc.uses_local_endpoints() {
        out.local = usable(eps.iter().filter(|e| e.is_on(node)));
        out.has_any |= !usable_endpoints(eps).is_empty();
    }
    out
}
