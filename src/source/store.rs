//! The store: the model of the cluster, owned by the source side, in the manner
//! of kube-rs's reflector store. Every source (the API server's watches, or
//! manifest files read whole) reaches it through the same `Update`s, applied one
//! object at a time.
//!
//! Each object is converted on its own (a malformed one is dropped with a
//! `Rejected`, the rest go on), and a Service is reported changed only when what
//! it proxies actually changed. So a relist after a dropped or expired watch,
//! which repeats everything we already have, costs no rules. The engine takes
//! the changed keys (`take_changes`) and never writes the model.

use super::{Delta, Update};
use crate::core::convert::{
    convert_endpoint_slice, convert_node, convert_service, namespace_of, Converted,
};
use crate::core::model::{ClusterState, EndpointSlice, NodeInfo, Rejected, Service, ServiceKey};
use crate::core::net::Family;
use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::SystemTime;

/// Set by the EndpointSlice controller: when the change that this slice reflects
/// happened (a pod became ready, say). Network programming latency starts there.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The ServiceCIDR the API server creates from `--service-cluster-ip-range`.
pub const DEFAULT_SERVICE_CIDR: &str = "kubernetes";

/// What applying one update did, for logs and metrics.
#[derive(Debug, Default)]
pub struct UpdateOutcome {
    pub service_changes: usize,
    pub endpoint_changes: usize,
    pub rejected: Vec<Rejected>,
    /// Values skipped in Services that were kept (`convert_service`).
    pub skipped_values: Vec<Rejected>,
    /// The ServiceCIDRs changed: `service_cidrs()` has the new list.
    pub service_cidrs_changed: bool,
}

/// What the lists under way have brought so far: at the end of a list, what it
/// did not bring is gone.
#[derive(Debug, Default)]
struct Listing {
    services: Option<BTreeSet<ServiceKey>>,
    slices: Option<BTreeSet<(String, String)>>,
    /// This node's Node, if the list under way had it.
    node: Option<Option<core::Node>>,
    service_cidrs: Option<BTreeMap<String, Vec<IpNet>>>,
}

/// The keys a finished list did not bring: gone.
fn unseen<'a, K: Ord + Clone + 'a>(
    have: impl Iterator<Item = &'a K>,
    seen: Option<BTreeSet<K>>,
) -> Vec<K> {
    let seen = seen.unwrap_or_default();
    have.filter(|k| !seen.contains(*k)).cloned().collect()
}

/// What changed in the store since the engine last looked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub services: BTreeSet<ServiceKey>,
    /// This node's Node changed: it shapes every Service.
    pub node: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Service,
    Slice,
    Node,
    ServiceCidr,
}

pub struct ClusterStore {
    state: ClusterState,
    /// Services changed since the engine last took the changes.
    changed: BTreeSet<ServiceKey>,
    /// The node (its name, zone or addresses) changed: every Service is shaped by it.
    node_changed: bool,
    node_name: String,
    /// The Service each slice was filed under, so that a slice which is deleted,
    /// rejected or relabelled leaves the right Service.
    slice_owners: HashMap<(String, String), ServiceKey>,
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
    listed: BTreeSet<Kind>,
    /// The lists under way: what each has brought so far.
    listing: Listing,
    /// The earliest unprogrammed trigger time of each changed Service's
    /// EndpointSlices, per family.
    triggers: HashMap<(ServiceKey, Family), SystemTime>,
}

fn object_id(meta: &ObjectMeta) -> (String, String) {
    (namespace_of(meta), meta.name.clone().unwrap_or_default())
}

fn service_key(meta: &ObjectMeta) -> ServiceKey {
    let (namespace, name) = object_id(meta);
    ServiceKey {
        namespace: namespace.into(),
        name,
    }
}

fn trigger_time(meta: &ObjectMeta) -> Option<SystemTime> {
    let text = meta.annotations.as_ref()?.get(TRIGGER_TIME_ANNOTATION)?;
    let ts: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(ts))
}

/// A Service as the store takes it: converted by the thread that read it. The
/// API source reads on its own thread, and a list is 200k objects at 100k
/// Services: made there and freed on the store's thread, they kept both
/// threads in malloc's locks; now the API object is made, read and freed by
/// one, and only the model's Service crosses.
#[derive(Debug, Clone)]
pub struct ServiceObject {
    key: ServiceKey,
    /// What it proxies: `None` for a Service deleted, not proxied or rejected.
    converted: Option<Service>,
    rejected: Option<Rejected>,
    /// Values skipped in a Service that was kept (`convert_service`).
    skipped_values: Vec<Rejected>,
}

impl ServiceObject {
    pub fn read(svc: core::Service, present: bool) -> ServiceObject {
        let key = service_key(&svc.metadata);
        let mut object = ServiceObject {
            key,
            converted: None,
            rejected: None,
            skipped_values: Vec::new(),
        };
        if present {
            match convert_service(&svc, &mut object.skipped_values) {
                Ok(Converted::Valid(s)) => object.converted = Some(s),
                Ok(Converted::Skipped(why)) => {
                    tracing::debug!("Service {}: not proxied: {why:?}", object.key);
                }
                Err(r) => object.rejected = Some(r),
            }
        }
        object
    }
}

/// An EndpointSlice as the store takes it (`ServiceObject` says why).
#[derive(Debug, Clone)]
pub struct SliceObject {
    /// Namespace and name.
    id: (String, String),
    /// `None` for a slice deleted, not proxied or rejected.
    converted: Option<EndpointSlice>,
    rejected: Option<Rejected>,
    trigger_time: Option<SystemTime>,
}

impl SliceObject {
    pub fn read(slice: discovery::EndpointSlice, present: bool) -> SliceObject {
        let mut object = SliceObject {
            id: object_id(&slice.metadata),
            converted: None,
            rejected: None,
            trigger_time: None,
        };
        match present.then(|| convert_endpoint_slice(&slice)) {
            Some(Ok(Converted::Valid(s))) => {
                object.converted = Some(s);
                object.trigger_time = trigger_time(&slice.metadata);
            }
            Some(Err(r)) => object.rejected = Some(r),
            _ => {}
        }
        object
    }
}

/// A change to a Service as the store's update (`Update::Service`).
pub fn service_update(delta: Delta<core::Service>) -> Update {
    Update::Service(delta.map(ServiceObject::read))
}

/// A change to an EndpointSlice as the store's update (`Update::Slice`).
pub fn slice_update(delta: Delta<discovery::EndpointSlice>) -> Update {
    Update::Slice(delta.map(SliceObject::read))
}

impl ClusterStore {
    pub fn new(node_name: &str) -> ClusterStore {
        ClusterStore {
            state: ClusterState::default(),
            changed: BTreeSet::new(),
            node_changed: false,
            node_name: node_name.to_string(),
            slice_owners: HashMap::new(),
            service_cidrs: BTreeMap::new(),
            listed: BTreeSet::new(),
            listing: Listing::default(),
            triggers: HashMap::new(),
        }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The changes since the last call, for the engine's next sync.
    pub fn take_changes(&mut self) -> Changes {
        Changes {
            services: std::mem::take(&mut self.changed),
            node: std::mem::take(&mut self.node_changed),
        }
    }

    /// Sets (or, with `None`, removes) one Service. It is reported changed only
    /// if it changed, so a relist that repeats what we have costs no rules.
    fn set_service(&mut self, key: &ServiceKey, svc: Option<Service>) -> bool {
        if self.state.services.get(key).map(|s| &**s) == svc.as_ref() {
            return false;
        }
        match svc {
            Some(svc) => self
                .state
                .services
                .insert(key.clone(), std::sync::Arc::new(svc)),
            None => self.state.services.remove(key),
        };
        self.changed.insert(key.clone());
        true
    }

    /// Sets (or removes) one EndpointSlice of the Service `key`; reports the
    /// Service changed only if the slice changed.
    fn set_slice(&mut self, key: &ServiceKey, name: &str, slice: Option<EndpointSlice>) -> bool {
        let current = self.state.slices.get(key).and_then(|s| s.get(name));
        if current == slice.as_ref() {
            return false;
        }
        let slices = self.state.slices.entry(key.clone()).or_default();
        match slice {
            Some(slice) => {
                debug_assert_eq!(slice.name, name);
                slices.insert(slice);
            }
            None => {
                slices.remove(name);
                if slices.is_empty() {
                    self.state.slices.remove(key);
                }
            }
        }
        self.changed.insert(key.clone());
        true
    }

    fn set_node(&mut self, node: Option<NodeInfo>) {
        if self.state.node != node {
            self.state.node = node;
            self.node_changed = true;
        }
    }

    /// Every kind has been listed once: the model is complete enough to program
    /// (programming before would delete the rules of Services not yet seen).
    pub fn synced(&self) -> bool {
        self.listed.len() == 4
    }

    /// The Node kind has been listed: from here on, no Node object means none.
    pub fn node_listed(&self) -> bool {
        self.listed.contains(&Kind::Node)
    }

    /// The CIDRs of every ServiceCIDR object: the cluster's default one (named
    /// `kubernetes`) first, then the others by name.
    pub fn service_cidrs(&self) -> Vec<IpNet> {
        let default = self.service_cidrs.get(DEFAULT_SERVICE_CIDR);
        let others = self
            .service_cidrs
            .iter()
            .filter(|(name, _)| *name != DEFAULT_SERVICE_CIDR)
            .map(|(_, cidrs)| cidrs);
        default
            .into_iter()
            .chain(others)
            .flatten()
            .copied()
            .collect()
    }

    /// Removes and returns the trigger times of these Services (just
    /// programmed), with their EndpointSlices' family.
    pub fn take_triggers<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a ServiceKey>,
    ) -> Vec<(Family, SystemTime)> {
        let mut out = Vec::new();
        for key in services {
            for family in Family::ALL {
                if let Some(t) = self.triggers.remove(&(key.clone(), family)) {
                    out.push((family, t));
                }
            }
        }
        out
    }

    /// Removes and returns every trigger time (after a full sync).
    pub fn take_all_triggers(&mut self) -> Vec<(Family, SystemTime)> {
        self.triggers
            .drain()
            .map(|((_, family), t)| (family, t))
            .collect()
    }

    pub fn apply(&mut self, update: Update) -> UpdateOutcome {
        let mut out = UpdateOutcome::default();
        match update {
            Update::Service(delta) => match delta {
                Delta::ListStarted => self.listing.services = Some(BTreeSet::new()),
                Delta::Listing(svc) => {
                    if let Some(seen) = &mut self.listing.services {
                        seen.insert(svc.key.clone());
                    }
                    self.apply_service(*svc, &mut out);
                }
                Delta::Listed => {
                    let seen = self.listing.services.take();
                    for key in unseen(self.state.services.keys(), seen) {
                        out.service_changes += self.set_service(&key, None) as usize;
                    }
                    self.listed.insert(Kind::Service);
                }
                Delta::Applied(svc) | Delta::Deleted(svc) => self.apply_service(*svc, &mut out),
            },
            Update::Slice(delta) => match delta {
                Delta::ListStarted => self.listing.slices = Some(BTreeSet::new()),
                Delta::Listing(slice) => {
                    if let Some(seen) = &mut self.listing.slices {
                        seen.insert(slice.id.clone());
                    }
                    self.apply_slice(*slice, &mut out);
                }
                Delta::Listed => {
                    let seen = self.listing.slices.take();
                    for id in unseen(self.slice_owners.keys(), seen) {
                        self.remove_slice(&id, &mut out);
                    }
                    self.listed.insert(Kind::Slice);
                }
                Delta::Applied(slice) | Delta::Deleted(slice) => self.apply_slice(*slice, &mut out),
            },
            Update::Node(delta) => {
                let mine = |n: &core::Node| n.metadata.name.as_deref() == Some(&self.node_name);
                let node = match delta {
                    Delta::ListStarted => {
                        self.listing.node = Some(None);
                        return out;
                    }
                    Delta::Listing(n) => {
                        if let (true, Some(found)) = (mine(&n), &mut self.listing.node) {
                            *found = Some(*n);
                        }
                        return out;
                    }
                    Delta::Listed => {
                        self.listed.insert(Kind::Node);
                        self.listing.node.take().flatten()
                    }
                    Delta::Applied(n) if mine(&n) => Some(*n),
                    Delta::Deleted(n) if mine(&n) => None,
                    _ => return out,
                };
                self.apply_node(node.as_ref(), &mut out);
            }
            Update::ServiceCidr(delta) => {
                let before = self.service_cidrs();
                match delta {
                    Delta::ListStarted => self.listing.service_cidrs = Some(BTreeMap::new()),
                    Delta::Listing(obj) => {
                        if let Some(listed) = &mut self.listing.service_cidrs {
                            apply_service_cidr(listed, &obj, true, &mut out);
                        }
                    }
                    Delta::Listed => {
                        self.service_cidrs = self.listing.service_cidrs.take().unwrap_or_default();
                        self.listed.insert(Kind::ServiceCidr);
                    }
                    Delta::Applied(obj) => {
                        apply_service_cidr(&mut self.service_cidrs, &obj, true, &mut out)
                    }
                    Delta::Deleted(obj) => {
                        apply_service_cidr(&mut self.service_cidrs, &obj, false, &mut out)
                    }
                }
                out.service_cidrs_changed = self.service_cidrs() != before;
            }
        }
        out
    }

    fn apply_service(&mut self, svc: ServiceObject, out: &mut UpdateOutcome) {
        out.rejected.extend(svc.rejected);
        out.skipped_values.extend(svc.skipped_values);
        out.service_changes += self.set_service(&svc.key, svc.converted) as usize;
    }

    fn apply_slice(&mut self, slice: SliceObject, out: &mut UpdateOutcome) {
        let id = slice.id;
        out.rejected.extend(slice.rejected);
        let Some(converted) = slice.converted else {
            return self.remove_slice(&id, out);
        };
        let owner = converted.service.clone();
        let converted_family = converted.family;
        if self.slice_owners.get(&id).is_some_and(|o| *o != owner) {
            self.remove_slice(&id, out);
        }
        self.slice_owners.insert(id.clone(), owner.clone());
        if self.set_slice(&owner, &id.1, Some(converted)) {
            out.endpoint_changes += 1;
            if let Some(t) = slice.trigger_time {
                let family = converted_family;
                let earliest = self.triggers.entry((owner, family)).or_insert(t);
                *earliest = (*earliest).min(t);
            }
        }
    }

    fn remove_slice(&mut self, id: &(String, String), out: &mut UpdateOutcome) {
        if let Some(owner) = self.slice_owners.remove(id) {
            out.endpoint_changes += self.set_slice(&owner, &id.1, None) as usize;
        }
    }

    fn apply_node(&mut self, node: Option<&core::Node>, out: &mut UpdateOutcome) {
        let info = match node.map(convert_node) {
            Some(Ok(info)) => info,
            Some(Err(r)) => {
                // Keep what we knew of the node rather than forget its addresses.
                out.rejected.push(r);
                return;
            }
            // Without its Node object, this node is still known by name (for locality).
            None => NodeInfo {
                name: self.node_name.clone(),
                ..NodeInfo::default()
            },
        };
        self.set_node(Some(info));
    }
}

/// Records (or forgets) one ServiceCIDR's CIDRs in `cidrs`; a CIDR that does not
/// parse rejects the object and keeps what `cidrs` had for it.
fn apply_service_cidr(
    cidrs: &mut BTreeMap<String, Vec<IpNet>>,
    obj: &ServiceCIDR,
    present: bool,
    out: &mut UpdateOutcome,
) {
    let name = obj.metadata.name.clone().unwrap_or_default();
    if !present {
        cidrs.remove(&name);
        return;
    }
    let listed = obj.spec.as_ref().and_then(|s| s.cidrs.as_deref());
    let mut parsed = Vec::new();
    for (i, c) in listed.unwrap_or_default().iter().enumerate() {
        match c.parse::<IpNet>() {
            Ok(net) => parsed.push(net.trunc()),
            Err(_) => {
                out.rejected.push(Rejected {
                    object: format!("ServiceCIDR {name}"),
                    field: format!("spec.cidrs[{i}]"),
                    reason: format!("{c:?} is not a CIDR"),
                });
                return;
            }
        }
    }
    cidrs.insert(name, parsed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::list_updates;

    fn service(name: &str, ip: &str) -> core::Service {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}"
        ))
        .unwrap()
    }

    fn apply_all(store: &mut ClusterStore, updates: Vec<Update>) {
        for u in updates {
            store.apply(u);
        }
    }

    fn names(store: &ClusterStore) -> Vec<String> {
        store
            .state()
            .services
            .keys()
            .map(|k| k.name.clone())
            .collect()
    }

    #[test]
    fn the_store_is_synced_once_every_kind_is_listed_and_lists_arrive_object_by_object() {
        let mut store = ClusterStore::new("node-a");
        apply_all(
            &mut store,
            list_updates(
                vec![service("a", "10.96.0.1"), service("b", "10.96.0.2")],
                service_update,
            )
            .collect(),
        );
        assert_eq!(names(&store), ["a", "b"]);
        assert!(
            !store.synced(),
            "slices, nodes and ServiceCIDRs are not listed yet"
        );
        apply_all(&mut store, list_updates(Vec::new(), slice_update).collect());
        apply_all(&mut store, list_updates(Vec::new(), Update::Node).collect());
        apply_all(
            &mut store,
            list_updates(Vec::new(), Update::ServiceCidr).collect(),
        );
        assert!(store.synced());
        let changes = store.take_changes();
        assert_eq!(changes.services.len(), 2);
        assert!(changes.node, "this node became known, by name");
    }

    #[test]
    fn a_relist_changes_what_differs_and_removes_what_it_lacks_only_at_its_end() {
        let mut store = ClusterStore::new("node-a");
        apply_all(
            &mut store,
            list_updates(
                vec![service("a", "10.96.0.1"), service("b", "10.96.0.2")],
                service_update,
            )
            .collect(),
        );
        store.take_changes();
        // The same list again: nothing changes.
        apply_all(
            &mut store,
            list_updates(
                vec![service("a", "10.96.0.1"), service("b", "10.96.0.2")],
                service_update,
            )
            .collect(),
        );
        assert!(store.take_changes().services.is_empty());
        // A relist without b and with a changed: a changes at once, b goes at the end.
        store.apply(service_update(Delta::ListStarted));
        store.apply(service_update(Delta::Listing(Box::new(service(
            "a",
            "10.96.0.9",
        )))));
        assert_eq!(
            names(&store),
            ["a", "b"],
            "nothing is deleted before the list ends"
        );
        let out = store.apply(service_update(Delta::Listed));
        assert_eq!(out.service_changes, 1);
        assert_eq!(names(&store), ["a"]);
        let changed: Vec<String> = store
            .take_changes()
            .services
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert_eq!(changed, ["a", "b"]);
    }

    /// Upstream e2e `[sig-network] Services should implement
    /// service.kubernetes.io/headless`: an EndpointSlice that gains the label
    /// is gone for a proxy (kube-proxy's informers select it away), so its
    /// Service is left without endpoints.
    #[test]
    fn an_endpoint_slice_labelled_headless_is_gone_for_its_service() {
        let slice = |labels: &str| -> discovery::EndpointSlice {
            serde_saphyr::from_str(&format!(
                "metadata: {{name: a-1, namespace: default, labels: {{kubernetes.io/service-name: a{labels}}}}}\naddressType: IPv4\nports: [{{port: 8090}}]\nendpoints: [{{addresses: [10.244.1.5], conditions: {{ready: true}}}}]"
            ))
            .unwrap()
        };
        let mut store = ClusterStore::new("node-a");
        store.apply(service_update(Delta::Applied(Box::new(service(
            "a",
            "10.96.0.1",
        )))));
        store.apply(slice_update(Delta::Applied(Box::new(slice("")))));
        let endpoints = |store: &ClusterStore| {
            store
                .state()
                .slices
                .values()
                .flat_map(|s| s.values())
                .map(|s| s.endpoints.len())
                .sum::<usize>()
        };
        assert_eq!(endpoints(&store), 1);
        let out = store.apply(slice_update(Delta::Applied(Box::new(slice(
            ", service.kubernetes.io/headless: ''",
        )))));
        assert_eq!(out.endpoint_changes, 1);
        assert_eq!(endpoints(&store), 0);
        assert!(out.rejected.is_empty());
    }
}
