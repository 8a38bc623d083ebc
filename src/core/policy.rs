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

/// kube-proxy's `CategorizeEndpoints` (pkg/proxy/topology.go), case by case.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Conditions, Hints};
    use std::net::{IpAddr, Ipv4Addr};

    /// Which traffic policies the Service has.
    #[derive(Clone, Copy)]
    enum Policy {
        Cluster,
        /// `internalTrafficPolicy: Local`, ClusterIP only.
        InternalLocal,
        /// `externalTrafficPolicy: Local` on a NodePort.
        ExternalLocal,
        /// Both Local, on a NodePort.
        BothLocal,
    }

    #[derive(Clone, Copy)]
    enum State {
        Ready,
        ServingTerminating,
        /// Terminating and no longer serving.
        Gone,
        /// Serving but neither ready nor terminating (not a fallback).
        ServingOnly,
    }

    /// Endpoint `n` (address 10.0.0.n) on `node`, with zone and node hints.
    struct Ep(
        u8,
        State,
        &'static str,
        &'static [&'static str],
        &'static [&'static str],
    );

    struct Case {
        what: &'static str,
        policy: Policy,
        /// This node's name and zone (`None`: the node is not known yet).
        node: Option<(&'static str, Option<&'static str>)>,
        eps: &'static [Ep],
        cluster: &'static [u8],
        local: &'static [u8],
        has_any: bool,
    }

    use State::*;

    const CASES: &[Case] = &[
        Case {
            what: "the ready endpoints, when some are ready",
            policy: Policy::Cluster,
            node: Some(("n1", None)),
            eps: &[Ep(1, Ready, "n1", &[], &[]), Ep(2, ServingTerminating, "n2", &[], &[])],
            cluster: &[1],
            local: &[],
            has_any: true,
        },
        Case {
            what: "none ready: those serving while terminating",
            policy: Policy::Cluster,
            node: Some(("n1", None)),
            eps: &[
                Ep(1, Gone, "n1", &[], &[]),
                Ep(2, ServingTerminating, "n2", &[], &[]),
                Ep(3, ServingOnly, "n2", &[], &[]),
            ],
            cluster: &[2],
            local: &[],
            has_any: true,
        },
        Case {
            what: "nothing usable: no endpoint at all (reject, not drop)",
            policy: Policy::Cluster,
            node: Some(("n1", None)),
            eps: &[Ep(1, Gone, "n1", &[], &[]), Ep(2, ServingOnly, "n2", &[], &[])],
            cluster: &[],
            local: &[],
            has_any: false,
        },
        Case {
            what: "PreferSameNode: every ready endpoint has node hints, one is for this node",
            policy: Policy::Cluster,
            node: Some(("n1", Some("z1"))),
            eps: &[
                Ep(1, Ready, "n1", &["z1"], &["n1"]),
                Ep(2, Ready, "n2", &["z1"], &["n2"]),
            ],
            cluster: &[1],
            local: &[],
            has_any: true,
        },
        Case {
            what: "node hints ignored when a ready endpoint has none",
            policy: Policy::Cluster,
            node: Some(("n1", None)),
            eps: &[Ep(1, Ready, "n1", &[], &["n1"]), Ep(2, Ready, "n2", &[], &[])],
            cluster: &[1, 2],
            local: &[],
            has_any: true,
        },
        Case {
            what: "no node hint for this node: the zone hints decide",
            policy: Policy::Cluster,
            node: Some(("n1", Some("z1"))),
            eps: &[
                Ep(1, Ready, "n2", &["z1"], &["n2"]),
                Ep(2, Ready, "n3", &["z2"], &["n3"]),
            ],
            cluster: &[1],
            local: &[],
            has_any: true,
        },
        Case {
            what: "PreferSameZone: this zone's endpoints",
            policy: Policy::Cluster,
            node: Some(("n1", Some("z1"))),
            eps: &[
                Ep(1, Ready, "n2", &["z1"], &[]),
                Ep(2, Ready, "n3", &["z2"], &[]),
                Ep(3, Ready, "n4", &["z1"], &[]),
            ],
            cluster: &[1, 3],
            local: &[],
            has_any: true,
        },
        Case {
            what: "zone hints ignored on a node without a zone",
            policy: Policy::Cluster,
            node: Some(("n1", None)),
            eps: &[Ep(1, Ready, "n2", &["z1"], &[]), Ep(2, Ready, "n3", &["z2"], &[])],
            cluster: &[1, 2],
            local: &[],
            has_any: true,
        },
        Case {
            what: "zone hints ignored when none is for this zone",
            policy: Policy::Cluster,
            node: Some(("n1", Some("z1"))),
            eps: &[Ep(1, Ready, "n2", &["z2"], &[]), Ep(2, Ready, "n3", &["z3"], &[])],
            cluster: &[1, 2],
            local: &[],
            has_any: true,
        },
        Case {
            what: "a not-ready endpoint without hints does not cancel them",
            policy: Policy::Cluster,
            node: Some(("n1", Some("z1"))),
            eps: &[
                Ep(1, Ready, "n2", &["z1"], &[]),
                Ep(2, Ready, "n3", &["z2"], &[]),
                Ep(3, ServingTerminating, "n1", &[], &[]),
            ],
            cluster: &[1],
            local: &[],
            has_any: true,
        },
        Case {
            what: "the node not known yet: hints ignored, nothing is local",
            policy: Policy::ExternalLocal,
            node: None,
            eps: &[Ep(1, Ready, "n1", &["z1"], &["n1"]), Ep(2, Ready, "n2", &["z2"], &["n2"])],
            cluster: &[1, 2],
            local: &[],
            has_any: true,
        },
        Case {
            what: "internalTrafficPolicy: Local: this node's ready endpoints only",
            policy: Policy::InternalLocal,
            node: Some(("n1", None)),
            eps: &[
                Ep(1, Ready, "n1", &[], &[]),
                Ep(2, Ready, "n2", &[], &[]),
                Ep(3, ServingTerminating, "n1", &[], &[]),
            ],
            cluster: &[],
            local: &[1],
            has_any: true,
        },
        Case {
            what: "Local with endpoints only elsewhere: none local, but some (drop, not reject)",
            policy: Policy::InternalLocal,
            node: Some(("n1", None)),
            eps: &[Ep(1, Ready, "n2", &[], &[])],
            cluster: &[],
            local: &[],
            has_any: true,
        },
        Case {
            what: "Local: this node's serving-terminating ones when none of its own is ready",
            policy: Policy::InternalLocal,
            node: Some(("n1", None)),
            eps: &[
                Ep(1, ServingTerminating, "n1", &[], &[]),
                Ep(2, Ready, "n2", &[], &[]),
            ],
            cluster: &[],
            local: &[1],
            has_any: true,
        },
        Case {
            what: "Local with nothing usable anywhere",
            policy: Policy::InternalLocal,
            node: Some(("n1", None)),
            eps: &[Ep(1, Gone, "n1", &[], &[])],
            cluster: &[],
            local: &[],
            has_any: false,
        },
        Case {
            what: "externalTrafficPolicy: Local: cluster endpoints (with hints) for internal traffic, this node's for external",
            policy: Policy::ExternalLocal,
            node: Some(("n1", Some("z1"))),
            eps: &[
                Ep(1, Ready, "n1", &["z2"], &[]),
                Ep(2, Ready, "n2", &["z1"], &[]),
            ],
            cluster: &[2],
            local: &[1],
            has_any: true,
        },
        Case {
            what: "both policies Local, reachable from outside: cluster endpoints still, for pods' and the node's traffic to its external addresses",
            policy: Policy::BothLocal,
            node: Some(("n1", None)),
            eps: &[Ep(1, Ready, "n1", &[], &[]), Ep(2, Ready, "n2", &[], &[])],
            cluster: &[1, 2],
            local: &[1],
            has_any: true,
        },
    ];

    fn endpoint(e: &Ep) -> PortEndpoint {
        let Ep(n, state, node, zones, nodes) = e;
        let (ready, serving, terminating) = match state {
            Ready => (true, true, false),
            ServingTerminating => (false, true, true),
            Gone => (false, false, true),
            ServingOnly => (false, true, false),
        };
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        PortEndpoint {
            addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, *n)),
            port: 8080,
            conditions: Conditions {
                ready,
                serving,
                terminating,
            },
            node_name: Some(crate::core::model::name(node)),
            zone: None,
            hints: Hints::new(names(zones), names(nodes)),
        }
    }

    fn service(policy: Policy) -> Service {
        let mut svc = crate::synthetic::service(1);
        match policy {
            Policy::Cluster => {}
            Policy::InternalLocal => svc.internal_policy_local = true,
            Policy::ExternalLocal => {
                svc.external_policy_local = true;
                svc.ports[0].node_port = Some(30080);
            }
            Policy::BothLocal => {
                svc.internal_policy_local = true;
                svc.external_policy_local = true;
                svc.ports[0].node_port = Some(30080);
            }
        }
        svc
    }

    #[test]
    fn endpoints_are_categorized_as_kube_proxy_does() {
        let mut failures = Vec::new();
        for case in CASES {
            let eps: Vec<PortEndpoint> = case.eps.iter().map(endpoint).collect();
            let node = case.node.map(|(name, zone)| NodeInfo {
                name: name.into(),
                zone: zone.map(Into::into),
                ..NodeInfo::default()
            });
            let got = categorize(&service(case.policy), &eps, node.as_ref());
            let numbers = |l: &[&PortEndpoint]| -> Vec<u8> {
                l.iter()
                    .map(|e| match e.addr {
                        IpAddr::V4(a) => a.octets()[3],
                        IpAddr::V6(_) => unreachable!(),
                    })
                    .collect()
            };
            let got = (numbers(&got.cluster), numbers(&got.local), got.has_any);
            let want = (case.cluster.to_vec(), case.local.to_vec(), case.has_any);
            if got != want {
                failures.push(format!(
                    "{}: (cluster, local, has_any) = {got:?}, not {want:?}",
                    case.what
                ));
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }
}
