//! kube-nft beside what else runs on a production node (issue #46): here a host
//! firewall, Debian 12's firewalld with its nftables backend, started before
//! kube-nft as at boot, in the node's namespace (`common::firewalld`).

mod common;

use common::firewalld::Firewalld;
use common::services::node_port;
use common::*;
use kube_nft::lab::topology::UPLINK_V4;
use std::time::Duration;

/// firewalld's default zone (`public`: ssh and dhcpv6-client open, the rest
/// rejected) on the node:
/// - ClusterIP and NodePort traffic passes without opening anything: firewalld
///   accepts what was DNATed (`ct status dnat accept`) before its zones;
/// - kube-nft's health port, which nothing DNATs, is refused from outside until
///   opened (`--permanent --add-port=10256/tcp`, then `--reload`);
/// - `firewall-cmd --reload` under load, three times: it rewrites only its own
///   table, so kube-nft sees no drift and no connection fails;
///   firewalld drops every new packet while it reloads (its own
///   `firewalld_policy_drop` table), so a connection whose SYN comes then is
///   answered on its retransmission, 1 s later, whatever the proxy;
/// - `nft flush ruleset` takes firewalld's table too: kube-nft repairs its own;
///   firewalld cannot reload over its deleted table, and comes back with a
///   restart once the table its failed reload left is gone.
#[test]
fn beside_firewalld_services_pass_its_reloads_cost_nothing_and_the_health_port_needs_opening() {
    let c = Cluster::new("firewalld", &WEB_PODS, &[9376]);
    let fw = Firewalld::start(c.node(), &c.scratch);
    let d = serve_web_with_node_port(&c);
    let node_port = node_port(WEB_NODE_PORT);
    let health = format!("{UPLINK_V4}:10256");
    // Other tables than kube-nft's, and whether kube-nft's main ones are there.
    let tables = || {
        let all = nft_tables(c.node());
        let ours = ["ip kube-nft", "ip6 kube-nft"]
            .iter()
            .all(|t| all.iter().any(|a| a == t));
        let others: Vec<String> = all
            .into_iter()
            .filter(|t| !t.contains(" kube-nft"))
            .collect();
        (others, ours)
    };
    assert_eq!(tables(), (vec!["inet firewalld".to_string()], true));
    assert_eq!(http_status(c.client(), &health, "/healthz"), None);
    assert_eq!(
        http_status(c.node(), "127.0.0.1:10256", "/healthz").map(|(code, _)| code),
        Some(200)
    );
    fw.cmd(&["--permanent", "--add-port=10256/tcp"]);
    fw.cmd(&["--reload"]);
    assert_eq!(
        http_status(c.client(), &health, "/healthz").map(|(code, _)| code),
        Some(200)
    );

    let (reloads, loads) = under_load(c.client(), &[WEB_VIP, &node_port], 3, || {
        let started = std::time::Instant::now();
        fw.cmd(&["--reload"]);
        started.elapsed()
    });
    for load in loads {
        println!("3 firewalld reloads ({reloads:?}): {}", load.summary());
        assert!(load.failed.is_empty(), "{}", load.summary());
        assert!(load.times.len() > 100, "{}", load.summary());
    }
    let (_, metrics) = http_status(c.node(), "127.0.0.1:10249", "/metrics").expect("metrics");
    assert_eq!(
        metric(
            &metrics,
            "kubenft_drift_repairs_total{cause=\"foreign_transaction\"}"
        ),
        None,
        "firewalld's reloads were taken for drift:\n{}",
        d.log_text()
    );

    nft_in(c.node(), "flush ruleset");
    wait_until(Duration::from_secs(5), "kube-nft's repair", || {
        answers(c.client(), WEB_VIP) && answers(c.client(), &node_port)
    });
    assert_eq!(tables(), (vec![], true));
    // firewalld cannot reload over its deleted table ("Could not process rule:
    // No such file or directory"), and the failed reload leaves the table it
    // drops everything with while reloading: the node passes nothing, Services
    // included, until someone deletes it and restarts firewalld.
    assert!(fw.try_cmd(&["--reload"]).is_err());
    assert_eq!(
        tables(),
        (vec!["inet firewalld_policy_drop".to_string()], true)
    );
    assert!(!answers(c.client(), WEB_VIP));
    nft_in(c.node(), "delete table inet firewalld_policy_drop");
    drop(fw);
    let _fw = Firewalld::start(c.node(), &c.scratch);
    assert_eq!(tables(), (vec!["inet firewalld".to_string()], true));
    assert!(answers(c.client(), WEB_VIP) && answers(c.client(), &node_port));
    assert_eq!(
        http_status(c.client(), &health, "/healthz").map(|(code, _)| code),
        Some(200)
    );
}
