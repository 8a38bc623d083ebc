//! A kernel in memory, for unit tests of the nftables dataplane without root (in
//! the manner of knftables' `Fake`). It applies a transaction by decoding each
//! message with the same `parse` functions that read the real kernel back, with
//! the kernel's rules that matter to a planner:
//! - all or nothing: a refused message leaves every table as it was;
//! - a rule or element may only name chains, sets and objects that exist;
//! - a chain, set or object still named by a rule or element cannot be deleted;
//! - deleting an element, rule or object that does not exist is refused;
//! - adding an element whose key is there with other data is refused;
//! - rule handles are new on every write, as the kernel gives them.
//!
//! Clones share one kernel, so a test can keep a handle on what a dataplane
//! writes, and start a second dataplane (a restart) over the same state.

use crate::core::net::Family;
use crate::netlink::batch::{
    Batch, DELCHAIN, DELOBJ, DELRULE, DELSET, DELSETELEM, DELTABLE, NEWCHAIN, NEWOBJ, NEWRULE,
    NEWSET, NEWSETELEM, NEWTABLE, NLM_F_APPEND, NLM_F_REPLACE,
};
use crate::netlink::expr::{Data, Expr};
use crate::netlink::message::split_messages;
use crate::netlink::objects::{
    KernelChain, KernelElement, KernelObject, KernelRule, KernelSet, KernelTable, ObjectKind,
    TableHeader, OBJECT_COUNTER,
};
use crate::netlink::{Committed, NftError};
use crate::nft::kernel::NftKernel;
use crate::nft::view::{rule_view, ChainView, Elements, RuleView, SetView, TableView};
use crate::ruleset::{Mapped, TableId, Verdict};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const EBUSY: i32 = 16;
const EINVAL: i32 = 22;
const ENFILE: i32 = 23;

#[derive(Debug, Default)]
struct State {
    tables: BTreeMap<TableId, KernelTable>,
    next_handle: u64,
    commits: usize,
}

#[derive(Debug, Clone, Default)]
pub struct FakeKernel(Rc<RefCell<State>>);

impl FakeKernel {
    pub fn new() -> Self {
        Self::default()
    }

    /// One of our tables as the fake holds it.
    pub fn table(&self, id: TableId) -> Option<KernelTable> {
        self.0.borrow().tables.get(&id).cloned()
    }

    /// Transactions committed so far (empty plans never reach the kernel).
    pub fn commits(&self) -> usize {
        self.0.borrow().commits
    }

    /// Changes the kernel behind the dataplane's back, as another tool would.
    pub fn tamper(&self, change: impl FnOnce(&mut BTreeMap<TableId, KernelTable>)) {
        change(&mut self.0.borrow_mut().tables);
    }
}

fn refused(what: String, errno: i32) -> NftError {
    NftError::Refused {
        what,
        source: std::io::Error::from_raw_os_error(errno),
        detail: None,
    }
}

/// The chains a rule jumps or goes to.
fn rule_targets(rule: &KernelRule) -> impl Iterator<Item = &str> {
    rule.exprs.iter().filter_map(|e| match e {
        Expr::Immediate {
            data: Data::Verdict(Verdict::Jump(c) | Verdict::Goto(c)),
            ..
        } => Some(c.as_str()),
        _ => None,
    })
}

/// The sets a rule reads or writes.
fn rule_sets(rule: &KernelRule) -> impl Iterator<Item = &str> {
    rule.exprs.iter().filter_map(|e| match e {
        Expr::Lookup { set, .. } | Expr::DynsetUpdate { set, .. } | Expr::ObjrefMap { set, .. } => {
            Some(set.as_str())
        }
        _ => None,
    })
}

/// The named objects a rule refers to directly (`ct timeout set`), by type.
fn rule_objects(rule: &KernelRule) -> impl Iterator<Item = (u32, &str)> {
    rule.exprs.iter().filter_map(|e| match e {
        Expr::Objref { obj_type, name } => Some((*obj_type, name.as_str())),
        _ => None,
    })
}

impl KernelTable {
    fn has_object(&self, type_id: u32, name: &str) -> bool {
        self.objects
            .iter()
            .any(|o| o.kind.type_id() == type_id && o.name == name)
    }

    fn chain_mut(&mut self, name: &str) -> Option<&mut KernelChain> {
        self.chains.iter_mut().find(|c| c.name == name)
    }

    fn set_mut(&mut self, name: &str) -> Option<&mut KernelSet> {
        self.sets.iter_mut().find(|s| s.name == name)
    }

    /// Whether a rule or a verdict element names this chain.
    fn chain_in_use(&self, chain: &str) -> bool {
        let by_rule = self
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .any(|r| rule_targets(r).any(|t| t == chain));
        let by_element = self.sets.iter().flat_map(|s| &s.elements).any(|e| {
            matches!(&e.data, Some(Mapped::Verdict(Verdict::Jump(c) | Verdict::Goto(c))) if c == chain)
        });
        by_rule || by_element
    }
}

/// Applies one message to the tables, or says why the kernel would refuse it.
/// The table an object message is about: every one starts with the table's
/// name, as a table's own message does.
fn table_of(family: Family, body: &[u8]) -> Result<(TableId, TableHeader), i32> {
    let header = TableHeader::parse(body).map_err(|_| EINVAL)?;
    let id = TableId::named(family, &header.name).ok_or(EINVAL)?;
    Ok((id, header))
}

fn apply(
    tables: &mut BTreeMap<TableId, KernelTable>,
    next_handle: &mut u64,
    (kind, flags): (u16, u16),
    (id, header): (TableId, TableHeader),
    body: &[u8],
) -> Result<(), i32> {
    if kind == NEWTABLE {
        tables.entry(id).or_insert_with(|| KernelTable {
            family: id.family,
            name: header.name,
            userdata: header.userdata,
            objects: Vec::new(),
            sets: Vec::new(),
            chains: Vec::new(),
        });
        return Ok(());
    }
    if kind == DELTABLE {
        return tables.remove(&id).map(|_| ()).ok_or(ENOENT);
    }
    let t = tables.get_mut(&id).ok_or(ENOENT)?;
    let table = header.name.as_str();
    let bad = |_| EINVAL;
    match kind {
        NEWCHAIN => {
            let chain = KernelChain::parse(body, table)
                .map_err(bad)?
                .ok_or(EINVAL)?;
            if t.chain_mut(&chain.name).is_none() {
                t.chains.push(chain);
            }
        }
        DELCHAIN => {
            let chain = KernelChain::parse(body, table)
                .map_err(bad)?
                .ok_or(EINVAL)?;
            let at = t
                .chains
                .iter()
                .position(|c| c.name == chain.name)
                .ok_or(ENOENT)?;
            if t.chain_in_use(&chain.name) {
                return Err(EBUSY);
            }
            t.chains.remove(at);
        }
        NEWRULE => {
            let (chain, mut rule) = KernelRule::parse(body, table).map_err(bad)?.ok_or(EINVAL)?;
            if rule_targets(&rule).any(|c| !t.chains.iter().any(|k| k.name == c))
                || rule_sets(&rule).any(|s| !t.sets.iter().any(|k| k.name == s))
                || rule_objects(&rule).any(|(k, o)| !t.has_object(k, o))
            {
                return Err(ENOENT);
            }
            let replaces = rule.handle.take();
            *next_handle += 1;
            rule.handle = Some(*next_handle);
            let rules = &mut t.chain_mut(&chain).ok_or(ENOENT)?.rules;
            match replaces {
                Some(h) if flags & NLM_F_REPLACE != 0 => {
                    let at = rules
                        .iter()
                        .position(|r| r.handle == Some(h))
                        .ok_or(ENOENT)?;
                    rules[at] = rule;
                }
                Some(_) => return Err(EINVAL),
                None if flags & NLM_F_APPEND != 0 => rules.push(rule),
                None => rules.insert(0, rule),
            }
        }
        DELRULE => {
            let (chain, rule) = KernelRule::parse(body, table).map_err(bad)?.ok_or(EINVAL)?;
            let rules = &mut t.chain_mut(&chain).ok_or(ENOENT)?.rules;
            match rule.handle {
                None => rules.clear(),
                Some(h) => {
                    let at = rules
                        .iter()
                        .position(|r| r.handle == Some(h))
                        .ok_or(ENOENT)?;
                    rules.remove(at);
                }
            }
        }
        NEWSET => {
            let set = KernelSet::parse(body, table).map_err(bad)?.ok_or(EINVAL)?;
            match t.set_mut(&set.name) {
                None => t.sets.push(set),
                Some(have) if have.flags != set.flags || have.key_type != set.key_type => {
                    return Err(EEXIST)
                }
                Some(_) => {}
            }
        }
        DELSET => {
            let set = KernelSet::parse(body, table).map_err(bad)?.ok_or(EINVAL)?;
            let at = t
                .sets
                .iter()
                .position(|s| s.name == set.name)
                .ok_or(ENOENT)?;
            let used = t
                .chains
                .iter()
                .flat_map(|c| &c.rules)
                .any(|r| rule_sets(r).any(|s| s == set.name));
            if used {
                return Err(EBUSY);
            }
            t.sets.remove(at);
        }
        NEWSETELEM | DELSETELEM => {
            let set_name = KernelElement::list_set(body).map_err(bad)?.ok_or(EINVAL)?;
            let elements = KernelElement::parse_list(body).map_err(bad)?;
            let chains: HashSet<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
            let counters: HashSet<&str> = t
                .objects
                .iter()
                .filter(|o| o.kind == ObjectKind::Counter)
                .map(|o| o.name.as_str())
                .collect();
            for e in &elements {
                let known = match &e.data {
                    Some(Mapped::Verdict(Verdict::Jump(c) | Verdict::Goto(c))) => {
                        chains.contains(c.as_str())
                    }
                    Some(Mapped::Counter(c)) => counters.contains(c.as_str()),
                    _ => true,
                };
                if kind == NEWSETELEM && !known {
                    return Err(ENOENT);
                }
            }
            let set = t.set_mut(&set_name).ok_or(ENOENT)?;
            let mut index: HashMap<Vec<u8>, usize> = set
                .elements
                .iter()
                .enumerate()
                .map(|(i, e)| (e.key.clone(), i))
                .collect();
            for e in elements {
                let at = index.get(&e.key).copied();
                if kind == DELSETELEM {
                    let at = at.ok_or(ENOENT)?;
                    index.remove(&e.key);
                    set.elements.swap_remove(at);
                    if let Some(moved) = set.elements.get(at) {
                        index.insert(moved.key.clone(), at);
                    }
                    continue;
                }
                match at {
                    // A set made with a size holds no more (the kernel counts
                    // what this transaction deleted as gone).
                    None if set.size.is_some_and(|s| set.elements.len() >= s as usize) => {
                        return Err(ENFILE)
                    }
                    None => {
                        index.insert(e.key.clone(), set.elements.len());
                        set.elements.push(e);
                    }
                    Some(i) if set.elements[i] == e => {}
                    Some(_) => return Err(EEXIST),
                }
            }
        }
        NEWOBJ => {
            let o = KernelObject::parse(body, table)
                .map_err(bad)?
                .ok_or(EINVAL)?
                .object;
            if !t.has_object(o.kind.type_id(), &o.name) {
                t.objects.push(o);
            }
        }
        DELOBJ => {
            let o = KernelObject::parse(body, table)
                .map_err(bad)?
                .ok_or(EINVAL)?
                .object;
            let (type_id, name) = (o.kind.type_id(), o.name);
            let at = t
                .objects
                .iter()
                .position(|x| x.kind.type_id() == type_id && x.name == name)
                .ok_or(ENOENT)?;
            let in_element = t
                .sets
                .iter()
                .flat_map(|s| &s.elements)
                .any(|e| matches!(&e.data, Some(Mapped::Counter(n)) if *n == name));
            let in_rule = t
                .chains
                .iter()
                .flat_map(|c| &c.rules)
                .any(|r| rule_objects(r).any(|(k, n)| k == type_id && n == name));
            if (type_id == OBJECT_COUNTER && in_element) || in_rule {
                return Err(EBUSY);
            }
            t.objects.remove(at);
        }
        _ => return Err(EINVAL),
    }
    Ok(())
}

fn view_of(t: &KernelTable) -> TableView {
    let chains = t
        .chains
        .iter()
        .map(|c| ChainView {
            name: c.name.clone(),
            base: c.base,
            userdata: c.userdata.clone(),
            rules: c
                .rules
                .iter()
                .map(|r| rule_view(r.handle.unwrap_or(0), r))
                .collect(),
        })
        .collect();
    let sets = t
        .sets
        .iter()
        .map(|s| SetView {
            def: KernelSet {
                elements: Vec::new(),
                ..s.clone()
            },
            elements: Elements::new(s.elements.clone()),
        })
        .collect();
    let objects = t
        .objects
        .iter()
        .map(|o| ((o.kind.type_id(), o.name.clone()), o.clone()))
        .collect();
    TableView::new(t.family, t.userdata.clone(), objects, sets, chains)
}

impl NftKernel for FakeKernel {
    fn read_view(&mut self, table: TableId) -> Result<Option<TableView>, NftError> {
        Ok(self.0.borrow().tables.get(&table).map(view_of))
    }

    fn read_chain_rules(&mut self, table: TableId, chain: &str) -> Result<Vec<RuleView>, NftError> {
        let state = self.0.borrow();
        let rules = state
            .tables
            .get(&table)
            .and_then(|t| t.chains.iter().find(|c| c.name == chain))
            .map(|c| {
                c.rules
                    .iter()
                    .map(|r| rule_view(r.handle.unwrap_or(0), r))
                    .collect()
            });
        Ok(rules.unwrap_or_default())
    }

    fn read_set_elements(
        &mut self,
        table: TableId,
        set: &str,
    ) -> Result<Vec<KernelElement>, NftError> {
        let state = self.0.borrow();
        let elements = state
            .tables
            .get(&table)
            .and_then(|t| t.sets.iter().find(|s| s.name == set))
            .map(|s| s.elements.clone());
        Ok(elements.unwrap_or_default())
    }

    fn read_table(&mut self, table: TableId) -> Result<Option<KernelTable>, NftError> {
        Ok(self.table(table))
    }

    fn commit(&mut self, batch: Batch) -> Result<Committed, NftError> {
        let tx = batch.finish();
        let mut state = self.0.borrow_mut();
        let State {
            tables,
            next_handle,
            ..
        } = &mut *state;
        // Each table as it was before the transaction touched it, to undo a
        // refused transaction without copying the tables it never touched.
        let mut before: BTreeMap<TableId, Option<KernelTable>> = BTreeMap::new();
        let mut result = Ok(());
        'messages: for chunk in &tx.chunks {
            for m in split_messages(chunk)? {
                let Some(&nfproto) = m.payload.first() else {
                    continue;
                };
                let Some(family) = Family::ALL.into_iter().find(|f| f.nfproto() == nfproto) else {
                    continue; // the batch framing
                };
                let body = &m.payload[4..];
                let applied = table_of(family, body).and_then(|(id, header)| {
                    before.entry(id).or_insert_with(|| tables.get(&id).cloned());
                    apply(
                        tables,
                        next_handle,
                        (m.kind & 0xff, m.flags),
                        (id, header),
                        body,
                    )
                });
                if let Err(errno) = applied {
                    result = Err(refused(tx.describe(m.seq), errno));
                    break 'messages;
                }
            }
        }
        if let Err(e) = result {
            for (id, table) in before {
                match table {
                    Some(t) => tables.insert(id, t),
                    None => tables.remove(&id),
                };
            }
            return Err(e);
        }
        state.commits += 1;
        Ok(Committed {
            messages: tx.messages,
            bytes: tx.bytes(),
            kernel: Duration::ZERO,
        })
    }
}
