//! The diff: from what the kernel holds to what we want, as an ordered plan of
//! nf_tables operations that becomes one transaction.
//!
//! Order inside the transaction matters to the kernel, which checks references
//! message by message: counters, sets and chains are created before the rules and
//! elements that refer to them, and elements pointing at a chain (or naming a
//! counter) are deleted before it. The whole plan commits atomically, so packets
//! never see a half state.

use super::lower::{KernelChain, KernelCounter, KernelElement, KernelRule, KernelSet, KernelTable};
use super::nftables::{write_table, Batch};
use super::view::{fingerprint, RuleView};
use crate::ruleset::TableId;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleOp {
    Append(KernelRule),
    InsertAtHead(KernelRule),
    Replace(u64, KernelRule),
    Delete(u64),
}

/// Rule operations that turn `old` into `new`, aligning the two chains on their
/// last rules. Service port chains keep their endpoints in stable cascade slots
/// counted from the end (see `translate`), so one endpoint change is one or two
/// operations here, whatever the number of endpoints.
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

/// One transaction's worth of operations on any of our tables, grouped by the
/// phase they must run in.
#[derive(Debug, Default)]
pub struct Plan {
    /// Tables replaced whole (the fallback when a fine-grained change is not possible).
    rebuild: Vec<KernelTable>,
    add_tables: Vec<(TableId, Option<Vec<u8>>)>,
    add_counters: Vec<(TableId, KernelCounter)>,
    add_sets: Vec<(TableId, KernelSet)>,
    add_chains: Vec<(TableId, KernelChain)>,
    rule_ops: Vec<(TableId, String, RuleOp)>,
    delete_elements: BTreeMap<(TableId, String), Vec<KernelElement>>,
    add_elements: BTreeMap<(TableId, String), Vec<KernelElement>>,
    delete_chains: Vec<(TableId, String)>,
    delete_sets: Vec<(TableId, String)>,
    delete_counters: Vec<(TableId, String)>,
    delete_tables: Vec<TableId>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.rebuild.is_empty()
            && self.add_tables.is_empty()
            && self.add_counters.is_empty()
            && self.add_sets.is_empty()
            && self.add_chains.is_empty()
            && self.rule_ops.is_empty()
            && self.delete_elements.is_empty()
            && self.add_elements.is_empty()
            && self.delete_chains.is_empty()
            && self.delete_sets.is_empty()
            && self.delete_counters.is_empty()
            && self.delete_tables.is_empty()
    }

    pub fn rebuild(&mut self, table: KernelTable) {
        self.rebuild.push(table);
    }

    pub fn add_table(&mut self, table: TableId, userdata: Option<Vec<u8>>) {
        self.add_tables.push((table, userdata));
    }

    /// Deletes a whole table (one we no longer use), last.
    pub fn delete_table(&mut self, table: TableId) {
        self.delete_tables.push(table);
    }

    pub fn add_counter(&mut self, table: TableId, counter: KernelCounter) {
        self.add_counters.push((table, counter));
    }

    /// Deletes a counter once no element names it: after elements and sets go.
    pub fn delete_counter(&mut self, table: TableId, name: &str) {
        self.delete_counters.push((table, name.to_string()));
    }

    pub fn add_set(&mut self, table: TableId, set: KernelSet) {
        self.add_sets.push((table, set));
    }

    /// Creates the chain and appends its rules.
    pub fn add_chain(&mut self, table: TableId, mut chain: KernelChain) {
        for r in std::mem::take(&mut chain.rules) {
            self.rule_ops
                .push((table, chain.name.clone(), RuleOp::Append(r)));
        }
        self.add_chains.push((table, chain));
    }

    pub fn rules(&mut self, table: TableId, chain: &str, ops: Vec<RuleOp>) {
        self.rule_ops
            .extend(ops.into_iter().map(|op| (table, chain.to_string(), op)));
    }

    pub fn delete_chain(&mut self, table: TableId, chain: &str) {
        self.delete_chains.push((table, chain.to_string()));
    }

    /// Deletes a set once nothing refers to it: after rules and chains go.
    pub fn delete_set(&mut self, table: TableId, set: &str) {
        self.delete_sets.push((table, set.to_string()));
    }

    pub fn add_element(&mut self, table: TableId, set: &str, e: KernelElement) {
        self.add_elements
            .entry((table, set.to_string()))
            .or_default()
            .push(e);
    }

    pub fn delete_element(&mut self, table: TableId, set: &str, e: KernelElement) {
        self.delete_elements
            .entry((table, set.to_string()))
            .or_default()
            .push(e);
    }

    /// The plan as one transaction, in an order the kernel accepts.
    pub fn into_batch(self) -> Batch {
        let mut b = Batch::new();
        let rebuilt: Vec<TableId> = self.rebuild.iter().map(|k| k.id()).collect();
        for table in &self.rebuild {
            b.add_table(table.family, &table.name, None);
            b.delete_table(table.family, &table.name);
            write_table(&mut b, table);
        }
        // Everything else concerns tables that are not being rebuilt.
        let keep = |t: &TableId| !rebuilt.contains(t);
        let at = |t: &TableId| (t.family, t.name());
        for (t, ud) in self.add_tables.iter().filter(|x| keep(&x.0)) {
            b.add_table(t.family, t.name(), ud.as_deref());
        }
        for (t, c) in self.add_counters.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.add_counter(f, t, c);
        }
        for (t, s) in self.add_sets.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.add_set(f, t, s);
        }
        for (t, c) in self.add_chains.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.add_chain(f, t, c);
        }
        for (t, chain, op) in self.rule_ops.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            match op {
                RuleOp::Append(r) => b.add_rule(f, t, chain, r),
                RuleOp::InsertAtHead(r) => b.insert_rule(f, t, chain, r),
                RuleOp::Replace(h, r) => b.replace_rule(f, t, chain, *h, r),
                RuleOp::Delete(h) => b.delete_rule(f, t, chain, *h),
            }
        }
        for ((t, set), els) in self.delete_elements.iter().filter(|x| keep(&x.0 .0)) {
            let (f, t) = at(t);
            b.delete_elements(f, t, set, els);
        }
        for ((t, set), els) in self.add_elements.iter().filter(|x| keep(&x.0 .0)) {
            let (f, t) = at(t);
            b.add_elements(f, t, set, els);
        }
        for (t, chain) in self.delete_chains.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.flush_chain(f, t, chain);
            b.delete_chain(f, t, chain);
        }
        for (t, set) in self.delete_sets.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.delete_set(f, t, set);
        }
        for (t, name) in self.delete_counters.iter().filter(|x| keep(&x.0)) {
            let (f, t) = at(t);
            b.delete_counter(f, t, name);
        }
        for t in self.delete_tables.iter().filter(|t| keep(t)) {
            b.delete_table(t.family, t.name());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::expr::Expr;
    use crate::netlink::view::rule_view;

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
