//! The IPVS dataplane's reconciliation against `FakeIpvs`, without root or an
//! IPVS kernel: what each sync sends, what it leaves alone, and how it
//! recovers. `integration/ipvs.rs` shows the same with packets, in a guest.

use super::fake::FakeIpvs;
use super::IpvsDataplane;
use crate::core::model::ServiceKey;
use crate::core::net::Protocol;
use crate::core::node_config::{IpvsSettings, NodeConfig, ProxyMode};
use crate::engine::dataplane::SyncKind;
use crate::engine::{Engine, Proxy, SyncReport};
use crate::netlink::ipvs::{Command, RealServer, VirtualKey, VirtualService};
use crate::testbed::synthetic::{add_service, endpoint, service_key, set_endpoints, vip};
use std::net::IpAddr;

fn config() -> NodeConfig {
    NodeConfig {
        mode: ProxyMode::Ipvs(IpvsSettings::default()),
        ..crate::testbed::synthetic::node_config()
    }
}

fn proxy_over(ipvs: &FakeIpvs) -> Proxy {
    let dataplane = IpvsDataplane::with_kernel(ipvs.clone());
    Proxy::new(Engine::new(config(), vec![Box::new(dataplane)]))
}

/// The IPVS commands a sync sent, from its report.
fn commands(r: &SyncReport) -> usize {
    let (name, written) = &r.written[0];
    assert_eq!(*name, "ipvs");
    written
        .counts
        .iter()
        .find(|(what, _)| *what == "commands")
        .map(|(_, n)| *n)
        .unwrap()
}

fn key(i: usize) -> VirtualKey {
    VirtualKey {
        addr: vip(i),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn reals(i: usize, js: &[usize]) -> Vec<RealServer> {
    let mut reals: Vec<RealServer> = js
        .iter()
        .map(|j| RealServer {
            addr: endpoint(i, *j),
            port: 8080,
            weight: 1,
        })
        .collect();
    reals.sort();
    reals
}

fn set(p: &mut Proxy, i: usize, js: &[usize]) {
    let addrs: Vec<IpAddr> = js.iter().map(|j| endpoint(i, *j)).collect();
    p.update(&service_key(i), |s| set_endpoints(s, i, &addrs));
}

fn remove(p: &mut Proxy, key: &ServiceKey) {
    p.update(key, |s| {
        s.services.remove(key);
        s.slices.remove(key);
    });
}

#[test]
fn a_full_sync_programs_every_service_and_a_second_sends_nothing() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    for i in 0..10 {
        add_service(p, i, 1 + i % 4);
    }
    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    let table = ipvs.table();
    assert_eq!(table.len(), 10);
    for i in 0..10 {
        let (service, got) = &table[&key(i)];
        assert_eq!(service.scheduler, "rr");
        assert_eq!(service.persistence, None);
        assert_eq!(*got, reals(i, &(0..1 + i % 4).collect::<Vec<_>>()));
    }
    assert_eq!(ipvs.addresses(), (0..10).map(vip).collect());
    assert_eq!(commands(&r), ipvs.commands());
    assert_eq!(ipvs.sysctl("net/ipv4/vs/conntrack").as_deref(), Some("1"));
    assert_eq!(ipvs.sysctl("net/ipv4/conf/all/arp_ignore"), None);
    assert!(p.verify().unwrap());

    p.request_full_sync();
    let again = p.sync().unwrap();
    assert_eq!(again.kind, SyncKind::Full);
    assert_eq!(commands(&again), 0);
    assert_eq!(
        ipvs.commands(),
        commands(&r),
        "a command reached the kernel"
    );
}

#[test]
fn partial_syncs_send_only_what_changed() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    for i in 0..10 {
        add_service(p, i, 3);
    }
    p.sync().unwrap();
    type Step = (&'static str, Box<dyn Fn(&mut Proxy)>, usize);
    let steps: Vec<Step> = vec![
        ("add an endpoint", Box::new(|p| set(p, 3, &[0, 1, 2, 9])), 1),
        // A real server that goes drains at weight 0 (`draining`).
        ("remove one", Box::new(|p| set(p, 4, &[0, 2])), 1),
        ("replace one", Box::new(|p| set(p, 2, &[0, 7, 2])), 2),
        // No endpoints: the virtual service goes, its address stays bound.
        ("remove every endpoint", Box::new(|p| set(p, 1, &[])), 1),
        ("endpoints come back", Box::new(|p| set(p, 1, &[5])), 2),
        (
            "session affinity on (persistence)",
            Box::new(|p| {
                p.update(&service_key(6), |s| {
                    s.service_mut(&service_key(6)).unwrap().affinity_timeout = Some(600)
                })
            }),
            1,
        ),
        (
            "a scheduler from the annotation",
            Box::new(|p| {
                p.update(&service_key(6), |s| {
                    s.service_mut(&service_key(6)).unwrap().ipvs_scheduler = Some("lc".into())
                })
            }),
            1,
        ),
        (
            "delete a Service (its reals go with it)",
            Box::new(|p| remove(p, &service_key(0))),
            1,
        ),
        ("add a Service", Box::new(|p| add_service(p, 40, 2)), 3),
    ];
    for (what, step, sent) in steps {
        step(p);
        let r = p.sync().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.kind, SyncKind::Partial, "{what}");
        assert_eq!(commands(&r), sent, "{what}");
        assert!(p.verify().unwrap(), "{what}: the kernel differs");
    }
    // The full sync finds the draining real servers idle, and removes them.
    assert_eq!(ipvs.table()[&key(4)].1.len(), 3, "0, 2, and 1 draining");
    p.request_full_sync();
    let r = p.sync().unwrap();
    assert_eq!(commands(&r), 2, "4's and 2's");
    assert_eq!(ipvs.table()[&key(4)].1, reals(4, &[0, 2]));
    let table = ipvs.table();
    assert_eq!(table[&key(3)].1, reals(3, &[0, 1, 2, 9]));
    assert_eq!(table[&key(1)].1, reals(1, &[5]));
    let (six, _) = &table[&key(6)];
    assert_eq!((six.persistence, six.scheduler.as_str()), (Some(600), "lc"));
    assert!(!table.contains_key(&key(0)));
    assert!(
        !ipvs.addresses().contains(&vip(0)),
        "a deleted Service's address stays"
    );
    assert!(ipvs.addresses().contains(&vip(40)));
}

#[test]
fn an_address_two_services_share_stays_until_both_let_it_go() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    let shared: IpAddr = "192.0.2.10".parse().unwrap();
    for i in [1, 2] {
        add_service(p, i, 2);
        p.update(&service_key(i), |s| {
            let svc = s.service_mut(&service_key(i)).unwrap();
            svc.external_ips = vec![shared];
            svc.ports[0].port = 8000 + i as u16;
        });
    }
    p.sync().unwrap();
    assert!(ipvs.addresses().contains(&shared));
    remove(p, &service_key(1));
    p.sync().unwrap();
    assert!(
        ipvs.addresses().contains(&shared),
        "Service 2 still uses it"
    );
    remove(p, &service_key(2));
    p.sync().unwrap();
    assert!(!ipvs.addresses().contains(&shared));
    assert!(ipvs.table().is_empty());
    assert!(p.verify().unwrap());
}

#[test]
fn a_restart_over_a_correct_table_sends_nothing() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    for i in 0..20 {
        add_service(p, i, 3);
    }
    p.sync().unwrap();
    let sent = ipvs.commands();
    let mut again = proxy_over(&ipvs);
    again.replace_state(p.state().clone());
    let r = again.sync().unwrap();
    assert_eq!((r.kind, commands(&r)), (SyncKind::Full, 0));
    assert_eq!(ipvs.commands(), sent);
    assert!(again.verify().unwrap());
}

#[test]
fn drift_is_found_and_the_next_full_sync_repairs_it_leaving_others_alone() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    for i in 0..5 {
        add_service(p, i, 2);
    }
    p.sync().unwrap();
    // Someone else's virtual service, on an address that is not ours.
    let foreign = VirtualService {
        key: VirtualKey {
            addr: "192.0.2.99".parse().unwrap(),
            protocol: Protocol::Udp,
            port: 53,
        },
        scheduler: "wrr".into(),
        persistence: None,
    };
    // Drift in ours: a real server gone, one added, a stray address bound.
    ipvs.tamper(&[
        Command::AddService(foreign.clone()),
        Command::DeleteReal(key(2), reals(2, &[0])[0].clone()),
        Command::AddReal(key(3), reals(3, &[9])[0].clone()),
    ]);
    ipvs.tamper_address(vip(77));
    assert!(!p.verify().unwrap(), "the drift goes unseen");
    p.request_full_sync();
    let r = p.sync().unwrap();
    assert_eq!(commands(&r), 2);
    assert!(p.verify().unwrap());
    assert!(!ipvs.addresses().contains(&vip(77)));
    assert_eq!(
        ipvs.table()[&foreign.key].0,
        foreign,
        "someone else's service changed"
    );
}

#[test]
fn a_refused_command_fails_the_sync_and_the_next_one_is_full_and_repairs() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    for i in 0..5 {
        add_service(p, i, 2);
    }
    p.sync().unwrap();
    // Behind the dataplane's back, Service 3's virtual service goes.
    ipvs.tamper(&[Command::DeleteService(key(3))]);
    set(p, 3, &[0, 1, 4]);
    let err = p.sync().unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "IPVS refused to add real server {}:8080 to {}",
            endpoint(3, 4),
            key(3)
        )),
        "{err}"
    );
    assert!(err.to_string().contains("No such process"), "{err}");
    let r = p.sync().unwrap();
    assert_eq!(r.kind, SyncKind::Full);
    assert!(p.verify().unwrap());
    assert_eq!(ipvs.table()[&key(3)].1, reals(3, &[0, 1, 4]));
}

/// The fake refuses what the kernel refuses, or the tests above prove little.
#[test]
fn the_fake_refuses_what_ip_vs_ctl_refuses() {
    use crate::ipvs::IpvsKernel;
    let mut ipvs = FakeIpvs::new();
    let service = VirtualService {
        key: key(1),
        scheduler: "rr".into(),
        persistence: None,
    };
    let real = reals(1, &[0])[0].clone();
    let refusal = |ipvs: &mut FakeIpvs, c: Command| ipvs.apply(&[c]).unwrap_err().to_string();
    assert!(refusal(&mut ipvs, Command::AddReal(key(1), real.clone())).contains("No such process"));
    ipvs.apply(&[Command::AddService(service.clone())]).unwrap();
    assert!(refusal(&mut ipvs, Command::AddService(service.clone())).contains("File exists"));
    assert!(refusal(&mut ipvs, Command::DeleteReal(key(1), real.clone())).contains("No such file"));
    let unknown = VirtualService {
        scheduler: "nope".into(),
        ..service.clone()
    };
    assert!(refusal(&mut ipvs, Command::UpdateService(unknown)).contains("No such file"));
    // No transactions: what came before a refusal stays.
    let err = ipvs.apply(&[
        Command::AddReal(key(1), real.clone()),
        Command::AddReal(key(1), real.clone()),
    ]);
    assert!(err.unwrap_err().to_string().contains("File exists"));
    assert_eq!(ipvs.table()[&key(1)].1, vec![real]);
    let i = ipvs.ensure_interface().unwrap();
    ipvs.add_address(i, vip(1)).unwrap();
    assert!(ipvs.add_address(i, vip(1)).is_err());
    ipvs.delete_address(i, vip(1)).unwrap();
    assert!(ipvs.delete_address(i, vip(1)).is_err());
}

/// `--ipvs-tcp-timeout` and the others: set when the kernel holds other
/// values (those at 0 left as the kernel has them), not again while it
/// holds them, and again after someone changed them; never with all at 0.
#[test]
fn the_ipvs_timeouts_asked_for_are_set_and_kept() {
    use crate::core::node_config::IpvsTimeouts;
    let ipvs = FakeIpvs::new();
    let kernels = IpvsTimeouts {
        tcp: 900,
        tcp_fin: 120,
        udp: 300,
    };
    ipvs.tamper_timeouts(kernels);
    let mut p = proxy_over(&ipvs);
    p.sync().unwrap();
    assert_eq!(ipvs.timeouts(), (kernels, 0), "none asked, none set");

    let want = IpvsTimeouts {
        tcp: 3600,
        tcp_fin: 0,
        udp: 5,
    };
    let settings = IpvsSettings {
        timeouts: want,
        ..IpvsSettings::default()
    };
    let dataplane = IpvsDataplane::with_kernel(ipvs.clone());
    let config = NodeConfig {
        mode: ProxyMode::Ipvs(settings),
        ..config()
    };
    let mut p = Proxy::new(Engine::new(config, vec![Box::new(dataplane)]));
    p.sync().unwrap();
    let set = IpvsTimeouts {
        tcp: 3600,
        tcp_fin: 120,
        udp: 5,
    };
    assert_eq!(ipvs.timeouts(), (set, 1));
    p.request_full_sync();
    p.sync().unwrap();
    assert_eq!(ipvs.timeouts(), (set, 1), "held: not set again");
    ipvs.tamper_timeouts(kernels);
    p.request_full_sync();
    p.sync().unwrap();
    assert_eq!(
        ipvs.timeouts(),
        (set, 2),
        "changed behind its back: set again"
    );
}

/// Graceful termination (`draining`): a real server that leaves a TCP
/// virtual service goes to weight 0 and stays while IPVS counts connections
/// on it, across full syncs and a restart; it goes once idle, and one that
/// comes back while draining gets its weight again.
#[test]
fn a_removed_tcp_real_server_drains_until_its_connections_end() {
    let ipvs = FakeIpvs::new();
    let p = &mut proxy_over(&ipvs);
    add_service(p, 0, 3);
    p.sync().unwrap();
    let weights = |ipvs: &FakeIpvs| -> Vec<(IpAddr, u32)> {
        ipvs.table()[&key(0)]
            .1
            .iter()
            .map(|r| (r.addr, r.weight))
            .collect()
    };
    ipvs.set_connections(key(0), endpoint(0, 1), 8080, 3);

    set(p, 0, &[0, 2]);
    let r = p.sync().unwrap();
    assert_eq!(commands(&r), 1, "weight 0, not deleted");
    let draining = vec![
        (endpoint(0, 0), 1),
        (endpoint(0, 1), 0),
        (endpoint(0, 2), 1),
    ];
    assert_eq!(weights(&ipvs), draining);
    assert!(p.verify().unwrap(), "draining is as it should be");

    p.request_full_sync();
    let r = p.sync().unwrap();
    assert_eq!(commands(&r), 0, "3 connections: kept");
    assert_eq!(weights(&ipvs), draining);

    // A restart finds it at weight 0 with connections, and keeps it.
    let mut restarted = proxy_over(&ipvs);
    restarted.replace_state(p.state().clone());
    let r = restarted.sync().unwrap();
    assert_eq!(commands(&r), 0);
    assert_eq!(weights(&ipvs), draining);

    ipvs.set_connections(key(0), endpoint(0, 1), 8080, 0);
    restarted.request_full_sync();
    let r = restarted.sync().unwrap();
    assert_eq!(commands(&r), 1, "idle: deleted");
    assert_eq!(ipvs.table()[&key(0)].1, reals(0, &[0, 2]));

    // Back while draining: its weight again, not a second add.
    set(&mut restarted, 0, &[0]);
    assert_eq!(commands(&restarted.sync().unwrap()), 1);
    set(&mut restarted, 0, &[0, 2]);
    assert_eq!(commands(&restarted.sync().unwrap()), 1);
    assert_eq!(ipvs.table()[&key(0)].1, reals(0, &[0, 2]));
    assert!(restarted.verify().unwrap());
}
