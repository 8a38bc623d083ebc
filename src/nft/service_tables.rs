//! How many Service tables a family has, and which one holds a Service.
//!
//! Two costs pull the count opposite ways (docs/DESIGN.md, "The Services are
//! spread over Service tables"):
//! - every Service table hooks the NAT chains, and a connection's first packet
//!   walks the tables registered after its own before one DNATs it: fewer
//!   tables, a cheaper new connection;
//! - a commit that adds a rule or a jumping element makes the kernel validate
//!   the whole table it touches: smaller tables, a cheaper change.
//!
//! So the count follows the cluster: a table for up to `GROW_ABOVE` Services,
//! doubling (up to `SERVICE_SHARDS`) as the cluster grows past that per table.
//! A count the kernel already has is kept while its tables are neither twice
//! too full nor four times too empty, so that a restart writes nothing and a
//! cluster at a bound does not regroup back and forth. Counts are powers of
//! two and a Service's table is its name hash modulo the count, so a regroup
//! keeps each Service in the table whose number is its hash modulo the new
//! count.

use crate::core::model::{ClusterState, ServiceKey};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::nft::kernel::Views;
use crate::ruleset::{TableId, SERVICE_SHARDS};

/// A table of this many Services costs a change ~0.25 ms of the kernel's
/// validation (0.6 ms per 10k Services measured with one table, 0.1 ms of
/// the change itself); beyond it the count doubles.
pub const GROW_ABOVE: usize = 4096;

/// The count a cold start chooses for this many Services: the smallest that
/// keeps each table at `GROW_ABOVE` Services or fewer, at most `SERVICE_SHARDS`.
pub fn for_services(services: usize) -> u16 {
    let mut count = 1;
    while count < SERVICE_SHARDS && services > count as usize * GROW_ABOVE {
        count *= 2;
    }
    count
}

/// The count to program for this many Services, given the count the kernel
/// has (`None`: no Service tables, or not a count kube-nft writes). The count
/// found is kept while its tables hold more than an eighth of `GROW_ABOVE`
/// Services each and at most twice `GROW_ABOVE`; a regroup lands between a
/// half and the whole of it, two times or more from either bound.
pub fn keep_or_choose(found: Option<u16>, services: usize) -> u16 {
    match found {
        Some(found) if found.is_power_of_two() && found <= SERVICE_SHARDS => {
            let tables = found as usize;
            let not_too_many = found == 1 || services > tables * GROW_ABOVE / 8;
            let not_too_few = found == SERVICE_SHARDS || services <= tables * GROW_ABOVE * 2;
            if not_too_many && not_too_few {
                found
            } else {
                for_services(services)
            }
        }
        _ => for_services(services),
    }
}

/// The count of Service tables in the kernel's IPv4 (else IPv6) tables, when
/// they are the first N of a count kube-nft writes.
pub fn found_in(views: &Views) -> Option<u16> {
    Family::ALL.into_iter().find_map(|family| {
        let present = (0..SERVICE_SHARDS)
            .take_while(|n| views.contains_key(&TableId::shard(family, *n)))
            .count() as u16;
        let beyond =
            (present..SERVICE_SHARDS).any(|n| views.contains_key(&TableId::shard(family, n)));
        (present > 0 && present.is_power_of_two() && !beyond).then_some(present)
    })
}

/// The count `config` programs for `state`: the dataplane's, once it has
/// chosen one against the kernel, else what a cold start would choose.
pub fn count(config: &NodeConfig, state: &ClusterState) -> u16 {
    config
        .service_tables
        .unwrap_or_else(|| for_services(state.services.len()))
}

/// The Service table that holds a Service, by a stable hash of its namespace
/// and name (both families use the same number).
pub fn table_of(key: &ServiceKey, family: Family, count: u16) -> TableId {
    TableId::shard(family, shard_of(key, count))
}

/// The number of a Service's table among `count`.
pub fn shard_of(key: &ServiceKey, count: u16) -> u16 {
    let hash = crate::nft::names::fnv1a(format!("{}/{}", key.namespace, key.name).as_bytes());
    (hash % count.max(1) as u64) as u16
}

/// The tables a family has: the main one, and `count` Service tables unless
/// IPVS (which has no Service chains) is the backend.
pub fn table_ids(family: Family, config: &NodeConfig, count: u16) -> Vec<TableId> {
    let main = std::iter::once(TableId::main(family));
    if config.mode.is_ipvs() {
        main.collect()
    } else {
        main.chain((0..count).map(|n| TableId::shard(family, n)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cold_start_keeps_each_table_at_or_below_the_bound() {
        assert_eq!(for_services(0), 1);
        assert_eq!(for_services(GROW_ABOVE), 1);
        assert_eq!(for_services(GROW_ABOVE + 1), 2);
        assert_eq!(for_services(10_000), 4);
        assert_eq!(for_services(30_000), 8);
        assert_eq!(for_services(32_768), 8);
        assert_eq!(for_services(32_769), 16);
        assert_eq!(for_services(1_000_000), SERVICE_SHARDS);
    }

    #[test]
    fn a_count_found_is_kept_while_its_tables_are_neither_too_full_nor_too_empty() {
        assert_eq!(keep_or_choose(Some(16), 100_000), 16);
        assert_eq!(keep_or_choose(Some(4), 10_000), 4);
        // Too full: more than 2 × GROW_ABOVE a table.
        assert_eq!(keep_or_choose(Some(1), 2 * GROW_ABOVE), 1);
        assert_eq!(keep_or_choose(Some(1), 2 * GROW_ABOVE + 1), 4);
        assert_eq!(keep_or_choose(Some(4), 100_000), 16);
        // Too empty: an eighth of GROW_ABOVE a table or fewer.
        assert_eq!(keep_or_choose(Some(16), 2 * GROW_ABOVE + 1), 16);
        assert_eq!(keep_or_choose(Some(16), 2 * GROW_ABOVE), 2);
        assert_eq!(keep_or_choose(Some(2), 10), 1);
        // What kube-nft does not write is not a count to keep.
        assert_eq!(keep_or_choose(Some(3), 10), 1);
        assert_eq!(keep_or_choose(Some(32), 100_000), 16);
        assert_eq!(keep_or_choose(None, 10_000), 4);
    }

    #[test]
    fn a_regrouped_count_is_kept_by_the_next_sync() {
        for services in [
            0, 1, 500, 4096, 4097, 10_000, 30_000, 65_536, 100_000, 300_000,
        ] {
            let chosen = keep_or_choose(None, services);
            assert_eq!(keep_or_choose(Some(chosen), services), chosen, "{services}");
        }
    }

    #[test]
    fn a_regroup_keeps_a_service_in_the_table_its_hash_names() {
        for i in 0..200 {
            let key = ServiceKey {
                namespace: "ns".into(),
                name: format!("svc-{i}"),
            };
            let at16 = shard_of(&key, 16);
            for count in [1, 2, 4, 8] {
                assert_eq!(shard_of(&key, count), at16 % count);
            }
        }
    }
}
