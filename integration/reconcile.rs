//! Incremental reconciliation against a real kernel: partial syncs send only what
//! changed and leave the kernel equal to the desired ruleset; a restart over a
//! correct ruleset writes nothing; a refused transaction changes nothing and the
//! next sync repairs.

mod common;

use common::*;
use kube_nft::bench::{add_bench_service, service_key, set_bench_endpoints, test_endpoint};

use kube_nft::core::net::Family;
use kube_nft::core::node_config::NodeConfig;
use kube_nft::dataplane::SyncKind;
use kube_nft::engine::Proxy;
use kube_nft::netlink::NftSocket;
use kube_nft::netns::{in_netns, Netns};
use kube_nft::nft::kernel;
use kube_nft::nft::names::{shard_of, CHAIN_SERVICES, MAP_SERVICE_IPS, SET_NODEPORT_IPS};
use kube_nft::nft::translate::{translate, Ruleset};
use kube_nft::ruleset::{Field, Rule, Stmt, TableId};

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

/// Runs `f` with a proxy inside a fresh namespace.
fn with_proxier<T: Send + 'static>(
    tag: &str,
    f: impl FnOnce(&mut Proxy) -> T + Send + 'static,
) -> T {
    with_proxier_config(tag, config(), f)
}

fn with_proxier_config<T: Send + 'static>(
    tag: &str,
    config: NodeConfig,
    f: impl FnOnce(&mut Proxy) -> T + Send + 'static,
) -> T {
    require_root();
    let ns = Netns::create(&unique(tag)).unwrap();
    in_netns(&ns.name, move || {
        let mut p = Proxy::new(config).unwrap();
        f(&mut p)
    })
    .unwrap()
}

/// Our own nf_tables socket in the current namespace, for reading back.
fn socket() -> NftSocket {
    NftSocket::open().unwrap()
}

/// A named change to the model.
type Step = (&'static str, Box<dyn Fn(&mut Proxy)>);

#[test]
fn partial_syncs_leave_the_kernel_equal_to_the_desired_ruleset() {
    check_partial_syncs("partial", config());
}

/// The same steps with a named counter per Service port: Services added and
/// deleted take their counters and counter-map elements with them.
#[test]
fn partial_syncs_keep_counters_in_step() {
    check_partial_syncs(
        "partialc",
        NodeConfig {
            counters: true,
            ..config()
        },
    );
}

fn check_partial_syncs(tag: &str, config: NodeConfig) {
    with_proxier_config(tag, config, |p| {
        for i in 0..20 {
            add_bench_service(p, i, 1 + i % 5);
        }
        assert_eq!(p.sync().unwrap().kind, SyncKind::Full);
        assert!(p.verify().unwrap());
        let steps: Vec<Step> = vec![
            (
                "add an endpoint",
                Box::new(|p| {
                    p.update(&service_key(3), |s| {
                        set_bench_endpoints(
                            s,
                            3,
                            &[
                                test_endpoint(3, 0),
                                test_endpoint(3, 1),
                                test_endpoint(3, 2),
                                test_endpoint(3, 3),
                                test_endpoint(3, 9),
                            ],
                        )
                    })
                }),
            ),
            (
                "remove a middle endpoint",
                Box::new(|p| {
                    p.update(&service_key(4), |s| {
                        set_bench_endpoints(
                            s,
                            4,
                            &[
                                test_endpoint(4, 0),
                                test_endpoint(4, 2),
                                test_endpoint(4, 3),
                                test_endpoint(4, 4),
                            ],
                        )
                    })
                }),
            ),
            (
                "replace an endpoint",
                Box::new(|p| {
                    p.update(&service_key(2), |s| {
                        set_bench_endpoints(
                            s,
                            2,
                            &[
                                test_endpoint(2, 0),
                                test_endpoint(2, 7),
                                test_endpoint(2, 2),
                            ],
                        )
                    })
                }),
            ),
            (
                "remove every endpoint",
                Box::new(|p| p.update(&service_key(1), |s| set_bench_endpoints(s, 1, &[]))),
            ),
            (
                "endpoints come back",
                Box::new(|p| {
                    p.update(&service_key(1), |s| {
                        set_bench_endpoints(s, 1, &[test_endpoint(1, 5)])
                    })
                }),
            ),
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
            (
                "and one lets it go",
                Box::new(|p| {
                    p.update(&service_key(5), |s| {
                        set_bench_endpoints(s, 5, &[test_endpoint(5, 0)])
                    })
                }),
            ),
            (
                "session affinity turned on (a timeout set per endpoint)",
                Box::new(|p| {
                    p.update(&service_key(7), |s| {
                        s.services
                            .get_mut(&service_key(7))
                            .unwrap()
                            .affinity_timeout = Some(600)
                    })
                }),
            ),
            (
                "an affinity endpoint leaves, its set with it",
                Box::new(|p| {
                    p.update(&service_key(7), |s| {
                        set_bench_endpoints(s, 7, &[test_endpoint(7, 1)])
                    })
                }),
            ),
            (
                "a new affinity timeout (new sets, old ones deleted)",
                Box::new(|p| {
                    p.update(&service_key(7), |s| {
                        s.services
                            .get_mut(&service_key(7))
                            .unwrap()
                            .affinity_timeout = Some(60)
                    })
                }),
            ),
            (
                "session affinity turned off",
                Box::new(|p| {
                    p.update(&service_key(7), |s| {
                        s.services
                            .get_mut(&service_key(7))
                            .unwrap()
                            .affinity_timeout = None
                    })
                }),
            ),
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
                Box::new(|p| p.update(&service_key(9), |s| set_bench_endpoints(s, 9, &[]))),
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
        // Nothing changed: nothing is sent.
        assert_eq!(p.sync().unwrap().committed.messages, 0);
    });
}

#[test]
fn restart_over_a_correct_ruleset_writes_nothing() {
    with_proxier("restart", |p| {
        for i in 0..50 {
            add_bench_service(p, i, 4);
        }
        p.sync().unwrap();
        // Move endpoints around so the kernel's slots differ from a fresh computation.
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
        let state = p.state().clone();
        // A new process: same model, nothing applied yet.
        let mut again = Proxy::new(config()).unwrap();
        again.replace_state(state);
        let r = again.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Full);
        assert_eq!(
            r.committed.messages, 0,
            "a restart rewrote {} bytes",
            r.committed.bytes
        );
        assert!(again.verify().unwrap());
    });
}

/// The bytes of a one-endpoint change, with `services` Services programmed.
fn endpoint_change_bytes(services: usize) -> Vec<usize> {
    with_proxier(&format!("size{services}"), move |p| {
        for i in 0..services {
            add_bench_service(p, i, 10);
        }
        p.sync().unwrap();
        let i = services / 2;
        let mut sizes = Vec::new();
        // Replace an endpoint, remove one, add one back.
        let changes: [Vec<usize>; 3] = [
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 11],
            vec![0, 1, 2, 3, 5, 6, 7, 8, 11],
            vec![0, 1, 2, 3, 5, 6, 7, 8, 11, 12],
        ];
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
    })
}

#[test]
fn endpoint_change_transaction_size_does_not_grow_with_services() {
    let small = endpoint_change_bytes(100);
    let large = endpoint_change_bytes(5_000);
    for (s, l) in small.iter().zip(&large) {
        // Names of Service 50 and Service 2500 differ by two characters per mention.
        assert!(
            l.abs_diff(*s) <= 64,
            "100 Services: {small:?} bytes, 5000: {large:?}"
        );
        assert!(*l <= 2048, "a one-endpoint change took {l} bytes");
    }
}

#[test]
fn refused_transaction_changes_nothing_and_the_next_full_sync_repairs() {
    with_proxier("refused", |p| {
        for i in 0..10 {
            add_bench_service(p, i, 3);
        }
        p.sync().unwrap();
        // Behind the proxy's back, remove an element it believes is there.
        let vip = "10.96.0.4";
        let table = TableId::shard(Family::Ip, shard_of(&service_key(3)));
        let out = std::process::Command::new("nft")
            .args([
                "delete",
                "element",
                "ip",
                table.name(),
                "service-ips",
                &format!("{{ {vip} . tcp . 80 }}"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // One change deletes that element (Service 3 goes away), another adds a Service.
        p.update(&service_key(3), |s| {
            s.services.remove(&service_key(3));
            s.slices.remove(&service_key(3));
        });
        add_bench_service(p, 77, 2);
        let read_all = || {
            [TableId::main(Family::Ip), table]
                .map(|t| socket().read_table(t.family, t.name()).unwrap().unwrap())
        };
        let before = read_all();
        let err = p.sync().unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("delete 1 element(s) of {table} service-ips")),
            "{err}"
        );
        let after = read_all();
        for (b, a) in before.iter().zip(&after) {
            assert!(
                kernel::same_table(b, a),
                "the refused transaction changed {}",
                b.name
            );
        }
        // The next sync reads the kernel back and repairs everything.
        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Full);
        assert!(p.verify().unwrap());
    });
}

/// Earlier versions kept every Service chain and the dispatch maps in the main
/// table. The first full sync over such a ruleset moves them into the Service
/// tables in one transaction and leaves the main table with none of them.
#[test]
fn a_single_table_ruleset_of_an_earlier_version_is_adopted_in_one_sync() {
    with_proxier("single-table", |p| {
        for i in 0..20 {
            add_bench_service(p, i, 3);
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
        kernel::apply(&mut socket(), &old).unwrap();
        let main_before = socket()
            .read_table(Family::Ip, "kube-nft")
            .unwrap()
            .unwrap();
        assert!(main_before.sets.iter().any(|s| s.name == MAP_SERVICE_IPS));

        let r = p.sync().unwrap();
        assert_eq!(r.kind, SyncKind::Full);
        assert!(p.verify().unwrap(), "the kernel holds the desired ruleset");
        let main_after = socket()
            .read_table(Family::Ip, "kube-nft")
            .unwrap()
            .unwrap();
        assert!(!main_after.sets.iter().any(|s| s.name == MAP_SERVICE_IPS));
        assert!(!main_after.chains.iter().any(|c| c.name.starts_with("svc-")));
        // And the next sync finds nothing to do.
        p.request_full_sync();
        assert_eq!(p.sync().unwrap().committed.messages, 0);
    });
}
