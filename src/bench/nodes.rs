//! `kube-nft bench-nodes`: many nodes on one API server (issue #48, item 5).
//! N node namespaces, each running its own proxy against one real
//! kube-apiserver that holds `api_cluster`'s Services × 10 endpoints; kube-nft
//! on every node, then kube-proxy (nftables mode) on every node, in the same
//! harness.
//!
//! Per contender:
//! - start: the N proxies start at once, as a DaemonSet rolls out on a fresh
//!   cluster, and each is synced once its metrics say it has written rules
//!   (`kubeproxy_sync_proxy_rules_last_timestamp_seconds`);
//! - churn: one endpoint of a Service changes at a steady rate for a while,
//!   each change carrying the trigger-time annotation that the EndpointSlice
//!   controller writes, so that every proxy reports its network programming
//!   latency (`kubeproxy_network_programming_duration_seconds`), read from
//!   each node's metrics before and after and summed over the nodes;
//! - the API server's CPU seconds and peak RSS (VmHWM, reset at the start of
//!   each contender, after a garbage collection, so that neither contender's
//!   peak holds what loading the cluster or the contender before left), the
//!   bytes each node received (its link's counter: the API server is all that
//!   talks to it), and each proxy's CPU seconds (with its children's:
//!   kube-proxy runs `nft`) and peak RSS.
//!
//! Both contenders get the same sequence of changes. It runs in the control
//! plane's namespace (`integration/k8s/bench-nodes.sh` sets it up), from
//! where it reaches the API server, etcd and every node's metrics.

use super::api_cluster::{
    client, create_namespaces, patch_endpoints, populate, proxy_flags, store_services, ENDPOINTS,
};
pub use super::etcd_load::Etcd;
use super::versus::proxy_command;
pub use super::versus::Contender;
use super::{median, nft, samples, stop_all};
use crate::lab::hostname_server::http_get_path;
use crate::node::metrics::peak_rss_kib_of;
use crate::node::process_metrics::ProcessStats;
use crate::testbed::synthetic::endpoint_addr;
use kube::Client;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const METRICS_PORT: u16 = 10249;
const LATENCY: &str = "kubeproxy_network_programming_duration_seconds";
const LAST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";

/// One node: its network namespace, its Node's name, and its address.
#[derive(Debug, Clone)]
pub struct Node {
    pub netns: String,
    pub name: String,
    pub ip: Ipv4Addr,
}

impl std::str::FromStr for Node {
    type Err = String;

    /// `NETNS:NAME:IP`.
    fn from_str(s: &str) -> Result<Node, String> {
        let bad = || format!("{s:?} is not NETNS:NAME:IP");
        let mut parts = s.split(':');
        let (Some(netns), Some(name), Some(ip), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Node {
            netns: netns.to_string(),
            name: name.to_string(),
            ip: ip.parse().map_err(|_| bad())?,
        })
    }
}

pub struct NodesOptions {
    pub kubeconfig: PathBuf,
    pub kube_proxy: PathBuf,
    pub nodes: Vec<Node>,
    pub services: usize,
    pub contenders: Vec<Contender>,
    /// Endpoint changes per second during the churn.
    pub rate: f64,
    pub churn: Duration,
    /// How long the N proxies may take to sync once, all of them.
    pub start_limit: Duration,
    /// How long the proxies may take, after the churn, to program what it changed.
    pub drain_limit: Duration,
    pub apiserver_pid: u32,
    /// Given to every proxy after the harness's own arguments.
    pub proxy_args: Vec<String>,
    pub etcd: Option<Etcd>,
    pub logs: PathBuf,
}

/// What one contender cost, over all nodes.
#[derive(Debug, Default)]
pub struct Figures {
    /// From the start of the N proxies until the last of them had synced.
    pub all_synced: f64,
    /// The network programming latency histogram of the churn, summed over the
    /// nodes: (upper bound, count) cumulative, and its sum and count.
    pub latency: Histogram,
    pub changes_made: usize,
    pub changes_failed: usize,
    pub apiserver_cpu_start: f64,
    pub apiserver_cpu_churn: f64,
    pub apiserver_peak_rss_mib: f64,
    /// The API server's RSS when the proxies start, from which its peak is
    /// measured: what is left of loading the cluster, or of the contender before.
    pub apiserver_rss_before_mib: f64,
    /// Per node.
    pub bytes_start: Vec<u64>,
    pub bytes_churn: Vec<u64>,
    pub cpu_start: Vec<f64>,
    pub cpu_churn: Vec<f64>,
    pub peak_rss_mib: Vec<f64>,
    pub notes: Vec<String>,
}

/// A Prometheus histogram as scraped: cumulative counts per upper bound.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Histogram {
    /// `name`'s series in a scrape, summed over their labels other than `le`.
    pub fn scraped(text: &str, name: &str) -> Histogram {
        let mut h = Histogram::default();
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for (metric, labels, value) in samples(text) {
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if metric == bucket {
                let Some(le) = labels
                    .split(',')
                    .find_map(|l| l.strip_prefix("le=\""))
                    .map(|l| l.trim_end_matches('"'))
                    .and_then(|l| l.parse::<f64>().ok())
                else {
                    continue;
                };
                h.add_bucket(le, value);
            } else if metric == sum {
                h.sum += value;
            } else if metric == count {
                h.count += value;
            }
        }
        h
    }

    fn add_bucket(&mut self, le: f64, count: f64) {
        match self.buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count,
            None => {
                self.buckets.push((le, count));
                self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// Every series of `other` added to this one's.
    pub fn add(&mut self, other: &Histogram) {
        for &(le, c) in &other.buckets {
            self.add_bucket(le, c);
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    /// This one less `earlier` (the same series, scraped before).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let mut d = self.clone();
        for (le, c) in &mut d.buckets {
            *c -= earlier
                .buckets
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, c)| *c);
        }
        d.sum -= earlier.sum;
        d.count -= earlier.count;
        d
    }

    /// The smallest bucket bound under which a fraction `q` of the
    /// observations fall: the quantile is at most this. None if empty.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        self.buckets
            .iter()
            .find(|(_, c)| *c >= q * self.count)
            .map(|(le, _)| *le)
    }
}

pub fn bench_nodes(opts: &NodesOptions) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime.block_on(client(&opts.kubeconfig))?;
    std::fs::create_dir_all(&opts.logs).map_err(|e| e.to_string())?;
    let t = Instant::now();
    runtime.block_on(create_namespaces(&client, 0, opts.services))?;
    if let Some(etcd) = &opts.etcd {
        store_services(&runtime, &client, etcd, 0, opts.services)?;
    }
    runtime.block_on(populate(
        &client,
        0,
        opts.services,
        None,
        Ipv4Addr::UNSPECIFIED,
        opts.etcd.is_some(),
    ))?;
    eprintln!(
        "bench-nodes: {} Services × {ENDPOINTS} endpoints in the API server ({:.0} s)",
        opts.services,
        t.elapsed().as_secs_f64()
    );
    let mut churn = Churn::new(opts.services);
    let mut results = Vec::new();
    for &c in &opts.contenders {
        let f = measure(opts, &runtime, &client, &mut churn, c);
        eprintln!("bench-nodes: {}: {f:?}", c.title());
        results.push((c, f));
    }
    print!("{}", table(opts, &results));
    Ok(())
}

/// The changes of the churn: Service after Service in a fixed pseudo-random
/// order (the same for each contender), each time its last endpoint moving to
/// another address or back.
struct Churn {
    services: usize,
    next: u64,
    moved: HashSet<usize>,
}

impl Churn {
    fn new(services: usize) -> Churn {
        Churn {
            services,
            next: 0x9e37_79b9_7f4a_7c15,
            moved: HashSet::new(),
        }
    }

    /// The next Service to change, and its endpoints after the change.
    fn next(&mut self) -> (usize, Vec<IpAddr>) {
        // xorshift64: a fixed sequence without a dependency.
        self.next ^= self.next << 13;
        self.next ^= self.next >> 7;
        self.next ^= self.next << 17;
        let i = (self.next % self.services as u64) as usize;
        let moved = !self.moved.remove(&i);
        if moved {
            self.moved.insert(i);
        }
        let mut addrs: Vec<IpAddr> = (0..ENDPOINTS)
            .map(|k| endpoint_addr(i * ENDPOINTS + k))
            .collect();
        if moved {
            // Past every Service's own addresses.
            addrs[ENDPOINTS - 1] = endpoint_addr((self.services + i) * ENDPOINTS);
        }
        (i, addrs)
    }
}

/// Service `i`'s endpoints set to `addrs`, with the time of the change as the
/// EndpointSlice controller records it.
async fn change(client: Client, i: usize, addrs: Vec<IpAddr>) -> Result<(), String> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    patch_endpoints(&client, i, &addrs, Some(&now)).await
}

/// The proxies of every node, stopped when dropped (also when a measurement
/// fails).
struct Proxies(Vec<Child>);

impl Drop for Proxies {
    fn drop(&mut self) {
        stop_all(&mut self.0);
    }
}

fn start(opts: &NodesOptions, c: Contender, node: &Node) -> Result<Child, String> {
    let mut flags = proxy_flags(&opts.kubeconfig, &node.name);
    flags.push(format!("--metrics-bind-address={}:{METRICS_PORT}", node.ip));
    let mut cmd = proxy_command(c, &opts.kube_proxy, Some(&node.netns), &flags)?;
    cmd.args(&opts.proxy_args);
    let log = opts.logs.join(format!("{}-{}.log", c.name(), node.name));
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("starting {} on {}: {e}", c.title(), node.name))
}

fn scrape(node: &Node) -> Option<String> {
    let addr = SocketAddr::new(IpAddr::V4(node.ip), METRICS_PORT);
    http_get_path(addr, "/metrics", Duration::from_secs(5)).ok()
}

/// A gauge's value in a scrape, summed over its series.
fn gauge(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for (metric, _, value) in samples(text) {
        if metric == name {
            *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    found
}

/// Bytes received by each node.
fn received_by(nodes: &[Node]) -> Result<Vec<u64>, String> {
    nodes.iter().map(received_bytes).collect()
}

/// Bytes received on the node's link to the fabric.
fn received_bytes(node: &Node) -> Result<u64, String> {
    let out = Command::new("ip")
        .args(["-n", &node.netns, "-j", "-s", "link", "show", "fabric0"])
        .output()
        .map_err(|e| e.to_string())?;
    let links: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("ip -j link: {e}"))?;
    links[0]["stats64"]["rx"]["bytes"]
        .as_u64()
        .ok_or_else(|| format!("no byte count for {}'s fabric0", node.netns))
}

/// The CPU time of a process and of the children it has waited for:
/// kube-proxy's syncs are mostly the `nft` it runs.
fn cpu_seconds(pid: u32) -> f64 {
    let stats = ProcessStats::of(&pid.to_string());
    stats.cpu_seconds.unwrap_or(f64::NAN) + stats.children_cpu_seconds.unwrap_or(f64::NAN)
}

/// Has the API server's Go runtime collect its garbage now: its heap profile
/// with `gc=1` (kube-apiserver serves /debug/pprof while `--profiling` is on,
/// its default). Freed memory is reused before the RSS grows again.
async fn collect_garbage(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/debug/pprof/heap?gc=1&debug=1")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map(drop)
        .map_err(|e| format!("the API server's garbage collection: {e}"))
}

fn measure(
    opts: &NodesOptions,
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    churn: &mut Churn,
    c: Contender,
) -> Result<Figures, String> {
    for node in &opts.nodes {
        nft(Some(&node.netns), &["flush", "ruleset"])?;
    }
    let mut f = Figures::default();
    let apiserver = opts.apiserver_pid.to_string();
    runtime.block_on(collect_garbage(client))?;
    // VmHWM starts again from the current RSS.
    std::fs::write(format!("/proc/{apiserver}/clear_refs"), "5")
        .map_err(|e| format!("resetting the API server's peak RSS: {e}"))?;
    f.apiserver_rss_before_mib = peak_rss_kib_of(&apiserver) as f64 / 1024.0;
    let api_cpu_0 = cpu_seconds(opts.apiserver_pid);
    let bytes_0 = received_by(&opts.nodes)?;

    let started = Instant::now();
    let proxies = Proxies(
        opts.nodes
            .iter()
            .map(|n| start(opts, c, n))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let mut synced = vec![false; opts.nodes.len()];
    while synced.iter().any(|s| !s) {
        if started.elapsed() > opts.start_limit {
            let left = synced.iter().filter(|s| !**s).count();
            return Err(format!(
                "{}: {left} of {} nodes not synced after {:.0} s",
                c.title(),
                opts.nodes.len(),
                opts.start_limit.as_secs_f64()
            ));
        }
        for (k, node) in opts.nodes.iter().enumerate() {
            if !synced[k] {
                synced[k] = scrape(node)
                    .and_then(|m| gauge(&m, LAST_SYNC))
                    .is_some_and(|t| t > 0.0);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f.all_synced = started.elapsed().as_secs_f64();
    // A first sync may be followed by another (kube-proxy's by the Node's
    // informer); the churn starts on a quiet cluster.
    std::thread::sleep(Duration::from_secs(5));
    let pids: Vec<u32> = proxies.0.iter().map(Child::id).collect();
    f.cpu_start = pids.iter().map(|&p| cpu_seconds(p)).collect();
    let api_cpu_1 = cpu_seconds(opts.apiserver_pid);
    let bytes_1 = received_by(&opts.nodes)?;
    let before: Vec<Histogram> = opts
        .nodes
        .iter()
        .map(|n| {
            scrape(n)
                .map(|m| Histogram::scraped(&m, LATENCY))
                .ok_or_else(|| format!("no metrics from {}", n.name))
        })
        .collect::<Result<_, _>>()?;
    f.apiserver_cpu_start = api_cpu_1 - api_cpu_0;
    f.bytes_start = bytes_1.iter().zip(&bytes_0).map(|(b, a)| b - a).collect();

    // The churn: one change every 1/rate seconds, each sent without waiting
    // for the one before, so that a slow answer does not slow the rate.
    let (made, failed) = runtime.block_on(async {
        let period = Duration::from_secs_f64(1.0 / opts.rate);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let end = tokio::time::Instant::now() + opts.churn;
        let mut sent = Vec::new();
        while tokio::time::Instant::now() < end {
            tick.tick().await;
            let (i, addrs) = churn.next();
            sent.push(tokio::spawn(change(client.clone(), i, addrs)));
        }
        let made = sent.len();
        let mut failed = 0;
        for s in sent {
            if !matches!(s.await, Ok(Ok(()))) {
                failed += 1;
            }
        }
        (made, failed)
    });
    f.changes_made = made;
    f.changes_failed = failed;
    let churn_ended = Instant::now();

    // Wait for every proxy to have programmed the churn: nothing pending,
    // and the latency counts still for 5 s.
    let mut last = (f64::NAN, Instant::now());
    let after = loop {
        let scrapes: Vec<Option<String>> = opts.nodes.iter().map(scrape).collect();
        let pending: f64 = scrapes
            .iter()
            .map(|m| m.as_deref().and_then(|m| gauge(m, PENDING)).unwrap_or(1.0))
            .sum();
        let count: f64 = scrapes
            .iter()
            .map(|m| {
                m.as_deref()
                    .map_or(0.0, |m| Histogram::scraped(m, LATENCY).count)
            })
            .sum();
        if count != last.0 {
            last = (count, Instant::now());
        }
        let still = last.1.elapsed() >= Duration::from_secs(5);
        let out_of_time = churn_ended.elapsed() > opts.drain_limit;
        if (pending == 0.0 && still) || out_of_time {
            if out_of_time {
                f.notes.push(format!(
                    "{pending} endpoint changes still pending {:.0} s after the churn",
                    opts.drain_limit.as_secs_f64()
                ));
            }
            break scrapes;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    for (k, m) in after.iter().enumerate() {
        let m = m
            .as_deref()
            .ok_or_else(|| format!("no metrics from {}", opts.nodes[k].name))?;
        f.latency
            .add(&Histogram::scraped(m, LATENCY).since(&before[k]));
    }
    f.cpu_churn = pids
        .iter()
        .zip(&f.cpu_start)
        .map(|(&p, c0)| cpu_seconds(p) - c0)
        .collect();
    f.peak_rss_mib = pids
        .iter()
        .map(|p| peak_rss_kib_of(&p.to_string()) as f64 / 1024.0)
        .collect();
    f.apiserver_cpu_churn = cpu_seconds(opts.apiserver_pid) - api_cpu_1;
    f.apiserver_peak_rss_mib = peak_rss_kib_of(&apiserver) as f64 / 1024.0;
    f.bytes_churn = received_by(&opts.nodes)?
        .iter()
        .zip(&bytes_1)
        .map(|(b, a)| b - a)
        .collect();
    drop(proxies);
    Ok(f)
}

fn seconds_bound(b: Option<f64>) -> String {
    match b {
        Some(b) if b.is_infinite() => "> 300 s".into(),
        Some(b) => format!("≤ {b} s"),
        None => "-".into(),
    }
}

fn med_max(v: &[f64], unit: &str, digits: usize) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let max = v.iter().copied().fold(f64::NAN, f64::max);
    format!(
        "{:.digits$} {unit} (max {max:.digits$})",
        median(v.to_vec())
    )
}

fn mib(bytes: &[u64]) -> Vec<f64> {
    bytes.iter().map(|&b| b as f64 / 1048576.0).collect()
}

pub fn table(opts: &NodesOptions, results: &[(Contender, Result<Figures, String>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### {} nodes, {} Services × {ENDPOINTS} endpoints, {} endpoint changes/s for {:.0} s{}\n",
        opts.nodes.len(),
        super::thousands(opts.services),
        opts.rate,
        opts.churn.as_secs_f64(),
        if opts.proxy_args.is_empty() {
            String::new()
        } else {
            format!(", every proxy with `{}`", opts.proxy_args.join(" "))
        }
    );
    let _ = write!(out, "| |");
    for (c, _) in results {
        let _ = write!(out, " {} |", c.title());
    }
    let _ = write!(out, "\n|---|");
    for _ in results {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    let row = |out: &mut String, what: &str, cell: &dyn Fn(&Figures) -> String| {
        let _ = write!(out, "| {what} |");
        for (_, f) in results {
            let text = match f {
                Ok(f) => cell(f),
                Err(_) => "failed".into(),
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    };
    row(&mut out, "start → all nodes synced", &|f| {
        format!("{:.1} s", f.all_synced)
    });
    row(&mut out, "changes made (failed)", &|f| {
        format!("{} ({})", f.changes_made, f.changes_failed)
    });
    row(&mut out, "latencies observed, all nodes", &|f| {
        format!("{:.0}", f.latency.count)
    });
    row(&mut out, "network programming latency p50", &|f| {
        seconds_bound(f.latency.quantile_bound(0.5))
    });
    row(&mut out, "p99", &|f| {
        seconds_bound(f.latency.quantile_bound(0.99))
    });
    row(&mut out, "max", &|f| {
        seconds_bound(f.latency.quantile_bound(1.0))
    });
    row(&mut out, "mean", &|f| {
        if f.latency.count > 0.0 {
            format!("{:.3} s", f.latency.sum / f.latency.count)
        } else {
            "-".into()
        }
    });
    row(&mut out, "API server CPU, start / churn", &|f| {
        format!(
            "{:.1} s / {:.1} s",
            f.apiserver_cpu_start, f.apiserver_cpu_churn
        )
    });
    row(&mut out, "API server RSS, at the start → peak", &|f| {
        format!(
            "{:.0} → {:.0} MiB",
            f.apiserver_rss_before_mib, f.apiserver_peak_rss_mib
        )
    });
    row(&mut out, "received per node, start", &|f| {
        med_max(&mib(&f.bytes_start), "MiB", 1)
    });
    row(&mut out, "received per node, churn", &|f| {
        med_max(&mib(&f.bytes_churn), "MiB", 2)
    });
    row(&mut out, "proxy CPU per node, start", &|f| {
        med_max(&f.cpu_start, "s", 2)
    });
    row(&mut out, "proxy CPU per node, churn", &|f| {
        med_max(&f.cpu_churn, "s", 2)
    });
    row(&mut out, "all nodes' proxies, churn", &|f| {
        let total: f64 = f.cpu_churn.iter().sum();
        format!("{:.2} cores", total / opts.churn.as_secs_f64())
    });
    row(&mut out, "proxy peak RSS per node", &|f| {
        med_max(&f.peak_rss_mib, "MiB", 0)
    });
    for (c, f) in results {
        match f {
            Ok(f) => {
                for n in &f.notes {
                    let _ = writeln!(out, "\n{}: {n}", c.title());
                }
            }
            Err(e) => {
                let _ = writeln!(out, "\n{}: {e}", c.title());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "\
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\",ip_family=\"IPv4\"} 90
kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\",ip_family=\"IPv4\"} 99
kubeproxy_network_programming_duration_seconds_bucket{le=\"1.0\",ip_family=\"IPv4\"} 100
kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\",ip_family=\"IPv4\"} 100
kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\",ip_family=\"IPv6\"} 0
kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\",ip_family=\"IPv6\"} 0
kubeproxy_network_programming_duration_seconds_bucket{le=\"1.0\",ip_family=\"IPv6\"} 0
kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\",ip_family=\"IPv6\"} 0
kubeproxy_network_programming_duration_seconds_sum{ip_family=\"IPv4\"} 12.5
kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 100
kubeproxy_network_programming_duration_seconds_sum{ip_family=\"IPv6\"} 0
kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv6\"} 0
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e9
";

    #[test]
    fn a_histogram_is_summed_over_its_labels_and_bounds_its_quantiles() {
        let h = Histogram::scraped(SCRAPE, LATENCY);
        assert_eq!(h.count, 100.0);
        assert_eq!(h.sum, 12.5);
        assert_eq!(h.quantile_bound(0.5), Some(0.25));
        assert_eq!(h.quantile_bound(0.99), Some(0.5));
        assert_eq!(h.quantile_bound(1.0), Some(1.0));
        let mut two = h.clone();
        two.add(&h);
        assert_eq!(two.count, 200.0);
        assert_eq!(two.since(&h), h);
        assert_eq!(Histogram::default().quantile_bound(0.5), None);
    }

    #[test]
    fn a_gauge_is_read_from_a_scrape() {
        assert_eq!(gauge(SCRAPE, LAST_SYNC), Some(1.7e9));
        assert_eq!(gauge(SCRAPE, PENDING), None);
    }

    #[test]
    fn the_churn_moves_an_endpoint_away_and_back() {
        let mut churn = Churn::new(3);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..30 {
            let (i, addrs) = churn.next();
            assert_eq!(addrs.len(), ENDPOINTS);
            assert_eq!(addrs[..ENDPOINTS - 1], {
                let own: Vec<IpAddr> = (0..ENDPOINTS - 1)
                    .map(|k| endpoint_addr(i * ENDPOINTS + k))
                    .collect();
                own
            });
            let moved = addrs[ENDPOINTS - 1] != endpoint_addr(i * ENDPOINTS + ENDPOINTS - 1);
            // Each change of a Service undoes the one before.
            let before = seen.insert(i, moved).unwrap_or(false);
            assert_ne!(before, moved);
        }
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn a_node_is_netns_name_and_address() {
        let n: Node = "kbn-node-3:node-3:10.100.0.13".parse().unwrap();
        assert_eq!(
            (n.netns.as_str(), n.name.as_str(), n.ip),
            ("kbn-node-3", "node-3", Ipv4Addr::new(10, 100, 0, 13))
        );
        assert!("kbn-node-3:node-3".parse::<Node>().is_err());
        assert!("a:b:c".parse::<Node>().is_err());
    }
}
