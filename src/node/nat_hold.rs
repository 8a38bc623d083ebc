//! Keeps the kernel translating established connections through a foreign
//! `nft flush ruleset`.
//!
//! The kernel translates an established connection from what conntrack
//! remembers, not from our rules; but it keeps conntrack's hooks only while
//! some rule uses conntrack, and its NAT hooks only while some nat chain of the
//! family exists, and drops each with the last user. `nft flush ruleset`
//! deletes every table, so until kube-nft's repair writes its tables back
//! (30-70 ms), packets of established Service connections pass untranslated: a
//! pod's answer arrives addressed to the masquerade address, the node resets
//! it, and the client waits on a connection that is gone.
//!
//! A table flagged `owner` belongs to the netlink socket that made it, and a
//! flush of the ruleset passes it by (kernel 5.12). One per family keeps both
//! kinds of hooks: an empty nat chain, and a chain that nothing jumps to whose
//! one rule matches on conntrack state. It acts on no packet, and lives as long
//! as the daemon, from its first sync (before it, kube-nft programs nothing):
//! when the process ends the kernel deletes it, while kube-nft's own tables
//! stay and keep the hooks themselves.

use crate::core::net::Family;
use crate::netlink::batch::{write_flagged_table, Batch};
use crate::netlink::objects::TABLE_F_OWNER;
use crate::netlink::{NftError, NftSocket};
use crate::nft::lower::lower_table;
use crate::ruleset::{BaseChain, Chain, ChainType, Hook, Rule, Stmt, Table};

/// The owned table's name, in each family.
pub const HOLD_TABLE: &str = "kube-nft-nat-hold";

/// The held table of `family`.
pub fn hold_table(family: Family) -> Table {
    Table {
        family,
        name: HOLD_TABLE.to_string(),
        comment: Some(
            "kube-nft: keeps established connections translated through nft flush ruleset; gone with the process"
                .to_string(),
        ),
        objects: Vec::new(),
        sets: Vec::new(),
        chains: vec![
            Chain {
                name: "nat".to_string(),
                base: Some(BaseChain {
                    kind: ChainType::Nat,
                    hook: Hook::Postrouting,
                    priority: 100,
                }),
                comment: Some("holds the NAT hooks".to_string()),
                rules: Vec::new(),
            },
            Chain {
                name: "conntrack".to_string(),
                base: None,
                comment: Some("holds conntrack's hooks; never jumped to".to_string()),
                rules: vec![Rule::new(vec![Stmt::CtStateNew])],
            },
        ],
    }
}

/// The batch that writes the held table of `family`.
pub fn hold_batch(family: Family) -> Batch {
    let mut b = Batch::new();
    write_flagged_table(&mut b, &lower_table(&hold_table(family)), TABLE_F_OWNER);
    b
}

/// The held tables; dropping this releases them.
pub struct NatHold {
    owner: NftSocket,
    /// The families whose table this socket owns.
    pub families: Vec<Family>,
    /// The families whose table the kernel cannot make (before 5.12 it knows
    /// no owner flag): not asked for again.
    cannot: Vec<Family>,
    /// Whether the warning that another process holds a table was given.
    warned_held: bool,
}

impl NatHold {
    /// Writes the held tables from a socket of their own, in the calling
    /// thread's namespace. A kernel without the owner flag leaves kube-nft
    /// serving as before, with a warning: only a flush of the ruleset costs
    /// more. A table another process owns (another kube-nft in the same
    /// namespace, as while one replaces another) is asked for again by
    /// `refresh`, which the daemon calls every sync period.
    pub fn take() -> Result<NatHold, NftError> {
        let mut hold = NatHold {
            owner: NftSocket::open()?,
            families: Vec::new(),
            cannot: Vec::new(),
            warned_held: false,
        };
        hold.refresh();
        Ok(hold)
    }

    /// Asks again for the tables not held yet.
    pub fn refresh(&mut self) {
        for family in Family::ALL {
            if self.families.contains(&family) || self.cannot.contains(&family) {
                continue;
            }
            match self.owner.commit(hold_batch(family)) {
                Ok(_) => {
                    if self.warned_held {
                        tracing::info!("the NAT hold of {family:?} is ours now");
                    }
                    self.families.push(family);
                }
                Err(e) if held_by_another(&e) => {
                    if !self.warned_held {
                        tracing::warn!(
                            "another process holds {HOLD_TABLE} ({e}): asking again every sync period"
                        );
                        self.warned_held = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        "a table owned by kube-nft could not be made ({e}; it needs kernel 5.12): {family:?} connections established through a Service will break if someone runs nft flush ruleset"
                    );
                    self.cannot.push(family);
                }
            }
        }
    }
}

/// EPERM: the table exists and another socket owns it.
fn held_by_another(e: &NftError) -> bool {
    matches!(e, NftError::Refused { source, .. }
        if source.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()))
}
