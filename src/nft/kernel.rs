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
