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
//! as the daemon: when the process ends the kernel deletes it, while kube-nft's
//! own tables stay and keep the hooks themselves.

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
        counters: Vec::new(),
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
    _owner: NftSocket,
    pub families: Vec<Family>,
}

impl NatHold {
    /// Writes the held tables from a socket of their own, in the calling
    /// thread's namespace. A family whose table the kernel refuses (before
    /// 5.12 it knows no owner flag) goes without, with a warning: kube-nft
    /// serves as before, only a flush of the ruleset costs more.
    pub fn take() -> Result<NatHold, NftError> {
        let mut sock = NftSocket::open()?;
        let mut families = Vec::new();
        for family in Family::ALL {
            match sock.commit(hold_batch(family)) {
                Ok(_) => families.push(family),
                Err(e) => tracing::warn!(
                    "a table owned by kube-nft could not be made ({e}; it needs kernel 5.12): {family:?} connections established through a Service will break if someone runs nft flush ruleset"
                ),
            }
        }
        Ok(NatHold {
            _owner: sock,
            families,
        })
    }
}
