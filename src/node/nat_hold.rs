//! Keeps the kernel's NAT of established connections through a foreign
//! `nft flush ruleset`.
//!
//! The kernel translates an established connection in its NAT hooks, from what
//! conntrack remembers, not from our rules; but it registers those hooks only
//! while some nat chain of the family exists, and drops them with the last one.
//! `nft flush ruleset` deletes every table, so until kube-nft's repair writes
//! its tables back (30-70 ms), packets of established Service connections pass
//! untranslated: a pod's answer arrives addressed to the masquerade address, the
//! node resets it, and the client waits on a connection that is gone.
//!
//! A table flagged `owner` belongs to the netlink socket that made it, and a
//! flush of the ruleset passes it by (kernel 5.12). One per family, holding one
//! empty nat chain, keeps the NAT hooks, and conntrack's, registered through the
//! gap. It does nothing to a packet, and lives as long as the daemon: when the
//! process ends the kernel deletes it, while kube-nft's own tables stay and keep
//! the hooks themselves.

use crate::core::net::Family;
use crate::netlink::batch::Batch;
use crate::netlink::objects::{comment_udata, KernelChain, TABLE_F_OWNER};
use crate::netlink::{NftError, NftSocket};
use crate::ruleset::{BaseChain, ChainType, Hook};

/// The owned table's name, in each family.
pub const HOLD_TABLE: &str = "kube-nft-nat-hold";
pub const HOLD_CHAIN: &str = "hold";
/// Said in `nft list ruleset`, where an operator meets the table.
pub const COMMENT: &str =
    "kube-nft: keeps NAT of established connections through nft flush ruleset; gone with the process";

/// The held tables; dropping this releases them.
pub struct NatHold {
    _owner: NftSocket,
    pub families: Vec<Family>,
}

/// The batch that writes the held table of `family`.
pub fn hold_batch(family: Family) -> Batch {
    let mut b = Batch::new();
    b.add_table_flagged(
        family,
        HOLD_TABLE,
        TABLE_F_OWNER,
        comment_udata(&Some(COMMENT.to_string())).as_deref(),
    );
    let chain = KernelChain {
        name: HOLD_CHAIN.to_string(),
        base: Some(BaseChain {
            kind: ChainType::Nat,
            hook: Hook::Postrouting,
            priority: 100,
        }),
        userdata: None,
        rules: Vec::new(),
    };
    b.add_chain(family, HOLD_TABLE, &chain);
    b
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
                    "established connections of {family:?} lose NAT while an nft flush ruleset leaves no nat chain: a table owned by kube-nft could not be made ({e}; it needs kernel 5.12)"
                ),
            }
        }
        Ok(NatHold {
            _owner: sock,
            families,
        })
    }
}
