//! The planner: pure functions from the kernel's view and the desired state to a
//! `Plan`, with no I/O, so that every reconciliation case is unit-tested against
//! a fake kernel (`fake`). `dataplane` does the reading and the committing.
//!
//! - `plan_full` diffs everything we own against the whole desired ruleset. A
//!   table whose static part cannot be patched in place is rebuilt whole.
//! - `Footprints::plan_partial` recomputes only the changed Services and trusts
//!   what the last sync committed (their footprints), re-reading only the chains
//!   it edits.

use crate::core::model::{ClusterState, Service, ServiceKey};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::netlink::objects::{KernelChain, KernelCounter, KernelElement, KernelSet, KernelTable};
use crate::nft::kernel::Views;
use crate::nft::lower::{
    lower_chain, lower_counter, lower_element, lower_key, lower_set, lower_table,
};
use crate::nft::names::{table_ids, SET_HAIRPIN};
use crate::nft::pick::{EndpointMap, EntryKind, Shared};
use crate::nft::plan::{diff_rules, Plan};
use crate::nft::skeleton::skeleton_of;
use crate::nft::slots::{Placement, SlotKey};
use crate::nft::translate::{hairpin_element, node_elements, service_rules, translate_placed};
use crate::nft::view::{map_slots, slots, Elements, RuleView, SetView, TableView};
use crate::ruleset::{KeyValue, Mapped, Ruleset, TableId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// What the last committed sync left in the kernel, per Service and family, and
/// how many Services use each hairpin element.
#[derive(Debug, Clone, Default)]
pub struct Footprints {
    services: HashMap<(ServiceKey, Family), Footprint>,
    hairpin_refs: HashMap<(Family, IpAddr), usize>,
    /// How many Services use each shared chain (and map) of a Service table.
    shared_refs: HashMap<(TableId, Shared), usize>,
}

/// A partial sync's change to the footprints, applied once its plan commits.
pub struct FootprintChange {
    services: Vec<((ServiceKey, Family), Footprint)>,
    hairpin_refs: Vec<((Family, IpAddr), usize)>,
    shared_refs: Vec<((TableId, Shared), usize)>,
}

/// The desired ruleset with endpoints in the slots the kernel has them in: what
/// the kernel must hold after a successful sync.
pub fn desired_as_placed(views: &Views, state: &ClusterState, config: &NodeConfig) -> Ruleset {
    translate_placed(state, config, &PlacedInViews::new(views))
}

/// What one Service has in one family's tables, as last committed. Counters are
/// in the main table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    chains: Vec<(TableId, String)>,
    sets: Vec<(TableId, String)>,
    counters: Vec<String>,
    elements: Vec<PlacedElement>,
    /// Its entries' endpoints, by slot, in the shared endpoint maps.
    slots: Vec<PlacedSlots>,
    /// The shared chains (and maps) it uses.
    shared: Vec<(TableId, Shared)>,
    hairpin: Vec<IpAddr>,
}

/// One entry's endpoints in an endpoint map, kept whole rather than as its
/// elements: one key prefix for all its slots (10k Services × 10: ~40 MiB
/// less), and what a partial sync needs to keep endpoints in their slots.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlacedSlots {
    table: TableId,
    map: EndpointMap,
    /// The entry's key, lowered: each element's key without its slot.
    entry: Vec<u8>,
    endpoints: Vec<SlotKey>,
}

impl PlacedSlots {
    fn element_key(&self, slot: usize) -> Vec<u8> {
        let mut key = self.entry.clone();
        key.extend_from_slice(&(slot as u32).to_ne_bytes());
        key
    }

    fn element(&self, slot: usize) -> KernelElement {
        let (addr, port) = self.endpoints[slot];
        KernelElement {
            key: self.element_key(slot),
            data: Some(Mapped::Endpoint(addr, port)),
            userdata: None,
        }
    }

    fn elements(&self) -> impl Iterator<Item = KernelElement> + '_ {
        (0..self.endpoints.len()).map(|i| self.element(i))
    }

    fn same_entry(&self, other: &PlacedSlots) -> bool {
        (self.table, self.map, &self.entry) == (other.table, other.map, &other.entry)
    }
}

/// An element a Service put in a shared set or map: where, its key (all a
/// delete needs) and a digest of the rest (enough to tell a change), not the
/// element with its comment and target chain (10k Services: ~4 MiB less).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlacedElement {
    table: TableId,
    set: &'static str,
    key: Vec<u8>,
    digest: u64,
}

impl PlacedElement {
    fn of(table: TableId, set: &'static str, e: &KernelElement) -> PlacedElement {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&e.data, &e.userdata).hash(&mut h);
        PlacedElement {
            table,
            set,
            key: e.key.clone(),
            digest: h.finish(),
        }
    }

    /// The element as a delete names it.
    fn deletion(&self) -> KernelElement {
        KernelElement {
            key: self.key.clone(),
            data: None,
            userdata: None,
        }
    }
}

/// One Service's rules in one family, lowered to kernel objects.
struct LoweredService {
    chains: Vec<(TableId, KernelChain)>,
    sets: Vec<(TableId, KernelSet)>,
    counters: Vec<KernelCounter>,
    /// Its elements of shared sets and maps.
    elements: Vec<(TableId, &'static str, KernelElement)>,
    footprint: Footprint,
}

fn lower_service(
    state: &ClusterState,
    svc: &Service,
    family: Family,
    config: &NodeConfig,
    placement: &dyn Placement,
) -> LoweredService {
    let rules = service_rules(state, svc, family, config, placement);
    let main = TableId::main(family);
    let elements: Vec<(TableId, &'static str, KernelElement)> = rules
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
    let table = rules.table;
    LoweredService {
        sets: rules
            .sets
            .iter()
            .map(|s| (rules.table, lower_set(s)))
            .collect(),
        counters: rules.counters.iter().map(lower_counter).collect(),
        footprint: Footprint {
            chains: chains.iter().map(|(t, c)| (*t, c.name.clone())).collect(),
            sets: rules
                .sets
                .iter()
                .map(|s| (rules.table, s.name.clone()))
                .collect(),
            counters: rules.counters.iter().map(|c| c.name.clone()).collect(),
            slots: rules
                .slots
                .into_iter()
                .map(|s| PlacedSlots {
                    table,
                    map: s.map,
                    entry: lower_key(&s.entry, true),
                    endpoints: s.endpoints,
                })
                .collect(),
            shared: rules.shared.iter().map(|s| (table, *s)).collect(),
            elements: elements
                .iter()
                .map(|(t, set, e)| PlacedElement::of(*t, set, e))
                .collect(),
            hairpin: rules.hairpin.clone(),
        },
        elements,
        chains,
    }
}

/// Where the kernel has each entry's and cascade's endpoints, as read back for a
/// full sync.
struct PlacedInViews<'a> {
    views: &'a Views,
    /// Each entry's elements (a run of a sorted endpoint map), by the kind and
    /// policy of the map that holds it and the entry's key.
    entries: HashMap<(TableId, EntryKind, bool, &'a [u8]), &'a [KernelElement]>,
}

impl<'a> PlacedInViews<'a> {
    fn new(views: &'a Views) -> Self {
        let mut entries = HashMap::new();
        for (table, view) in views {
            for set in &view.sets {
                let Some(map) = EndpointMap::of_name(&set.def.name) else {
                    continue;
                };
                let elements = set.elements.as_slice();
                let mut start = 0;
                while start < elements.len() {
                    let prefix = entry_of(&elements[start].key);
                    let len = elements[start..]
                        .iter()
                        .take_while(|e| entry_of(&e.key) == prefix)
                        .count();
                    let run = &elements[start..start + len];
                    entries
                        .entry((*table, map.kind, map.local, prefix))
                        .or_insert(run);
                    start += len;
                }
            }
        }
        PlacedInViews { views, entries }
    }
}

/// An endpoint map element's entry: its key without the slot.
fn entry_of(key: &[u8]) -> &[u8] {
    &key[..key.len().saturating_sub(4)]
}

impl Placement for PlacedInViews<'_> {
    fn cascade(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>> {
        let view = self.views.get(&table)?;
        view.chain(chain).map(|c| slots(&c.rules))
    }

    fn entry(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
    ) -> Option<Vec<SlotKey>> {
        let key = lower_key(entry, true);
        let run = self.entries.get(&(table, kind, local, key.as_slice()))?;
        Some(map_slots(run.iter()))
    }
}

/// What a partial sync re-reads of the changed Services: their own chains (for
/// rule handles and cascade slots), by table and name.
#[derive(Default)]
pub struct Reread {
    pub chains: HashMap<(TableId, String), Vec<RuleView>>,
}

/// A partial sync's placement of one Service: its cascades as re-read, its
/// entries where the last sync put them (its footprint).
struct PlacedBefore<'a> {
    reread: &'a Reread,
    old: &'a Footprint,
}

impl Placement for PlacedBefore<'_> {
    fn cascade(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>> {
        self.reread
            .chains
            .get(&(table, chain.to_string()))
            .map(|rules| slots(rules))
    }

    fn entry(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
    ) -> Option<Vec<SlotKey>> {
        let key = lower_key(entry, true);
        self.old
            .slots
            .iter()
            .find(|s| (s.table, s.map.kind, s.map.local) == (table, kind, local) && s.entry == key)
            .map(|s| s.endpoints.clone())
    }
}

/// Plans one of a Service's sets in a full sync against the kernel's; false if
/// its definition differs (then the table is rebuilt). An endpoint map's
/// elements are diffed; an affinity set's are the packets'.
fn plan_service_set(
    plan: &mut Plan,
    table: TableId,
    mut set: KernelSet,
    have: Option<&SetView>,
) -> bool {
    let elements = std::mem::take(&mut set.elements);
    match have {
        None => add_set_with(plan, table, set, elements),
        Some(have) if !same_set_def(&have.def, &set) => return false,
        Some(have) if set.timeout_ms.is_none() => plan_elements(
            plan,
            table,
            &set.name,
            Some(&have.elements),
            Elements::new(elements),
        ),
        Some(_) => {}
    }
    true
}

fn add_set_with(plan: &mut Plan, table: TableId, set: KernelSet, elements: Vec<KernelElement>) {
    plan.add_new_set_elements(table, &set.name, &elements);
    plan.add_set(table, set);
}

/// The full sync's diff of the shared endpoint maps, made entry by entry as the
/// Services come, against the kernel's sorted elements: the wanted elements
/// (a million at 100k Services) are never gathered.
struct EndpointMaps<'v> {
    views: &'v Views,
    maps: HashMap<(TableId, EndpointMap), MapDiff<'v>>,
    /// The entries placed so far: where two Services claim one (the same
    /// external IP and port), the first keeps it, as in the dispatch maps.
    claimed: HashSet<(TableId, EntryKind, bool, Vec<u8>)>,
}

/// One endpoint map: the kernel's elements, and which of them are wanted.
struct MapDiff<'v> {
    name: String,
    have: Option<&'v Elements>,
    seen: Vec<bool>,
}

impl<'v> EndpointMaps<'v> {
    fn new(views: &'v Views) -> Self {
        EndpointMaps {
            views,
            maps: HashMap::new(),
            claimed: HashSet::new(),
        }
    }

    /// Plans an entry's elements, unless another Service has the entry;
    /// false then.
    fn claim(&mut self, plan: &mut Plan, s: &PlacedSlots) -> bool {
        let views = self.views;
        let map = self.maps.entry((s.table, s.map)).or_insert_with(|| {
            let name = s.map.name();
            let have = views
                .get(&s.table)
                .and_then(|v| v.set(&name))
                .map(|v| &v.elements);
            let seen = vec![false; have.map_or(0, |h| h.len())];
            MapDiff { name, have, seen }
        });
        let at = (s.table, s.map.kind, s.map.local, s.entry.clone());
        if !self.claimed.insert(at) {
            return false;
        }
        for e in s.elements() {
            match map.have.and_then(|h| h.index_of(&e.key).map(|i| (i, h))) {
                Some((i, have)) => {
                    map.seen[i] = true;
                    let old = &have.as_slice()[i];
                    if *old != e {
                        plan.delete_element(s.table, &map.name, old.clone());
                        plan.add_element(s.table, &map.name, e);
                    }
                }
                None => plan.add_element(s.table, &map.name, e),
            }
        }
        true
    }

    /// Deletes what the kernel has and no entry wants, in the maps still used
    /// (an unused map goes whole).
    fn finish(self, plan: &mut Plan) {
        for ((table, _), map) in self.maps {
            let Some(have) = map.have else { continue };
            for (e, seen) in have.iter().zip(&map.seen) {
                if !seen {
                    plan.delete_element(table, &map.name, e.clone());
                }
            }
        }
    }
}

/// The full sync's plan: everything the kernel (`views`) lacks or has wrong
/// against the whole desired state, and the footprints it leaves behind.
pub fn plan_full(views: &Views, state: &ClusterState, config: &NodeConfig) -> (Plan, Footprints) {
    let mut plan = Plan::default();
    let mut footprints = Footprints::default();
    let placement = PlacedInViews::new(views);
    let mut rebuilt: Option<Ruleset> = None;
    for family in Family::ALL {
        let ids = table_ids(family, config);
        for stale in TableId::all_of(family).filter(|t| !ids.contains(t)) {
            if views.contains_key(&stale) {
                plan.delete_table(stale);
            }
        }
        let skeletons: Vec<(TableId, KernelTable)> = ids
            .iter()
            .map(|id| (*id, lower_table(&skeleton_of(*id, config))))
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
        let mut endpoint_maps = EndpointMaps::new(views);
        // Gathered in order; `Elements::new` keeps the first of a key.
        let mut wanted_elements: HashMap<(TableId, &str), Vec<KernelElement>> = HashMap::new();
        for (set, e) in node_elements(state, config, family) {
            let e = lower_element(&e);
            for id in &ids {
                wanted_elements
                    .entry((*id, set))
                    .or_default()
                    .push(e.clone());
            }
        }
        for (key, svc) in &state.services {
            let svc = lower_service(state, svc, family, config, &placement);
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
                    let have = views.get(&id).and_then(|v| v.set(&set.name));
                    if !plan_service_set(&mut plan, id, set, have) {
                        rebuild.insert(id);
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
            for (id, set, e) in svc.elements {
                wanted_elements.entry((id, set)).or_default().push(e);
            }
            let mut footprint = svc.footprint;
            footprint
                .slots
                .retain(|s| endpoint_maps.claim(&mut plan, s));
            for a in &footprint.hairpin {
                *footprints.hairpin_refs.entry((family, *a)).or_insert(0) += 1;
            }
            for s in &footprint.shared {
                *footprints.shared_refs.entry(*s).or_insert(0) += 1;
            }
            // A single-stack Service leaves nothing in the other family.
            if footprint != Footprint::default() {
                footprints.services.insert((key.clone(), family), footprint);
            }
        }
        endpoint_maps.finish(&mut plan);
        let mut shared: Vec<(TableId, Shared)> = footprints
            .shared_refs
            .keys()
            .filter(|(t, _)| t.family == family)
            .copied()
            .collect();
        shared.sort();
        for (id, s) in shared {
            for chain in s.chains(config.masquerade_mark()) {
                let chain = lower_chain(family, &chain);
                wanted_chains
                    .entry(id)
                    .or_default()
                    .insert(chain.name.clone());
                if !plan_chain(&mut plan, id, chain, views.get(&id)) {
                    rebuild.insert(id);
                }
            }
            if let Shared::Map(map) = s {
                let def = lower_set(&map.set(family));
                wanted_sets.entry(id).or_default().insert(def.name.clone());
                match views.get(&id).and_then(|v| v.set(&def.name)) {
                    None => plan.add_set(id, def),
                    Some(have) if !same_set_def(&have.def, &def) => {
                        rebuild.insert(id);
                    }
                    Some(_) => {}
                }
            }
        }
        let hairpin = wanted_elements.entry((main, SET_HAIRPIN)).or_default();
        for (f, a) in footprints.hairpin_refs.keys() {
            if *f == family {
                hairpin.push(lower_element(&hairpin_element(*a)));
            }
        }
        for (id, skeleton) in &skeletons {
            let view = views.get(id);
            for set in &skeleton.sets {
                let have = view.and_then(|v| v.set(&set.name)).map(|s| &s.elements);
                let want = wanted_elements
                    .remove(&(*id, set.name.as_str()))
                    .unwrap_or_default();
                plan_elements(&mut plan, *id, &set.name, have, Elements::new(want));
            }
            let Some(v) = view else { continue };
            let wanted = |names: &HashMap<TableId, BTreeSet<String>>, name: &str| {
                names.get(id).is_some_and(|n| n.contains(name))
            };
            let unwanted_sets = v.sets.iter().filter(|s| !wanted(&wanted_sets, &s.def.name));
            for s in unwanted_sets {
                // Its verdict elements hold the chains they point to.
                let verdict = |e: &&KernelElement| matches!(e.data, Some(Mapped::Verdict(_)));
                for e in s.elements.iter().filter(verdict) {
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
            let ruleset =
                rebuilt.get_or_insert_with(|| translate_placed(state, config, &placement));
            plan.rebuild(lower_table(ruleset.get(id).expect("a table per id")));
        }
    }
    (plan, footprints)
}

impl Footprints {
    /// The chains a partial sync of `dirty` must re-read from the kernel: those
    /// the Services had (for their rule handles and cascade slots).
    pub fn chains_of<'a>(
        &'a self,
        dirty: &'a [ServiceKey],
    ) -> impl Iterator<Item = &'a (TableId, String)> + 'a {
        self.of(dirty, |f| &f.chains)
    }

    fn of<'a>(
        &'a self,
        dirty: &'a [ServiceKey],
        part: fn(&Footprint) -> &Vec<(TableId, String)>,
    ) -> impl Iterator<Item = &'a (TableId, String)> + 'a {
        dirty.iter().flat_map(move |key| {
            Family::ALL.into_iter().flat_map(move |family| {
                self.services
                    .get(&(key.clone(), family))
                    .map(|f| part(f).as_slice())
                    .unwrap_or_default()
            })
        })
    }

    /// The partial sync's plan for the Services `dirty`, against the footprints
    /// of the last sync and their chains as re-read (`kernel`); `apply` the
    /// returned change once the plan is committed.
    pub fn plan_partial(
        &self,
        kernel: Reread,
        dirty: &[ServiceKey],
        state: &ClusterState,
        config: &NodeConfig,
    ) -> (Plan, FootprintChange) {
        let mut plan = Plan::default();
        let mut updates = Vec::new();
        let mut hairpin_delta: HashMap<(Family, IpAddr), isize> = HashMap::new();
        let mut shared_delta: HashMap<(TableId, Shared), isize> = HashMap::new();
        let none = Footprint::default();
        for key in dirty {
            for family in Family::ALL {
                let main = TableId::main(family);
                let old = self.services.get(&(key.clone(), family)).unwrap_or(&none);
                let placement = PlacedBefore {
                    reread: &kernel,
                    old,
                };
                let new = state
                    .services
                    .get(key)
                    .map(|svc| lower_service(state, svc, family, config, &placement));
                let (chains, sets, counters, elements, new_applied) = match new {
                    Some(s) => (s.chains, s.sets, s.counters, s.elements, s.footprint),
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
                // A Service's own sets are its affinity sets, whose elements
                // are the packets'.
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
                    match kernel.chains.get(&at) {
                        Some(rules) if old.chains.contains(&at) => {
                            plan.rules(id, &chain.name, diff_rules(rules, &chain.rules))
                        }
                        _ => plan.add_chain(id, chain),
                    }
                }
                diff_service_elements(&mut plan, &old.elements, &new_applied.elements, elements);
                diff_slots(&mut plan, &old.slots, &new_applied.slots);
                for s in &old.shared {
                    *shared_delta.entry(*s).or_insert(0) -= 1;
                }
                for s in &new_applied.shared {
                    *shared_delta.entry(*s).or_insert(0) += 1;
                }
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
        let mut shared_refs = Vec::new();
        for ((table, shared), delta) in shared_delta {
            let before = self.shared_refs.get(&(table, shared)).copied().unwrap_or(0);
            let after = (before as isize + delta).max(0) as usize;
            let family = table.family;
            match (before, after) {
                (0, n) if n > 0 => {
                    if let Shared::Map(map) = shared {
                        plan.add_set(table, lower_set(&map.set(family)));
                    }
                    for chain in shared.chains(config.masquerade_mark()) {
                        plan.add_chain(table, lower_chain(family, &chain));
                    }
                }
                (n, 0) if n > 0 => {
                    for chain in shared.chain_names() {
                        plan.delete_chain(table, &chain);
                    }
                    if let Shared::Map(map) = shared {
                        plan.delete_set(table, &map.name());
                    }
                }
                _ => {}
            }
            shared_refs.push(((table, shared), after));
        }
        (
            plan,
            FootprintChange {
                services: updates,
                hairpin_refs: new_refs,
                shared_refs,
            },
        )
    }

    /// Records a committed partial sync.
    pub fn apply(&mut self, change: FootprintChange) {
        for (k, f) in change.services {
            if f == Footprint::default() {
                self.services.remove(&k);
            } else {
                self.services.insert(k, f);
            }
        }
        for (k, n) in change.hairpin_refs {
            if n == 0 {
                self.hairpin_refs.remove(&k);
            } else {
                self.hairpin_refs.insert(k, n);
            }
        }
        for (k, n) in change.shared_refs {
            if n == 0 {
                self.shared_refs.remove(&k);
            } else {
                self.shared_refs.insert(k, n);
            }
        }
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
        && have.data_len == want.data_len
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
    have: Option<&Elements>,
    want: Elements,
) {
    let empty = Elements::default();
    let have = have.unwrap_or(&empty);
    for old in have.iter() {
        if want.get(&old.key) != Some(old) {
            plan.delete_element(table, set, old.clone());
        }
    }
    for new in want {
        if have.get(&new.key) != Some(&new) {
            plan.add_element(table, set, new);
        }
    }
}

/// A partial sync's change to one Service's entries: per entry, the slots
/// whose endpoint changed are replaced, the slots beyond the new count deleted,
/// new slots added; an entry that moved to another map (its count changed)
/// leaves the old map whole and fills the new one.
fn diff_slots(plan: &mut Plan, old: &[PlacedSlots], new: &[PlacedSlots]) {
    for o in old {
        let map = o.map.name();
        let kept = new.iter().find(|n| n.same_entry(o));
        for (slot, ep) in o.endpoints.iter().enumerate() {
            if kept.and_then(|n| n.endpoints.get(slot)) != Some(ep) {
                plan.delete_element(
                    o.table,
                    &map,
                    KernelElement {
                        key: o.element_key(slot),
                        data: None,
                        userdata: None,
                    },
                );
            }
        }
    }
    for n in new {
        let map = n.map.name();
        let before = old.iter().find(|o| o.same_entry(n));
        for (slot, ep) in n.endpoints.iter().enumerate() {
            if before.and_then(|o| o.endpoints.get(slot)) != Some(ep) {
                plan.add_element(n.table, &map, n.element(slot));
            }
        }
    }
}

fn diff_service_elements(
    plan: &mut Plan,
    old: &[PlacedElement],
    new: &[PlacedElement],
    new_elements: Vec<(TableId, &'static str, KernelElement)>,
) {
    for o in old.iter().filter(|o| !new.contains(o)) {
        plan.delete_element(o.table, o.set, o.deletion());
    }
    for (placed, (table, set, e)) in new.iter().zip(new_elements) {
        if !old.contains(placed) {
            plan.add_element(table, set, e);
        }
    }
}
