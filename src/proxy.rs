//! One sync of the proxy: objects → model → desired ruleset → kernel.
//!
//! Today every sync replaces our tables in one atomic transaction; packets see the
//! old rules until the commit and the new ones after it, and established
//! connections keep their conntrack NAT state throughout. Incremental syncs (only
//! what changed) are the next step (issue #3) and will slot in here.

use crate::model::{build_state, Objects, Rejected, Validated};
use crate::netlink::{lower_table, Committed, KernelTable, NftError, NftSocket};
use crate::ruleset::{Family, TABLE_NAME};
use crate::translate::{translate, NodeConfig, Ruleset};

/// What one sync did.
#[derive(Debug)]
pub struct SyncReport {
    pub ruleset: Ruleset,
    pub rejected: Vec<Rejected>,
    pub committed: Committed,
}

/// Validates the objects and computes the desired ruleset, logging each rejected
/// object; the others still go through.
pub fn desired(
    objects: &Objects,
    node_name: Option<&str>,
    config: &NodeConfig,
) -> (Ruleset, Validated) {
    let validated = build_state(objects, node_name);
    for r in &validated.rejected {
        tracing::warn!(object = %r.object, field = %r.field, "rejected: {r}");
    }
    for (object, why) in &validated.skipped {
        tracing::debug!("{object}: not proxied ({why:?})");
    }
    (translate(&validated.state, config), validated)
}

pub fn lowered(ruleset: &Ruleset) -> Vec<KernelTable> {
    ruleset.tables.iter().map(lower_table).collect()
}

/// Programs `ruleset` into the current network namespace, replacing our tables.
pub fn apply(sock: &mut NftSocket, ruleset: &Ruleset) -> Result<Committed, NftError> {
    let batch = crate::netlink::nftables::replace_tables(&lowered(ruleset));
    sock.commit(batch)
}

/// Removes our tables from the current network namespace, touching nothing else.
pub fn cleanup(sock: &mut NftSocket) -> Result<Committed, NftError> {
    sock.commit(crate::netlink::nftables::delete_tables(
        &Family::ALL,
        TABLE_NAME,
    ))
}

/// Reads our tables back and says whether the kernel holds exactly `ruleset`.
pub fn kernel_matches(sock: &mut NftSocket, ruleset: &Ruleset) -> Result<bool, NftError> {
    for want in lowered(ruleset) {
        let Some(mut got) = sock.read_table(want.family, &want.name)? else {
            return Ok(false);
        };
        for c in &mut got.chains {
            for r in &mut c.rules {
                r.handle = None;
            }
        }
        if !same_table(&want, &got) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Equal as programmed: same objects in the same order, counters ignored.
pub fn same_table(a: &KernelTable, b: &KernelTable) -> bool {
    let mut a_sets = a.sets.clone();
    let mut b_sets = b.sets.clone();
    // Element order in a hash set is the kernel's, not ours.
    for s in a_sets.iter_mut().chain(b_sets.iter_mut()) {
        s.elements.sort_by(|x, y| x.key.cmp(&y.key));
    }
    a.family == b.family
        && a.name == b.name
        && a.userdata == b.userdata
        && a_sets == b_sets
        && a.chains.len() == b.chains.len()
        && a.chains.iter().zip(&b.chains).all(|(x, y)| {
            x.name == y.name
                && x.base == y.base
                && x.userdata == y.userdata
                && x.rules.len() == y.rules.len()
                && x.rules.iter().zip(&y.rules).all(|(r, s)| r.same_as(s))
        })
}
