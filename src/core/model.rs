//! The validated model of what kube-nft proxies: Services, their ports, and their
//! endpoints merged from every EndpointSlice. Plain data, the same for every
//! dataplane; `convert` is the only way in from the Kubernetes API types.

use crate::core::endpoint_key::EndpointKey;
use crate::core::net::{Family, Protocol};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Services labelled with this belong to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// On a Service or an EndpointSlice: no proxy serves it (kube-proxy's informers
/// select `!service.kubernetes.io/headless`, so one that gains the label is
/// gone for it).
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServiceKey {
    /// Shared (`name`): the model, its footprints and the store each keep a
    /// Service's key, and a cluster has far fewer namespaces than Services.
    pub namespace: Name,
    pub name: String,
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An object that failed validation, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// `Service default/web`, `EndpointSlice default/web-abc12`, or a file position.
    pub object: String,
    pub field: String,
    pub reason: String,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.object, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.object, self.field, self.reason)
        }
    }
}

impl std::error::Error for Rejected {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Empty for the single unnamed port a Service may have.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub target_port: TargetPort,
    /// Set for NodePort and LoadBalancer Services (unless node ports are not allocated).
    pub node_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Service {
    pub key: ServiceKey,
    /// One per IP family the Service has (dual-stack Services have two).
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip`, except those with `ipMode: Proxy`
    /// (the load balancer proxies those itself, so the node must not capture them).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`: who may reach the load balancer IPs.
    pub source_ranges: Vec<IpNet>,
    /// `externalTrafficPolicy: Local` on a Service reachable from outside.
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP`, with its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    /// The `kube-nft.io/ipvs-scheduler` annotation (IPVS backend only).
    pub ipvs_scheduler: Option<String>,
    /// Its flows' own conntrack timeouts (`kube-nft.io/conntrack-*-timeout`;
    /// nftables backend only).
    pub conntrack_timeouts: ConntrackTimeouts,
    /// `kube-nft.io/traffic-hint: LongLived`: its established flows take the
    /// flowtable fast path (nftables backend, on a kernel with flowtables).
    pub long_lived: bool,
}

/// A Service's own conntrack timeouts, in seconds; `None` keeps the node's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConntrackTimeouts {
    /// `kube-nft.io/conntrack-tcp-established-timeout`: an established TCP
    /// connection's idle timeout.
    pub tcp_established: Option<u32>,
    /// `kube-nft.io/conntrack-udp-timeout`: a UDP flow's idle timeout, replied
    /// to or not.
    pub udp: Option<u32>,
}

/// The annotations that set `ConntrackTimeouts`, as Go durations (`5s`, `24h`).
pub const CONNTRACK_TCP_ESTABLISHED_TIMEOUT_ANNOTATION: &str =
    "kube-nft.io/conntrack-tcp-established-timeout";
pub const CONNTRACK_UDP_TIMEOUT_ANNOTATION: &str = "kube-nft.io/conntrack-udp-timeout";

/// The longest conntrack timeout a Service may set: the kernel keeps timeouts in
/// jiffies of 32 bits, which at 1000 Hz overflow after 49 days.
pub const MAX_CONNTRACK_TIMEOUT: u32 = 30 * 86400;

/// Marks a Service whose flows are long-lived (`LongLived`, the one value), so
/// that they are offloaded to the fast path; named after the traffic hint
/// KEP-4963 proposed for the Service API, so that it can follow that field.
pub const TRAFFIC_HINT_ANNOTATION: &str = "kube-nft.io/traffic-hint";

/// Picks this Service's IPVS scheduler over `--ipvs-scheduler`.
pub const IPVS_SCHEDULER_ANNOTATION: &str = "kube-nft.io/ipvs-scheduler";

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

impl Service {
    /// The ClusterIP of one family, if the Service has that family.
    pub fn cluster_ip_of(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips
            .iter()
            .copied()
            .find(|ip| Family::of(ip) == family)
    }

    /// Whether the Service has destinations outside its ClusterIPs.
    pub fn externally_accessible(&self) -> bool {
        self.ports.iter().any(|p| p.node_port.is_some())
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// kube-proxy's `UsesClusterEndpoints`: some traffic may go to any endpoint.
    /// With both policies Local, a Service reachable from outside still does:
    /// its pods' and this node's traffic to an external address is subject to
    /// neither policy (as if it had gone out to a load balancer and come back).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// kube-proxy's `UsesLocalEndpoints`: some traffic goes to this node's only.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }

    /// `ns/name:port`, the name kube-proxy users know a Service port by (the port
    /// number stands in for the name of an unnamed port).
    pub fn port_label(&self, port: &ServicePort) -> String {
        if port.name.is_empty() {
            format!("{}:{}", self.key, port.port)
        } else {
            format!("{}:{}", self.key, port.name)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Conditions {
    /// Still serving while terminating: used when no endpoint is ready.
    pub fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

/// A node's or a zone's name, as endpoints carry it. A cluster has a million
/// endpoints and a few thousand nodes: each name is kept once (`name`), and an
/// endpoint holds a reference to it (a `String` each was 120 MiB at 100k
/// Services × 10). A thin pointer: an endpoint carries two, and `Arc<str>`
/// would make each twice as wide (16 MiB more at a million endpoints).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<String>);

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl Default for Name {
    fn default() -> Name {
        name("")
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        name(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        name(&s)
    }
}

/// Names interned, and how many there were when those nobody held were last
/// let go.
#[derive(Default)]
struct Names {
    names: HashSet<Name>,
    after_last_purge: usize,
}

/// The one copy of a node's, a zone's or a namespace's name. Names that nothing
/// holds any more (a namespace deleted, a node gone) are let go each time the
/// set has doubled, so a cluster that makes and deletes namespaces all day
/// does not grow it.
pub fn name(s: &str) -> Name {
    static NAMES: OnceLock<Mutex<Names>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.names.get(s) {
        return n.clone();
    }
    if names.names.len() >= 2 * names.after_last_purge.max(64) {
        names.names.retain(|n| Arc::strong_count(&n.0) > 1);
        names.after_last_purge = names.names.len();
    }
    let n = Name(Arc::new(s.to_owned()));
    names.names.insert(n.clone());
    n
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub conditions: Conditions,
    pub node_name: Option<Name>,
    pub zone: Option<Name>,
    pub hints: Hints,
}

/// Topology hints the EndpointSlice controller writes (from `trafficDistribution`).
/// Most endpoints have none, and a cluster has 100k endpoints or more: boxed, so
/// an endpoint without hints carries one pointer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hints(Option<Box<HintLists>>);

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct HintLists {
    for_zones: Vec<String>,
    for_nodes: Vec<String>,
}

impl Hints {
    pub fn new(for_zones: Vec<String>, for_nodes: Vec<String>) -> Hints {
        if for_zones.is_empty() && for_nodes.is_empty() {
            return Hints(None);
        }
        Hints(Some(Box::new(HintLists {
            for_zones,
            for_nodes,
        })))
    }

    pub fn for_zones(&self) -> &[String] {
        self.0.as_ref().map_or(&[], |h| &h.for_zones)
    }

    pub fn for_nodes(&self) -> &[String] {
        self.0.as_ref().map_or(&[], |h| &h.for_nodes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// One EndpointSlice, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    pub name: String,
    pub service: ServiceKey,
    pub family: Family,
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

/// An endpoint of one Service port: an address with the port to DNAT to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEndpoint {
    pub addr: IpAddr,
    pub port: u16,
    pub conditions: Conditions,
    pub node_name: Option<Name>,
    pub zone: Option<Name>,
    pub hints: Hints,
}

impl PortEndpoint {
    pub fn key(&self) -> EndpointKey {
        EndpointKey::new(self.addr, self.port)
    }

    /// Whether the endpoint runs on this node (never, when the node is unknown).
    pub fn is_on(&self, node: Option<&NodeInfo>) -> bool {
        node.is_some_and(|n| self.node_name.as_deref() == Some(n.name.as_str()))
    }

    /// Whether the endpoint may run on this node: it does, or its node or
    /// this node is not known.
    pub fn may_be_on(&self, node: Option<&NodeInfo>) -> bool {
        node.is_none() || self.node_name.is_none() || self.is_on(node)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    pub name: String,
    pub zone: Option<String>,
    /// The node's primary IPs, one per family: its first InternalIP of the family,
    /// else its first ExternalIP (as kube-proxy picks them).
    pub primary_ips: Vec<IpAddr>,
    /// `spec.podCIDRs`: this node's pods, for `detectLocalMode: NodeCIDR`.
    pub pod_cidrs: Vec<IpNet>,
    /// Known from its Node object, not only by name.
    pub from_object: bool,
    /// The Node is going away: it has a deletion timestamp, or the cluster
    /// autoscaler's `ToBeDeletedByClusterAutoscaler` taint (KEP-3836).
    pub leaving: bool,
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// The EndpointSlices of one Service, by name. Most Services have one or two,
/// so a sorted vector: a map would allocate a whole tree node per Service.
/// Each slice is shared (`Arc`), so that what synced a slice last can tell it
/// from its successor by address alone (`shared`): a change to a Service of
/// many slices is then found in the slices that changed, not in all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slices(Vec<Arc<EndpointSlice>>);

impl Slices {
    pub fn get(&self, name: &str) -> Option<&EndpointSlice> {
        self.find(name).ok().map(|i| &*self.0[i])
    }

    /// Adds the slice, or replaces the one of the same name (returned).
    pub fn insert(&mut self, slice: EndpointSlice) -> Option<Arc<EndpointSlice>> {
        let slice = Arc::new(slice);
        match self.find(&slice.name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i], slice)),
            Err(i) => {
                // Room for one more, not for four: most Services have one
                // slice per family (40 MiB at 100k Services).
                self.0.reserve_exact(1);
                self.0.insert(i, slice);
                None
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<EndpointSlice>> {
        self.find(name).ok().map(|i| self.0.remove(i))
    }

    pub fn values(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.0.iter().map(|s| &**s)
    }

    /// The slices, each as shared: a slice edited here is copied first if
    /// anything else holds it, so it is a new slice to them.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut EndpointSlice> {
        self.0.iter_mut().map(Arc::make_mut)
    }

    /// The slices as shared, in name order.
    pub fn shared(&self) -> &[Arc<EndpointSlice>] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|s| s.name.as_str().cmp(name))
    }
}

impl FromIterator<EndpointSlice> for Slices {
    fn from_iter<I: IntoIterator<Item = EndpointSlice>>(iter: I) -> Self {
        let mut slices = Slices::default();
        for s in iter {
            slices.insert(s);
        }
        slices
    }
}

/// Everything kube-nft proxies, as validated objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub services: BTreeMap<ServiceKey, Arc<Service>>,
    /// Slices by Service.
    pub slices: BTreeMap<ServiceKey, Slices>,
    pub node: Option<NodeInfo>,
}

/// A snapshot of a `ClusterState`, for another thread to read while the state
/// goes on changing (`nft::verifier`): its objects, shared. Taking it costs
/// the state's owner a pointer per object and no map; `to_state` builds the
/// maps, on the thread that reads them. (A clone of the maps, keys and all,
/// took 7.6 ms at 10k Services.)
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    services: Vec<Arc<Service>>,
    slices: Vec<Arc<EndpointSlice>>,
    node: Option<NodeInfo>,
}

impl Snapshot {
    pub fn to_state(&self) -> ClusterState {
        let mut state = ClusterState {
            node: self.node.clone(),
            ..ClusterState::default()
        };
        for svc in &self.services {
            state.services.insert(svc.key.clone(), svc.clone());
        }
        // Slices come grouped by Service and in name order, as kept.
        for slice in &self.slices {
            let slices = state.slices.entry(slice.service.clone()).or_default();
            slices.0.push(slice.clone());
        }
        state
    }
}

impl ClusterState {
    /// This state as it is now, for another thread (`Snapshot`).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            services: self.services.values().cloned().collect(),
            slices: self
                .slices
                .values()
                .flat_map(|s| s.0.iter().cloned())
                .collect(),
            node: self.node.clone(),
        }
    }

    /// Adds the Service, or replaces the one of its key. Services are shared
    /// (`Arc`), so that a `Snapshot` costs a pointer per Service.
    pub fn put_service(&mut self, svc: Service) -> Option<Arc<Service>> {
        self.services.insert(svc.key.clone(), Arc::new(svc))
    }

    /// The Service to change in place (copied first if a snapshot shares it).
    pub fn service_mut(&mut self, key: &ServiceKey) -> Option<&mut Service> {
        self.services.get_mut(key).map(Arc::make_mut)
    }

    /// The Services whose Service object or EndpointSlices differ in `other`.
    pub fn changed_services(&self, other: &ClusterState) -> Vec<ServiceKey> {
        let keys: BTreeSet<&ServiceKey> = self
            .services
            .keys()
            .chain(other.services.keys())
            .chain(self.slices.keys())
            .chain(other.slices.keys())
            .collect();
        keys.into_iter()
            .filter(|k| {
                self.services.get(*k) != other.services.get(*k)
                    || self.slices.get(*k) != other.slices.get(*k)
            })
            .cloned()
            .collect()
    }

    /// The endpoints of one Service port, merged over all its slices: matched by
    /// port name and protocol, de-duplicated by address and port. When two slices
    /// disagree about an endpoint, the one that is more ready wins (`prefer`).
    pub fn endpoints_for(&self, svc: &Service, port: &ServicePort) -> Vec<PortEndpoint> {
        let mut merged: BTreeMap<EndpointKey, PortEndpoint> = BTreeMap::new();
        let Some(slices) = self.slices.get(&svc.key) else {
            return Vec::new();
        };
        for candidate in slices.values().flat_map(|s| s.port_endpoints(port)) {
            merged
                .entry(candidate.key())
                .and_modify(|cur| {
                    if prefer(&candidate, cur) {
                        *cur = candidate.clone();
                    }
                })
                .or_insert(candidate);
        }
        merged.into_values().collect()
    }
}

impl EndpointSlice {
    /// Its endpoints as endpoints of the Service port `port` (matched by name
    /// and protocol), if it has that port.
    pub fn port_endpoints<'a>(
        &'a self,
        port: &ServicePort,
    ) -> impl Iterator<Item = PortEndpoint> + 'a {
        let number = self
            .ports
            .iter()
            .find(|p| p.name == port.name && p.protocol == port.protocol)
            .map(|p| p.port);
        number.into_iter().flat_map(move |number| {
            self.endpoints.iter().map(move |ep| PortEndpoint {
                addr: ep.addr,
                port: number,
                conditions: ep.conditions,
                node_name: ep.node_name.clone(),
                zone: ep.zone.clone(),
                hints: ep.hints.clone(),
            })
        })
    }
}

/// Of two slices' versions of one endpoint, whether `candidate` replaces
/// `current`: only when it is more ready, so the first slice keeps a tie.
pub fn prefer(candidate: &PortEndpoint, current: &PortEndpoint) -> bool {
    rank(&candidate.conditions) > rank(&current.conditions)
}

fn rank(c: &Conditions) -> u8 {
    (c.ready as u8) * 2 + c.serving as u8
}

#[cfg(test)]
mod tests {
    use crate::testbed::synthetic;

    #[test]
    fn a_name_nothing_holds_is_let_go() {
        let gone = super::name("a-namespace-deleted-long-ago");
        let weak = std::sync::Arc::downgrade(&gone.0);
        drop(gone);
        for i in 0..10_000 {
            super::name(&format!("a-namespace-made-and-deleted-{i}"));
        }
        assert!(weak.upgrade().is_none());
        let held = super::name("node-held");
        for i in 0..10_000 {
            super::name(&format!("another-namespace-{i}"));
        }
        assert!(std::sync::Arc::ptr_eq(&held.0, &super::name("node-held").0));
    }

    /// A cluster holds a million endpoints: each byte here is a mebibyte there.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_endpoint_is_48_bytes_and_its_names_are_shared() {
        assert_eq!(std::mem::size_of::<super::Endpoint>(), 48);
        let (a, b) = (super::name("node-7"), super::name("node-7"));
        assert!(std::sync::Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(
            (&*a, format!("{a:?}")),
            ("node-7", "\"node-7\"".to_string())
        );
    }

    #[test]
    fn a_snapshot_builds_the_state_it_was_taken_of() {
        let mut state = synthetic::state(40, 400);
        // A second slice of one Service, and the slice of a Service not (yet)
        // known.
        let mut second = synthetic::slice(7, &[synthetic::endpoint(7, 20)]);
        second.name = "svc-00007-second".into();
        state
            .slices
            .get_mut(&synthetic::service_key(7))
            .unwrap()
            .insert(second);
        let orphan = synthetic::slice(99, &[synthetic::endpoint(99, 0)]);
        state
            .slices
            .entry(synthetic::service_key(99))
            .or_default()
            .insert(orphan);
        let snapshot = state.snapshot();
        assert_eq!(snapshot.to_state(), state);
        // Later changes to the state are not the snapshot's.
        state.services.remove(&synthetic::service_key(3));
        assert_ne!(snapshot.to_state(), state);
    }
}
