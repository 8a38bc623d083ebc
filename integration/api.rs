//! kube-nft against an API server: the recorded answers of a real kube-apiserver
//! served on the node's loopback, real namespaces, real packets.
//!
//! The real control plane (`cluster.rs`) covers what a real API server does
//! when asked. This server stays for what a real one cannot be made to do on
//! demand, and these tests are those cases:
//! - drop every open watch at a chosen moment, with nothing else changing;
//! - answer a resumed watch with 410 Gone without a compaction (and so without
//!   a restart that rewrites the `kubernetes` Service's endpoints);
//! - stay down, every connection refused, for exactly as long as a test wants,
//!   and be absent from the start (`before_the_first_list_…`);
//! - replay objects exactly as recorded, including the ones a real server would
//!   have rewritten since (`the_recorded_objects_convert_as_expected`).

mod common;

use common::*;
use kube_nft::bench::apiserver::{self, ApiServer, Kind};
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

/// The fixtures' `hostnames` Service and its endpoints: node1's ready pod, node2's
/// ready pod, node3's terminating pod (made ready by the recorded slice watch).
const HOSTNAMES: &str = "10.96.95.35:80";
const PODS: [(&str, &[&str]); 3] = [
    ("hn-node1", &["10.244.1.7"]),
    ("hn-node2", &["10.244.2.3"]),
    ("hn-node3", &["10.244.3.6"]),
];
/// `web-np` (deleted by the recorded Service watch) and `added` (created by it):
/// neither has endpoints.
const WEB_NP: &str = "10.96.16.66:8080";
const ADDED: &str = "10.96.189.195:8443";
const HEALTHZ: &str = "127.0.0.1:10256";
const METRICS: &str = "127.0.0.1:10249";

/// `run` as node1 with `source` (`--master URL` or `--kubeconfig FILE`) and `extra`.
fn start_daemon(c: &Cluster, source: [&str; 2], extra: &[&str]) -> Daemon {
    let mut args = vec!["run", source[0], source[1], "--hostname-override", "node1"];
    args.extend(IN_A_NETNS);
    args.extend_from_slice(&["--healthz-bind-address", HEALTHZ]);
    args.extend_from_slice(extra);
    Daemon::spawn(c.node(), &args, c.scratch.0.join("daemon.log"))
}

fn wait_ready(c: &Cluster, limit: Duration) {
    wait_until(limit, "healthz to answer 200", || {
        http_status(c.node(), HEALTHZ, "/healthz").is_some_and(|(code, _)| code == 200)
    });
}

/// A kubeconfig naming `server`, with a token the fake API server does not check.
fn kubeconfig_for(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: \"{server}\"}}}}]
users: [{{name: test, user: {{token: not-checked}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test}}}}]
current-context: test
"
    )
}

fn names(t: &Tally) -> BTreeSet<String> {
    t.answers.keys().cloned().collect()
}

fn metrics(c: &Cluster) -> String {
    let (code, body) = http_status(c.node(), METRICS, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    body
}

fn syncs(c: &Cluster) -> f64 {
    metric(
        &metrics(c),
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
    )
    .unwrap()
}

fn refused(c: &Cluster, target: &str) -> bool {
    let (err, _) = connect_error(c.client(), target, Duration::from_secs(1));
    err == Some(std::io::ErrorKind::ConnectionRefused)
}

fn timed_out(c: &Cluster, target: &str) -> bool {
    let (err, _) = connect_error(c.client(), target, Duration::from_secs(1));
    matches!(
        err,
        Some(std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
    )
}

#[test]
fn services_from_the_api_server_take_effect_and_drops_410s_and_outages_change_no_rule() {
    let c = Cluster::new("api", &PODS, &[9376]);
    let api = ApiServer::start_in(c.node());
    let url = api.url();
    let d = start_daemon(
        &c,
        ["--master", &url],
        // Only changes sync: a periodic resync would blur "a relist changed nothing".
        &[
            "--cluster-cidr",
            CLUSTER_CIDRS,
            "--sync-period",
            "1h",
            "--min-sync-period",
            "100ms",
        ],
    );
    // Ready only after the first sync: then the recorded objects are programmed.
    wait_ready(&c, Duration::from_secs(30));
    let t = tally(c.client(), HOSTNAMES, 40, false);
    assert!(t.errors.is_empty(), "{:?}\n{}", t.errors, d.log_text());
    assert_eq!(
        names(&t),
        BTreeSet::from(["hn-node1".to_string(), "hn-node2".to_string()]),
        "the terminating endpoint takes no traffic while others are ready"
    );
    assert!(refused(&c, WEB_NP), "web-np has no endpoints: rejected");

    // The recorded EndpointSlice watch: node3's endpoint becomes ready.
    api.replay("watch-endpointslices.jsonl");
    wait_until(
        Duration::from_secs(10),
        "node3's pod to get traffic",
        || names(&tally(c.client(), HOSTNAMES, 30, false)).contains("hn-node3"),
    );

    // The recorded Service watch: hostnames patched, web-np deleted, added created.
    api.replay("watch-services.jsonl");
    wait_until(Duration::from_secs(10), "added to be programmed", || {
        nft_list(c.node()).contains("10.96.189.195")
    });
    assert!(refused(&c, ADDED), "added has no endpoints: rejected");
    assert!(
        timed_out(&c, WEB_NP),
        "web-np's address is now unallocated in the ServiceCIDR: dropped"
    );
    assert!(!nft_list(c.node()).contains("10.96.16.66"));

    // Created, changed and deleted through the API.
    api.apply(
        Kind::Service,
        &service("made", &["10.96.7.7"], &[tcp(80, 9376)]),
    );
    // The EndpointSlice controller's trigger time, two seconds ago: network
    // programming latency is measured from it.
    let triggered =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(2);
    api.apply(
        Kind::Slice,
        &slice("made", "a", &[tcp(80, 9376)], &["10.244.1.7"]).replace(
            "  namespace: default\n",
            &format!("  namespace: default\n  annotations: {{endpoints.kubernetes.io/last-change-trigger-time: \"{triggered}\"}}\n"),
        ),
    );
    wait_until(
        Duration::from_secs(10),
        "made to answer from node1's pod",
        || {
            names(&tally(c.client(), "10.96.7.7:80", 5, false))
                == BTreeSet::from(["hn-node1".into()])
        },
    );
    api.apply(
        Kind::Slice,
        &slice("made", "a", &[tcp(80, 9376)], &["10.244.2.3"]),
    );
    wait_until(
        Duration::from_secs(10),
        "made to move to node2's pod",
        || {
            names(&tally(c.client(), "10.96.7.7:80", 5, false))
                == BTreeSet::from(["hn-node2".into()])
        },
    );
    api.delete(Kind::Service, "default", "made");
    wait_until(Duration::from_secs(10), "made to be gone", || {
        !nft_list(c.node()).contains("10.96.7.7")
    });
    assert!(timed_out(&c, "10.96.7.7:80"));

    // Services and EndpointSlices are asked for with kube-proxy's label
    // selector, lists and watches alike; Nodes and ServiceCIDRs without it.
    let selected = |r: &String| {
        r.replace("%21", "!")
            .replace("%2F", "/")
            .replace("%2C", ",")
            .contains("labelSelector=!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless")
    };
    let all = api.requests();
    for (path, want) in [
        ("/api/v1/services", true),
        ("/apis/discovery.k8s.io/v1/endpointslices", true),
        ("/api/v1/nodes", false),
        ("/apis/networking.k8s.io/v1/servicecidrs", false),
    ] {
        let of: Vec<&String> = all
            .iter()
            .filter(|r| r.contains(&format!("{path}?")))
            .collect();
        assert!(of.len() >= 2, "a list and a watch of {path}: {all:?}");
        assert!(of.iter().all(|r| selected(r) == want), "{path}: {of:?}");
        // Services and EndpointSlices: a stream of the initial state is asked
        // for once, refused by this server (as with WatchList off), and listed.
        let streamed = of.iter().filter(|r| r.contains("sendInitialEvents=true"));
        assert_eq!(streamed.count(), usize::from(want), "{path}: {of:?}");
        if want {
            assert!(of[0].contains("sendInitialEvents=true"), "{path}: {of:?}");
        }
    }
    assert_eq!(
        d.log_text().matches("does not stream the").count(),
        2,
        "{}",
        d.log_text()
    );

    // A dropped watch resumes from the last resourceVersion: no relist, no sync.
    let ruleset = nft_list(c.node());
    let synced = syncs(&c);
    let requests = api.requests().len();
    api.drop_watches();
    wait_until(
        Duration::from_secs(30),
        "the four watches to resume",
        || {
            api.requests()[requests..]
                .iter()
                .filter(|r| r.contains("watch=true"))
                .count()
                >= 4
                && api.open_watches() == 4
        },
    );
    let lists_after_drop = api.requests()[requests..]
        .iter()
        .filter(|r| !r.contains("watch=true"))
        .count();
    assert_eq!(
        lists_after_drop, 0,
        "a dropped watch resumes without a relist"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(syncs(&c), synced, "a dropped watch synced rules");
    assert_eq!(nft_list(c.node()), ruleset);

    // 410 Gone: every kind relists, finds what it had, and changes nothing.
    let requests = api.requests().len();
    api.expire_history();
    wait_until(
        Duration::from_secs(30),
        "all four kinds to relist and watch",
        || {
            let new = &api.requests()[requests..];
            new.iter().filter(|r| !r.contains("watch=true")).count() >= 4 && api.open_watches() == 4
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(syncs(&c), synced, "a relist after 410 synced rules");
    assert_eq!(nft_list(c.node()), ruleset);
    let t = tally(c.client(), HOSTNAMES, 30, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(names(&t).len(), 3);

    // The API server goes away: the rules keep serving, nothing syncs; when it
    // is back, the watches resume and new changes take effect.
    let outages = || d.log_text().matches("retrying with backoff").count();
    let before = outages();
    api.set_down(true);
    wait_until(Duration::from_secs(30), "the watchers to notice", || {
        outages() > before
    });
    let t = tally(c.client(), HOSTNAMES, 20, false);
    assert!(t.errors.is_empty(), "{:?}", t.errors);
    assert_eq!(syncs(&c), synced);
    api.set_down(false);
    api.apply(
        Kind::Service,
        &service("late", &["10.96.8.8"], &[tcp(80, 9376)]),
    );
    wait_until(
        Duration::from_secs(60),
        "a Service created after the outage",
        || nft_list(c.node()).contains("10.96.8.8"),
    );
    assert!(d.log_text().contains("watching Services again"));

    // The documented metrics, under kube-proxy's names.
    let m = metrics(&c);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"}",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}",
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"}",
        "kubeproxy_proxy_healthz_total{code=\"200\"}",
        "kubenft_transaction_bytes_count",
    ] {
        assert!(metric(&m, name).is_some(), "no {name} in:\n{m}");
    }
    assert!(
        metric(
            &m,
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}"
        )
        .unwrap()
            >= 4.0
    );
    assert!(metric(&m, "kubeproxy_sync_proxy_rules_service_changes_total").unwrap() >= 6.0);
    assert!(metric(&m, "kubenft_transaction_bytes_sum").unwrap() > 0.0);
    // Only the annotated slice has a trigger time: one observation of about 2 s.
    assert_eq!(
        metric(
            &m,
            "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}"
        ),
        Some(1.0)
    );
    let latency = metric(
        &m,
        "kubeproxy_network_programming_duration_seconds_sum{ip_family=\"IPv4\"}",
    )
    .unwrap();
    assert!((2.0..10.0).contains(&latency), "{latency}");
    // web-np (externalTrafficPolicy: Local) is gone; the lb Service is Cluster.
    assert_eq!(
        metric(
            &m,
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\",ip_family=\"IPv4\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        http_status(c.node(), HEALTHZ, "/livez").map(|(code, _)| code),
        Some(200)
    );
    if std::env::var("API_TEST_DEBUG").is_ok() {
        eprintln!("{:#?}\n{}", api.requests(), d.log_text());
    }
}

/// Also: the wait for an API server that never answers costs nothing. Each
/// kind says once that it retries, and backs off; the main loop sleeps, also
/// after the periodic full sync (here every second) falls due and cannot be done.
#[test]
fn before_the_first_list_nothing_is_programmed_and_healthz_says_so() {
    let c = Cluster::new("api-down", &PODS[..1], &[9376]);
    // Nothing listens on port 1 of the node's fresh loopback: the daemon retries.
    let d = start_daemon(
        &c,
        ["--master", "http://127.0.0.1:1"],
        &["--sync-period", "1s"],
    );
    wait_until(Duration::from_secs(10), "healthz to answer", || {
        http_status(c.node(), HEALTHZ, "/healthz").is_some()
    });
    let cpu_before = cpu_seconds(d.pid());
    std::thread::sleep(Duration::from_secs(6));
    let (code, body) = http_status(c.node(), HEALTHZ, "/healthz").unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("\"lastUpdated\":\"\""), "{body}");
    assert!(
        !nft_list(c.node()).contains("kube-nft"),
        "programmed before listing:\n{}",
        d.log_text()
    );
    let cpu = cpu_seconds(d.pid()) - cpu_before;
    assert!(
        cpu < 1.0,
        "{cpu:.2} s of CPU in 6 s of waiting: a busy loop"
    );
    let log = d.log_text();
    for kind in ["Services", "EndpointSlices", "Node", "ServiceCIDRs"] {
        let said = log.matches(&format!("watching {kind}: ")).count();
        assert_eq!(
            said, 1,
            "watching {kind}: said {said} times, not once:\n{log}"
        );
    }
    assert!(
        !log.contains("relisting"),
        "nothing was listed to relist:\n{log}"
    );
}

/// A restart over an earlier run's rules while the API server is away: those
/// rules serve, and /healthz says 200 all along. A Node not listed yet is not a
/// Node being deleted (this answered 503 from each start until the Node was listed).
#[test]
fn a_restart_over_our_rules_stays_healthy_while_the_api_server_is_away() {
    let c = Cluster::new("api-away", &WEB_PODS[..1], &[9376]);
    let manifests = c.scratch.write("web.yaml", &web(&["10.244.0.11"]));
    sync_once(c.node(), &manifests);
    let d = start_daemon(&c, ["--master", "http://127.0.0.1:1"], &[]);
    wait_until(Duration::from_secs(10), "healthz to answer", || {
        http_status(c.node(), HEALTHZ, "/healthz").is_some()
    });
    for _ in 0..20 {
        let (code, body) = http_status(c.node(), HEALTHZ, "/healthz").unwrap();
        assert_eq!(code, 200, "{body}\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(answers(c.client(), "10.96.0.10:80"));
    let log = d.log_text();
    assert!(log.contains("in place from an earlier run"), "{log}");
    assert!(!log.contains("being deleted"), "{log}");
}

/// User and system CPU time a process has used, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // In clock ticks, which /proc gives in USER_HZ: 100 a second on Linux.
    ticks as f64 / 100.0
}

/// Without `--kubeconfig` or `--master`, the in-cluster config or nothing, as
/// kube-proxy: not `$KUBECONFIG` or `~/.kube/config`, even when they name a
/// server that answers (on a node they are an administrator's).
#[test]
fn without_kubeconfig_or_master_only_the_in_cluster_config_is_used() {
    let c = Cluster::new("api-incluster", &PODS[..1], &[9376]);
    let api = ApiServer::start_in(c.node());
    let home = c.scratch.0.join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    let kubeconfig = home.join(".kube/config");
    std::fs::write(&kubeconfig, kubeconfig_for(&api.url())).unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", c.node(), BIN, "run", "--once"])
        .args(IN_A_NETNS)
        .args(["--hostname-override", "node1"])
        .env("HOME", &home)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut child, Duration::from_secs(20))
        .expect("still running after 20 s: it found an API server to wait for");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        !status.success(),
        "synced from a kubeconfig it was not given"
    );
    assert!(err.contains("in-cluster"), "{err}");
    assert!(
        api.requests().is_empty(),
        "asked the kubeconfig's server: {:?}",
        api.requests()
    );
    assert!(!nft_list(c.node()).contains("kube-nft"));
}

/// Every recorded object converts as a proxy must read it.
#[test]
fn the_recorded_objects_convert_as_expected() {
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::discovery::v1 as discovery;
    use kube_nft::core::convert::{
        convert_endpoint_slice, convert_node, convert_service, Converted,
    };
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(apiserver::fixtures().join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let mut verdicts = Vec::new();
    for item in read("list-services.json")["items"].as_array().unwrap() {
        let svc: core::Service = serde_json::from_value(item.clone()).unwrap();
        let name = svc.metadata.name.clone().unwrap();
        verdicts.push(match convert_service(&svc, &mut Vec::new()) {
            Ok(Converted::Valid(s)) => format!("{name}: valid, {} ports", s.ports.len()),
            Ok(Converted::Skipped(why)) => format!("{name}: skipped, {why:?}"),
            Err(r) => format!("{name}: rejected, {r}"),
        });
    }
    assert_eq!(
        verdicts,
        [
            "ext: skipped, ExternalName",
            "headless: skipped, Headless",
            "hostnames: valid, 1 ports",
            "lb: valid, 2 ports",
            "web-np: valid, 1 ports",
        ]
    );
    let slices = read("list-endpointslices.json");
    let slice: discovery::EndpointSlice =
        serde_json::from_value(slices["items"][0].clone()).unwrap();
    let Ok(Converted::Valid(slice)) = convert_endpoint_slice(&slice) else {
        panic!("the recorded slice does not convert");
    };
    assert_eq!(slice.service.name, "hostnames");
    let terminating: Vec<bool> = slice
        .endpoints
        .iter()
        .map(|e| e.conditions.terminating)
        .collect();
    assert_eq!(terminating, [false, false, true]);
    let node: core::Node = serde_json::from_value(read("node-node1.json")).unwrap();
    let node = convert_node(&node).unwrap();
    assert_eq!(
        node.primary_ips,
        ["169.254.100.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        node.pod_cidrs,
        ["10.244.1.0/24".parse::<ipnet::IpNet>().unwrap()]
    );
}

/// `--kubeconfig` reaches the API server; Services and EndpointSlices are asked
/// for whole (no limit: the API server's cache answers a whole list for far
/// less CPU than pages), from its cache, protobuf first; a server that pages
/// anyway, and answers in JSON, is read through its `continue` tokens; and
/// `--detect-local-mode NodeCIDR` takes the pod CIDR from the Node object.
#[test]
fn a_kubeconfig_reaches_the_api_server_and_lists_are_asked_whole_and_read_in_its_pages() {
    let c = Cluster::new("api-kc", &PODS, &[9376]);
    let api = ApiServer::start_in(c.node());
    api.page_by(500);
    let count = 1100;
    let vip = |i: usize| format!("10.96.{}.{}", 100 + i / 250, i % 250 + 1);
    for i in 0..count {
        api.apply(
            Kind::Service,
            &service(&format!("s{i}"), &[&vip(i)], &[tcp(80, 9376)]),
        );
    }
    let kubeconfig = c.scratch.write("kubeconfig", &kubeconfig_for(&api.url()));
    let d = start_daemon(
        &c,
        ["--kubeconfig", kubeconfig.to_str().unwrap()],
        &["--detect-local-mode", "NodeCIDR"],
    );
    wait_ready(&c, Duration::from_secs(60));
    let pages: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("/api/v1/services?") && !r.contains("watch=true"))
        .collect();
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert!(pages.iter().all(|r| !r.contains("limit=")), "{pages:?}");
    assert!(pages[0].contains("resourceVersion=0"), "{pages:?}");
    let ruleset = nft_list(c.node());
    for i in [0, 499, 500, count - 1] {
        assert!(ruleset.contains(&vip(i)), "s{i} missing\n{}", d.log_text());
    }
    // NodeCIDR: traffic from outside node1's spec.podCIDRs is masqueraded.
    assert!(ruleset.contains("ip saddr != 10.244.1.0/24"), "{ruleset}");
    // The recorded Services are there too, and hostnames answers.
    assert!(answers(c.client(), HOSTNAMES));
}
