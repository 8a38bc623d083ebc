//! Life over time against a real control plane (issue #19): a churn soak at 1k
//! Services, and the API server gone for minutes. Both run kube-nft as the
//! DaemonSet runs it, beside a Service `web` whose two pods stay up and a client
//! that keeps opening connections to it.
//!
//! Lengths: `KUBE_NFT_SOAK_SECONDS` (default 120, as in CI; the documented run
//! is 600) and `KUBE_NFT_OUTAGE_SECONDS` (default 120). `KUBE_NFT_SOAK_SEED`
//! replays a soak's random changes; `KUBE_NFT_SOAK_RATE` sets their rate
//! (default 10 a second).

mod common;

use common::control_plane::*;
use common::*;
use futures_util::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVICES: usize = 1000;
/// Of the Services, these are UDP and point at the two real pods, so that
/// removing one of their endpoints leaves real conntrack entries to clean.
const UDP_SERVICES: usize = 10;
const POD_IPS: [&str; 2] = ["10.244.0.11", "10.244.0.12"];
const NAMESPACE: &str = "default";

/// The environment variable `name` parsed, or `default`.
fn from_env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: the soak's changes are replayable from the seed it prints.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

fn udp_name(i: usize) -> String {
    format!("dns-{i}")
}

fn service_json(name: &str, udp: bool) -> Value {
    let port = if udp {
        json!({"name": "p", "protocol": "UDP", "port": 53, "targetPort": 9376})
    } else {
        json!({"name": "p", "protocol": "TCP", "port": 80, "targetPort": 8080})
    };
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"ports": [port]},
    })
}

/// Endpoints as the EndpointSlice API has them: (address, ready, serving, terminating).
fn endpoints_json(endpoints: &[(String, bool, bool, bool)]) -> Value {
    endpoints
        .iter()
        .map(|(a, ready, serving, terminating)| {
            json!({"addresses": [a], "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
        })
        .collect()
}

fn slice_json(service: &str, udp: bool, endpoints: &[(String, bool, bool, bool)]) -> Value {
    let (protocol, port) = if udp { ("UDP", 9376) } else { ("TCP", 8080) };
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-a"), "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "soak.kube-nft.io"}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "protocol": protocol, "port": port}],
        "endpoints": endpoints_json(endpoints),
    })
}

fn ready(addrs: &[&str]) -> Vec<(String, bool, bool, bool)> {
    addrs
        .iter()
        .map(|a| (a.to_string(), true, true, false))
        .collect()
}

/// Up to four made-up endpoints (nothing listens there), in random states.
fn random_endpoints(rng: &mut Rng) -> Vec<(String, bool, bool, bool)> {
    (0..rng.below(5))
        .map(|_| {
            let addr = format!("10.245.{}.{}", rng.below(200), 1 + rng.below(250));
            match rng.below(4) {
                0 => (addr, false, true, true),   // terminating, still serving
                1 => (addr, false, false, false), // not ready
                _ => (addr, true, true, false),
            }
        })
        .collect()
}

async fn client(kubeconfig: &Path) -> Client {
    let conn = kube_nft::source::kubernetes::Connection {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        master: None,
    };
    let config = kube_nft::source::kubernetes::client_config(&conn)
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// Runs `f` on a one-thread runtime inside `ns` (where the API server is
/// reachable), to completion.
fn in_cluster<T: Send + 'static>(
    ns: &str,
    kubeconfig: &Path,
    f: impl FnOnce(Client) -> futures_util::future::BoxFuture<'static, T> + Send + 'static,
) -> T {
    let kubeconfig = kubeconfig.to_path_buf();
    kube_nft::testbed::netns::in_netns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = client(&kubeconfig).await;
            f(c).await
        })
    })
    .unwrap()
}

/// What the churn changed, by kind of change.
#[derive(Debug, Default)]
struct Changes(BTreeMap<&'static str, usize>);

impl Changes {
    fn count(&mut self, what: &'static str) {
        *self.0.entry(what).or_default() += 1;
    }
}

/// The churn, from one task: random changes to the TCP Services (their
/// endpoints, ports, type, session affinity; deleted and replaced by new ones)
/// and to the UDP Services' endpoints, `per_second` a second until `until`.
async fn churn(client: Client, seed: u64, until: Instant, per_second: u32) -> Changes {
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(client, NAMESPACE);
    // xorshift stays at 0 from 0.
    let mut rng = Rng(seed | 1);
    let mut tcp: Vec<String> = (UDP_SERVICES..SERVICES)
        .map(|i| format!("churn-{i}"))
        .collect();
    let mut next = SERVICES;
    let mut changes = Changes::default();
    let tick = Duration::from_secs(1) / per_second;
    let merge = |v: Value| Patch::Merge(v);
    let pp = PatchParams::default();
    while Instant::now() < until {
        let started = Instant::now();
        let roll = rng.below(100);
        if roll < 15 {
            // A UDP Service's endpoints: one pod, the other, or both.
            let name = udp_name(rng.below(UDP_SERVICES));
            let eps = match rng.below(3) {
                0 => ready(&POD_IPS[..1]),
                1 => ready(&POD_IPS[1..]),
                _ => ready(&POD_IPS),
            };
            let patch = json!({"endpoints": endpoints_json(&eps)});
            slices
                .patch(&format!("{name}-a"), &pp, &merge(patch))
                .await
                .unwrap();
            changes.count("udp endpoints");
            continue_after(started, tick).await;
            continue;
        }
        let k = rng.below(tcp.len());
        let name = tcp[k].clone();
        if roll < 55 {
            let patch = json!({"endpoints": endpoints_json(&random_endpoints(&mut rng))});
            slices
                .patch(&format!("{name}-a"), &pp, &merge(patch))
                .await
                .unwrap();
            changes.count("endpoints");
        } else if roll < 70 {
            services
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
            slices
                .delete(&format!("{name}-a"), &DeleteParams::default())
                .await
                .unwrap();
            let fresh = format!("churn-{next}");
            next += 1;
            create(
                &services,
                &slices,
                &fresh,
                false,
                &random_endpoints(&mut rng),
            )
            .await;
            tcp[k] = fresh;
            changes.count("replaced");
        } else if roll < 80 {
            let port = 1000 + rng.below(60000);
            let patch = json!({"spec": {"ports": [{"name": "p", "protocol": "TCP", "port": port, "targetPort": 8080}]}});
            services.patch(&name, &pp, &merge(patch)).await.unwrap();
            changes.count("port");
        } else if roll < 90 {
            let svc = services.get(&name).await.unwrap();
            let is_node_port = svc.spec.and_then(|s| s.type_).as_deref() == Some("NodePort");
            let to = if is_node_port {
                "ClusterIP"
            } else {
                "NodePort"
            };
            let patch = json!({"spec": {"type": to}});
            services.patch(&name, &pp, &merge(patch)).await.unwrap();
            changes.count("type");
        } else {
            let affinity = if rng.chance(50) { "ClientIP" } else { "None" };
            let patch = json!({"spec": {"sessionAffinity": affinity}});
            services.patch(&name, &pp, &merge(patch)).await.unwrap();
            changes.count("affinity");
        }
        continue_after(started, tick).await;
    }
    changes
}

async fn continue_after(started: Instant, tick: Duration) {
    tokio::time::sleep(tick.saturating_sub(started.elapsed())).await;
}

async fn create(
    services: &Api<Service>,
    slices: &Api<EndpointSlice>,
    name: &str,
    udp: bool,
    endpoints: &[(String, bool, bool, bool)],
) {
    let svc: Service = serde_json::from_value(service_json(name, udp)).unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let slice: EndpointSlice = serde_json::from_value(slice_json(name, udp, endpoints)).unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
}

/// The 1k Services: UDP ones on both pods, the rest on made-up endpoints.
async fn populate(client: Client) {
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(client, NAMESPACE);
    stream::iter(0..SERVICES)
        .map(|i| {
            let (services, slices) = (services.clone(), slices.clone());
            async move {
                if i < UDP_SERVICES {
                    create(&services, &slices, &udp_name(i), true, &ready(&POD_IPS)).await;
                } else {
                    let eps = ready(&[&format!("10.245.{}.{}", i / 250, i % 250 + 1)]);
                    create(&services, &slices, &format!("churn-{i}"), false, &eps).await;
                }
                Ok::<(), ()>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
}

/// Every ClusterIP port the API server has, as `IP . proto . port`, and each
/// UDP ClusterIP's ready endpoints.
type ApiView = (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>);

async fn api_view(client: Client) -> ApiView {
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let slices: Api<EndpointSlice> = Api::namespaced(client, NAMESPACE);
    let mut ports = BTreeSet::new();
    let mut udp_vips = BTreeMap::new();
    for svc in services.list(&ListParams::default()).await.unwrap() {
        let name = svc.metadata.name.clone().unwrap();
        let spec = svc.spec.unwrap();
        let ip = spec.cluster_ip.unwrap();
        for p in spec.ports.unwrap_or_default() {
            let proto = p.protocol.unwrap_or_default().to_lowercase();
            ports.insert(format!("{ip} . {proto} . {}", p.port));
            if proto == "udp" {
                udp_vips.insert(name.clone(), ip.clone());
            }
        }
    }
    let mut udp_endpoints = BTreeMap::new();
    for slice in slices.list(&ListParams::default()).await.unwrap() {
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        if let Some(vip) = udp_vips.get(service) {
            let ready: BTreeSet<String> = slice
                .endpoints
                .iter()
                .flatten()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .flat_map(|e| e.addresses.clone())
                .collect();
            udp_endpoints.insert(vip.clone(), ready);
        }
    }
    (ports, udp_endpoints)
}

/// Every `IP . proto . port` of a ClusterIP in the node's ruleset (the Service
/// CIDR is 10.96.0.0/16).
fn kernel_ports(ns: &str) -> BTreeSet<String> {
    let listing = nft_list(ns);
    let words: Vec<&str> = listing
        .split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(5)
        .filter(|w| {
            w[0].starts_with("10.96.")
                && w[1] == "."
                && ["tcp", "udp", "sctp"].contains(&w[2])
                && w[3] == "."
                && w[4].parse::<u16>().is_ok()
        })
        .map(|w| w.join(" "))
        .collect()
}

/// The node's UDP conntrack entries: (ClusterIP, endpoint it was DNATed to).
fn udp_flows(ns: &str) -> Vec<(String, String)> {
    exec_in(ns, &["conntrack", "-L", "-p", "udp"])
        .lines()
        .filter_map(|l| {
            let field = |key: &str, nth: usize| {
                l.split_whitespace()
                    .filter_map(|w| w.strip_prefix(key))
                    .nth(nth)
                    .map(str::to_string)
            };
            Some((field("dst=", 0)?, field("src=", 1)?))
        })
        .collect()
}

/// The daemon's resident memory (KiB) and open file descriptors.
fn rss_and_fds(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (rss, fds)
}

/// Samples `rss_and_fds` every `every` until `stop`.
fn sample(
    pid: u32,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, usize)>> {
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            samples.push(rss_and_fds(pid));
            std::thread::sleep(every);
        }
        samples
    })
}

/// Whether memory and descriptors stayed flat: the last third of the samples
/// against the first third after `warm_up` samples.
fn flat(samples: &[(u64, usize)], warm_up: usize) -> Result<(), String> {
    let steady = &samples[warm_up.min(samples.len())..];
    if steady.len() < 3 {
        return Err(format!("too few samples: {samples:?}"));
    }
    let third = steady.len() / 3;
    let median = |s: &[(u64, usize)]| {
        let mut v: Vec<u64> = s.iter().map(|x| x.0).collect();
        v.sort();
        v[v.len() / 2]
    };
    let (early, late) = (
        &steady[..third.max(1)],
        &steady[steady.len() - third.max(1)..],
    );
    let (rss_early, rss_late) = (median(early), median(late));
    let fds_early = early.iter().map(|x| x.1).max().unwrap();
    let fds_late = late.iter().map(|x| x.1).max().unwrap();
    // A leak grows with time; allocator noise is a few MiB.
    if rss_late > rss_early + rss_early / 10 + 4096 {
        return Err(format!(
            "RSS grew from {rss_early} to {rss_late} KiB: {samples:?}"
        ));
    }
    if fds_late > fds_early + 2 {
        return Err(format!(
            "open fds grew from {fds_early} to {fds_late}: {samples:?}"
        ));
    }
    Ok(())
}

/// What one UDP flow saw: how many questions it sent, how many answers came,
/// and the longest time it went without an answer.
#[derive(Debug, Clone)]
struct UdpFlow {
    vip: SocketAddr,
    asked: usize,
    answered: usize,
    longest_silence: Duration,
}

/// Keeps one connected UDP socket per ClusterIP asking every 200 ms, as a
/// client whose flow outlives an endpoint would. Both pods stay up through the
/// churn, so every question should be answered: by the endpoint the flow was
/// sent to, or, once its conntrack entry is cleaned, by one its Service still has.
fn keep_asking(
    ns: &str,
    vips: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<UdpFlow>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        kube_nft::testbed::netns::in_netns(&ns, move || {
            let socks: Vec<UdpSocket> = vips
                .iter()
                .map(|vip| {
                    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                    s.connect(vip).unwrap();
                    // A late answer is read by the next question instead.
                    s.set_read_timeout(Some(Duration::from_millis(100)))
                        .unwrap();
                    s
                })
                .collect();
            let started = Instant::now();
            let mut flows: Vec<UdpFlow> = vips
                .iter()
                .map(|&vip| UdpFlow {
                    vip,
                    asked: 0,
                    answered: 0,
                    longest_silence: Duration::ZERO,
                })
                .collect();
            let mut last_answer = vec![started; socks.len()];
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::Relaxed) {
                for ((s, flow), last) in socks.iter().zip(&mut flows).zip(&mut last_answer) {
                    let _ = s.send(b"who are you?");
                    flow.asked += 1;
                    if s.recv(&mut buf).is_ok() {
                        flow.answered += 1;
                        *last = Instant::now();
                    }
                    flow.longest_silence = flow.longest_silence.max(last.elapsed());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            flows
        })
        .unwrap()
    })
}

#[test]
fn a_churn_soak_at_1k_services_fails_no_connection_and_leaves_the_kernel_as_desired() {
    let length = Duration::from_secs(from_env("KUBE_NFT_SOAK_SECONDS", 120));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let seed = from_env("KUBE_NFT_SOAK_SEED", now.as_nanos() as u64);
    let rate: u32 = from_env("KUBE_NFT_SOAK_RATE", 10);
    println!("soak of {length:?} at {rate} changes a second, KUBE_NFT_SOAK_SEED={seed}");
    let s = Serving::new("kso", "kc6");
    let (c, vip) = (&s.c, s.vip());
    let kubeconfig = Path::new(s.cp.dir()).join("admin.kubeconfig");
    let mut daemon = s.daemonset("kube-nft.log");
    wait_until(Duration::from_secs(30), "the ClusterIP to answer", || {
        answers(c.client(), &vip)
    });

    let started = Instant::now();
    in_cluster(c.node(), &kubeconfig, |client| Box::pin(populate(client)));
    let (ports, _) = in_cluster(c.node(), &kubeconfig, |c| Box::pin(api_view(c)));
    assert!(ports.len() > SERVICES, "{}", ports.len());
    wait_until(Duration::from_secs(60), "1k Services programmed", || {
        kernel_ports(c.node()) == ports
    });
    println!(
        "{SERVICES} Services created and programmed in {:?}",
        started.elapsed()
    );

    let udp_vips: Vec<SocketAddr> = ports
        .iter()
        .filter(|p| p.contains(" . udp . "))
        .map(|p| {
            format!("{}:53", p.split(' ').next().unwrap())
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(udp_vips.len(), UDP_SERVICES);
    let stop = Arc::new(AtomicBool::new(false));
    let tcp_client = keep_connecting(c.client(), &vip, Duration::from_secs(2), stop.clone());
    let udp_client = keep_asking(c.client(), udp_vips, stop.clone());
    let pid = daemon.pid();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "kube-nft"
    );
    let every = length / 24;
    let sampler = sample(pid, every, stop.clone());

    let until = Instant::now() + length;
    let changes = in_cluster(c.node(), &kubeconfig, move |client| {
        Box::pin(churn(client, seed, until, rate))
    });
    let (ports, udp_endpoints) = in_cluster(c.node(), &kubeconfig, |c| Box::pin(api_view(c)));
    let settled = wait_until(Duration::from_secs(30), "the kernel to settle", || {
        kernel_ports(c.node()) == ports
    });
    // The stale-flow cleaning follows each sync; the clients are still running.
    std::thread::sleep(Duration::from_secs(2));
    let flows = udp_flows(c.node());
    stop.store(true, Ordering::Relaxed);
    let load = tcp_client.join().unwrap();
    let (answered, failed) = (load.times.len(), &load.failed);
    let udp_flows_seen = udp_client.join().unwrap();
    let samples = sampler.join().unwrap();
    let (asked, udp_answered) = udp_flows_seen
        .iter()
        .fold((0, 0), |(q, a), f| (q + f.asked, a + f.answered));
    let longest = udp_flows_seen
        .iter()
        .map(|f| f.longest_silence)
        .max()
        .unwrap_or_default();
    println!(
        "changes: {:?}; settled {settled:?} after the last; {answered} connections answered, {} failed; UDP: {udp_answered} of {asked} questions answered over {} flows, the longest silence {longest:?}",
        changes.0,
        failed.len(),
        udp_flows_seen.len()
    );
    println!("RSS (KiB) and open fds every {every:?}: {samples:?}");

    assert!(failed.is_empty(), "connections to web failed: {failed:?}");
    assert!(answered > 100, "{answered}");
    // Both pods serve throughout: a question goes unanswered only when its flow's
    // conntrack entry is cleaned between the question and its answer, or when the
    // answer takes over 100 ms. A flow that the churn broke goes silent for good.
    for f in &udp_flows_seen {
        assert!(
            f.asked >= 10 && f.answered * 100 >= f.asked * 95,
            "UDP flow to {}: {} of {} questions answered\n{udp_flows_seen:?}",
            f.vip,
            f.answered,
            f.asked
        );
        assert!(
            f.longest_silence < Duration::from_secs(2),
            "UDP flow to {} went {:?} without an answer\n{udp_flows_seen:?}",
            f.vip,
            f.longest_silence
        );
    }
    assert!(
        changes.0.get("udp endpoints").copied().unwrap_or(0) > 10,
        "{changes:?}"
    );
    // Each UDP flow goes to an endpoint its Service still has.
    let to_vips: Vec<&(String, String)> = flows
        .iter()
        .filter(|(dst, _)| udp_endpoints.contains_key(dst))
        .collect();
    assert!(!to_vips.is_empty(), "no UDP flow to a ClusterIP: {flows:?}");
    let stale: Vec<_> = to_vips
        .iter()
        .filter(|(vip, endpoint)| !udp_endpoints[vip].contains(endpoint))
        .collect();
    println!(
        "{} UDP flows to ClusterIPs after the churn, {} to a removed endpoint",
        to_vips.len(),
        stale.len()
    );
    assert!(
        stale.is_empty(),
        "flows to removed endpoints: {stale:?}\n{udp_endpoints:?}"
    );
    if let Err(e) = flat(&samples, samples.len() / 4) {
        panic!("{e}");
    }

    // The kernel equals the desired ruleset: a new kube-nft reads it back, diffs
    // it with what the API server says, and has nothing to write.
    daemon.terminate();
    let again = s.daemonset("kube-nft-again.log");
    wait_until(Duration::from_secs(60), "the restart's first sync", || {
        again.syncs("Full") >= 1
    });
    let log = again.log_text();
    assert!(
        log.contains("messages=0 bytes=0"),
        "after the soak, a restart wrote:\n{log}"
    );
}

#[test]
fn the_api_server_gone_for_minutes_changes_no_rule_and_the_node_keeps_serving() {
    let outage = Duration::from_secs(from_env("KUBE_NFT_OUTAGE_SECONDS", 120));
    let s = Serving::new("kgo", "kc7");
    let (c, cp, vip) = (&s.c, &s.cp, s.vip());
    let daemon = s.daemonset("kube-nft.log");
    wait_until(Duration::from_secs(30), "the ClusterIP to answer", || {
        answers(c.client(), &vip)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let tcp_client = keep_connecting(c.client(), &vip, Duration::from_secs(2), stop.clone());

    let log_at_stop = daemon.log_text().len();
    // With its connections to the API server open.
    let (_, fds_before) = rss_and_fds(daemon.pid());
    cp.run("stop-apiserver", &[]);
    // The API server took its own address out of the `kubernetes` Service as it
    // stopped; let that sync land, then nothing may change.
    std::thread::sleep(Duration::from_secs(3));
    let ruleset = nft_list(c.node());
    let log_before = daemon.log_text().len();
    let every = outage / 12;
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = sample(daemon.pid(), every, sampling.clone());
    std::thread::sleep(outage);
    sampling.store(true, Ordering::Relaxed);
    let health: Vec<_> = ["/healthz", "/livez"]
        .iter()
        .map(|p| http_status(c.node(), "127.0.0.1:10256", p).map(|(code, _)| code))
        .collect();
    let during = daemon.log_text()[log_before..].to_string();
    let same = nft_list(c.node()) == ruleset;

    cp.run("start-apiserver", &[]);
    let back = Instant::now();
    cp.apply(&service_yaml("after-outage"));
    let after = format!("{}:80", cp.cluster_ip("after-outage"));
    let created = Instant::now();
    // The watches retry at most 60 s apart (30 s with jitter up to as much
    // again), and a 410 on resuming relists at once.
    while !answers(c.client(), &after) {
        assert!(
            created.elapsed() < Duration::from_secs(75),
            "a Service made after the outage was not programmed in 75 s:\n{}",
            &daemon.log_text()[log_at_stop..]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let programmed = created.elapsed();
    let from_back = back.elapsed();
    // Every watch is back (the Service above came through one): the retries
    // left no descriptor behind.
    let (_, fds_after) = rss_and_fds(daemon.pid());
    stop.store(true, Ordering::Relaxed);
    let load = tcp_client.join().unwrap();
    let (answered, failed) = (load.times.len(), &load.failed);
    let samples = sampler.join().unwrap();
    let retries = daemon.log_text()[log_at_stop..]
        .matches("retrying with backoff")
        .count();
    println!(
        "outage of {outage:?}: {answered} connections answered, {} failed; {retries} watch retries logged; health {health:?}; \
         a Service made after the API server returned answered {programmed:?} after it was created, {from_back:?} after the API server was back",
        failed.len()
    );
    println!(
        "RSS (KiB) and open fds every {every:?} of the outage: {samples:?}; open fds before {fds_before}, after {fds_after}"
    );

    assert!(failed.is_empty(), "connections failed: {failed:?}");
    assert!(same, "the ruleset changed during the outage:\n{during}");
    assert!(retries > 0, "no watch noticed the outage:\n{during}");
    let wrote: Vec<&str> = during
        .lines()
        .filter(|l| l.contains("synced") && !l.contains("bytes=0"))
        .collect();
    assert!(wrote.is_empty(), "syncs wrote during the outage: {wrote:?}");
    // No change waits, so the node is healthy: kube-proxy says the same, and a
    // liveness probe must not restart every node's proxy during an API outage.
    assert_eq!(health, [Some(200), Some(200)]);
    if let Err(e) = flat(&samples, 1) {
        panic!("{e}");
    }
    assert!(fds_after <= fds_before + 2, "{fds_before} → {fds_after}");
}
