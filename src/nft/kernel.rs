//! The kernel as the nftables dataplane sees it: what it reads back (`NftKernel`,
//! implemented by the netlink socket and, for unit tests, by `fake::FakeKernel`)
//! and the whole-table operations of the one-shot commands (`apply`, `cleanup`,
//! `kernel_matches`).

use crate::core::net::Family;
use crate::netlink::batch::{delete_tables, replace_tables};
use crate::netlink::objects::{KernelChain, KernelElement, KernelTable};
use crate::netlink::{Batch, Committed, NftError, NftSocket};
use crate::nft::lower::lower_table;
use crate::nft::view::{RuleView, TableView};
use crate::ruleset::Ruleset;
use crate::ruleset::TableId;
use std::collections::HashMap;

/// What the nftables dataplane needs of a kernel: compact readback of one of our
/// tables or of one chain's rules, and atomic transactions.
pub trait NftKernel {
    /// One of our tables; `None` if it does not exist.
    fn read_view(&mut self, table: TableId) -> Result<Option<TableView>, NftError>;
    /// Every table of ours the kernel has (wanted or not).
    fn read_views(&mut self) -> Result<Views, NftError> {
        let mut views = HashMap::new();
        for id in all_tables() {
            if let Some(v) = self.read_view(id)? {
                views.insert(id, v);
            }
        }
        Ok(views)
    }
    /// The rules of one chain (empty if it has none or does not exist).
    fn read_chain_rules(&mut self, table: TableId, chain: &str) -> Result<Vec<RuleView>, NftError>;
    /// The elements of one set (empty if it has none or does not exist).
    fn read_set_elements(
        &mut self,
        table: TableId,
        set: &str,
    ) -> Result<Vec<KernelElement>, NftError>;
    /// One of our tables in full (every rule decoded), for verification.
    fn read_table(&mut self, table: TableId) -> Result<Option<KernelTable>, NftError>;
    /// Commits the batch as one transaction; on error nothing changed.
    fn commit(&mut self, batch: Batch) -> Result<Committed, NftError>;
    /// Another socket into the same kernel, for reading off the path of
    /// changes (`verifier`); `None` where there is no other.
    fn second_socket(&self) -> Option<std::io::Result<NftSocket>> {
        None
    }
    /// Returns once no packet that met the ruleset before the last commit is
    /// still on its way between two hooks (`Plan::then`).
    fn let_packets_pass(&mut self) {}
}

impl NftKernel for NftSocket {
    fn read_view(&mut self, table: TableId) -> Result<Option<TableView>, NftError> {
        crate::nft::view::read_view(self, table.family, table.name())
    }

    /// One walk per family: see `NftSocket::walk_tables`.
    fn read_views(&mut self) -> Result<Views, NftError> {
        let mut views = HashMap::new();
        for family in Family::ALL {
            let read = crate::nft::view::read_views(self, family, |name| {
                TableId::named(family, name).is_some()
            })?;
            for (name, view) in read {
                views.insert(TableId::named(family, &name).expect("ours"), view);
            }
        }
        Ok(views)
    }

    fn read_chain_rules(&mut self, table: TableId, chain: &str) -> Result<Vec<RuleView>, NftError> {
        crate::nft::view::read_chain_rules(self, table.family, table.name(), chain)
    }

    fn read_set_elements(
        &mut self,
        table: TableId,
        set: &str,
    ) -> Result<Vec<KernelElement>, NftError> {
        crate::nft::view::read_set_elements(self, table.family, table.name(), set)
    }

    fn read_table(&mut self, table: TableId) -> Result<Option<KernelTable>, NftError> {
        NftSocket::read_table(self, table.family, table.name())
    }

    fn commit(&mut self, batch: Batch) -> Result<Committed, NftError> {
        NftSocket::commit(self, batch)
    }

    /// Opened in this thread's network namespace, the one this socket's
    /// daemon runs in.
    fn second_socket(&self) -> Option<std::io::Result<NftSocket>> {
        Some(NftSocket::open())
    }

    /// An RCU grace period: `membarrier(MEMBARRIER_CMD_GLOBAL)` is the
    /// kernel's `synchronize_rcu()`, and a packet crosses the hooks from one
    /// softirq, inside one RCU read-side section. Where the call is refused (a
    /// nohz_full kernel, a seccomp filter), 10 ms, far longer than a packet
    /// takes between two hooks.
    fn let_packets_pass(&mut self) {
        use rustix::thread::{membarrier, MembarrierCommand};
        if membarrier(MembarrierCommand::Global).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Our tables as the kernel holds them.
pub type Views = HashMap<TableId, TableView>;

/// Every table of ours the kernel has (wanted or not).
pub fn read_views(kernel: &mut dyn NftKernel) -> Result<Views, NftError> {
    kernel.read_views()
}

/// Every table kube-nft may own, in both families.
pub fn all_tables() -> impl Iterator<Item = TableId> {
    Family::ALL.into_iter().flat_map(TableId::all_of)
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
    let mut batch = delete_tables(unused);
    replace_tables(&mut batch, &tables);
    sock.commit(batch)
}

/// Whether the kernel already holds our main table in either family (an
/// earlier run's, at start): one dump of the table names, nothing more.
pub fn holds_our_tables(sock: &mut NftSocket) -> Result<bool, NftError> {
    for family in Family::ALL {
        if sock
            .find_table(family, TableId::main(family).name())?
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Removes our tables from the current network namespace, touching nothing else.
pub fn cleanup(sock: &mut NftSocket) -> Result<Committed, NftError> {
    sock.commit(delete_tables(all_tables()))
}

/// Our tables as the kernel holds them now, lifted back into ruleset objects
/// (what `explain` walks on a live node): one walk per family, main tables
/// first. An object `lower` could not have written is an error naming it.
pub fn read_ruleset(sock: &mut NftSocket) -> Result<Ruleset, ReadError> {
    let mut tables = Vec::new();
    for family in Family::ALL {
        let read = sock.walk_tables(family, None, |header| {
            TableId::named(family, &header.name).map(|_| KernelTable::empty(family, &header.name))
        })?;
        let mut read: Vec<KernelTable> = read.into_values().collect();
        read.sort_by_key(KernelTable::id);
        for k in &read {
            tables.push(crate::nft::lift::lift_table(k)?);
        }
    }
    Ok(Ruleset { tables })
}

#[derive(Debug)]
pub enum ReadError {
    Nft(NftError),
    Lift(crate::nft::lift::LiftError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Nft(e) => write!(f, "reading our tables: {e}"),
            ReadError::Lift(e) => write!(f, "{e}: not written by kube-nft (edited by hand?)"),
        }
    }
}

impl From<NftError> for ReadError {
    fn from(e: NftError) -> Self {
        ReadError::Nft(e)
    }
}

impl From<crate::nft::lift::LiftError> for ReadError {
    fn from(e: crate::nft::lift::LiftError) -> Self {
        ReadError::Lift(e)
    }
}

/// Reads our tables back and says whether the kernel holds exactly `ruleset`.
pub fn kernel_matches(kernel: &mut dyn NftKernel, ruleset: &Ruleset) -> Result<bool, NftError> {
    for want in lowered(ruleset) {
        let Some(got) = kernel.read_table(want.id())? else {
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
    difference(a, b).is_none()
}

/// The first place where `got` is not `want` as `same_table` compares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// Another family or name.
    Table,
    TableComment,
    /// A named object: missing, extra, or otherwise (its comment among the rest).
    Object(String),
    /// Missing or extra.
    Set(String),
    /// Its typeof and comment.
    SetComment(String),
    /// Its definition or its elements.
    SetContent(String),
    /// Missing or extra.
    Chain(String),
    ChainComment(String),
    ChainHook(String),
    ChainRules(String),
}

/// Walks two lists sorted by name together: the first name on one side only,
/// or the first pair of one name for which `differ` says how they differ.
fn first_by_name<T>(
    want: &[T],
    got: &[T],
    name: impl Fn(&T) -> &str,
    missing: impl Fn(&str) -> Difference,
    differ: impl Fn(&T, &T) -> Option<Difference>,
) -> Option<Difference> {
    let (mut w, mut g) = (want.iter().peekable(), got.iter().peekable());
    loop {
        match (w.peek(), g.peek()) {
            (None, None) => return None,
            (Some(x), None) => return Some(missing(name(x))),
            (None, Some(y)) => return Some(missing(name(y))),
            (Some(x), Some(y)) => match name(x).cmp(name(y)) {
                std::cmp::Ordering::Less => return Some(missing(name(x))),
                std::cmp::Ordering::Greater => return Some(missing(name(y))),
                std::cmp::Ordering::Equal => {
                    if let Some(d) = differ(x, y) {
                        return Some(d);
                    }
                    w.next();
                    g.next();
                }
            },
        }
    }
}

/// Where `got` first differs from `want`, or `None` if they are the same table.
pub fn difference(want: &KernelTable, got: &KernelTable) -> Option<Difference> {
    if want.family != got.family || want.name != got.name {
        return Some(Difference::Table);
    }
    if want.userdata != got.userdata {
        return Some(Difference::TableComment);
    }
    let objects = |t: &KernelTable| {
        let mut v = t.objects.clone();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    };
    if let Some(d) = first_by_name(
        &objects(want),
        &objects(got),
        |o| o.name.as_str(),
        |n| Difference::Object(n.into()),
        |x, y| (x != y).then(|| Difference::Object(x.name.clone())),
    ) {
        return Some(d);
    }
    let sets = |t: &KernelTable| {
        let mut v = t.sets.clone();
        // Element order in a hash set is the kernel's, not ours.
        for s in &mut v {
            s.elements.sort_by(|x, y| x.key.cmp(&y.key));
            // A dynamic set's elements are the packets', not ours.
            if s.timeout_ms.is_some() {
                s.elements.clear();
            } else {
                // An endpoint map's size is the room it was made with, for
                // the elements it had then; the kernel holds no more.
                s.size = None;
            }
        }
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    };
    if let Some(d) = first_by_name(
        &sets(want),
        &sets(got),
        |s| s.name.as_str(),
        |n| Difference::Set(n.into()),
        |x, y| {
            if x.userdata != y.userdata {
                Some(Difference::SetComment(x.name.clone()))
            } else {
                (x != y).then(|| Difference::SetContent(x.name.clone()))
            }
        },
    ) {
        return Some(d);
    }
    fn by_name(t: &KernelTable) -> Vec<&KernelChain> {
        let mut v: Vec<&KernelChain> = t.chains.iter().collect();
        v.sort_by(|x, y| x.name.cmp(&y.name));
        v
    }
    first_by_name(
        &by_name(want),
        &by_name(got),
        |c| c.name.as_str(),
        |n| Difference::Chain(n.into()),
        |x, y| {
            let same_rules = x.rules.len() == y.rules.len()
                && x.rules.iter().zip(&y.rules).all(|(r, s)| r.same_as(s));
            if x.userdata != y.userdata {
                Some(Difference::ChainComment(x.name.clone()))
            } else if x.base != y.base {
                Some(Difference::ChainHook(x.name.clone()))
            } else {
                (!same_rules).then(|| Difference::ChainRules(x.name.clone()))
            }
        },
    )
}
