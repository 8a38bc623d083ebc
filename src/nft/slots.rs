//! Cascade slots: where each endpoint sits in a Service port chain. Slots are
//! kept across syncs, so one endpoint change moves at most one other endpoint and
//! rewrites one or two rules.

use crate::core::model::PortEndpoint;
use crate::ruleset::TableId;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// An endpoint's identity in a cascade slot.
pub type SlotKey = (IpAddr, u16);

/// Where the kernel's cascade currently has each endpoint of a chain, by slot
/// (slot 0 = the last rule); `None` for a chain it does not have.
pub trait SlotHints {
    fn slots(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>>;
}

/// No hints: a ruleset computed from scratch (render, a cold start).
pub struct NoHints;

impl SlotHints for NoHints {
    fn slots(&self, _: TableId, _: &str) -> Option<Vec<SlotKey>> {
        None
    }
}

/// Assigns the usable endpoints to cascade slots, keeping every endpoint that
/// stays where it was. A leaving endpoint's slot is taken by the one in the last
/// slot; newcomers take new slots. So one endpoint change moves at most one other
/// endpoint, and the chain changes by one or two rules. From scratch, slots are
/// filled so the chain lists endpoints in ascending order.
pub fn assign_slots<'a>(
    previous: Option<Vec<SlotKey>>,
    usable: &[&'a PortEndpoint],
) -> Vec<&'a PortEndpoint> {
    let by_key: BTreeMap<SlotKey, &PortEndpoint> =
        usable.iter().map(|e| ((e.addr, e.port), *e)).collect();
    let mut slots: Vec<SlotKey> = Vec::new();
    for k in previous.unwrap_or_default() {
        if !slots.contains(&k) {
            slots.push(k);
        }
    }
    for i in (0..slots.len()).rev() {
        if !by_key.contains_key(&slots[i]) {
            slots.swap_remove(i);
        }
    }
    let newcomers: Vec<SlotKey> = by_key
        .keys()
        .rev()
        .filter(|k| !slots.contains(k))
        .copied()
        .collect();
    slots.extend(newcomers);
    slots.iter().map(|k| by_key[k]).collect()
}
