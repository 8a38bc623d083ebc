//! The unit twins of `integration/reconcile.rs`: the same cases, the same
//! assertions, against the fake kernel instead of a network namespace, so that
//! the planner's reconciliation is checked in milliseconds and without root.
//! The root tests stay: only they show that the real kernel agrees.

use crate::bench::{add_bench_service, service_key, set_bench_endpoints, test_endpoint};

use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::dataplane::SyncKind;
use crate::engine::{Engine, Proxy};
use crate::netlink::batch::replace_tables;
use crate::netlink::Batch;
use crate::nft::dataplane::NftDataplane;
use crate::nft::fake::FakeKernel;
use crate::nft::kernel::{lowered, same_table, NftKernel};
use crate::nft::names::{shard_of, CHAIN_SERVICES, MAP_SERVICE_IPS, SET_NODEPORT_IPS};
use crate::nft::translate::{translate, Ruleset};
use crate::ruleset::{Field, Rule, Stmt, TableId};

fn config() -> NodeConfig {
    NodeConfig {
        cluster_cidrs: vec![
            "10.128.0.0/9".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ],
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        masquerade_bit: 14,
        ..NodeConfig::default()
    }
}

/// A proxy whose one dataplane writes into `kernel`.
fn proxy_over(kernel: &FakeKernel, config: NodeConfig) -> Proxy {
    let nft = NftDataplane::with_kernel(kernel.clone());
    Proxy::with_engine(Engine::with_dataplanes(config, vec![Box::new(nft)]))
}

type Step = (&'static str, Box<dyn Fn(&mut Proxy)>);

#[test]
fn partial_syncs_leave_the_kernel_equal_to_the_desired_ruleset() {
    check_partial_syncs(config());
}

#[test]
fn partial_syncs_keep_counters_in_step() {
    check_partial_syncs(NodeConfig {
        counters: true,
        ..config()
    });
}

fn check_partial_syncs(config: NodeConfig) {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config);
    for i in 0..20 {
        add_bench_service(p, i, 1 + i % 5);
    }
    assert_eq!(p.sync().unwrap().kind, SyncKind::Full);
    assert!(p.verify().unwrap());
    let endpoints = |i: usize, js: &'static [usize]| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(i), |s| {
                set_bench_endpoints(
                    s,
                    i,
                    &js.iter().map(|j| test_endpoint(i, *j)).collect::<Vec<_>>(),
                )
            })
        })
    };
    let affinity = |timeout: Option<u32>| -> Box<dyn Fn(&mut Proxy)> {
        Box::new(move |p| {
            p.update(&service_key(7), |s| {
                s.services
                    .get_mut(&service_key(7))
                    .unwrap()
                    .affinity_timeout = timeout
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
        ("add a Service", Box::new(|p| add_bench_service(p, 40, 3))),
        (
            "two Services share an endpoint address",
            Box::new(|p| {
                p.update(&service_key(5), |s| {
                    set_bench_endpoints(s, 5, &[test_endpoint(6, 0)])
                })
            }),
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
            "a NodePort with a Local policy (external-, svc- and local- chains)",
            Box::new(|p| {
                p.update(&service_key(9), |s| {
                    let svc = s.services.get_mut(&service_key(9)).unwrap();
                    svc.external_policy_local = true;
                    svc.ports[0].node_port = Some(30009);
                })
            }),
        ),
        (
            "it loses every endpoint (chains that jump to each other go together)",
            endpoints(9, &[]),
        ),
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
    p.request_full_sync();
    assert_eq!(p.sync().unwrap().committed.messages, 0);
}

#[test]
fn restart_over_a_correct_ruleset_writes_nothing() {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config());
    for i in 0..50 {
        add_bench_service(p, i, 4);
    }
    p.sync().unwrap();
    p.update(&service_key(7), |s| {
        set_bench_endpoints(
            s,
            7,
            &[
                test_endpoint(7, 3),
                test_endpoint(7, 1),
                test_endpoint(7, 9),
            ],
        )
    });
    p.sync().unwrap();
    let commits = kernel.commits();
    // A new process: same model and kernel, nothing applied yet.
    let mut again = proxy_over(&kernel, config());
    again.replace_state(p.state().clone());
    let r = again.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!(
        r.committed.messages, 0,
        "a restart rewrote {} bytes",
        r.committed.bytes
    );
    assert_eq!(
        kernel.commits(),
        commits,
        "an empty plan reached the kernel"
    );
    assert!(again.verify().unwrap());
}

/// The bytes of three one-endpoint changes with `services` Services programmed.
fn endpoint_change_bytes(services: usize) -> Vec<usize> {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config());
    for i in 0..services {
        add_bench_service(p, i, 10);
    }
    p.sync().unwrap();
    let i = services / 2;
    let changes: [&[usize]; 3] = [
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 11],
        &[0, 1, 2, 3, 5, 6, 7, 8, 11],
        &[0, 1, 2, 3, 5, 6, 7, 8, 11, 12],
    ];
    let mut sizes = Vec::new();
    for eps in changes {
        p.update(&service_key(i), |s| {
            set_bench_endpoints(
                s,
                i,
                &eps.iter().map(|j| test_endpoint(i, *j)).collect::<Vec<_>>(),
            )
        });
        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Partial);
        sizes.push(r.committed.bytes);
    }
    assert!(p.verify().unwrap());
    sizes
}

#[test]
fn endpoint_change_transaction_size_does_not_grow_with_services() {
    let small = endpoint_change_bytes(100);
    let large = endpoint_change_bytes(5_000);
    for (s, l) in small.iter().zip(&large) {
        assert!(
            l.abs_diff(*s) <= 64,
            "100 Services: {small:?} bytes, 5000: {large:?}"
        );
        assert!(*l <= 2048, "a one-endpoint change took {l} bytes");
    }
}

#[test]
fn refused_transaction_changes_nothing_and_the_next_full_sync_repairs() {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config());
    for i in 0..10 {
        add_bench_service(p, i, 3);
    }
    p.sync().unwrap();
    // Behind the proxy's back, remove an element it believes is there.
    let table = TableId::shard(Family::Ip, shard_of(&service_key(3)));
    let vip: std::net::Ipv4Addr = "10.96.0.4".parse().unwrap();
    kernel.tamper(|tables| {
        let set = tables
            .get_mut(&table)
            .and_then(|t| t.sets.iter_mut().find(|s| s.name == MAP_SERVICE_IPS))
            .unwrap();
        let before = set.elements.len();
        set.elements.retain(|e| !e.key.starts_with(&vip.octets()));
        assert_eq!(set.elements.len(), before - 1, "the element was there");
    });
    p.update(&service_key(3), |s| {
        s.services.remove(&service_key(3));
        s.slices.remove(&service_key(3));
    });
    add_bench_service(p, 77, 2);
    let read_all = || [TableId::main(Family::Ip), table].map(|t| kernel.table(t).unwrap());
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
    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert!(p.verify().unwrap());
}

#[test]
fn a_single_table_ruleset_of_an_earlier_version_is_adopted_in_one_sync() {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config());
    for i in 0..20 {
        add_bench_service(p, i, 3);
    }
    // The layout before Service tables: everything in the main table.
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
    replace_tables(&mut batch, &lowered(&old));
    kernel.clone().commit(batch).unwrap();
    let main_id = TableId::main(Family::Ip);
    assert!(kernel
        .table(main_id)
        .unwrap()
        .sets
        .iter()
        .any(|s| s.name == MAP_SERVICE_IPS));

    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert!(p.verify().unwrap(), "the kernel holds the desired ruleset");
    let main_after = kernel.table(main_id).unwrap();
    assert!(!main_after.sets.iter().any(|s| s.name == MAP_SERVICE_IPS));
    assert!(!main_after.chains.iter().any(|c| c.name.starts_with("svc-")));
    p.request_full_sync();
    assert_eq!(p.sync().unwrap().committed.messages, 0);
}

/// The fake refuses what the kernel refuses, or the twins above prove nothing:
/// a chain that a verdict element still points to cannot be deleted.
#[test]
fn the_fake_refuses_to_delete_a_chain_an_element_points_to() {
    let kernel = FakeKernel::new();
    let p = &mut proxy_over(&kernel, config());
    add_bench_service(p, 1, 2);
    p.sync().unwrap();
    let table = TableId::shard(Family::Ip, shard_of(&service_key(1)));
    let chain = kernel
        .table(table)
        .unwrap()
        .chains
        .iter()
        .find(|c| c.name.starts_with("svc-"))
        .unwrap()
        .name
        .clone();
    let mut batch = Batch::new();
    batch.delete_chain(Family::Ip, table.name(), &chain);
    let err = kernel.clone().commit(batch).unwrap_err();
    assert!(err.to_string().contains("busy"), "{err}");
    assert!(p.verify().unwrap(), "the refused delete changed nothing");
}
