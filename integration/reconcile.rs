//! Incremental reconciliation: partial syncs send only what changed and leave
//! the kernel equal to the desired ruleset; a restart over a correct ruleset
//! writes nothing; a refused transaction changes nothing and the next sync
//! repairs.
//!
//! Each case is written once, generic over the kernel, and `cases!` runs the
//! list twice: `namespace::` in a fresh network namespace (root), and `fake::`
//! against `FakeKernel` (no root, milliseconds). The fake is worth its speed
//! only while the kernel agrees with it, so no case runs on one side alone,
//! but the verification off the path of changes: it reads through a second
//! socket, which the fake has not.

mod common;

use common::*;
use kube_nft::testbed::synthetic::{
    add_service, endpoint, endpoint_addr, service_key, set_endpoints,
};

use kube_nft::core::endpoint_key::key_operations;
use kube_nft::core::model::ClusterState;
use kube_nft::core::net::Family;
use kube_nft::core::node_config::NodeConfig;
use kube_nft::engine::dataplane::{SyncKind, Verification};
use kube_nft::engine::{Engine, Proxy};
use kube_nft::netlink::objects::{KernelElement, KernelTable};
use kube_nft::netlink::{Batch, Committed, NftError, NftSocket};
use kube_nft::nft::dataplane::NftDataplane;
use kube_nft::nft::fake::FakeKernel;
use kube_nft::nft::kernel::{self, lowered, same_table, NftKernel};
use kube_nft::nft::names::{
    CHAIN_SERVICES, MAP_CLUSTER_IPS_REJECT, MAP_SERVICE_IPS, SET_NODEPORT_IPS,
};
use kube_nft::nft::service_tables;
use kube_nft::nft::translate::translate;
use kube_nft::nft::view::{RuleView, TableView};
use kube_nft::ruleset::{Field, Mapped, Rule, Ruleset, Stmt, TableId};
use kube_nft::testbed::netns::{in_netns, Netns};
use std::cell::Cell;
use std::rc::Rc;

/// One kernel, as a case sees it: any number of handles on the same tables.
trait Kernel {
    type Handle: NftKernel + 'static;
    fn handle(&self) -> Self::Handle;
}

/// The kernel of the network namespace the case runs in.
struct Namespace;

impl Kernel for Namespace {
    type Handle = NftSocket;
    fn handle(&self) -> NftSocket {
        NftSocket::open().unwrap()
    }
}

impl Kernel for FakeKernel {
    type Handle = FakeKernel;
    fn handle(&self) -> FakeKernel {
        self.clone()
    }
}

/// A kernel under test, and how many transactions the proxies over it sent.
struct Harness<K> {
    kernel: K,
    commits: Rc<Cell<usize>>,
}

impl<K: Kernel> Harness<K> {
    fn new(kernel: K) -> Self {
        Harness {
            kernel,
            commits: Rc::default(),
        }
    }

    /// A new proxy (a new process, as far as the kernel knows) over this kernel.
    fn proxy(&self, config: NodeConfig) -> Proxy {
        let counted = Counted {
            inner: self.kernel.handle(),
            commits: self.commits.clone(),
        };
        let nft = NftDataplane::with_kernel(counted);
        Proxy::new(Engine::new(config, vec![Box::new(nft)]))
    }

    /// A new proxy that has synced `services` Services of `endpoints` each.
    fn synced_proxy(&self, services: usize, endpoints: usize) -> Proxy {
        let mut p = self.proxy(config());
        for i in 0..services {
            add_service(&mut p, i, endpoints);
        }
        p.sync().unwrap();
        p
    }

    fn read_table(&self, table: TableId) -> KernelTable {
        self.kernel.handle().read_table(table).unwrap().unwrap()
    }

    /// Commits `batch` behind the proxies' backs.
    fn commit(&self, batch: Batch) -> Result<Committed, NftError> {
        self.kernel.handle().commit(batch)
    }
}

/// A kernel handle that counts the transactions sent through it.
struct Counted<H> {
    inner: H,
    commits: Rc<Cell<usize>>,
}

impl<H: NftKernel> NftKernel for Counted<H> {
    fn read_view(&mut self, table: TableId) -> Result<Option<TableView>, NftError> {
        self.inner.read_view(table)
    }
    fn read_views(&mut self) -> Result<kernel::Views, NftError> {
        self.inner.read_views()
    }
    fn read_chain_rules(&mut self, table: TableId, chain: &str) -> Result<Vec<RuleView>, NftError> {
        self.inner.read_chain_rules(table, chain)
    }
    fn read_set_elements(
        &mut self,
        table: TableId,
        set: &str,
    ) -> Result<Vec<KernelElement>, NftError> {
        self.inner.read_set_elements(table, set)
    }
    fn read_table(&mut self, table: TableId) -> Result<Option<KernelTable>, NftError> {
        self.inner.read_table(table)
    }
    fn commit(&mut self, batch: Batch) -> Result<Committed, NftError> {
        self.commits.set(self.commits.get() + 1);
        self.inner.commit(batch)
    }
    fn second_socket(&self) -> Option<std::io::Result<NftSocket>> {
        self.inner.second_socket()
    }
    fn let_packets_pass(&mut self) {
        self.inner.let_packets_pass()
    }
}

/// Every case, run against both kernels.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        mod namespace {
            $(
                #[test]
                fn $case() {
                    super::require_root();
                    let ns = super::Netns::create(&super::unique(stringify!($case))).unwrap();
                    super::in_netns(&ns.name, || super::$case(&super::Harness::new(super::Namespace)))
                        .unwrap();
                }
            )*
        }
        mod fake {
            $(
                #[test]
                fn $case() {
                    super::$case(&super::Harness::new(super::FakeKernel::new()));
                }
            )*
        }
    };
}

cases!(
    partial_syncs_leave_the_kernel_equal_to_the_desired_ruleset,
    a_count_change_across_blocks_leaves_the_kernel_as_desired,
    partial_syncs_keep_counters_in_step,
    restart_over_a_correct_ruleset_writes_nothing,
    endpoint_change_transaction_size_does_not_grow_with_services,
    refused_transaction_changes_nothing_and_the_next_full_sync_repairs,
    a_single_table_ruleset_of_an_earlier_version_is_adopted_in_one_sync,
    a_chain_an_element_points_to_cannot_be_deleted,
    a_new_count_makes_a_chain_only_above_16_endpoints,
    a_change_in_a_large_service_costs_what_it_changes,
    the_service_tables_follow_the_clusters_size,
    tables_written_where_none_were_get_their_reject_verdict_a_commit_later,
    an_endpoint_map_filled_past_its_size_is_made_again_with_room,
);

fn config() -> NodeConfig {
    NodeConfig {
        cluster_cidrs: vec![
            "10.128.0.0/9".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ],
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        masquerade_bit: 14,
        fast_path: kube_nft::core::node_config::FastPath::LongLived,
        ..NodeConfig::default()
    }
}

/// A named change to the model.
type Step = (&'static str, Box<dyn Fn(&mut Proxy)>);

fn partial_syncs_leave_the_kernel_equal_to_the_desired_ruleset(h: &Harness<impl Kernel>) {
    check_partial_syncs(h, config());
}

/// The same steps with a named counter per Service port: Services added and
/// deleted take their counters and counter-map elements with them.
fn partial_syncs_keep_counters_in_step(h: &Harness<impl Kernel>) {
    check_partial_syncs(
        h,
        NodeConfig {
            counters: true,
            ..config()
        },
    );
}

fn check_partial_syncs(h: &Harness<impl Kernel>, config: NodeConfig) {
    let p = &mut h.proxy(config);
    for i in 0..20 {
        add_service(p, i, 1 + i % 5);
    }
    assert_eq!(p.sync().unwrap().kind, SyncKind::Full);
    assert!(p.verify().unwrap());
    let endpoints = |i: usize, js: &'static [usize]| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(i), |s| {
                let addrs: Vec<_> = js.iter().map(|j| endpoint(i, *j)).collect();
                set_endpoints(s, i, &addrs)
            })
        })
    };
    let affinity = |timeout: Option<u32>| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(7), |s| {
                s.service_mut(&service_key(7)).unwrap().affinity_timeout = timeout
            })
        })
    };
    let timeouts = |i: usize, tcp: Option<u32>| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(i), |s| {
                let svc = s.service_mut(&service_key(i)).unwrap();
                svc.conntrack_timeouts.tcp_established = tcp;
            })
        })
    };
    let long_lived = |i: usize, on: bool| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(i), |s| {
                s.service_mut(&service_key(i)).unwrap().long_lived = on;
            })
        })
    };
    let steps: Vec<Step> = vec![
        ("add an endpoint", endpoints(3, &[0, 1, 2, 3, 9])),
        ("remove a middle endpoint", endpoints(4, &[0, 2, 3, 4])),
        ("replace an endpoint", endpoints(2, &[0, 7, 2])),
        ("remove every endpoint", endpoints(1, &[])),
        ("endpoints come back", endpoints(1, &[5])),
        (
            "delete a Service",
            Box::new(|p| {
                p.update(&service_key(0), |s| {
                    s.services.remove(&service_key(0));
                    s.slices.remove(&service_key(0));
                })
            }),
        ),
        ("add a Service", Box::new(|p| add_service(p, 40, 3))),
        (
            "an endpoint count no Service had (a new pick chain and map)",
            endpoints(8, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
        ),
        (
            "and back (the chain and map go, unless another Service has the count)",
            endpoints(8, &[0, 1, 2, 3]),
        ),
        (
            "two Services share an endpoint address",
            Box::new(|p| p.update(&service_key(5), |s| set_endpoints(s, 5, &[endpoint(6, 0)]))),
        ),
        ("and one lets it go", endpoints(5, &[0])),
        (
            "session affinity turned on (a timeout set per endpoint)",
            affinity(Some(600)),
        ),
        (
            "an affinity endpoint leaves, its set with it",
            endpoints(7, &[1]),
        ),
        (
            "a new affinity timeout (new sets, old ones deleted)",
            affinity(Some(60)),
        ),
        ("session affinity turned off", affinity(None)),
        (
            "a NodePort and an external IP (masquerade-pick chains)",
            Box::new(|p| {
                p.update(&service_key(9), |s| {
                    let svc = s.service_mut(&service_key(9)).unwrap();
                    svc.ports[0].node_port = Some(30009);
                    svc.external_ips = vec!["192.0.2.9".parse().unwrap()];
                })
            }),
        ),
        (
            "a Local policy (the port's external- and nodeport- chains, local picks)",
            Box::new(|p| {
                p.update(&service_key(9), |s| {
                    let svc = s.service_mut(&service_key(9)).unwrap();
                    svc.external_policy_local = true;
                })
            }),
        ),
        (
            "its own conntrack timeout (a ct timeout object, timeout- chains before the others)",
            timeouts(9, Some(3600)),
        ),
        (
            "a new timeout (a new object, the old one deleted once no rule names it)",
            timeouts(9, Some(60)),
        ),
        (
            "it loses every endpoint (chains that jump to each other go together)",
            endpoints(9, &[]),
        ),
        (
            "a conntrack timeout on a ClusterIP",
            timeouts(3, Some(7200)),
        ),
        ("and off again", timeouts(3, None)),
        (
            "on the fast path (fast- chains that label its flows)",
            long_lived(3, true),
        ),
        (
            "with its own conntrack timeout too (one wraps the other)",
            timeouts(3, Some(600)),
        ),
        ("off the fast path", long_lived(3, false)),
    ];
    for (what, step) in steps {
        step(p);
        let r = p.sync().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.kind, SyncKind::Partial, "{what}");
        assert!(r.committed.messages > 0, "{what}: nothing was sent");
        assert!(
            p.verify().unwrap(),
            "{what}: the kernel differs from the desired ruleset"
        );
    }
    // Nothing changed: a full sync finds nothing to send.
    p.request_full_sync();
    assert_eq!(p.sync().unwrap().committed.messages, 0);
}

/// A first sync writes the tables in one commit and the verdict of the
/// ClusterIP reject in a second (`Plan::then`), as does the repair of a main
/// table deleted behind its back; a sync over tables in place, one commit.
fn tables_written_where_none_were_get_their_reject_verdict_a_commit_later(
    h: &Harness<impl Kernel>,
) {
    let verdicts = |h: &Harness<_>| {
        Family::ALL.map(|f| {
            let main = h.read_table(TableId::main(f));
            let map = main.sets.iter().find(|s| s.name == MAP_CLUSTER_IPS_REJECT);
            map.map_or(0, |m| m.elements.len())
        })
    };
    let p = &mut h.synced_proxy(3, 2);
    assert_eq!(
        h.commits.get(),
        2,
        "a first sync: the tables, then the verdict"
    );
    assert_eq!(verdicts(h), [1, 1]);
    add_service(p, 3, 2);
    p.sync().unwrap();
    assert_eq!(h.commits.get(), 3, "a change: one commit");
    let mut delete = Batch::new();
    delete.delete_table(Family::Ip, TableId::main(Family::Ip).name());
    h.commit(delete).unwrap();
    p.request_full_sync();
    p.sync().unwrap();
    assert_eq!(h.commits.get(), 5, "a repair: the table, then the verdict");
    assert_eq!(verdicts(h), [1, 1]);
    assert!(p.verify().unwrap());
}

fn restart_over_a_correct_ruleset_writes_nothing(h: &Harness<impl Kernel>) {
    let p = &mut h.synced_proxy(50, 4);
    // Move endpoints around so the kernel's slots differ from a fresh computation.
    p.update(&service_key(7), |s| {
        set_endpoints(s, 7, &[endpoint(7, 3), endpoint(7, 1), endpoint(7, 9)])
    });
    p.sync().unwrap();
    a_restart_writes_nothing(h, p.state());
}

/// A new process over the same model and kernel, nothing applied yet: its
/// first (full) sync sends no transaction, and the kernel verifies.
fn a_restart_writes_nothing(h: &Harness<impl Kernel>, state: &ClusterState) {
    let commits = h.commits.get();
    let mut again = h.proxy(config());
    again.replace_state(state.clone());
    let r = again.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!(
        r.committed.messages, 0,
        "a restart rewrote {} bytes",
        r.committed.bytes
    );
    assert_eq!(h.commits.get(), commits, "an empty plan reached the kernel");
    assert!(again.verify().unwrap());
}

/// The bytes of three one-endpoint changes (replace one, remove one, add one
/// back), with `services` Services programmed by a new proxy.
fn endpoint_change_bytes(h: &Harness<impl Kernel>, services: usize) -> Vec<usize> {
    let p = &mut h.synced_proxy(services, 10);
    let i = services / 2;
    let changes: [&[usize]; 3] = [
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 11],
        &[0, 1, 2, 3, 5, 6, 7, 8, 11],
        &[0, 1, 2, 3, 5, 6, 7, 8, 11, 12],
    ];
    let mut sizes = Vec::new();
    for eps in changes {
        p.update(&service_key(i), |s| {
            let addrs: Vec<_> = eps.iter().map(|j| endpoint(i, *j)).collect();
            set_endpoints(s, i, &addrs)
        });
        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Partial);
        sizes.push(r.committed.bytes);
    }
    assert!(p.verify().unwrap());
    sizes
}

fn endpoint_change_transaction_size_does_not_grow_with_services(h: &Harness<impl Kernel>) {
    let small = endpoint_change_bytes(h, 100);
    let large = endpoint_change_bytes(h, 5_000);
    for (s, l) in small.iter().zip(&large) {
        // Names of Service 50 and Service 2500 differ by two characters per mention.
        assert!(
            l.abs_diff(*s) <= 64,
            "100 Services: {small:?} bytes, 5000: {large:?}"
        );
        assert!(*l <= 2048, "a one-endpoint change took {l} bytes");
    }
}

fn refused_transaction_changes_nothing_and_the_next_full_sync_repairs(h: &Harness<impl Kernel>) {
    let p = &mut h.synced_proxy(10, 3);
    // Behind the proxy's back, remove an element it believes is there.
    let table = remove_service_3s_cluster_ip(h);
    // One change deletes that element (Service 3 goes away), another adds a Service.
    p.update(&service_key(3), |s| {
        s.services.remove(&service_key(3));
        s.slices.remove(&service_key(3));
    });
    add_service(p, 77, 2);
    let read_all = || [TableId::main(Family::Ip), table].map(|t| h.read_table(t));
    let before = read_all();
    let err = p.sync().unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("delete 1 element(s) of {table} service-ips")),
        "{err}"
    );
    for (b, a) in before.iter().zip(&read_all()) {
        assert!(
            same_table(b, a),
            "the refused transaction changed {}",
            b.name
        );
    }
    // The next sync reads the kernel back and repairs everything.
    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert!(p.verify().unwrap());
}

/// The Service tables present in the kernel, by family.
fn service_tables_in(h: &Harness<impl Kernel>) -> Vec<TableId> {
    TableId::all_of(Family::Ip)
        .chain(TableId::all_of(Family::Ip6))
        .filter(|t| t.shard.is_some())
        .filter(|t| h.kernel.handle().read_table(*t).unwrap().is_some())
        .collect()
}

/// The count of Service tables follows the cluster's size: one table for a
/// small cluster (a new connection walks few NAT chains), more as it grows
/// (a change validates a table of bounded size). Growing past a bound
/// regroups every Service in one full sync, a restart keeps the count the
/// kernel has, and shrinking far enough regroups back.
fn the_service_tables_follow_the_clusters_size(h: &Harness<impl Kernel>) {
    let bound = service_tables::GROW_ABOVE;
    let p = &mut h.synced_proxy(bound, 1);
    let one = vec![
        TableId::shard(Family::Ip, 0),
        TableId::shard(Family::Ip6, 0),
    ];
    assert_eq!(service_tables_in(h), one, "{bound} Services");
    // Up to twice what a cold start gives one table, the table stays alone.
    for i in bound..2 * bound {
        add_service(p, i, 1);
    }
    p.sync().unwrap();
    assert_eq!(service_tables_in(h), one, "{} Services", 2 * bound);

    // One Service more than one table is for: a partial sync regroups all.
    add_service(p, 2 * bound, 1);
    p.sync().unwrap();
    let four: Vec<TableId> = [Family::Ip, Family::Ip6]
        .into_iter()
        .flat_map(|f| (0..4).map(move |n| TableId::shard(f, n)))
        .collect();
    assert_eq!(service_tables_in(h), four, "{} Services", 2 * bound + 1);
    assert!(p.verify().unwrap());
    let moved = (0..=2 * bound)
        .filter(|i| service_tables::shard_of(&service_key(*i), 4) != 0)
        .count();
    assert!(moved > bound, "only {moved} Services left table 00");

    // Back to the size of the start: the four tables stay (no regroup back
    // and forth at a bound), and a restart writes nothing.
    p.update(&service_key(2 * bound), |s| {
        s.services.remove(&service_key(2 * bound));
    });
    p.sync().unwrap();
    assert_eq!(service_tables_in(h), four);
    a_restart_writes_nothing(h, p.state());

    // Down to an eighth of a table's bound in each of the four: one table.
    let keep = 4 * bound / 8;
    let mut state = p.state().clone();
    for i in keep..2 * bound {
        state.services.remove(&service_key(i));
    }
    p.replace_state(state);
    p.sync().unwrap();
    assert_eq!(service_tables_in(h), one, "{keep} Services");
    assert!(p.verify().unwrap());
}

/// The Service table of Service i, in a cluster of the cases' sizes (one table
/// up to `service_tables::GROW_ABOVE` Services).
fn home_table(i: usize) -> TableId {
    service_tables::table_of(&service_key(i), Family::Ip, 1)
}

/// Deletes Service 3's ClusterIP element (10.96.0.4) from its table, behind
/// the proxies' backs; the table.
fn remove_service_3s_cluster_ip(h: &Harness<impl Kernel>) -> TableId {
    let table = home_table(3);
    let vip: std::net::Ipv4Addr = "10.96.0.4".parse().unwrap();
    let element = h
        .kernel
        .handle()
        .read_set_elements(table, MAP_SERVICE_IPS)
        .unwrap()
        .into_iter()
        .find(|e| e.key.starts_with(&vip.octets()))
        .expect("the element is there");
    let mut batch = Batch::new();
    batch.delete_elements(Family::Ip, table.name(), MAP_SERVICE_IPS, &[element]);
    h.commit(batch).unwrap();
    table
}

/// Earlier versions kept every Service chain and the dispatch maps in the main
/// table. The first full sync over such a ruleset moves them into the Service
/// tables in one transaction and leaves the main table with none of them.
fn a_single_table_ruleset_of_an_earlier_version_is_adopted_in_one_sync(h: &Harness<impl Kernel>) {
    let p = &mut h.proxy(config());
    for i in 0..20 {
        add_service(p, i, 3);
    }
    let rs = translate(p.state(), &config());
    let mut main = rs.table(Family::Ip).unwrap().clone();
    for shard in rs.of_family(Family::Ip).skip(1) {
        for set in &shard.sets {
            if set.name == SET_NODEPORT_IPS {
                continue;
            }
            match main.sets.iter_mut().find(|s| s.name == set.name) {
                Some(s) => s.elements.extend(set.elements.iter().cloned()),
                None => main.sets.push(set.clone()),
            }
        }
        let own = shard.chains.iter().filter(|c| c.base.is_none());
        main.chains
            .extend(own.filter(|c| c.name != CHAIN_SERVICES).cloned());
    }
    let services = main
        .chains
        .iter_mut()
        .find(|c| c.name == CHAIN_SERVICES)
        .unwrap();
    services.rules.push(Rule::new(vec![Stmt::Vmap {
        fields: vec![Field::Daddr, Field::L4Proto, Field::Dport],
        map: MAP_SERVICE_IPS.into(),
    }]));
    let old = Ruleset {
        tables: vec![main, rs.table(Family::Ip6).unwrap().clone()],
    };
    let mut batch = Batch::new();
    kube_nft::netlink::batch::replace_tables(&mut batch, &lowered(&old));
    h.commit(batch).unwrap();
    let main_id = TableId::main(Family::Ip);
    let main_before = h.read_table(main_id);
    assert!(main_before.sets.iter().any(|s| s.name == MAP_SERVICE_IPS));

    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert!(p.verify().unwrap(), "the kernel holds the desired ruleset");
    let main_after = h.read_table(main_id);
    assert!(!main_after.sets.iter().any(|s| s.name == MAP_SERVICE_IPS));
    assert!(!main_after.chains.iter().any(|c| c.name.starts_with("svc-")));
    // And the next sync finds nothing to do.
    p.request_full_sync();
    assert_eq!(p.sync().unwrap().committed.messages, 0);
}

/// A chain that a verdict element still points to cannot be deleted: the rule
/// the planner's order of deletions exists for, refused by both kernels.
fn a_chain_an_element_points_to_cannot_be_deleted(h: &Harness<impl Kernel>) {
    let p = &mut h.proxy(config());
    add_service(p, 1, 2);
    p.sync().unwrap();
    let table = home_table(1);
    let chain = "pick-2";
    let mut batch = Batch::new();
    batch.delete_chain(Family::Ip, table.name(), chain);
    let err = h.commit(batch).unwrap_err();
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(p.verify().unwrap(), "the refused delete changed nothing");
}

/// A count new to its table, in a range up to 16 endpoints, makes no chain:
/// its map came with the pick chains of all its counts, while it was empty. A
/// chain made later would bind a full map, which the kernel walks element by
/// element (18–26 ms at 100k Services). Above 16, a count's chain comes with
/// its first entry and goes with its last; it reads no map, only picks among
/// the entry's blocks, and each block's chain comes and goes with the block's
/// map.
fn a_new_count_makes_a_chain_only_above_16_endpoints(h: &Harness<impl Kernel>) {
    // Enough that Service 0's table keeps others of 10 endpoints as it moves.
    let p = &mut h.synced_proxy(100, 10);
    let table = home_table(0);
    let chains = || -> Vec<String> {
        let mut names: Vec<String> = h
            .read_table(table)
            .chains
            .into_iter()
            .map(|c| c.name)
            .collect();
        names.sort();
        names
    };
    let made = chains();
    for c in 9..=16 {
        assert!(made.contains(&format!("pick-{c}")), "pick-{c} in {made:?}");
    }
    let mut sync_to = |n: usize| {
        p.update(&service_key(0), |s| {
            let addrs: Vec<_> = (0..n).map(|j| endpoint_addr(1_000 + j)).collect();
            set_endpoints(s, 0, &addrs)
        });
        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Partial);
        assert!(p.verify().unwrap());
    };
    for n in [9, 16] {
        sync_to(n);
        assert_eq!(chains(), made, "{n} endpoints");
    }
    for (n, blocks) in [(20, &[16, 4][..]), (21, &[16, 4, 1])] {
        sync_to(n);
        let mut with_n = made.clone();
        with_n.push(format!("pick-{n}"));
        with_n.extend(blocks.iter().map(|b| format!("pick-block-{b}-0")));
        with_n.sort();
        assert_eq!(chains(), with_n, "{n} endpoints");
        let table = h.read_table(table);
        let pick = table.chains.iter().find(|c| c.name == format!("pick-{n}"));
        let reads_a_map = pick.unwrap().rules.iter().any(|r| {
            r.exprs
                .iter()
                .any(|e| matches!(e, kube_nft::netlink::expr::Expr::Lookup { .. }))
        });
        assert!(!reads_a_map, "pick-{n} reads a map");
    }
    sync_to(9);
    assert_eq!(chains(), made, "back to 9 endpoints");
}

/// A Service's count moved across the edges of its blocks (a block of 1024
/// gone and its slots spread over the smaller ones, and back; into a range's
/// map and out), one endpoint at a time as a rolling update does and also
/// all at once, each a partial sync after which the kernel holds exactly
/// what it should.
fn a_count_change_across_blocks_leaves_the_kernel_as_desired(h: &Harness<impl Kernel>) {
    let p = &mut h.synced_proxy(3, 2048);
    let mut count = 2048;
    let mut step = |p: &mut Proxy, to: usize| {
        p.update(&service_key(0), |s| {
            if to + 1 == count {
                // The last endpoint of the first slice goes, as one slice's change.
                let slices = s.slices.get_mut(&service_key(0)).unwrap();
                slices.values_mut().next().unwrap().endpoints.pop();
            } else {
                let addrs: Vec<_> = (0..to).map(|j| endpoint_addr(10_000 + j)).collect();
                set_endpoints(s, 0, &addrs);
            }
        });
        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Partial, "to {to}");
        assert!(
            p.verify().unwrap(),
            "the kernel differs after {count} -> {to}"
        );
        count = to;
    };
    for to in [2047, 2048, 1025, 1024, 1023, 17, 16, 17, 3000, 2999] {
        step(p, to);
    }
}

/// The one endpoint map of the table made with a size, as (size, elements).
fn sized_map(h: &Harness<impl Kernel>) -> (u32, usize) {
    let table = h.read_table(home_table(0));
    let sized: Vec<_> = table.sets.iter().filter(|s| s.size.is_some()).collect();
    assert_eq!(sized.len(), 1, "one sized map: the first block's");
    (sized[0].size.unwrap(), sized[0].elements.len())
}

/// A large endpoint map is made with a size (`endpoint_map_size`), which the
/// kernel holds it to. Filled to its size by partial syncs it stays as it is;
/// one element more, and the sync makes the table again with room, instead
/// of sending a transaction the kernel would refuse. Emptied, it keeps its
/// room, and a restart writes nothing.
fn an_endpoint_map_filled_past_its_size_is_made_again_with_room(h: &Harness<impl Kernel>) {
    // Each Service of 1024 endpoints puts 1024 in the first block's map.
    let p = &mut h.synced_proxy(4, 1024);
    assert_eq!(sized_map(h), (8192, 4096));
    for i in 4..8 {
        add_service(p, i, 1024);
        assert_eq!(p.sync().unwrap().kind, SyncKind::Partial);
        assert_eq!(sized_map(h), (8192, 1024 * (i + 1)), "Service {i} added");
    }
    add_service(p, 8, 1024);
    p.sync().expect("a sync past the map's size");
    assert_eq!(sized_map(h), (32768, 9216), "made again, with room");
    assert!(p.verify().unwrap());
    for i in 2..9 {
        p.update(&service_key(i), |s| {
            s.services.remove(&service_key(i));
        });
    }
    assert_eq!(p.sync().unwrap().kind, SyncKind::Partial);
    assert_eq!(sized_map(h), (32768, 2048), "emptied, it keeps its room");
    a_restart_writes_nothing(h, p.state());
}

/// One endpoint changed in a Service of 10,000 endpoints does the work of one
/// in a Service of 1,000 (issue #44: it did a hundred times as much). The
/// work is counted, not timed: endpoint keys compared or hashed on this
/// thread (`core::endpoint_key`), which a search, sort or map over the whole
/// Service would multiply. Each change comes as the API server sends it, one
/// EndpointSlice of 100 endpoints.
fn a_change_in_a_large_service_costs_what_it_changes(h: &Harness<impl Kernel>) {
    let work = |n: usize| -> Vec<(&'static str, u64)> {
        let p = &mut h.proxy(config());
        for i in 1..20 {
            add_service(p, i, 3);
        }
        p.update(&service_key(0), |s| {
            s.put_service(kube_nft::testbed::synthetic::service(0));
            let addrs: Vec<_> = (0..n).map(|j| endpoint_addr(10_000 + j)).collect();
            set_endpoints(s, 0, &addrs)
        });
        assert_eq!(p.sync().unwrap().kind, SyncKind::Full);
        type Change = Box<dyn Fn(&mut ClusterState)>;
        let in_first_slice = |f: fn(&mut Vec<kube_nft::core::model::Endpoint>)| -> Change {
            Box::new(move |s: &mut ClusterState| {
                let slices = s.slices.get_mut(&service_key(0)).unwrap();
                f(&mut slices.values_mut().next().unwrap().endpoints)
            })
        };
        let changes: Vec<(&'static str, Change)> = vec![
            (
                "an endpoint replaced",
                in_first_slice(|eps| eps[0].addr = endpoint_addr(900_000)),
            ),
            ("an endpoint removed", in_first_slice(|eps| drop(eps.pop()))),
            (
                "an endpoint added",
                in_first_slice(|eps| {
                    eps.push(kube_nft::testbed::synthetic::ready(endpoint_addr(900_001)))
                }),
            ),
        ];
        changes
            .into_iter()
            .map(|(what, change)| {
                let before = key_operations();
                p.update(&service_key(0), |s| change(s));
                let r = p.sync().unwrap();
                let spent = key_operations() - before;
                assert_eq!(r.kind, SyncKind::Partial, "{what}");
                assert!(p.verify().unwrap(), "{n} endpoints, {what}");
                (what, spent)
            })
            .collect()
    };
    let (small, large) = (work(1_000), work(10_000));
    for ((what, small), (_, large)) in small.into_iter().zip(large) {
        assert!(
            large <= 2 * small.max(1),
            "{what}: {large} key operations in a Service of 10,000 endpoints, {small} in one of 1,000"
        );
    }
}

/// The periodic verification runs beside the syncs (`nft::verifier`): a sync
/// during it commits at once, drift in what no sync touched meanwhile is told
/// once a second round finds it too, and what a sync touched is as the sync
/// left it.
#[test]
fn the_verification_beside_syncs_confirms_drift_and_trusts_what_they_wrote() {
    require_root();
    let ns = Netns::create(&unique("verification")).unwrap();
    in_netns(&ns.name, || {
        let h = Harness::new(Namespace);
        let p = &mut h.synced_proxy(60, 3);
        assert_eq!(verify_beside(p, |_| ()), Verification::Matches);

        // Service 3's ClusterIP element goes, behind the proxy's back, and a
        // sync of another Service of its table runs during the round.
        let drifted = remove_service_3s_cluster_ip(&h);
        let same_table = |i: usize| home_table(i) == home_table(3);
        let neighbour = (4..60).find(|i| same_table(*i)).unwrap();
        let first = verify_beside(p, |p| move_endpoint(p, neighbour, endpoint_addr(50_000)));
        assert_eq!(
            first,
            Verification::Unsettled,
            "drift is told by a second round"
        );
        let want = Verification::Differs(format!("an element of {drifted} {MAP_SERVICE_IPS}"));
        assert_eq!(verify_beside(p, |_| ()), want);
        p.request_full_sync();
        p.sync().unwrap();
        assert!(p.verify().unwrap());

        // The element of the neighbour's endpoint that a sync during the
        // round moves is changed behind the proxy's back: the sync's commit
        // leaves it right, and no round takes it for drift.
        let moved = endpoint_addr(50_000);
        let (table, set, element) = TableId::all_of(Family::Ip)
            .flat_map(|t| h.read_table(t).sets.into_iter().map(move |s| (t, s)))
            .find_map(|(t, s)| {
                let e = s
                    .elements
                    .iter()
                    .find(|e| matches!(e.data, Some(Mapped::Endpoint(a, _)) if a == moved))?;
                Some((t, s.name.clone(), e.clone()))
            })
            .expect("the endpoint has an element");
        let mut changed = element.clone();
        changed.data = Some(Mapped::Endpoint("10.255.0.99".parse().unwrap(), 80));
        let mut batch = Batch::new();
        batch.delete_elements(Family::Ip, table.name(), &set, &[element]);
        batch.add_elements(Family::Ip, table.name(), &set, &[changed]);
        h.commit(batch).unwrap();
        let answer = verify_beside(p, |p| move_endpoint(p, neighbour, endpoint_addr(50_001)));
        assert!(!matches!(answer, Verification::Differs(_)), "{answer:?}");
        assert_eq!(verify_beside(p, |_| ()), Verification::Matches);
        assert!(p.verify().unwrap());

        // Moves in a Service of 12 endpoints during rounds: never drift,
        // though a round's plan against the older snapshot may place that
        // Service's endpoints in other slots, and judged (what the moves
        // wrote is trusted): unsettled only where a dump that a commit came
        // during found something.
        add_service(p, 60, 12);
        p.sync().unwrap();
        let mut answers = Vec::new();
        for r in 0..20 {
            let to = endpoint_addr(60_000 + r);
            answers.push(verify_beside(p, |p| move_endpoint(p, 60, to)));
        }
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Verification::Matches | Verification::Unsettled)),
            "{answers:?}"
        );
        let matched = answers
            .iter()
            .filter(|a| **a == Verification::Matches)
            .count();
        assert!(matched >= 15, "{answers:?}");

        // A full sync during a round makes it moot: no answer.
        assert!(p.begin_verification());
        p.request_full_sync();
        p.sync().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(p.verification(), None);
        assert_eq!(verify_beside(p, |_| ()), Verification::Matches);
    })
    .unwrap();
}

/// One round of the verification, with `meanwhile` done (and synced) while
/// it runs; its answer.
fn verify_beside(p: &mut Proxy, meanwhile: impl FnOnce(&mut Proxy)) -> Verification {
    assert!(
        p.begin_verification(),
        "a real kernel verifies off the path"
    );
    meanwhile(p);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(answer) = p.verification() {
            return answer;
        }
        assert!(std::time::Instant::now() < deadline, "no answer in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Service `i`'s first endpoint moves to `to`; synced, partially.
fn move_endpoint(p: &mut Proxy, i: usize, to: std::net::IpAddr) {
    let slices = &p.state().slices[&service_key(i)];
    let mut addrs: Vec<std::net::IpAddr> = slices
        .values()
        .flat_map(|s| s.endpoints.iter().map(|e| e.addr))
        .collect();
    addrs[0] = to;
    p.update(&service_key(i), |s| set_endpoints(s, i, &addrs));
    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Partial);
}
