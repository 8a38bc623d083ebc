//! Endpoint slots: where each endpoint sits in an entry's elements of an
//! endpoint map (or, with session affinity, in its port's cascade). Slots are
//! kept across syncs, so one endpoint change moves at most one other endpoint:
//! two map elements (or one or two cascade rules).

use crate::core::model::PortEndpoint;
use crate::core::policy::Categorized;
use crate::nft::pick::EntryKind;
use crate::ruleset::{KeyValue, TableId};
use std::collections::{BTreeMap, HashSet};

/// An endpoint's identity in a slot.
pub type SlotKey = crate::core::endpoint_key::EndpointKey;

/// Where the kernel currently has the endpoints of a Service port, by slot;
/// `None` where it has none.
pub trait Placement {
    /// A session-affinity cascade's, from the DNAT rules of its `chain` (slot
    /// 0 = the last rule).
    fn cascade(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>>;

    /// An entry's, from whichever endpoint map of its kind and policy
    /// (`local`) holds it, whatever its count there.
    fn entry(
        &self,
        table: TableId,
        kind: EntryKind,
        local: bool,
        entry: &[KeyValue],
    ) -> Option<Vec<SlotKey>>;

    /// The endpoints chosen for the Service's port `port` (its index among the
    /// Service's ports), when this placement knows them without merging and
    /// choosing among every endpoint of the port again.
    fn chosen(&self, _port: usize) -> Option<Categorized<'_>> {
        None
    }

    /// An entry's endpoints already in their slots, when this placement has
    /// worked them out from what changed (`port` as for `chosen`); the caller
    /// assigns them otherwise (`assign_slots`).
    fn placed(
        &self,
        _table: TableId,
        _kind: EntryKind,
        _local: bool,
        _entry: &[KeyValue],
        _port: usize,
    ) -> Option<Vec<SlotKey>> {
        None
    }
}

/// No placement: a ruleset computed from scratch (render, a cold start).
pub struct FromScratch;

impl Placement for FromScratch {
    fn cascade(&self, _: TableId, _: &str) -> Option<Vec<SlotKey>> {
        None
    }

    fn entry(&self, _: TableId, _: EntryKind, _: bool, _: &[KeyValue]) -> Option<Vec<SlotKey>> {
        None
    }
}

/// How newcomers fill slots: so that what an operator lists shows endpoints in
/// ascending order. A map lists slot 0 first; a cascade lists slot 0 last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    Map,
    Cascade,
}

/// Assigns the usable endpoints to slots, keeping every endpoint that stays
/// where it was. A leaving endpoint's slot is taken by the one in the last
/// slot; newcomers take new slots. So one endpoint change moves at most one other
/// endpoint: two map elements (or one or two cascade rules) change.
pub fn assign_slots<'a>(
    previous: Option<Vec<SlotKey>>,
    usable: &[&'a PortEndpoint],
    fill: Fill,
) -> Vec<&'a PortEndpoint> {
    let by_key: BTreeMap<SlotKey, &PortEndpoint> = usable.iter().map(|e| (e.key(), *e)).collect();
    // A set beside the slots, not a search of them: a Service port has up to
    // tens of thousands of endpoints, and one change must not cost their square.
    let mut placed: HashSet<SlotKey> = HashSet::with_capacity(by_key.len());
    let mut slots: Vec<SlotKey> = Vec::with_capacity(by_key.len());
    for k in previous.unwrap_or_default() {
        if placed.insert(k) {
            slots.push(k);
        }
    }
    for i in (0..slots.len()).rev() {
        if !by_key.contains_key(&slots[i]) {
            slots.swap_remove(i);
        }
    }
    // A key that left is in `placed` still, but not among `by_key`'s.
    let mut newcomers: Vec<SlotKey> = by_key
        .keys()
        .filter(|k| !placed.contains(k))
        .copied()
        .collect();
    if fill == Fill::Cascade {
        newcomers.reverse();
    }
    slots.extend(newcomers);
    slots.iter().map(|k| by_key[k]).collect()
}
