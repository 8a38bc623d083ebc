//! The proxy's sync engine: the model, what has been applied per Service, and the
//! two kinds of sync that bring the kernel to the desired state.
//!
//! - A **full sync** reads our tables back (compactly, see `netlink::view`), diffs
//!   them against the whole desired ruleset and sends only the difference. It runs
//!   at start (so a restart over a correct ruleset writes nothing), periodically,
//!   after any failed transaction, and when someone else changed our table.
//! - A **partial sync** recomputes only the Services marked dirty since the last
//!   sync and sends only what they changed; its cost follows the change, not the
//!   cluster. It trusts what the last sync applied, and re-reads only the chains
//!   it edits (for their rule handles and current endpoint slots).
//!
//! Either way the changes go out as one atomic transaction; if the kernel refuses
//! it nothing changed, and the next sync is a full one.
//!
//! With the IPVS backend the same syncs run over the nftables table that IPVS
//! mode keeps, and then over IPVS (`ipvs::IpvsTables`) for the same Services:
//! full after full, partial after partial.

use crate::core::convert::{build_state, Objects, Validated};
use crate::core::model::{ClusterState, EndpointSlice, NodeInfo, Rejected, Service, ServiceKey};
use crate::core::node_config::NodeConfig;
use crate::ipvs::{BackendError, IpvsReport, IpvsTables};
use crate::netlink::objects::{KernelChain, KernelCounter, KernelElement, KernelSet};
use crate::netlink::{Committed, KernelTable, NftError, NftSocket};
use crate::nft::lower::{lower_chain, lower_counter, lower_element, lower_set, lower_table};
use crate::nft::names::{table_ids, SET_HAIRPIN};
use crate::nft::plan::{diff_rules, Plan};
use crate::nft::service::service_rules;
use crate::nft::skeleton::skeleton_of;
use crate::nft::slots::{SlotHints, SlotKey};
use crate::nft::translate::{
    hairpin_element, node_elements, translate, translate_with_hints, Ruleset,
};
use crate::nft::view::{slots, RuleView, TableView};
use crate::ruleset::{Family, Mapped, TableId};
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Validates the objects and computes the desired ruleset, logging each rejected
/// object; the others still go through.
pub fn desired(
    objects: &Objects,
    node_name: Option<&str>,
    config: &NodeConfig,
) -> (Ruleset, Validated) {
    let validated = validate(objects, node_name);
    (translate(&validated.state, config), validated)
}

/// Validates the objects, logging each one rejected or skipped.
pub fn validate(objects: &Objects, node_name: Option<&str>) -> Validated {
    let validated = build_state(objects, node_name);
    log_rejected(&validated.rejected);
    for (object, why) in &validated.skipped {
        tracing::debug!("{object}: not proxied ({why:?})");
    }
    validated
}

pub fn log_rejected(rejected: &[Rejected]) {
    for r in rejected {
        tracing::warn!(object = %r.object, field = %r.field, "rejected: {r}");
    }
}

pub fn lowered(ruleset: &Ruleset) -> Vec<KernelTable> {
    ruleset.tables.iter().map(lower_table).collect()
}

/// Programs `ruleset` into the current network namespace, replacing our tables
/// whole (what `nft -f` of `kube-nft render` does) and removing any of ours it
/// does not have.
pub fn apply(sock: &mut NftSocket, ruleset: &Ruleset) -> Result<Committed, NftError> {
    let tables = lowered(ruleset);
    let unused = all_tables().filter(|id| !tables.iter().any(|t| t.id() == *id));
    let mut batch = crate::netlink::nftables::delete_tables(unused);
    crate::netlink::nftables::replace_tables(&mut batch, &tables);
    sock.commit(batch)
}

/// Every table kube-nft may own, in both families.
fn all_tables() -> impl Iterator<Item = TableId> {
    Family::ALL.into_iter().flat_map(TableId::all_of)
}

/// Removes our tables from the current network namespace, touching nothing else.
pub fn cleanup(sock: &mut NftSocket) -> Result<Committed, NftError> {
    sock.commit(crate::netlink::nftables::delete_tables(all_tables()))
}

/// Reads our tables back and says whether the kernel holds exactly `ruleset`.
pub fn kernel_matches(sock: &mut NftSocket, ruleset: &Ruleset) -> Result<bool, NftError> {
    for want in lowered(ruleset) {
        let Some(got) = sock.read_table(want.family, &want.name)? else {
            return Ok(false);
        };
        if !same_table(&want, &got) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Equal as programmed: the same sets, elements, chains and rules, handles and
/// counters ignored. Chain order is not compared: it is creation order in the
/// kernel, and packets reach Service chains only through the maps.
pub fn same_table(a: &KernelTable, b: &KernelTable) -> bool {
    let mut a_sets = a.sets.clone();
    let mut b_sets = b.sets.clone();
    // Element order in a hash set is the kernel's, not ours.
    for s in a_sets.iter_mut().chain(b_sets.iter_mut()) {
        s.elements.sort_by(|x, y| x.key.cmp(&y.key));
        // A dynamic set's elements are the packets', not ours.
        if s.timeout_ms.is_some() {
            s.elements.clear();
        }
    }
    a_sets.sort_by(|x, y| x.name.cmp(&y.name));
    b_sets.sort_by(|x, y| x.name.cmp(&y.name));
    let counters = |t: &KernelTable| {
        let mut v = t.counters.clone();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    };
    fn by_name(t: &KernelTable) -> Vec<&KernelChain> {
        let mut v: Vec<&KernelChain> = t.chains.iter().collect();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    }
    let (a_chains, b_chains) = (by_name(a), by_name(b));
    a.family == b.family
        && a.name == b.name
        && a.userdata == b.userdata
        && counters(a) == counters(b)
        && a_sets == b_sets
        && a_chains.len() == b_chains.len()
        && a_chains.iter().zip(&b_chains).all(|(x, y)| {
            x.name == y.name
                && x.base == y.base
                && x.userdata == y.userdata
                && x.rules.len() == y.rules.len()
                && x.rules.iter().zip(&y.rules).all(|(r, s)| r.same_as(s))
        })
}

/// What one Service has in one family's tables, as last applied. Counters are
/// in the main table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Applied {
    chains: Vec<(TableId, String)>,
    sets: Vec<(TableId, String)>,
    counters: Vec<String>,
    elements: Vec<(TableId, &'static str, KernelElement)>,
    hairpin: Vec<IpAddr>,
}

/// One Service's rules in one family, lowered to kernel objects.
struct LoweredService {
    chains: Vec<(TableId, KernelChain)>,
    sets: Vec<(TableId, KernelSet)>,
    counters: Vec<KernelCounter>,
    applied: Applied,
}

fn lower_service(
    state: &ClusterState,
    key: &ServiceKey,
    family: Family,
    config: &NodeConfig,
    hints: &dyn SlotHints,
) -> Option<LoweredService> {
    let svc = state.services.get(key)?;
    let rules = service_rules(state, svc, family, config, hints);
    let main = TableId::main(family);
    let elements = rules
        .elements
        .iter()
        .map(|(set, e)| (rules.home(set), *set, lower_element(e)))
        .collect();
    let chains: Vec<(TableId, KernelChain)> = rules
        .chains
        .iter()
        .map(|c| (rules.table, c))
        .chain(rules.main_chains.iter().map(|c| (main, c)))
        .map(|(t, c)| (t, lower_chain(family, c)))
        .collect();
    Some(LoweredService {
        sets: rules
            .sets
            .iter()
            .map(|s| (rules.table, lower_set(s)))
            .collect(),
        counters: rules.counters.iter().map(lower_counter).collect(),
        applied: Applied {
            chains: chains.iter().map(|(t, c)| (*t, c.name.clone())).collect(),
            sets: rules
                .sets
                .iter()
                .map(|s| (rules.table, s.name.clone()))
                .collect(),
            counters: rules.counters.iter().map(|c| c.name.clone()).collect(),
            elements,
            hairpin: rules.hairpin.clone(),
        },
        chains,
    })
}

/// Our tables as the kernel holds them.
type Views = HashMap<TableId, TableView>;

struct ViewHints<'a>(&'a Views);

impl SlotHints for ViewHints<'_> {
    fn slots(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>> {
        self.0.get(&table)?.chain(chain).map(|c| slots(&c.rules))
    }
}

/// Chains re-read from the kernel for a partial sync, by table and name.
struct ChainHints(HashMap<(TableId, String), Vec<RuleView>>);

impl SlotHints for ChainHints {
    fn slots(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>> {
        self.0
            .get(&(table, chain.to_string()))
            .map(|rules| slots(rules))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Readback of the whole table and diff against everything.
    Full,
    /// Only the Services that changed.
    Partial,
}

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    /// Services recomputed (all of them for a full sync).
    pub services: usize,
    /// Which ones, after a partial sync (a full one recomputes every Service).
    pub recomputed: Vec<ServiceKey>,
    pub committed: Committed,
    /// With the IPVS backend, what changed there.
    pub ipvs: Option<IpvsReport>,
    pub duration: Duration,
}

/// Why a sync failed; the next one is a full one either way.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error(transparent)]
    Ipvs(#[from] BackendError),
}

/// The proxy: the model of the cluster, and the kernel kept in step with it.
pub struct Proxier {
    config: NodeConfig,
    sock: NftSocket,
    state: ClusterState,
    applied: HashMap<(ServiceKey, Family), Applied>,
    /// How many Services use each hairpin element.
    hairpin_refs: HashMap<(Family, IpAddr), usize>,
    dirty: BTreeSet<ServiceKey>,
    full_sync_needed: bool,
    /// The IPVS backend's tables, when it is the backend.
    ipvs: Option<IpvsTables>,
}

impl Proxier {
    /// Opens the nf_tables socket (and IPVS, with that backend) in the current
    /// network namespace. The first sync is a full one: it adopts whatever correct
    /// state the kernel already has.
    pub fn new(config: NodeConfig) -> std::io::Result<Proxier> {
        let ipvs = if config.mode.is_ipvs() {
            Some(IpvsTables::open().map_err(std::io::Error::other)?)
        } else {
            None
        };
        Ok(Proxier {
            ipvs,
            config,
            sock: NftSocket::open().map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("opening the nf_tables netlink socket: {e}"),
                )
            })?,
            state: ClusterState::default(),
            applied: HashMap::new(),
            hairpin_refs: HashMap::new(),
            dirty: BTreeSet::new(),
            full_sync_needed: true,
        })
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn socket(&mut self) -> &mut NftSocket {
        &mut self.sock
    }

    /// Replaces the model (a reloaded source); only Services whose Service or
    /// EndpointSlices differ are marked for the next sync.
    pub fn replace_state(&mut self, state: ClusterState) {
        // The node's zone, name and addresses shape every Service: recompute all.
        if self.state.node != state.node {
            self.full_sync_needed = true;
        }
        let keys: BTreeSet<&ServiceKey> = self
            .state
            .services
            .keys()
            .chain(state.services.keys())
            .chain(self.state.slices.keys())
            .chain(state.slices.keys())
            .collect();
        for key in keys {
            if self.state.services.get(key) != state.services.get(key)
                || self.state.slices.get(key) != state.slices.get(key)
            {
                self.dirty.insert(key.clone());
            }
        }
        self.state = state;
    }

    /// Sets (or, with `None`, removes) one Service. It is marked for the next sync
    /// only if it changed, so a relist that repeats what we have costs no rules.
    pub fn set_service(&mut self, key: &ServiceKey, svc: Option<Service>) -> bool {
        if self.state.services.get(key) == svc.as_ref() {
            return false;
        }
        match svc {
            Some(svc) => self.state.services.insert(key.clone(), svc),
            None => self.state.services.remove(key),
        };
        self.dirty.insert(key.clone());
        true
    }

    /// Sets (or removes) one EndpointSlice of the Service `key`; marks the Service
    /// only if the slice changed.
    pub fn set_slice(
        &mut self,
        key: &ServiceKey,
        name: &str,
        slice: Option<EndpointSlice>,
    ) -> bool {
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
        self.dirty.insert(key.clone());
        true
    }

    /// Sets this node's Node; a change shapes every Service, so it forces a full sync.
    pub fn set_node(&mut self, node: Option<NodeInfo>) {
        if self.state.node != node {
            self.state.node = node;
            self.full_sync_needed = true;
        }
    }

    /// Changes the model through `change`, marking the Service `key` for the next sync.
    pub fn update(&mut self, key: &ServiceKey, change: impl FnOnce(&mut ClusterState)) {
        change(&mut self.state);
        self.dirty.insert(key.clone());
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Changes the node settings (for example its addresses); a change makes the
    /// next sync a full one.
    pub fn set_config(&mut self, config: NodeConfig) {
        if config != self.config {
            self.config = config;
            self.full_sync_needed = true;
        }
    }

    /// Makes the next sync a full readback and diff (drift, resync period).
    pub fn request_full_sync(&mut self) {
        self.full_sync_needed = true;
    }

    pub fn pending(&self) -> bool {
        self.full_sync_needed || !self.dirty.is_empty()
    }

    /// Brings the kernel to the desired state: a full sync when one is due, else
    /// a partial one over the dirty Services. After an error the next is full.
    pub fn sync(&mut self) -> Result<SyncReport, SyncError> {
        let started = Instant::now();
        let result = self.sync_both();
        match result {
            Ok((kind, recomputed, committed, ipvs)) => Ok(SyncReport {
                kind,
                services: match kind {
                    SyncKind::Full => self.state.services.len(),
                    SyncKind::Partial => recomputed.len(),
                },
                recomputed,
                committed,
                ipvs,
                duration: started.elapsed(),
            }),
            Err(e) => {
                self.full_sync_needed = true;
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn sync_both(
        &mut self,
    ) -> Result<(SyncKind, Vec<ServiceKey>, Committed, Option<IpvsReport>), SyncError> {
        let (kind, recomputed, committed) = if self.full_sync_needed {
            self.full_sync()?
        } else {
            self.partial_sync()?
        };
        let ipvs = match &mut self.ipvs {
            None => None,
            Some(t) if kind == SyncKind::Full => Some(t.full_sync(&self.state, &self.config)?),
            Some(t) => Some(t.partial_sync(&self.state, &self.config, &recomputed)?),
        };
        Ok((kind, recomputed, committed, ipvs))
    }

    fn full_sync(&mut self) -> Result<(SyncKind, Vec<ServiceKey>, Committed), NftError> {
        let views = self.read_views()?;
        let mut plan = Plan::default();
        let mut applied = HashMap::new();
        let mut hairpin_refs = HashMap::new();
        let hints = ViewHints(&views);
        let mut rebuilt: Option<Ruleset> = None;
        for family in Family::ALL {
            let ids = table_ids(family, &self.config);
            for stale in TableId::all_of(family).filter(|t| !ids.contains(t)) {
                if views.contains_key(&stale) {
                    plan.delete_table(stale);
                }
            }
            let skeletons: Vec<(TableId, KernelTable)> = ids
                .iter()
                .map(|id| (*id, lower_table(&skeleton_of(*id, &self.config))))
                .collect();
            let mut rebuild: BTreeSet<TableId> = BTreeSet::new();
            let mut wanted_chains: HashMap<TableId, BTreeSet<String>> = HashMap::new();
            let mut wanted_sets: HashMap<TableId, BTreeSet<String>> = HashMap::new();
            for (id, skeleton) in &skeletons {
                if !plan_skeleton(&mut plan, *id, skeleton, views.get(id)) {
                    rebuild.insert(*id);
                }
                let chains = skeleton.chains.iter().map(|c| c.name.clone());
                wanted_chains.entry(*id).or_default().extend(chains);
                let sets = skeleton.sets.iter().map(|s| s.name.clone());
                wanted_sets.entry(*id).or_default().extend(sets);
            }
            let main = TableId::main(family);
            let main_view = views.get(&main);
            let mut wanted_counters = BTreeSet::new();
            let mut wanted_elements: HashMap<(TableId, &str), HashMap<Vec<u8>, KernelElement>> =
                HashMap::new();
            for (set, e) in node_elements(&self.state, &self.config, family) {
                let e = lower_element(&e);
                for id in &ids {
                    wanted_elements
                        .entry((*id, set))
                        .or_default()
                        .insert(e.key.clone(), e.clone());
                }
            }
            for key in self.state.services.keys() {
                let Some(svc) = lower_service(&self.state, key, family, &self.config, &hints)
                else {
                    continue;
                };
                for c in svc.counters {
                    if wanted_counters.insert(c.name.clone()) {
                        match main_view.and_then(|v| v.counters.get(&c.name)) {
                            None => plan.add_counter(main, c),
                            Some(have) if *have != c => {
                                rebuild.insert(main);
                            }
                            Some(_) => {}
                        }
                    }
                }
                for (id, set) in svc.sets {
                    if wanted_sets.entry(id).or_default().insert(set.name.clone()) {
                        match views.get(&id).and_then(|v| v.set(&set.name)) {
                            None => plan.add_set(id, set),
                            Some(have) if !same_set_def(&have.def, &set) => {
                                rebuild.insert(id);
                            }
                            Some(_) => {}
                        }
                    }
                }
                for (id, chain) in svc.chains {
                    wanted_chains
                        .entry(id)
                        .or_default()
                        .insert(chain.name.clone());
                    if !plan_chain(&mut plan, id, chain, views.get(&id)) {
                        rebuild.insert(id);
                    }
                }
                for (id, set, e) in &svc.applied.elements {
                    wanted_elements
                        .entry((*id, set))
                        .or_default()
                        .entry(e.key.clone())
                        .or_insert_with(|| e.clone());
                }
                for a in &svc.applied.hairpin {
                    *hairpin_refs.entry((family, *a)).or_insert(0) += 1;
                }
                applied.insert((key.clone(), family), svc.applied);
            }
            let hairpin = wanted_elements.entry((main, SET_HAIRPIN)).or_default();
            for (f, a) in hairpin_refs.keys() {
                if *f == family {
                    let e = lower_element(&hairpin_element(*a));
                    hairpin.insert(e.key.clone(), e);
                }
            }
            for (id, skeleton) in &skeletons {
                let view = views.get(id);
                for set in &skeleton.sets {
                    let have = view.and_then(|v| v.set(&set.name)).map(|s| &s.elements);
                    let want = wanted_elements
                        .remove(&(*id, set.name.as_str()))
                        .unwrap_or_default();
                    plan_elements(&mut plan, *id, &set.name, have, want);
                }
                let Some(v) = view else { continue };
                let wanted = |names: &HashMap<TableId, BTreeSet<String>>, name: &str| {
                    names.get(id).is_some_and(|n| n.contains(name))
                };
                let unwanted_sets = v.sets.iter().filter(|s| !wanted(&wanted_sets, &s.def.name));
                for s in unwanted_sets {
                    // Its verdict elements hold the chains they point to.
                    let verdict = |e: &&KernelElement| matches!(e.data, Some(Mapped::Verdict(_)));
                    for e in s.elements.values().filter(verdict) {
                        plan.delete_element(*id, &s.def.name, e.clone());
                    }
                    plan.delete_set(*id, &s.def.name);
                }
                for c in v.chains.iter().filter(|c| !wanted(&wanted_chains, &c.name)) {
                    plan.delete_chain(*id, &c.name);
                }
                if *id == main {
                    for name in v.counters.keys().filter(|n| !wanted_counters.contains(*n)) {
                        plan.delete_counter(main, name);
                    }
                }
            }
            for id in rebuild {
                let ruleset = rebuilt
                    .get_or_insert_with(|| translate_with_hints(&self.state, &self.config, &hints));
                plan.rebuild(lower_table(ruleset.get(id).expect("a table per id")));
            }
        }
        let committed = self.commit(plan)?;
        self.applied = applied;
        self.hairpin_refs = hairpin_refs;
        self.dirty.clear();
        self.full_sync_needed = false;
        Ok((SyncKind::Full, Vec::new(), committed))
    }

    fn partial_sync(&mut self) -> Result<(SyncKind, Vec<ServiceKey>, Committed), NftError> {
        let dirty: Vec<ServiceKey> = std::mem::take(&mut self.dirty).into_iter().collect();
        // Re-read the chains these Services had: their handles and endpoint slots.
        let mut kernel = HashMap::new();
        for key in &dirty {
            for family in Family::ALL {
                for (table, chain) in self
                    .applied
                    .get(&(key.clone(), family))
                    .map(|a| a.chains.as_slice())
                    .unwrap_or_default()
                {
                    let rules = self.sock.read_chain_rules(family, table.name(), chain)?;
                    kernel.insert((*table, chain.clone()), rules);
                }
            }
        }
        let hints = ChainHints(kernel);
        let mut plan = Plan::default();
        let mut updates = Vec::new();
        let mut hairpin_delta: HashMap<(Family, IpAddr), isize> = HashMap::new();
        for key in &dirty {
            for family in Family::ALL {
                let main = TableId::main(family);
                let old = self
                    .applied
                    .get(&(key.clone(), family))
                    .cloned()
                    .unwrap_or_default();
                let new = lower_service(&self.state, key, family, &self.config, &hints);
                let (chains, sets, counters, new_applied) = match new {
                    Some(s) => (s.chains, s.sets, s.counters, s.applied),
                    None => Default::default(),
                };
                for c in counters
                    .into_iter()
                    .filter(|c| !old.counters.contains(&c.name))
                {
                    plan.add_counter(main, c);
                }
                for c in old
                    .counters
                    .iter()
                    .filter(|c| !new_applied.counters.contains(c))
                {
                    plan.delete_counter(main, c);
                }
                for (id, set) in sets {
                    if !old.sets.contains(&(id, set.name.clone())) {
                        plan.add_set(id, set);
                    }
                }
                for (id, s) in old.sets.iter().filter(|s| !new_applied.sets.contains(s)) {
                    plan.delete_set(*id, s);
                }
                for (id, chain) in chains {
                    let at = (id, chain.name.clone());
                    match hints.0.get(&at) {
                        Some(rules) if old.chains.contains(&at) => {
                            plan.rules(id, &chain.name, diff_rules(rules, &chain.rules))
                        }
                        _ => plan.add_chain(id, chain),
                    }
                }
                diff_service_elements(&mut plan, &old.elements, &new_applied.elements);
                for (id, c) in old
                    .chains
                    .iter()
                    .filter(|c| !new_applied.chains.contains(c))
                {
                    plan.delete_chain(*id, c);
                }
                for a in &old.hairpin {
                    *hairpin_delta.entry((family, *a)).or_insert(0) -= 1;
                }
                for a in &new_applied.hairpin {
                    *hairpin_delta.entry((family, *a)).or_insert(0) += 1;
                }
                updates.push(((key.clone(), family), new_applied));
            }
        }
        let mut new_refs = Vec::new();
        for ((family, addr), delta) in hairpin_delta {
            let before = self.hairpin_refs.get(&(family, addr)).copied().unwrap_or(0);
            let after = (before as isize + delta).max(0) as usize;
            let e = lower_element(&hairpin_element(addr));
            let main = TableId::main(family);
            match (before, after) {
                (0, n) if n > 0 => plan.add_element(main, SET_HAIRPIN, e),
                (n, 0) if n > 0 => plan.delete_element(main, SET_HAIRPIN, e),
                _ => {}
            }
            new_refs.push(((family, addr), after));
        }
        let committed = self.commit(plan)?;
        for (k, a) in updates {
            if a == Applied::default() {
                self.applied.remove(&k);
            } else {
                self.applied.insert(k, a);
            }
        }
        for (k, n) in new_refs {
            if n == 0 {
                self.hairpin_refs.remove(&k);
            } else {
                self.hairpin_refs.insert(k, n);
            }
        }
        Ok((SyncKind::Partial, dirty, committed))
    }

    /// The desired ruleset with endpoints in the slots the kernel has them in:
    /// what the kernel must hold after a successful sync.
    pub fn desired_as_placed(&mut self) -> Result<Ruleset, NftError> {
        let views = self.read_views()?;
        Ok(translate_with_hints(
            &self.state,
            &self.config,
            &ViewHints(&views),
        ))
    }

    /// Whether the kernel holds exactly the desired ruleset (read back in full).
    pub fn verify(&mut self) -> Result<bool, NftError> {
        let want = self.desired_as_placed()?;
        kernel_matches(&mut self.sock, &want)
    }

    /// Every table of ours the kernel has (wanted or not).
    fn read_views(&mut self) -> Result<Views, NftError> {
        let mut views = HashMap::new();
        for id in all_tables() {
            if let Some(v) = self.sock.read_view(id.family, id.name())? {
                views.insert(id, v);
            }
        }
        Ok(views)
    }

    fn commit(&mut self, plan: Plan) -> Result<Committed, NftError> {
        if plan.is_empty() {
            return Ok(Committed::default());
        }
        self.sock.commit(plan.into_batch())
    }
}

/// Plans the static part of a table. Returns false when the kernel's version
/// cannot be patched in place (then the table is rebuilt).
fn plan_skeleton(
    plan: &mut Plan,
    table: TableId,
    skeleton: &KernelTable,
    view: Option<&TableView>,
) -> bool {
    let Some(v) = view else {
        plan.add_table(table, skeleton.userdata.clone());
        for s in &skeleton.sets {
            let mut def = s.clone();
            def.elements.clear();
            plan.add_set(table, def);
        }
        for c in &skeleton.chains {
            plan.add_chain(table, c.clone());
        }
        return true;
    };
    if v.userdata != skeleton.userdata {
        return false;
    }
    for s in &skeleton.sets {
        match v.set(&s.name) {
            Some(have) if same_set_def(&have.def, s) => {}
            _ => return false,
        }
    }
    skeleton
        .chains
        .iter()
        .all(|c| plan_chain(plan, table, c.clone(), view))
}

/// The same set definition (elements aside).
fn same_set_def(have: &KernelSet, want: &KernelSet) -> bool {
    have.flags == want.flags
        && have.key_type == want.key_type
        && have.key_len == want.key_len
        && have.data_type == want.data_type
        && have.timeout_ms == want.timeout_ms
        && have.userdata == want.userdata
}

/// Plans one chain against the kernel's; false if it must be rebuilt.
fn plan_chain(
    plan: &mut Plan,
    table: TableId,
    chain: KernelChain,
    view: Option<&TableView>,
) -> bool {
    match view.and_then(|v| v.chain(&chain.name)) {
        None => {
            plan.add_chain(table, chain);
            true
        }
        Some(have) if have.base != chain.base || have.userdata != chain.userdata => false,
        Some(have) => {
            let ops = diff_rules(&have.rules, &chain.rules);
            plan.rules(table, &chain.name, ops);
            true
        }
    }
}

fn plan_elements(
    plan: &mut Plan,
    table: TableId,
    set: &str,
    have: Option<&HashMap<Vec<u8>, KernelElement>>,
    want: HashMap<Vec<u8>, KernelElement>,
) {
    let empty = HashMap::new();
    let have = have.unwrap_or(&empty);
    for (key, old) in have {
        match want.get(key) {
            Some(new) if new == old => {}
            _ => plan.delete_element(table, set, old.clone()),
        }
    }
    for (key, new) in want {
        if have.get(&key) != Some(&new) {
            plan.add_element(table, set, new);
        }
    }
}

fn diff_service_elements(
    plan: &mut Plan,
    old: &[(TableId, &'static str, KernelElement)],
    new: &[(TableId, &'static str, KernelElement)],
) {
    for (table, set, e) in old {
        if !new.iter().any(|(t, s, n)| t == table && s == set && n == e) {
            plan.delete_element(*table, set, e.clone());
        }
    }
    for (table, set, e) in new {
        if !old.iter().any(|(t, s, o)| t == table && s == set && o == e) {
            plan.add_element(*table, set, e.clone());
        }
    }
}
