//! The diff: from what the kernel holds to what we want, as an ordered plan of
//! nf_tables operations that becomes one transaction.
//!
//! Order inside the transaction matters to the kernel, which checks references
//! message by message: counters, sets and chains are created before the rules and
//! elements that refer to them, and elements pointing at a chain (or naming a
//! counter) are deleted before it. The whole plan commits atomically, so packets
//! never see a half state.

use crate::netlink::batch::{replace_tables, Batch};
use crate::netlink::objects::{
    KernelChain, KernelElement, KernelObject, KernelRule, KernelSet, KernelTable,
};
use crate::nft::pick::EndpointMap;
use crate::nft::view::{fingerprint, RuleView};
use crate::ruleset::TableId;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleOp {
    Append(KernelRule),
    InsertAtHead(KernelRule),
    Replace(u64, KernelRule),
    Delete(u64),
}

/// Rule operations that turn `old` into `new`, aligning the two chains on their
/// last rules. A cascade (session affinity) keeps its endpoints in stable slots
/// counted from the end (see `slots`), so one endpoint change is one or two
/// operations here, whatever the number of endpoints; a pick chain has one
/// rule per protocol, and never changes.
pub fn diff_rules(old: &[RuleView], new: &[KernelRule]) -> Vec<RuleOp> {
    let mut ops = Vec::new();
    let common = old.len().min(new.len());
    for k in 0..common {
        let (o, n) = (&old[old.len() - 1 - k], &new[new.len() - 1 - k]);
        if o.fingerprint != fingerprint(n) {
            ops.push(RuleOp::Replace(o.handle, n.clone()));
        }
    }
    for o in &old[..old.len() - common] {
        ops.push(RuleOp::Delete(o.handle));
    }
    // Each insert goes to the head, so insert the rule nearest the tail first.
    for n in new[..new.len() - common].iter().rev() {
        ops.push(RuleOp::InsertAtHead(n.clone()));
    }
    ops
}

/// The phases of a transaction, in the order the kernel needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Tables replaced whole (the fallback when a fine-grained change is not possible).
    Rebuild,
    AddTables,
    AddObjects,
    AddSets,
    AddChains,
    Rules,
    DeleteElements,
    AddElements,
    /// Every chain that goes is emptied before any is deleted: one may jump to
    /// another (a `masquerade-pick-` chain to its `pick-` chain), and the
    /// kernel refuses to delete a chain a rule still names.
    FlushChains,
    /// After the elements that point at them.
    DeleteChains,
    /// After the rules and chains that refer to them.
    DeleteSets,
    /// Once no element or rule names them.
    DeleteObjects,
    DeleteTables,
}

/// One transaction's worth of operations on any of our tables, encoded as they
/// are planned (a plan of 100k rules would otherwise hold them all as objects
/// until it is sent) and kept apart by phase and table, so that a table rebuilt
/// whole drops what was planned for it.
#[derive(Default)]
pub struct Plan {
    parts: BTreeMap<(Phase, TableId), Batch>,
    rebuilt: BTreeSet<TableId>,
    // Elements are gathered per set and packed into messages at the end.
    delete_elements: ElementsBySet,
    add_elements: ElementsBySet,
    /// What it changes, where asked for (`recording`).
    touches: Option<BTreeSet<Touch>>,
    /// A second transaction, committed once no packet that met the state
    /// before the first is still between two hooks (`NftKernel::let_packets_pass`).
    then: Option<Box<Plan>>,
}

/// One thing a plan changes, as the verification beside the syncs compares
/// them (`nft::verifier`): a whole table, a named object, set or chain (its
/// rules included), one element, or one entry's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Touch {
    Table(TableId),
    Named(TableId, String),
    Element(TableId, String, Vec<u8>),
    /// The elements of an entry (its key without the slot) in every endpoint
    /// map: a plan against another placement may move any of them.
    Entry(TableId, Vec<u8>),
}

impl Touch {
    pub fn table(&self) -> TableId {
        match self {
            Touch::Table(t) | Touch::Named(t, _) | Touch::Element(t, _, _) | Touch::Entry(t, _) => {
                *t
            }
        }
    }
}

impl std::fmt::Display for Touch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Touch::Table(t) => write!(f, "table {t}"),
            Touch::Named(t, n) => write!(f, "{n} of {t}"),
            Touch::Element(t, n, _) => write!(f, "an element of {t} {n}"),
            Touch::Entry(t, _) => write!(f, "an entry's endpoints in {t}"),
        }
    }
}

type ElementsBySet = BTreeMap<TableId, BTreeMap<String, Vec<KernelElement>>>;

/// About one message's worth of endpoint-map elements (~50 bytes each, in
/// messages of up to ~60 KiB).
const ELEMENTS_PER_ENCODING: usize = 1024;

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.parts.values().all(Batch::is_empty)
            && self.delete_elements.is_empty()
            && self.add_elements.is_empty()
            && self.then.as_ref().is_none_or(|t| t.is_empty())
    }

    /// A plan that keeps what it changes (`touches`).
    pub fn recording() -> Plan {
        Plan {
            touches: Some(BTreeSet::new()),
            ..Plan::default()
        }
    }

    /// What this plan changes, if it was `recording`: its transaction and
    /// the one after it.
    pub fn touches(&self) -> Option<BTreeSet<Touch>> {
        let mut all = self.touches.clone()?;
        all.extend(self.then.iter().flat_map(|t| t.touches()).flatten());
        Some(all)
    }

    fn touch(&mut self, touch: impl FnOnce() -> Touch) {
        if let Some(t) = &mut self.touches {
            t.insert(touch());
        }
    }

    /// Where to encode an operation on `table`; none once the table is rebuilt.
    fn part(&mut self, phase: Phase, table: TableId) -> Option<&mut Batch> {
        if self.rebuilt.contains(&table) {
            return None;
        }
        Some(self.parts.entry((phase, table)).or_default())
    }

    /// Replaces the table whole, instead of anything else planned for it.
    pub fn rebuild(&mut self, table: KernelTable) {
        let id = table.id();
        self.touch(|| Touch::Table(id));
        self.parts.retain(|(_, t), _| *t != id);
        self.delete_elements.remove(&id);
        self.add_elements.remove(&id);
        let b = self.parts.entry((Phase::Rebuild, id)).or_default();
        replace_tables(b, std::slice::from_ref(&table));
        self.rebuilt.insert(id);
    }

    pub fn add_table(&mut self, table: TableId, userdata: Option<Vec<u8>>) {
        self.touch(|| Touch::Table(table));
        if let Some(b) = self.part(Phase::AddTables, table) {
            b.add_table(table.family, table.name(), userdata.as_deref());
        }
    }

    /// Deletes a whole table (one we no longer use), last.
    pub fn delete_table(&mut self, table: TableId) {
        self.touch(|| Touch::Table(table));
        if let Some(b) = self.part(Phase::DeleteTables, table) {
            b.delete_table(table.family, table.name());
        }
    }

    pub fn add_object(&mut self, table: TableId, object: KernelObject) {
        self.touch(|| Touch::Named(table, object.name.clone()));
        if let Some(b) = self.part(Phase::AddObjects, table) {
            b.add_object(table.family, table.name(), &object);
        }
    }

    pub fn delete_object(&mut self, table: TableId, type_id: u32, name: &str) {
        self.touch(|| Touch::Named(table, name.to_string()));
        if let Some(b) = self.part(Phase::DeleteObjects, table) {
            b.delete_object(table.family, table.name(), type_id, name);
        }
    }

    pub fn add_set(&mut self, table: TableId, set: KernelSet) {
        self.touch(|| Touch::Named(table, set.name.clone()));
        if let Some(b) = self.part(Phase::AddSets, table) {
            b.add_set(table.family, table.name(), &set);
        }
    }

    /// Creates the chain and appends its rules.
    pub fn add_chain(&mut self, table: TableId, chain: KernelChain) {
        self.touch(|| Touch::Named(table, chain.name.clone()));
        if let Some(b) = self.part(Phase::AddChains, table) {
            b.add_chain(table.family, table.name(), &chain);
        }
        let ops = chain.rules.into_iter().map(RuleOp::Append).collect();
        self.rules(table, &chain.name, ops);
    }

    pub fn rules(&mut self, table: TableId, chain: &str, ops: Vec<RuleOp>) {
        if !ops.is_empty() {
            self.touch(|| Touch::Named(table, chain.to_string()));
        }
        let Some(b) = self.part(Phase::Rules, table) else {
            return;
        };
        let (f, t) = (table.family, table.name());
        for op in ops {
            match op {
                RuleOp::Append(r) => b.add_rule(f, t, chain, &r),
                RuleOp::InsertAtHead(r) => b.insert_rule(f, t, chain, &r),
                RuleOp::Replace(h, r) => b.replace_rule(f, t, chain, h, &r),
                RuleOp::Delete(h) => b.delete_rule(f, t, chain, h),
            }
        }
    }

    pub fn delete_chain(&mut self, table: TableId, chain: &str) {
        self.touch(|| Touch::Named(table, chain.to_string()));
        if let Some(b) = self.part(Phase::FlushChains, table) {
            b.flush_chain(table.family, table.name(), chain);
        }
        if let Some(b) = self.part(Phase::DeleteChains, table) {
            b.delete_chain(table.family, table.name(), chain);
        }
    }

    pub fn delete_set(&mut self, table: TableId, set: &str) {
        self.touch(|| Touch::Named(table, set.to_string()));
        if let Some(b) = self.part(Phase::DeleteSets, table) {
            b.delete_set(table.family, table.name(), set);
        }
    }

    pub fn add_element(&mut self, table: TableId, set: &str, e: KernelElement) {
        self.gather(Phase::AddElements, table, set, e);
    }

    /// The elements of a set this plan creates, encoded at once: nothing else
    /// adds to such a set, so there is nothing to gather them with (at 10k
    /// Services, 100k endpoint-map elements held as objects until the end).
    pub fn add_new_set_elements(&mut self, table: TableId, set: &str, elements: &[KernelElement]) {
        if elements.is_empty() {
            return;
        }
        self.touch(|| Touch::Named(table, set.to_string()));
        if let Some(b) = self.part(Phase::AddElements, table) {
            b.add_elements(table.family, table.name(), set, elements);
        }
    }

    pub fn delete_element(&mut self, table: TableId, set: &str, e: KernelElement) {
        self.gather(Phase::DeleteElements, table, set, e);
    }

    /// Gathers an element with the others of its set, and encodes them a
    /// message's worth at a time: a cold sync of 100k Services has a million,
    /// which as objects took twice the memory of their encoded bytes.
    fn gather(&mut self, phase: Phase, table: TableId, set: &str, e: KernelElement) {
        // An endpoint map's key is the entry's, then its slot's 4 bytes.
        self.touch(|| match EndpointMap::of_name(set) {
            Some(_) => Touch::Entry(table, e.key[..e.key.len().saturating_sub(4)].to_vec()),
            None => Touch::Element(table, set.to_string(), e.key.clone()),
        });
        if self.rebuilt.contains(&table) {
            return;
        }
        let by_set = match phase {
            Phase::AddElements => &mut self.add_elements,
            _ => &mut self.delete_elements,
        };
        let gathered = elements_of(by_set, table, set);
        gathered.push(e);
        if gathered.len() < ELEMENTS_PER_ENCODING {
            return;
        }
        let elements = std::mem::take(gathered);
        let b = self.parts.entry((phase, table)).or_default();
        match phase {
            Phase::AddElements => b.add_elements(table.family, table.name(), set, &elements),
            _ => b.delete_elements(table.family, table.name(), set, &elements),
        }
    }

    /// The plan of the transaction that follows this one (see `then`).
    pub fn then(&mut self) -> &mut Plan {
        let recording = self.touches.is_some();
        self.then.get_or_insert_with(|| {
            Box::new(match recording {
                true => Plan::recording(),
                false => Plan::default(),
            })
        })
    }

    /// The plan as its transactions: this one, and the one after it if any.
    pub fn into_batches(mut self) -> (Batch, Option<Batch>) {
        let then = self.then.take().map(|t| t.into_batch());
        (self.into_batch(), then)
    }

    /// This transaction, in an order the kernel accepts.
    fn into_batch(mut self) -> Batch {
        for (t, sets) in std::mem::take(&mut self.delete_elements) {
            let b = self.parts.entry((Phase::DeleteElements, t)).or_default();
            for (set, els) in sets {
                b.delete_elements(t.family, t.name(), &set, &els);
            }
        }
        for (t, sets) in std::mem::take(&mut self.add_elements) {
            let b = self.parts.entry((Phase::AddElements, t)).or_default();
            for (set, els) in sets {
                b.add_elements(t.family, t.name(), &set, &els);
            }
        }
        let mut batch = Batch::new();
        for (_, part) in self.parts {
            batch.append(part);
        }
        batch
    }
}

fn elements_of<'a>(
    by_set: &'a mut ElementsBySet,
    table: TableId,
    set: &str,
) -> &'a mut Vec<KernelElement> {
    let sets = by_set.entry(table).or_default();
    // Looked up before inserting: most calls find the set, and need no key.
    if !sets.contains_key(set) {
        sets.insert(set.to_string(), Vec::new());
    }
    sets.get_mut(set).expect("just inserted")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::expr::Expr;
    use crate::nft::view::rule_view;

    fn rule(tag: &str) -> KernelRule {
        KernelRule {
            handle: None,
            exprs: vec![Expr::Other(tag.to_string())],
            userdata: None,
        }
    }

    fn kernel(tags: &[&str]) -> Vec<RuleView> {
        tags.iter()
            .enumerate()
            .map(|(i, t)| rule_view(100 + i as u64, &rule(t)))
            .collect()
    }

    #[test]
    fn a_plan_goes_phase_by_phase_and_a_rebuilt_table_drops_its_other_operations() {
        use crate::core::net::Family;
        let (main, shard) = (TableId::main(Family::Ip), TableId::shard(Family::Ip, 3));
        let chain = |name: &str, rules: Vec<KernelRule>| KernelChain {
            name: name.into(),
            base: None,
            userdata: None,
            rules,
        };
        let element = KernelElement {
            key: vec![10, 0, 0, 1],
            data: None,
            userdata: None,
        };
        let mut plan = Plan::default();
        plan.delete_chain(shard, "svc-old");
        plan.add_element(shard, "service-ips", element.clone());
        plan.add_chain(shard, chain("svc-new", vec![rule("a")]));
        plan.add_chain(main, chain("dropped", Vec::new()));
        plan.delete_element(main, "cluster-ips", element);
        plan.rebuild(KernelTable {
            family: Family::Ip,
            name: main.name().into(),
            userdata: None,
            objects: Vec::new(),
            sets: Vec::new(),
            chains: vec![chain("kept", Vec::new())],
        });
        plan.add_chain(main, chain("also-dropped", Vec::new()));
        let (m, s) = ("ip kube-nft", "ip kube-nft-services-03");
        assert_eq!(
            plan.into_batches().0.finish().described(),
            [
                format!("add table {m}"),
                format!("delete table {m}"),
                format!("add table {m}"),
                format!("add chain {m} kept"),
                format!("add chain {s} svc-new"),
                format!("add rule to {s} chain svc-new"),
                format!("add 1 element(s) of {s} service-ips"),
                format!("flush chain {s} svc-old"),
                format!("delete chain {s} svc-old"),
            ]
        );
    }

    #[test]
    fn identical_chains_need_nothing() {
        assert!(diff_rules(&kernel(&["a", "b"]), &[rule("a"), rule("b")]).is_empty());
    }

    #[test]
    fn a_new_head_rule_is_one_insert() {
        let ops = diff_rules(&kernel(&["b", "c"]), &[rule("a"), rule("b"), rule("c")]);
        assert_eq!(ops, vec![RuleOp::InsertAtHead(rule("a"))]);
    }

    #[test]
    fn a_removed_slot_is_a_replace_and_a_head_delete() {
        // Slots 2,1,0 hold x,y,z; y leaves, so x moves into slot 1.
        let ops = diff_rules(&kernel(&["x@2", "y@1", "z@0"]), &[rule("x@1"), rule("z@0")]);
        assert_eq!(
            ops,
            vec![RuleOp::Replace(101, rule("x@1")), RuleOp::Delete(100)]
        );
    }

    #[test]
    fn inserts_come_out_in_head_order() {
        let ops = diff_rules(&kernel(&["c"]), &[rule("a"), rule("b"), rule("c")]);
        assert_eq!(
            ops,
            vec![
                RuleOp::InsertAtHead(rule("b")),
                RuleOp::InsertAtHead(rule("a"))
            ]
        );
    }
}
