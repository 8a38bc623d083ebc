//! What the kernel holds in one of our tables, kept compact: for each rule its
//! handle, a fingerprint of its bytecode and its DNAT target; for each set its
//! definition and elements. Enough to diff against, at a fraction of the memory of
//! the decoded rules (100k rules: a few MiB).

use crate::core::endpoint_key::EndpointKey;
use crate::core::net::Family;
use crate::netlink::attr::AttrWriter;
use crate::netlink::expr::{Data, Expr, REG_1, REG_2};
use crate::netlink::nftables::{NftError, NftSocket, TableVisitor};
use crate::netlink::objects::{
    KernelChain, KernelElement, KernelObject, KernelRule, KernelSet, ObjectReading, TableHeader,
};
use crate::ruleset::{BaseChain, Mapped};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleView {
    pub handle: u64,
    pub fingerprint: u64,
    /// Where the rule DNATs to, if it does: the endpoint in a Service port chain.
    pub dnat: Option<(IpAddr, u16)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainView {
    pub name: String,
    pub base: Option<BaseChain>,
    pub userdata: Option<Vec<u8>>,
    pub rules: Vec<RuleView>,
}

/// The endpoints of a Service port chain's DNAT rules by cascade slot (slot 0
/// is the last rule; a single endpoint's chain has only that one).
pub fn slots(rules: &[RuleView]) -> Vec<EndpointKey> {
    rules
        .iter()
        .rev()
        .filter_map(|r| r.dnat)
        .map(|(addr, port)| EndpointKey::new(addr, port))
        .collect()
}

/// The endpoints of one entry's elements of an endpoint map, by slot (the
/// last field of each key).
pub fn map_slots<'a>(elements: impl Iterator<Item = &'a KernelElement>) -> Vec<EndpointKey> {
    let mut by_slot: Vec<(u32, EndpointKey)> = elements
        .filter_map(|e| {
            let at = e.key.len().checked_sub(4)?;
            let slot = u32::from_ne_bytes(e.key[at..].try_into().ok()?);
            match e.data {
                Some(Mapped::Endpoint(addr, port)) => Some((slot, EndpointKey::new(addr, port))),
                _ => None,
            }
        })
        .collect();
    by_slot.sort_unstable_by_key(|(slot, _)| *slot);
    by_slot.into_iter().map(|(_, ep)| ep).collect()
}

/// A set's elements, sorted by key. A restart at 10k Services reads 110k of
/// them: a hash map keyed by a copy of each key cost twice the memory, 21 MiB
/// of a 61 MiB peak, most of it in the buckets of 10k ten-element maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elements(Vec<KernelElement>);

impl Elements {
    /// Of elements with the same key, the first is kept.
    pub fn new(mut elements: Vec<KernelElement>) -> Elements {
        elements.sort_by(|a, b| a.key.cmp(&b.key));
        elements.dedup_by(|later, first| later.key == first.key);
        Elements(elements)
    }

    pub fn get(&self, key: &[u8]) -> Option<&KernelElement> {
        self.index_of(key).map(|i| &self.0[i])
    }

    /// Where the element of this key is, in key order.
    pub fn index_of(&self, key: &[u8]) -> Option<usize> {
        self.0.binary_search_by(|e| e.key.as_slice().cmp(key)).ok()
    }

    pub fn as_slice(&self) -> &[KernelElement] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, KernelElement> {
        self.0.iter()
    }
}

impl IntoIterator for Elements {
    type Item = KernelElement;
    type IntoIter = std::vec::IntoIter<KernelElement>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[derive(Debug, Clone)]
pub struct SetView {
    /// The set's definition; its `elements` are empty (see `elements`).
    pub def: KernelSet,
    pub elements: Elements,
}

#[derive(Debug, Clone)]
pub struct TableView {
    pub family: Family,
    pub userdata: Option<Vec<u8>>,
    /// Named objects by type (`ObjectKind::type_id`) and name (a counter's
    /// values are of no concern to a sync).
    pub objects: HashMap<(u32, String), KernelObject>,
    pub sets: Vec<SetView>,
    pub chains: Vec<ChainView>,
    chain_index: HashMap<String, usize>,
    // A table of an earlier layout held an endpoint map per Service port.
    set_index: HashMap<String, usize>,
}

impl TableView {
    pub fn new(
        family: Family,
        userdata: Option<Vec<u8>>,
        objects: HashMap<(u32, String), KernelObject>,
        sets: Vec<SetView>,
        chains: Vec<ChainView>,
    ) -> TableView {
        let chain_index = chains
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let set_index = sets
            .iter()
            .enumerate()
            .map(|(i, s)| (s.def.name.clone(), i))
            .collect();
        TableView {
            family,
            userdata,
            objects,
            sets,
            chains,
            chain_index,
            set_index,
        }
    }

    pub fn chain(&self, name: &str) -> Option<&ChainView> {
        self.chain_index.get(name).map(|&i| &self.chains[i])
    }

    pub fn set(&self, name: &str) -> Option<&SetView> {
        self.set_index.get(name).map(|&i| &self.sets[i])
    }
}

/// A hash of what a rule does (its bytecode, counters zeroed) and its comment.
/// Equal for a rule we are about to write and the same rule read back.
pub fn fingerprint(rule: &KernelRule) -> u64 {
    let mut w = AttrWriter::new();
    for e in &rule.exprs {
        match e {
            Expr::Counter { .. } => Expr::Counter {
                packets: 0,
                bytes: 0,
            }
            .emit(&mut w),
            other => other.emit(&mut w),
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    w.into_bytes().hash(&mut h);
    rule.userdata.hash(&mut h);
    h.finish()
}

/// The DNAT target of a rule: the immediates loaded into the registers a DNAT reads.
pub fn dnat_target(exprs: &[Expr]) -> Option<(IpAddr, u16)> {
    let Some(Expr::Dnat {
        addr_reg: REG_1,
        proto_reg: Some(REG_2),
        ..
    }) = exprs.last()
    else {
        return None;
    };
    let (mut addr, mut port) = (None, None);
    for e in exprs {
        if let Expr::Immediate {
            dreg,
            data: Data::Value(v),
        } = e
        {
            match (*dreg, v.len()) {
                (REG_1, 4) => addr = <[u8; 4]>::try_from(v.as_slice()).ok().map(IpAddr::from),
                (REG_1, 16) => addr = <[u8; 16]>::try_from(v.as_slice()).ok().map(IpAddr::from),
                (REG_2, 2) => port = Some(u16::from_be_bytes([v[0], v[1]])),
                _ => {}
            }
        }
    }
    Some((addr?, port?))
}

pub fn rule_view(handle: u64, rule: &KernelRule) -> RuleView {
    RuleView {
        handle,
        fingerprint: fingerprint(rule),
        dnat: dnat_target(&rule.exprs),
    }
}

/// The compact readback: each rule fingerprinted as it is decoded, and dropped.
struct ViewBuilder(TableView);

impl TableVisitor for ViewBuilder {
    fn table(&mut self, header: TableHeader) {
        self.0.userdata = header.userdata;
    }

    fn chain(&mut self, chain: KernelChain) {
        self.0
            .chain_index
            .insert(chain.name.clone(), self.0.chains.len());
        self.0.chains.push(ChainView {
            name: chain.name,
            base: chain.base,
            userdata: chain.userdata,
            rules: Vec::new(),
        });
    }

    fn rule(&mut self, chain: &str, rule: KernelRule) {
        if let Some(&i) = self.0.chain_index.get(chain) {
            self.0.chains[i]
                .rules
                .push(rule_view(rule.handle.unwrap_or(0), &rule));
        }
    }

    fn set(&mut self, def: KernelSet) {
        self.0.set_index.insert(def.name.clone(), self.0.sets.len());
        self.0.sets.push(SetView {
            def,
            elements: Elements::default(),
        });
    }

    // Gathered unsorted; `finish` sorts each set's once.
    fn element(&mut self, set: &str, element: KernelElement) {
        if let Some(&i) = self.0.set_index.get(set) {
            self.0.sets[i].elements.0.push(element);
        }
    }

    fn object(&mut self, r: ObjectReading) {
        let key = (r.object.kind.type_id(), r.object.name.clone());
        self.0.objects.insert(key, r.object);
    }
}

impl ViewBuilder {
    fn new(family: Family) -> ViewBuilder {
        ViewBuilder(TableView {
            family,
            userdata: None,
            objects: HashMap::new(),
            sets: Vec::new(),
            chains: Vec::new(),
            chain_index: HashMap::new(),
            set_index: HashMap::new(),
        })
    }

    // A view is held through the whole sync, so its vectors give back their
    // spare capacity; the desired side's are consumed as soon as they are made.
    fn finish(mut self) -> TableView {
        for set in &mut self.0.sets {
            set.elements = Elements::new(std::mem::take(&mut set.elements.0));
            set.elements.0.shrink_to_fit();
        }
        self.0
    }
}

/// Reads one of our tables compactly; `None` if it does not exist.
pub fn read_view(
    sock: &mut NftSocket,
    family: Family,
    name: &str,
) -> Result<Option<TableView>, NftError> {
    let mut b = ViewBuilder::new(family);
    Ok(sock.walk_table(family, name, &mut b)?.then(|| b.finish()))
}

/// Reads every table of a family that `ours` accepts, compactly, in one walk.
pub fn read_views(
    sock: &mut NftSocket,
    family: Family,
    ours: impl Fn(&str) -> bool,
) -> Result<HashMap<String, TableView>, NftError> {
    let walked = sock.walk_tables(family, None, |h| {
        ours(&h.name).then(|| ViewBuilder::new(family))
    })?;
    Ok(walked.into_iter().map(|(n, b)| (n, b.finish())).collect())
}

/// Reads the elements of one set (empty if it has none or does not exist).
pub fn read_set_elements(
    sock: &mut NftSocket,
    family: Family,
    table: &str,
    set: &str,
) -> Result<Vec<KernelElement>, NftError> {
    let mut elements = Vec::new();
    sock.each_set_element(family, table, set, |e| elements.push(e))?;
    Ok(elements)
}

/// Reads the rules of one chain (empty if the chain has none or does not exist).
pub fn read_chain_rules(
    sock: &mut NftSocket,
    family: Family,
    table: &str,
    chain: &str,
) -> Result<Vec<RuleView>, NftError> {
    let mut rules = Vec::new();
    sock.each_chain_rule(family, table, chain, |r| {
        rules.push(rule_view(r.handle.unwrap_or(0), &r))
    })?;
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element(key: &[u8], port: u16) -> KernelElement {
        KernelElement {
            key: key.to_vec(),
            data: Some(Mapped::Endpoint(IpAddr::from([10, 0, 0, 1]), port)),
            userdata: None,
        }
    }

    #[test]
    fn elements_are_found_by_key_and_the_first_of_a_key_is_kept() {
        let elements = Elements::new(vec![
            element(&[3], 30),
            element(&[1], 10),
            element(&[3], 31),
            element(&[2], 20),
        ]);
        let keys: Vec<&[u8]> = elements.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [[1], [2], [3]]);
        assert_eq!(elements.get(&[3]), Some(&element(&[3], 30)));
        assert_eq!(elements.get(&[4]), None);
        assert_eq!(Elements::default().get(&[1]), None);
    }
}
