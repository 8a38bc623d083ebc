//! Endpoint policy, kube-proxy's rules for which endpoints take new connections:
//! ready before serving-terminating, topology hints, and traffic policies
//! (`Cluster` or `Local`). Every dataplane picks endpoints through here.

use crate::core::model::{ClusterState, NodeInfo, PortEndpoint, Service, ServicePort};
use crate::core::net::Family;
use std::net::IpAddr;

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
    /// The addresses of those in either list that may be on this node
    /// (`PortEndpoint::may_be_on`), when known without visiting the lists.
    pub here: Option<Vec<IpAddr>>,
}

/// The counts over a Service port's endpoints that decide what `categorize`
/// chooses. They are kept endpoint by endpoint (`add`, `remove`), so that a
/// change to a few endpoints of a large port is judged without visiting the
/// others: if the `Choice` they give is the one before, every other endpoint
/// keeps its place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    ready: u32,
    serving_terminating: u32,
    ready_without_node_hints: u32,
    ready_without_zone_hints: u32,
    ready_for_this_node: u32,
    ready_for_this_zone: u32,
    ready_here: u32,
}

impl Tally {
    pub fn of<'a>(
        eps: impl IntoIterator<Item = &'a PortEndpoint>,
        node: Option<&NodeInfo>,
    ) -> Tally {
        let mut t = Tally::default();
        for e in eps {
            t.add(e, node);
        }
        t
    }

    pub fn add(&mut self, e: &PortEndpoint, node: Option<&NodeInfo>) {
        self.count(e, node, |n| *n += 1);
    }

    pub fn remove(&mut self, e: &PortEndpoint, node: Option<&NodeInfo>) {
        self.count(e, node, |n| *n -= 1);
    }

    fn count(&mut self, e: &PortEndpoint, node: Option<&NodeInfo>, step: fn(&mut u32)) {
        if e.conditions.serving_terminating() {
            step(&mut self.serving_terminating);
        }
        if !e.conditions.ready {
            return;
        }
        step(&mut self.ready);
        if e.is_on(node) {
            step(&mut self.ready_here);
        }
        if e.hints.for_nodes().is_empty() {
            step(&mut self.ready_without_node_hints);
        }
        if e.hints.for_zones().is_empty() {
            step(&mut self.ready_without_zone_hints);
        }
        if Hinted::SameNode.allows(e, node) {
            step(&mut self.ready_for_this_node);
        }
        if Hinted::SameZone.allows(e, node) {
            step(&mut self.ready_for_this_zone);
        }
    }

    /// kube-proxy's rules, from the counts: topology hints count only when
    /// every ready endpoint has them and one is for this node (or zone),
    /// same-node before same-zone; with no ready endpoint allowed, those
    /// serving while terminating.
    pub fn choice(&self, svc: &Service, node: Option<&NodeInfo>) -> Choice {
        let hinted = |without: u32, here: u32| self.ready > 0 && without == 0 && here > 0;
        let hints = match node {
            None => Hinted::Any,
            Some(_) if hinted(self.ready_without_node_hints, self.ready_for_this_node) => {
                Hinted::SameNode
            }
            Some(_) if hinted(self.ready_without_zone_hints, self.ready_for_this_zone) => {
                Hinted::SameZone
            }
            Some(_) => Hinted::Any,
        };
        let cluster_fallback = hints == Hinted::Any && self.ready == 0;
        let uses_cluster = svc.uses_cluster_endpoints();
        let uses_local = svc.uses_local_endpoints();
        let cluster_any = !cluster_fallback || self.serving_terminating > 0;
        let any_usable = self.ready > 0 || self.serving_terminating > 0;
        Choice {
            uses_cluster,
            uses_local,
            hints,
            cluster_fallback,
            local_fallback: self.ready_here == 0,
            has_any: (uses_cluster && cluster_any) || (uses_local && any_usable),
        }
    }
}

/// Which topology hints apply on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hinted {
    Any,
    SameNode,
    SameZone,
}

impl Hinted {
    fn allows(self, e: &PortEndpoint, node: Option<&NodeInfo>) -> bool {
        match (self, node) {
            (Hinted::Any, _) => true,
            (Hinted::SameNode, Some(n)) => e.hints.for_nodes().contains(&n.name),
            (Hinted::SameZone, Some(NodeInfo { zone: Some(z), .. })) => {
                e.hints.for_zones().contains(z)
            }
            _ => false,
        }
    }
}

/// What `categorize` decides once for a whole Service port; where each
/// endpoint goes follows from it and from the endpoint alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    uses_cluster: bool,
    uses_local: bool,
    hints: Hinted,
    /// No ready endpoint is allowed: the cluster's serving-terminating ones.
    cluster_fallback: bool,
    /// None of this node's is ready: its serving-terminating ones.
    local_fallback: bool,
    /// Whether the Service port has any usable endpoint anywhere.
    pub has_any: bool,
}

impl Choice {
    pub fn in_cluster(&self, e: &PortEndpoint, node: Option<&NodeInfo>) -> bool {
        self.uses_cluster
            && if self.cluster_fallback {
                e.conditions.serving_terminating()
            } else {
                e.conditions.ready && self.hints.allows(e, node)
            }
    }

    pub fn in_local(&self, e: &PortEndpoint, node: Option<&NodeInfo>) -> bool {
        self.uses_local
            && e.is_on(node)
            && if self.local_fallback {
                e.conditions.serving_terminating()
            } else {
                e.conditions.ready
            }
    }

    /// The endpoints in their places, in the order given.
    pub fn categorize<'a>(
        &self,
        eps: impl Iterator<Item = &'a PortEndpoint> + Clone,
        node: Option<&NodeInfo>,
    ) -> Categorized<'a> {
        Categorized {
            cluster: eps.clone().filter(|e| self.in_cluster(e, node)).collect(),
            local: eps.filter(|e| self.in_local(e, node)).collect(),
            has_any: self.has_any,
            here: None,
        }
    }
}

/// kube-proxy's endpoint categorisation: cluster endpoints (ready, topology
/// hints honoured, else serving-terminating), local ones (this node's ready,
/// else its serving-terminating), and whether any endpoint is usable at all.
pub fn categorize<'a>(
    svc: &Service,
    eps: &'a [PortEndpoint],
    node: Option<&NodeInfo>,
) -> Categorized<'a> {
    Tally::of(eps, node)
        .choice(svc, node)
        .categorize(eps.iter(), node)
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
        let mut svc = crate::testbed::synthetic::service(1);
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
