//! A large Service's endpoints as its last sync left them, so that the next
//! partial sync finds what changed in the EndpointSlices that changed, not by
//! merging and choosing among all of the Service's endpoints again.
//!
//! A change to a Service comes as one EndpointSlice (at most 1,000 endpoints,
//! 100 as the EndpointSlice controller writes them), while the Service may
//! have tens of thousands. Slices are shared (`Arc`) between the model and
//! this memo, so the changed ones are told by address. Their endpoints are
//! merged into the memo's per port; the counts that decide kube-proxy's
//! choice (`core::policy::Tally`) are kept as they go; and if the choice is
//! the one before, every endpoint but the changed ones keeps its place, so
//! each port's change is the few endpoints that left or joined its lists.
//!
//! The memo gives up (`advance` returns `None`, and the Service is recomputed
//! whole, as every Service was before) whenever the change is not one of
//! endpoints alone: the Service object or the node changed, the choice
//! changed (the last ready endpoint went, topology hints came or went), or an
//! endpoint of a changed slice is also in another slice, whose version may
//! win.
//!
//! What it does not own: the slots (`slots`, and the planner's footprints),
//! and kube-proxy's rules themselves (`core::policy`).

use crate::core::model::{
    prefer, ClusterState, EndpointSlice, NodeInfo, PortEndpoint, Service, ServicePort,
};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::core::policy::{Categorized, Choice, Tally};
use crate::nft::slots::SlotKey;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// Services with fewer endpoints are recomputed whole: cheap at their size,
/// and a memo for each of a hundred thousand small Services would double
/// their memory.
pub const LARGE: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointMemo {
    svc: Service,
    node: Option<NodeInfo>,
    family: Family,
    /// The Service's slices as last synced, in name order.
    slices: Vec<Arc<EndpointSlice>>,
    /// Per Service port, in the Service's order.
    ports: Vec<PortMemo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PortMemo {
    merged: MergedEndpoints,
    tally: Tally,
    choice: Choice,
    here: HairpinPlaces,
}

/// The addresses of a port's chosen endpoints that may be on this node (its
/// hairpin addresses), with how many places each has: an endpoint in both
/// lists, or two ports of one address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct HairpinPlaces(BTreeMap<IpAddr, u32>);

impl HairpinPlaces {
    /// Counts `ep`'s places, as `choice` gives them, in or out.
    fn count(&mut self, choice: &Choice, ep: &PortEndpoint, node: Option<&NodeInfo>, add: bool) {
        if !ep.may_be_on(node) {
            return;
        }
        let places = u32::from(choice.in_cluster(ep, node)) + u32::from(choice.in_local(ep, node));
        if places == 0 {
            return;
        }
        let n = self.0.entry(ep.addr).or_insert(0);
        if add {
            *n += places;
        } else {
            *n -= places;
            if *n == 0 {
                self.0.remove(&ep.addr);
            }
        }
    }
}

/// A port's endpoints, merged: side by side in one vector (walked for the
/// lists of every change), found by key through a map of positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MergedEndpoints {
    all: Vec<Merged>,
    at: HashMap<SlotKey, u32>,
}

impl MergedEndpoints {
    fn get(&self, key: &SlotKey) -> Option<&Merged> {
        self.at.get(key).map(|i| &self.all[*i as usize])
    }

    fn get_mut(&mut self, key: &SlotKey) -> Option<&mut Merged> {
        self.at.get(key).map(|i| &mut self.all[*i as usize])
    }

    fn insert(&mut self, m: Merged) {
        match self.at.get(&m.ep.key()) {
            Some(i) => self.all[*i as usize] = m,
            None => {
                self.at.insert(m.ep.key(), self.all.len() as u32);
                self.all.push(m);
            }
        }
    }

    fn remove(&mut self, key: &SlotKey) {
        let Some(i) = self.at.remove(key) else {
            return;
        };
        self.all.swap_remove(i as usize);
        if let Some(moved) = self.all.get(i as usize) {
            self.at.insert(moved.ep.key(), i);
        }
    }

    /// Another slice's version of an endpoint: one source more, and the more
    /// ready version kept (`prefer`).
    fn merge(&mut self, ep: PortEndpoint) {
        match self.get_mut(&ep.key()) {
            Some(m) => {
                m.sources += 1;
                if prefer(&ep, &m.ep) {
                    m.ep = ep;
                }
            }
            None => self.insert(Merged { ep, sources: 1 }),
        }
    }

    fn values(&self) -> std::slice::Iter<'_, Merged> {
        self.all.iter()
    }
}

/// One endpoint of a port, merged over the slices that have it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Merged {
    ep: PortEndpoint,
    /// How many slices have it.
    sources: u32,
}

/// How one list of a port's chosen endpoints changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListChange {
    pub gone: Vec<SlotKey>,
    pub came: Vec<SlotKey>,
}

/// How one port's chosen endpoints changed: the cluster list and the local.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortChange {
    pub cluster: ListChange,
    pub local: ListChange,
}

impl PortChange {
    pub fn of(&self, local: bool) -> &ListChange {
        if local {
            &self.local
        } else {
            &self.cluster
        }
    }
}

/// One changed slice: its version last synced and its version now.
type SliceChange<'a> = (Option<&'a EndpointSlice>, Option<&'a EndpointSlice>);

impl EndpointMemo {
    /// The memo of a Service in `family`, if it is large and picks through the
    /// shared chains (no session affinity, not the IPVS flavour).
    pub fn remember(
        state: &ClusterState,
        svc: &Service,
        family: Family,
        config: &NodeConfig,
    ) -> Option<EndpointMemo> {
        if config.mode.is_ipvs() || svc.affinity_timeout.is_some() {
            return None;
        }
        let slices = state.slices.get(&svc.key)?;
        let size: usize = slices.values().map(|s| s.endpoints.len()).sum();
        if size < LARGE {
            return None;
        }
        let node = state.node.as_ref();
        let ports = svc
            .ports
            .iter()
            .map(|port| {
                let mut merged = MergedEndpoints::default();
                for ep in slices
                    .values()
                    .flat_map(|s| of_family(Some(s), port, family))
                {
                    merged.merge(ep);
                }
                let tally = Tally::of(merged.values().map(|m| &m.ep), node);
                let choice = tally.choice(svc, node);
                let mut here = HairpinPlaces::default();
                for m in merged.values() {
                    here.count(&choice, &m.ep, node, true);
                }
                PortMemo {
                    merged,
                    tally,
                    choice,
                    here,
                }
            })
            .collect();
        Some(EndpointMemo {
            svc: svc.clone(),
            node: state.node.clone(),
            family,
            slices: slices.shared().to_vec(),
            ports,
        })
    }

    /// Brings the memo up to `state`, from the slices that changed, and
    /// returns each port's change; `None` if the change is not one of
    /// endpoints alone (the module's comment), and the memo is then not to
    /// be used again.
    pub fn advance(&mut self, state: &ClusterState, svc: &Service) -> Option<Vec<PortChange>> {
        if *svc != self.svc || state.node != self.node {
            return None;
        }
        let now: &[Arc<EndpointSlice>] = state
            .slices
            .get(&svc.key)
            .map(|s| s.shared())
            .unwrap_or_default();
        let changed = changed_slices(&self.slices, now);
        let mut changes = Vec::with_capacity(self.ports.len());
        for (memo, port) in self.ports.iter_mut().zip(&svc.ports) {
            changes.push(memo.advance(&changed, port, self.family, svc, self.node.as_ref())?);
        }
        self.slices = now.to_vec();
        Some(changes)
    }

    /// The endpoints chosen for the Service's port `port`, as of the last
    /// `advance`, in no particular order.
    pub fn chosen(&self, port: usize) -> Categorized<'_> {
        let memo = &self.ports[port];
        let mut chosen = memo
            .choice
            .categorize(memo.merged.values().map(|m| &m.ep), self.node.as_ref());
        chosen.here = Some(memo.here.0.keys().copied().collect());
        chosen
    }
}

/// The slices that differ between two name-ordered lists, by name; a slice
/// whose version is the same object in both is unchanged.
fn changed_slices<'a>(
    before: &'a [Arc<EndpointSlice>],
    now: &'a [Arc<EndpointSlice>],
) -> Vec<SliceChange<'a>> {
    let mut changed = Vec::new();
    let (mut b, mut n) = (before.iter().peekable(), now.iter().peekable());
    loop {
        let order = match (b.peek(), n.peek()) {
            (None, None) => return changed,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => x.name.cmp(&y.name),
        };
        match order {
            std::cmp::Ordering::Less => changed.push((b.next().map(|s| &**s), None)),
            std::cmp::Ordering::Greater => changed.push((None, n.next().map(|s| &**s))),
            std::cmp::Ordering::Equal => {
                let (x, y) = (b.next().unwrap(), n.next().unwrap());
                if !Arc::ptr_eq(x, y) {
                    changed.push((Some(&**x), Some(&**y)));
                }
            }
        }
    }
}

/// A slice's endpoints of `port` in `family`.
fn of_family<'a>(
    slice: Option<&'a EndpointSlice>,
    port: &'a ServicePort,
    family: Family,
) -> impl Iterator<Item = PortEndpoint> + 'a {
    slice
        .into_iter()
        .flat_map(move |s| s.port_endpoints(port))
        .filter(move |e| Family::of(&e.addr) == family)
}

/// One endpoint key's versions in the changed slices: how many slices had it
/// and the one that won, before and now.
#[derive(Default)]
struct Touched {
    before: u32,
    now: u32,
    now_best: Option<PortEndpoint>,
}

impl PortMemo {
    fn advance(
        &mut self,
        changed: &[SliceChange],
        port: &ServicePort,
        family: Family,
        svc: &Service,
        node: Option<&NodeInfo>,
    ) -> Option<PortChange> {
        let mut touched: HashMap<SlotKey, Touched> = HashMap::new();
        for (before, now) in changed {
            for ep in of_family(*before, port, family) {
                touched.entry(ep.key()).or_default().before += 1;
            }
            for ep in of_family(*now, port, family) {
                let t = touched.entry(ep.key()).or_default();
                t.now += 1;
                match &t.now_best {
                    Some(best) if !prefer(&ep, best) => {}
                    _ => t.now_best = Some(ep),
                }
            }
        }
        let before = self.choice;
        // Each endpoint that changed, and the lists it was in.
        let mut moved: Vec<(SlotKey, bool, bool)> = Vec::new();
        for (key, t) in touched {
            let old = self.merged.get(&key);
            if old.map_or(0, |m| m.sources) != t.before {
                // An unchanged slice has it too: its version may win.
                return None;
            }
            let was = old.map_or((false, false), |m| {
                (before.in_cluster(&m.ep, node), before.in_local(&m.ep, node))
            });
            match (old, t.now_best) {
                (Some(m), Some(ep)) if m.ep == ep => {
                    if t.now != m.sources {
                        self.merged.get_mut(&key)?.sources = t.now;
                    }
                    continue;
                }
                (old, now) => {
                    if let Some(m) = old {
                        self.here.count(&before, &m.ep, node, false);
                        self.tally.remove(&m.ep, node);
                    }
                    match now {
                        Some(ep) => {
                            self.tally.add(&ep, node);
                            self.merged.insert(Merged { ep, sources: t.now });
                        }
                        None => {
                            self.merged.remove(&key);
                        }
                    }
                }
            }
            moved.push((key, was.0, was.1));
        }
        self.choice = self.tally.choice(svc, node);
        if self.choice != before {
            return None;
        }
        let mut change = PortChange::default();
        for (key, was_cluster, was_local) in moved {
            let now = self.merged.get(&key).map(|m| &m.ep);
            if let Some(ep) = now {
                self.here.count(&self.choice, ep, node, true);
            }
            let (is_cluster, is_local) = now.map_or((false, false), |ep| {
                (
                    self.choice.in_cluster(ep, node),
                    self.choice.in_local(ep, node),
                )
            });
            for (list, was, is) in [
                (&mut change.cluster, was_cluster, is_cluster),
                (&mut change.local, was_local, is_local),
            ] {
                match (was, is) {
                    (true, false) => list.gone.push(key),
                    (false, true) => list.came.push(key),
                    _ => {}
                }
            }
        }
        Some(change)
    }
}
