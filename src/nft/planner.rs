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
use crate::core::policy::Categorized;
use crate::netlink::objects::{KernelChain, KernelElement, KernelObject, KernelSet, KernelTable};
use crate::nft::endpoint_memo::{EndpointMemo, ListChange, PortChange};
use crate::nft::kernel::Views;
use crate::nft::lower::{
    lower_chain, lower_element, lower_key, lower_object, lower_set, lower_table,
};
use crate::nft::names::{MAP_CLUSTER_IPS_REJECT, SET_HAIRPIN};
use crate::nft::pick::{
    endpoint_map_size, Block, EndpointMap, EntryKind, Layout, MapShape, PickGroup, Shared,
};
use crate::nft::plan::{diff_rules, Plan};
use crate::nft::service_tables;
use crate::nft::skeleton::skeleton_of;
use crate::nft::slots::{Placement, SlotKey};
use crate::nft::translate::{hairpin_element, node_elements, service_rules, translate_placed};
use crate::nft::view::{map_slots, slots, Elements, RuleView, SetView, TableView};
use crate::ruleset::{KeyValue, Mapped, Ruleset, TableId};
use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
    /// Each endpoint map's elements, and the size it was made with.
    maps: HashMap<(TableId, EndpointMap), Room>,
}

/// How full an endpoint map is: a partial sync that would put more in it than
/// its size (the kernel refuses past it, ENFILE) makes way for a full sync,
/// which makes the map again with room (`endpoint_map_size`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Room {
    held: usize,
    size: Option<u32>,
}

impl Room {
    fn fits(&self) -> bool {
        self.size.is_none_or(|s| self.held <= s as usize)
    }
}

/// A partial sync's change to the footprints, applied once its plan commits.
pub struct FootprintChange {
    /// How many of the Services (each family counted) were planned from
    /// their memo, the rest recomputed whole.
    pub from_memo: usize,
    services: Vec<((ServiceKey, Family), Footprint)>,
    hairpin_refs: Vec<((Family, IpAddr), usize)>,
    shared_refs: Vec<((TableId, Shared), usize)>,
    maps: Vec<((TableId, EndpointMap), Room)>,
    /// An endpoint map this plan would fill past its size, with what it
    /// would hold: the plan must not be committed, a full sync must run.
    pub overflow: Option<(String, usize, u32)>,
}

/// The desired ruleset with endpoints in the slots the kernel has them in: what
/// the kernel must hold after a successful sync.
pub fn desired_as_placed(views: &Views, state: &ClusterState, config: &NodeConfig) -> Ruleset {
    translate_placed(state, config, &PlacedInViews::new(views))
}

/// What one Service has in one family's tables, as last committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    chains: Vec<(TableId, String)>,
    sets: Vec<(TableId, String)>,
    /// Named objects: table, type (`ObjectKind::type_id`), name.
    objects: Vec<(TableId, u32, String)>,
    elements: Vec<PlacedElement>,
    /// Its entries' endpoints, by slot, in the shared endpoint maps.
    slots: Vec<PlacedSlots>,
    /// The shared chains (and maps) it uses.
    shared: Vec<(TableId, Shared)>,
    hairpin: Vec<IpAddr>,
    /// A large Service's endpoints, for its next partial sync.
    memo: Option<Box<EndpointMemo>>,
}

impl Footprint {
    /// Remembers a large Service's endpoints (`EndpointMemo`) and where each
    /// of its entries' endpoints sits, so that its next partial sync starts
    /// from the slices that changed.
    fn remember(
        &mut self,
        memo: Option<EndpointMemo>,
        state: &ClusterState,
        svc: &Service,
        config: &NodeConfig,
        family: Family,
    ) {
        self.memo = memo
            .or_else(|| EndpointMemo::remember(state, svc, family, config))
            .map(Box::new);
        if self.memo.is_none() {
            return;
        }
        for s in &mut self.slots {
            if s.index.is_none() {
                let index = s.endpoints.iter().enumerate();
                s.index = Some(Box::new(index.map(|(i, k)| (*k, i as u32)).collect()));
            }
        }
    }
}

/// One entry's endpoints in the endpoint maps of its count, kept whole rather
/// than as its elements: one key prefix for all its slots (10k Services × 10:
/// ~40 MiB less), and what a partial sync needs to keep endpoints in their
/// slots. Its count says which maps hold which slots (`PickGroup::layout`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlacedSlots {
    table: TableId,
    kind: EntryKind,
    local: bool,
    /// The entry's key, lowered: each element's key without its slot.
    entry: Vec<u8>,
    endpoints: Vec<SlotKey>,
    /// Each endpoint's slot, kept for a large Service's entries.
    index: Option<Box<SlotIndex>>,
}

/// Where each endpoint of an entry sits.
type SlotIndex = HashMap<SlotKey, u32>;

impl PlacedSlots {
    fn layout(&self) -> Layout {
        PickGroup {
            kind: self.kind,
            local: self.local,
            count: self.endpoints.len() as u32,
        }
        .layout()
    }

    /// The key of the entry's element in slot `rel` of a map.
    fn element_key(&self, rel: u32) -> Vec<u8> {
        let mut key = self.entry.clone();
        key.extend_from_slice(&rel.to_ne_bytes());
        key
    }

    /// Whether `key` is this entry's element key of slot `rel` of a map.
    fn is_key(&self, key: &[u8], rel: u32) -> bool {
        key.len() == self.entry.len() + 4
            && key.starts_with(&self.entry)
            && key[self.entry.len()..] == rel.to_ne_bytes()
    }

    /// The element of the entry's slot `rel` of a map, holding `ep`.
    fn element(&self, rel: u32, ep: SlotKey) -> KernelElement {
        KernelElement {
            key: self.element_key(rel),
            data: Some(Mapped::Endpoint(ep.addr, ep.port)),
            userdata: None,
        }
    }

    /// How many elements it has in each endpoint map.
    fn held_by_map(&self) -> impl Iterator<Item = ((TableId, EndpointMap), usize)> + '_ {
        self.layout()
            .map(|b| ((self.table, b.map), b.size as usize))
    }

    fn same_entry(&self, other: &PlacedSlots) -> bool {
        (self.table, self.kind, self.local, &self.entry)
            == (other.table, other.kind, other.local, &other.entry)
    }
}

/// Which map holds slot `slot` of a layout, and its slot there.
fn held_at(layout: &[Block], slot: u32) -> Option<(EndpointMap, u32)> {
    let i = layout.partition_point(|b| b.start + b.size <= slot);
    let b = layout.get(i).filter(|b| b.start <= slot)?;
    Some((b.map, slot - b.start))
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
    objects: Vec<(TableId, KernelObject)>,
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
    let objects: Vec<(TableId, KernelObject)> = rules
        .objects
        .iter()
        .map(|(t, o)| (*t, lower_object(family, o)))
        .collect();
    let table = rules.table;
    LoweredService {
        sets: rules
            .sets
            .iter()
            .map(|s| (rules.table, lower_set(s)))
            .collect(),
        footprint: Footprint {
            chains: chains.iter().map(|(t, c)| (*t, c.name.clone())).collect(),
            sets: rules
                .sets
                .iter()
                .map(|s| (rules.table, s.name.clone()))
                .collect(),
            objects: objects
                .iter()
                .map(|(t, o)| (*t, o.kind.type_id(), o.name.clone()))
                .collect(),
            slots: rules
                .slots
                .into_iter()
                .map(|s| PlacedSlots {
                    table,
                    kind: s.kind,
                    local: s.local,
                    entry: lower_key(&s.entry, true),
                    endpoints: s.endpoints,
                    index: None,
                })
                .collect(),
            shared: rules.shared.iter().map(|s| (table, *s)).collect(),
            elements: elements
                .iter()
                .map(|(t, set, e)| PlacedElement::of(*t, set, e))
                .collect(),
            hairpin: rules.hairpin.clone(),
            memo: None,
        },
        objects,
        elements,
        chains,
    }
}

/// Where the kernel has each entry's and cascade's endpoints, as read back for a
/// full sync.
struct PlacedInViews<'a> {
    views: &'a Views,
    /// Each entry's elements (a run of a sorted endpoint map), by the kind and
    /// policy of the map that holds it and the entry's key: its first run
    /// found, and the others of an entry in blocks (apart, so that the many
    /// entries of one run each cost no vector of their own).
    entries: HashMap<EntryAt<'a>, Run<'a>>,
    more: HashMap<EntryAt<'a>, Vec<Run<'a>>>,
}

type EntryAt<'a> = (TableId, EntryKind, bool, &'a [u8]);
type Run<'a> = (MapShape, &'a [KernelElement]);

impl<'a> PlacedInViews<'a> {
    fn new(views: &'a Views) -> Self {
        let mut entries = HashMap::new();
        let mut more: HashMap<EntryAt<'a>, Vec<Run<'a>>> = HashMap::new();
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
                    let run = (map.shape, &elements[start..start + len]);
                    let at = (*table, map.kind, map.local, prefix);
                    match entries.entry(at) {
                        Entry::Vacant(v) => {
                            v.insert(run);
                        }
                        Entry::Occupied(_) => more.entry(at).or_default().push(run),
                    }
                    start += len;
                }
            }
        }
        PlacedInViews {
            views,
            entries,
            more,
        }
    }
}

/// The order of a layout's maps: a range's alone; blocks of `BLOCK` by index,
/// then the smaller ones, largest first.
fn layout_order(shape: &MapShape) -> (u32, u32) {
    match *shape {
        MapShape::Range { .. } => (0, 0),
        MapShape::Block { size, index } => (u32::MAX - size, index),
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
        let at = (table, kind, local, key.as_slice());
        let first = self.entries.get(&at)?;
        let Some(more) = self.more.get(&at) else {
            return Some(map_slots(first.1.iter()));
        };
        let mut runs: Vec<&Run> = std::iter::once(first).chain(more).collect();
        runs.sort_by_key(|(shape, _)| layout_order(shape));
        Some(
            runs.iter()
                .flat_map(|(_, run)| map_slots(run.iter()))
                .collect(),
        )
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

impl PlacedBefore<'_> {
    fn slots_of(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
    ) -> Option<&PlacedSlots> {
        let key = lower_key(entry, true);
        self.old
            .slots
            .iter()
            .find(|s| (s.table, s.kind, s.local) == (table, kind, local) && s.entry == key)
    }
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
        self.slots_of(table, kind, local, entry)
            .map(|s| s.endpoints.clone())
    }
}

/// A large Service's partial sync whose memo found what changed: each port's
/// chosen endpoints come from the memo, and each entry's slots are the last
/// sync's with the change applied, not assigned again over every endpoint.
struct PlacedByChange<'a> {
    before: PlacedBefore<'a>,
    memo: &'a EndpointMemo,
    changes: &'a [PortChange],
    /// Each entry placed here: its new index, and the slots that changed.
    placed: RefCell<Vec<MovedSlots>>,
}

/// An entry's slots after a change.
struct MovedSlots {
    table: TableId,
    kind: EntryKind,
    local: bool,
    entry: Vec<u8>,
    index: SlotIndex,
    /// The slots whose endpoint changed, came or went, ascending.
    changed: Vec<u32>,
}

impl MovedSlots {
    /// Whether these are the slots of `s`, in the map they were moved in.
    fn holds(&self, s: &PlacedSlots) -> bool {
        (self.table, self.kind, self.local, &self.entry) == (s.table, s.kind, s.local, &s.entry)
    }
}

impl Placement for PlacedByChange<'_> {
    fn cascade(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>> {
        self.before.cascade(table, chain)
    }

    fn entry(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
    ) -> Option<Vec<SlotKey>> {
        self.before.entry(table, kind, local, entry)
    }

    fn chosen(&self, port: usize) -> Option<Categorized<'_>> {
        Some(self.memo.chosen(port))
    }

    fn placed(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
        port: usize,
    ) -> Option<Vec<SlotKey>> {
        let old = self.before.slots_of(table, kind, local, entry)?;
        let index = old.index.as_ref()?;
        let change = self.changes.get(port)?.of(local);
        let (slots, index, changed) = move_slots(&old.endpoints, index, change)?;
        self.placed.borrow_mut().push(MovedSlots {
            table,
            kind,
            local,
            entry: old.entry.clone(),
            index,
            changed,
        });
        Some(slots)
    }
}

/// An entry's slots with a change applied as `slots::assign_slots` would
/// apply it: each leaving endpoint's slot, from the highest down, taken by
/// the endpoint in the last slot; newcomers in new slots, in ascending
/// order. It visits only the endpoints that changed, and those it moves.
/// `None` if the change does not fit the slots (then they are assigned anew).
fn move_slots(
    previous: &[SlotKey],
    index: &SlotIndex,
    change: &ListChange,
) -> Option<(Vec<SlotKey>, SlotIndex, Vec<u32>)> {
    let mut slots = previous.to_vec();
    let mut index = index.clone();
    let mut changed = Vec::new();
    let mut gone = Vec::with_capacity(change.gone.len());
    for key in &change.gone {
        gone.push(index.remove(key)? as usize);
    }
    gone.sort_unstable_by(|a, b| b.cmp(a));
    for slot in gone {
        let last = slots.len() - 1;
        slots.swap_remove(slot);
        changed.push(slot as u32);
        if slot != last {
            index.insert(slots[slot], slot as u32);
            changed.push(last as u32);
        }
    }
    let mut came = change.came.clone();
    came.sort_unstable();
    for key in came {
        if index.insert(key, slots.len() as u32).is_some() {
            return None;
        }
        changed.push(slots.len() as u32);
        slots.push(key);
    }
    changed.sort_unstable();
    changed.dedup();
    Some((slots, index, changed))
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
    /// How many elements the entries placed so far have in it.
    held: usize,
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
        let at = (s.table, s.kind, s.local, s.entry.clone());
        if !self.claimed.insert(at) {
            return false;
        }
        let views = self.views;
        for block in s.layout() {
            let map = self.maps.entry((s.table, block.map)).or_insert_with(|| {
                let name = block.map.name();
                let have = views
                    .get(&s.table)
                    .and_then(|v| v.set(&name))
                    .map(|v| &v.elements);
                let seen = vec![false; have.map_or(0, |h| h.len())];
                MapDiff {
                    name,
                    have,
                    seen,
                    held: 0,
                }
            });
            let held = block.held(&s.endpoints);
            map.held += held.len();
            let Some(have) = map.have else {
                for (rel, ep) in (0..).zip(held) {
                    plan.add_element(s.table, &map.name, s.element(rel, *ep));
                }
                continue;
            };
            // The entry's elements are one run of the sorted map, in slot
            // order for fewer than 256 slots (a slot's first key byte is its
            // lowest): found once, then each is where its slot says, or
            // searched for.
            let elements = have.as_slice();
            let start = elements.partition_point(|e| e.key.as_slice() < s.entry.as_slice());
            for (rel, ep) in (0..).zip(held) {
                let at = Some(start + rel as usize)
                    .filter(|i| elements.get(*i).is_some_and(|e| s.is_key(&e.key, rel)))
                    .or_else(|| have.index_of(&s.element_key(rel)));
                let Some(i) = at else {
                    plan.add_element(s.table, &map.name, s.element(rel, *ep));
                    continue;
                };
                map.seen[i] = true;
                let old = &elements[i];
                if old.data != Some(Mapped::Endpoint(ep.addr, ep.port)) || old.userdata.is_some() {
                    plan.delete_element(s.table, &map.name, old.clone());
                    plan.add_element(s.table, &map.name, s.element(rel, *ep));
                }
            }
        }
        true
    }

    /// Deletes what the kernel has and no entry wants, in the maps still used
    /// (an unused map goes whole); how many elements each map holds then.
    fn finish(self, plan: &mut Plan) -> HashMap<(TableId, EndpointMap), usize> {
        let mut held = HashMap::new();
        for ((table, endpoint_map), map) in self.maps {
            held.insert((table, endpoint_map), map.held);
            let Some(have) = map.have else { continue };
            for (e, seen) in have.iter().zip(&map.seen) {
                if !seen {
                    plan.delete_element(table, &map.name, e.clone());
                }
            }
        }
        held
    }
}

/// The full sync's plan: everything the kernel (`views`) lacks or has wrong
/// against the whole desired state, and the footprints it leaves behind.
pub fn plan_full(views: &Views, state: &ClusterState, config: &NodeConfig) -> (Plan, Footprints) {
    plan_full_into(Plan::default(), views, state, config)
}

/// `plan_full`, into `plan` (a `Plan::recording`, say).
pub fn plan_full_into(
    mut plan: Plan,
    views: &Views,
    state: &ClusterState,
    config: &NodeConfig,
) -> (Plan, Footprints) {
    let mut footprints = Footprints::default();
    let placement = PlacedInViews::new(views);
    let mut rebuilt: Option<Ruleset> = None;
    let count = service_tables::count(config, state);
    for family in Family::ALL {
        let ids = service_tables::table_ids(family, config, count);
        for stale in TableId::all_of(family).filter(|t| !ids.contains(t)) {
            if views.contains_key(&stale) {
                plan.delete_table(stale);
            }
        }
        let skeletons: Vec<(TableId, KernelTable)> = ids
            .iter()
            .map(|id| (*id, lower_table(&skeleton_of(*id, config, count))))
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
        let mut wanted_objects: HashMap<TableId, BTreeSet<(u32, String)>> = HashMap::new();
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
        for (key, service) in &state.services {
            let svc = lower_service(state, service, family, config, &placement);
            for (id, o) in svc.objects {
                let key = (o.kind.type_id(), o.name.clone());
                if wanted_objects.entry(id).or_default().insert(key.clone()) {
                    match views.get(&id).and_then(|v| v.objects.get(&key)) {
                        None => plan.add_object(id, o),
                        Some(have) if *have != o => {
                            rebuild.insert(id);
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
                // Kept to find the kernel's chains that nothing wants: a table
                // it lacks has none, and a cold sync keeps no copy of 100k names.
                if views.contains_key(&id) {
                    wanted_chains
                        .entry(id)
                        .or_default()
                        .insert(chain.name.clone());
                }
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
                footprint.remember(None, state, service, config, family);
                footprints.services.insert((key.clone(), family), footprint);
            }
        }
        let held = endpoint_maps.finish(&mut plan);
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
                let mut def = lower_set(&map.set(family));
                wanted_sets.entry(id).or_default().insert(def.name.clone());
                let held = held.get(&(id, map)).copied().unwrap_or(0);
                let mut room = Room { held, size: None };
                match views.get(&id).and_then(|v| v.set(&def.name)) {
                    None => {
                        def.size = endpoint_map_size(held);
                        room.size = def.size;
                        plan.add_set(id, def);
                    }
                    Some(have) if !same_set_def(&have.def, &def) => {
                        rebuild.insert(id);
                    }
                    Some(have) => {
                        room.size = have.def.size;
                        // Full: the table is made again, the map with room.
                        if !room.fits() {
                            rebuild.insert(id);
                        }
                    }
                }
                footprints.maps.insert((id, map), room);
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
                // A table this commit creates gets its reject verdict a
                // commit later: a packet that met no NAT chain of ours before
                // it, and a filter chain after it, would be refused.
                let held = view.is_none() && set.name == MAP_CLUSTER_IPS_REJECT;
                let plan = if held { plan.then() } else { &mut plan };
                plan_elements(plan, *id, &set.name, have, Elements::new(want));
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
            let unwanted_objects = v
                .objects
                .keys()
                .filter(|k| !wanted_objects.get(id).is_some_and(|w| w.contains(*k)));
            for (type_id, name) in unwanted_objects {
                plan.delete_object(*id, *type_id, name);
            }
        }
        for id in rebuild {
            let ruleset =
                rebuilt.get_or_insert_with(|| translate_placed(state, config, &placement));
            let table = ruleset.get(id).expect("a table per id");
            for set in &table.sets {
                if let Some(map) = EndpointMap::of_name(&set.name) {
                    let held = set.elements.len();
                    let room = Room {
                        held,
                        size: set.size,
                    };
                    footprints.maps.insert((id, map), room);
                }
            }
            plan.rebuild(lower_table(table));
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
    /// of the last sync and their chains as re-read (`kernel`), into `plan` (a
    /// `Plan::recording` while a verification runs); `apply` the returned
    /// change once the plan is committed.
    pub fn plan_partial(
        &mut self,
        mut plan: Plan,
        kernel: Reread,
        dirty: &[ServiceKey],
        state: &ClusterState,
        config: &NodeConfig,
    ) -> (Plan, FootprintChange) {
        let mut updates = Vec::new();
        // Ordered, so that a change is always the same transaction.
        let mut hairpin_delta: BTreeMap<(Family, IpAddr), isize> = BTreeMap::new();
        let mut shared_delta: BTreeMap<(TableId, Shared), isize> = BTreeMap::new();
        let mut held_delta: BTreeMap<(TableId, EndpointMap), isize> = BTreeMap::new();
        let none = Footprint::default();
        let mut from_memo = 0;
        for key in dirty {
            for family in Family::ALL {
                let svc = state.services.get(key);
                // Taken: a memo moves on with its Service. If this sync's
                // commit fails, the full sync that follows remembers anew.
                let mut memo = self
                    .services
                    .get_mut(&(key.clone(), family))
                    .and_then(|f| f.memo.take());
                let changes = match (&mut memo, svc) {
                    (Some(m), Some(svc)) => m.advance(state, svc),
                    _ => None,
                };
                let old = self.services.get(&(key.clone(), family)).unwrap_or(&none);
                let before = PlacedBefore {
                    reread: &kernel,
                    old,
                };
                let (new, mut moved) = match (svc, &memo, &changes) {
                    (Some(svc), Some(memo), Some(changes)) => {
                        let placement = PlacedByChange {
                            before,
                            memo,
                            changes,
                            placed: RefCell::default(),
                        };
                        let new = lower_service(state, svc, family, config, &placement);
                        (Some(new), placement.placed.into_inner())
                    }
                    _ => {
                        let new = svc.map(|svc| lower_service(state, svc, family, config, &before));
                        (new, Vec::new())
                    }
                };
                let memo = changes.and(memo).map(|m| *m);
                from_memo += usize::from(memo.is_some());
                let (chains, sets, objects, elements, mut new_applied) = match new {
                    Some(s) => (s.chains, s.sets, s.objects, s.elements, s.footprint),
                    None => Default::default(),
                };
                if let (Some(svc), false) = (svc, new_applied == Footprint::default()) {
                    for s in &mut new_applied.slots {
                        let found = moved.iter_mut().find(|m| m.holds(s));
                        s.index = found.map(|m| Box::new(std::mem::take(&mut m.index)));
                    }
                    new_applied.remember(memo, state, svc, config, family);
                }
                for (id, o) in objects {
                    let key = (id, o.kind.type_id(), o.name.clone());
                    if !old.objects.contains(&key) {
                        plan.add_object(id, o);
                    }
                }
                for (id, type_id, name) in &old.objects {
                    let key = (*id, *type_id, name.clone());
                    if !new_applied.objects.contains(&key) {
                        plan.delete_object(*id, *type_id, name);
                    }
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
                diff_slots(&mut plan, &old.slots, &new_applied.slots, &moved);
                for (at, n) in old.slots.iter().flat_map(PlacedSlots::held_by_map) {
                    *held_delta.entry(at).or_insert(0) -= n as isize;
                }
                for (at, n) in new_applied.slots.iter().flat_map(PlacedSlots::held_by_map) {
                    *held_delta.entry(at).or_insert(0) += n as isize;
                }
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
        let mut maps = Vec::new();
        let mut overflow = None;
        for (at, delta) in held_delta {
            // A map this sync makes has no size: it grows as it must.
            let mut room = self.maps.get(&at).copied().unwrap_or_default();
            room.held = (room.held as isize + delta).max(0) as usize;
            if let (false, Some(size)) = (room.fits(), room.size) {
                overflow.get_or_insert((format!("{} {}", at.0, at.1.name()), room.held, size));
            }
            maps.push((at, room));
        }
        (
            plan,
            FootprintChange {
                from_memo,
                services: updates,
                hairpin_refs: new_refs,
                shared_refs,
                maps,
                overflow,
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
        for (k, room) in change.maps {
            if room.held == 0 {
                self.maps.remove(&k);
            } else {
                self.maps.insert(k, room);
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

/// A partial sync's change to one Service's entries: per entry, each slot
/// whose endpoint or place changed leaves its old element and gets a new one.
/// A count change moves the slots of the blocks its two layouts do not share
/// (an entry that changed range leaves the old map whole and fills the new
/// one). An entry whose slots were moved by a change (`moved`) is compared
/// only in the slots that moved and those whose place did.
fn diff_slots(plan: &mut Plan, old: &[PlacedSlots], new: &[PlacedSlots], moved: &[MovedSlots]) {
    for o in old {
        diff_entry(plan, Some(o), new.iter().find(|n| n.same_entry(o)), moved);
    }
    for n in new.iter().filter(|n| !old.iter().any(|o| o.same_entry(n))) {
        diff_entry(plan, None, Some(n), moved);
    }
}

fn diff_entry(
    plan: &mut Plan,
    old: Option<&PlacedSlots>,
    new: Option<&PlacedSlots>,
    moved: &[MovedSlots],
) {
    let layout = |s: Option<&PlacedSlots>| -> Vec<Block> {
        s.map(|s| s.layout().collect()).unwrap_or_default()
    };
    let (was_laid, is_laid) = (layout(old), layout(new));
    let compared: Vec<u32> = match new.and_then(|n| moved.iter().find(|m| m.holds(n))) {
        Some(m) => {
            let mut slots: BTreeSet<u32> = m.changed.iter().copied().collect();
            let only_was = was_laid.iter().filter(|b| !is_laid.contains(b));
            let only_is = is_laid.iter().filter(|b| !was_laid.contains(b));
            for b in only_was.chain(only_is) {
                slots.extend(b.start..b.start + b.size);
            }
            slots.into_iter().collect()
        }
        None => {
            let len = |s: Option<&PlacedSlots>| s.map_or(0, |s| s.endpoints.len());
            (0..len(old).max(len(new)) as u32).collect()
        }
    };
    let placed = |s: Option<&PlacedSlots>, laid: &[Block], slot: u32| {
        let ep = *s?.endpoints.get(slot as usize)?;
        Some((held_at(laid, slot)?, ep))
    };
    for slot in compared {
        let was = placed(old, &was_laid, slot);
        let is = placed(new, &is_laid, slot);
        if was == is {
            continue;
        }
        if let (Some(o), Some(((map, rel), _))) = (old, was) {
            let gone = KernelElement {
                key: o.element_key(rel),
                data: None,
                userdata: None,
            };
            plan.delete_element(o.table, &map.name(), gone);
        }
        if let (Some(n), Some(((map, rel), ep))) = (new, is) {
            plan.add_element(n.table, &map.name(), n.element(rel, ep));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Conditions, Hints};
    use crate::testbed::synthetic;

    /// The footprints without what only speeds a partial sync up.
    fn forgetful(f: &Footprints) -> Footprints {
        let mut f = f.clone();
        for fp in f.services.values_mut() {
            fp.memo = None;
            for s in &mut fp.slots {
                s.index = None;
            }
        }
        f
    }

    fn sorted(f: &Footprints) -> Vec<(ServiceKey, Family, Footprint)> {
        let mut v: Vec<_> = forgetful(f)
            .services
            .into_iter()
            .map(|((k, fam), fp)| (k, fam, fp))
            .collect();
        v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        v
    }

    /// A plan's messages as bytes, but for the ID of each new set, which is
    /// unique in the process (the kernel resolves a new set's elements by it
    /// within a transaction), and its messages described.
    fn bytes(plan: Plan) -> (Vec<u8>, Vec<String>) {
        const NEWSET: u16 = (10 << 8) | 9;
        const NFTA_SET_ID: u16 = 10;
        let (first, then) = plan.into_batches();
        let done: Vec<_> = std::iter::once(first)
            .chain(then)
            .map(|t| t.finish())
            .collect();
        let mut b: Vec<u8> = done.iter().flat_map(|t| t.chunks.concat()).collect();
        let mut at = 0;
        while at + 20 <= b.len() {
            let len = u32::from_ne_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(b[at + 4..at + 6].try_into().unwrap());
            let mut attr = at + 20;
            while kind == NEWSET && attr + 4 <= at + len {
                let alen = u16::from_ne_bytes(b[attr..attr + 2].try_into().unwrap()) as usize;
                let atype = u16::from_ne_bytes(b[attr + 2..attr + 4].try_into().unwrap());
                if atype & 0x3fff == NFTA_SET_ID {
                    b[attr + 4..attr + alen].fill(0);
                }
                attr += (alen + 3) & !3;
            }
            at += (len + 3) & !3;
        }
        (b, done.iter().flat_map(|t| t.described()).collect())
    }

    /// A small deterministic generator, so a failure names its step.
    struct Dice(u64);

    impl Dice {
        fn roll(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) as usize) % n
        }
    }

    /// Large Services of each policy, their endpoints in slices of 100 on 100
    /// nodes (this node among them).
    fn large_services() -> ClusterState {
        let mut state = synthetic::state(0, 0);
        let sizes = [450, 300, 250, 180];
        let mut next = 0;
        for (i, n) in sizes.into_iter().enumerate() {
            let mut svc = synthetic::service(i);
            match i {
                1 => {
                    svc.ports[0].node_port = Some(30001);
                    svc.external_ips = vec!["192.0.2.1".parse().unwrap()];
                }
                2 => {
                    svc.ports[0].node_port = Some(30002);
                    svc.external_policy_local = true;
                }
                3 => svc.internal_policy_local = true,
                _ => {}
            }
            state.put_service(svc);
            let addrs: Vec<IpAddr> = (next..next + n).map(synthetic::endpoint_addr).collect();
            next += n;
            synthetic::set_endpoints(&mut state, i, &addrs);
        }
        state
    }

    /// One change an EndpointSlice can bring to one slice of Service `i`
    /// (or the Service's slices as a whole), named.
    fn change(state: &mut ClusterState, dice: &mut Dice, fresh: &mut u32) -> (usize, String) {
        let i = dice.roll(4);
        let key = synthetic::service_key(i);
        let slices = state.slices.get_mut(&key).unwrap();
        let count = slices.shared().len();
        let which = dice.roll(count);
        let what = dice.roll(10);
        let slice = slices.values_mut().nth(which).unwrap();
        let eps = &mut slice.endpoints;
        let at = dice.roll(eps.len().max(1));
        let mut new_addr = || {
            *fresh += 1;
            synthetic::endpoint_addr(1_000_000 + *fresh as usize)
        };
        let what = match what {
            0 | 1 if !eps.is_empty() => {
                eps[at].addr = new_addr();
                "an endpoint replaced"
            }
            2 if !eps.is_empty() => {
                eps.remove(at);
                "an endpoint removed"
            }
            3 => {
                eps.push(synthetic::ready(new_addr()));
                "an endpoint added"
            }
            4 if !eps.is_empty() => {
                eps[at].conditions = Conditions {
                    ready: false,
                    serving: true,
                    terminating: true,
                };
                "an endpoint terminating"
            }
            5 if !eps.is_empty() => {
                eps[at].node_name = Some(crate::core::model::name(synthetic::THIS_NODE));
                "an endpoint moved to this node"
            }
            6 if !eps.is_empty() => {
                eps[at].hints = Hints::new(vec!["zone-a".into()], vec![]);
                "an endpoint hinted for a zone"
            }
            7 if !eps.is_empty() && count > 1 => {
                let dup = eps[at].clone();
                let other = (which + 1) % count;
                slices.values_mut().nth(other).unwrap().endpoints.push(dup);
                "an endpoint in two slices"
            }
            8 if !eps.is_empty() => {
                for e in eps.iter_mut() {
                    e.conditions.ready = !e.conditions.ready;
                }
                "a slice's endpoints flip readiness"
            }
            9 if !eps.is_empty() => {
                eps.truncate(eps.len().saturating_sub(3));
                "a slice loses its last three"
            }
            _ => "a slice written again as it was",
        };
        (i, what.to_string())
    }

    #[test]
    fn a_change_planned_from_the_memo_is_the_change_planned_from_scratch() {
        let config = synthetic::node_config();
        let mut state = large_services();
        let (_, mut footprints) = plan_full(&Views::default(), &state, &config);
        let mut dice = Dice(44);
        let mut fresh = 0;
        let (mut from_memo, mut steps) = (0, 0);
        for step in 0..400 {
            let (i, what) = change(&mut state, &mut dice, &mut fresh);
            let dirty = [synthetic::service_key(i)];
            let mut scratch = forgetful(&footprints);
            let (plan, change) = footprints.plan_partial(
                Plan::default(),
                Reread::default(),
                &dirty,
                &state,
                &config,
            );
            let (want, want_change) =
                scratch.plan_partial(Plan::default(), Reread::default(), &dirty, &state, &config);
            assert_eq!(want_change.from_memo, 0);
            from_memo += change.from_memo;
            steps += 1;
            let (got, want) = (bytes(plan), bytes(want));
            assert!(
                got.0 == want.0,
                "step {step}, Service {i}: {what}: the plans differ:\n{}",
                if got.1 == want.1 {
                    format!("in their bytes, not their messages: {:#?}", got.1)
                } else {
                    format!("{:#?}\n{:#?}", got.1, want.1)
                }
            );
            footprints.apply(change);
            scratch.apply(want_change);
            assert!(
                sorted(&footprints) == sorted(&scratch),
                "step {step}, Service {i}: {what}: the footprints differ"
            );
        }
        // Most changes touch endpoints alone; the test is worth nothing if the
        // memo gave up on them.
        assert!(
            from_memo * 2 > steps,
            "{from_memo} of {steps} from the memo"
        );
    }
}
