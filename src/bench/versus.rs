//! `kube-nft bench-kube-proxy`: kube-nft and real kube-proxy (nftables and
//! iptables modes), each in turn on the same node namespace against the same
//! kube-apiserver, at several cluster sizes (issue #17).
//!
//! Runs inside the node's network namespace (`integration/k8s/bench.sh` sets it
//! up: a real control plane, the node joined to it, its Node registered). The
//! cluster is `api_cluster`'s, N Services × 10 endpoints. The last Service's one
//! endpoint is a listener on the node, so that traffic through its VIP proves
//! the rules are in.
//!
//! Per proxy and size:
//! - start → first traffic: the process starts, then new connections to the
//!   probe VIP every 10 ms until one is answered;
//! - endpoint removed → kernel, Service deleted → kernel: from just before the API
//!   request, sent over a live connection, to the first nf_tables transaction
//!   after which the address is unreachable (all three write through nf_tables:
//!   iptables here is iptables-nft);
//! - restart → healthy: SIGTERM, a new process, then `/healthz` on :10256 polled
//!   every 10 ms until it says 200;
//! - peak RSS of the process (VmHWM), before its restarts.
//!
//! Where the kernel has IPVS (`benches/ipvs_versus.sh`, in a guest), kube-nft's
//! IPVS backend and kube-proxy's IPVS mode run the same way, with two
//! differences: a change reaches the kernel when IPVS no longer sends new
//! connections to what went (read every 2 ms, IPVS having no transactions),
//! and the changes wait for the end of the first sync, which is also a figure.

use super::api_cluster::{
    addresses, client, create_namespaces, populate, proxy_flags, service_api, service_name,
    set_endpoints, slice_api, slice_name, store_services, vip, ENDPOINTS, PROBE_PORT,
};
pub use super::etcd_load::Etcd;
use super::reach::reaches;
use super::versus_dataplane;
use super::{flush_conntrack, median, nft};
use crate::core::net::Protocol;
use crate::netlink::ipvs::{IpvsSocket, VirtualKey};
use crate::netlink::monitor::Monitor;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Endpoint changes and Service deletions are spaced by more than kube-proxy's
/// default minimum sync period (1 s), so that none waits on the one before.
const SPACING: Duration = Duration::from_millis(1500);
/// How long a change may take to reach the kernel before it is reported as not
/// having reached it.
const CHANGE_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    KubeNft,
    KubeProxyNftables,
    KubeProxyIptables,
    /// kube-nft's IPVS backend, and kube-proxy's IPVS mode: only where the
    /// kernel has IPVS (`benches/ipvs_versus.sh` runs them in a guest).
    KubeNftIpvs,
    KubeProxyIpvs,
}

impl Contender {
    pub const ALL: [Contender; 5] = [
        Contender::KubeNft,
        Contender::KubeProxyNftables,
        Contender::KubeProxyIptables,
        Contender::KubeNftIpvs,
        Contender::KubeProxyIpvs,
    ];

    pub fn named(name: &str) -> Option<Contender> {
        Contender::ALL.into_iter().find(|c| c.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Contender::KubeNft => "kube-nft",
            Contender::KubeProxyNftables => "nftables",
            Contender::KubeProxyIptables => "iptables",
            Contender::KubeNftIpvs => "kube-nft-ipvs",
            Contender::KubeProxyIpvs => "ipvs",
        }
    }

    pub(crate) fn is_kube_nft(self) -> bool {
        matches!(self, Contender::KubeNft | Contender::KubeNftIpvs)
    }

    /// Whether it programs IPVS, where a change is read from IPVS rather than
    /// from nf_tables.
    pub(crate) fn ipvs(self) -> bool {
        matches!(self, Contender::KubeNftIpvs | Contender::KubeProxyIpvs)
    }

    /// The `--proxy-mode` it runs with; kube-nft's default is nftables.
    fn proxy_mode(self) -> Option<&'static str> {
        match self {
            Contender::KubeNft => None,
            Contender::KubeProxyNftables => Some("nftables"),
            Contender::KubeProxyIptables => Some("iptables"),
            Contender::KubeNftIpvs | Contender::KubeProxyIpvs => Some("ipvs"),
        }
    }

    /// Whether `nft` can read what it writes (iptables-nft's and IPVS's cannot
    /// be loaded again with `nft -f`, nor measured as an nftables data plane).
    fn nft_ruleset(self) -> bool {
        matches!(self, Contender::KubeNft | Contender::KubeProxyNftables)
    }

    pub(crate) fn title(self) -> &'static str {
        match self {
            Contender::KubeNft => "kube-nft",
            Contender::KubeProxyNftables => "kube-proxy nftables",
            Contender::KubeProxyIptables => "kube-proxy iptables",
            Contender::KubeNftIpvs => "kube-nft IPVS",
            Contender::KubeProxyIpvs => "kube-proxy IPVS",
        }
    }
}

pub struct VersusOptions {
    pub kubeconfig: PathBuf,
    pub kube_proxy: PathBuf,
    pub node_name: String,
    pub node_ip: Ipv4Addr,
    pub sizes: Vec<usize>,
    pub runs: usize,
    pub contenders: Vec<Contender>,
    /// How long a contender may take from its start to the probe's first answer.
    pub start_limit: Duration,
    /// Each process's log goes here.
    pub logs: PathBuf,
    /// Where the plot of start → first traffic per 1k Services goes, if anywhere.
    pub plot: Option<PathBuf>,
    /// Write the Services into this etcd, not through the API server.
    pub etcd: Option<Etcd>,
    /// The largest size at which each ruleset is loaded again with `nft -f`.
    pub nft_f_max: usize,
    /// Measure each nftables ruleset's data plane (`versus_dataplane`).
    pub dataplane: Option<DataplaneRuns>,
}

/// The data plane's rounds, and how long each measurement sends.
#[derive(Debug, Clone, Copy)]
pub struct DataplaneRuns {
    pub rounds: usize,
    pub seconds: f64,
}

/// The medians of one contender at one size.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub start_to_traffic: f64,
    /// For IPVS, which has no transactions, the start to the end of the first
    /// sync: traffic flows through the first virtual services long before the
    /// last is written.
    pub start_to_synced: Option<f64>,
    pub endpoint_to_kernel: f64,
    pub delete_to_kernel: f64,
    pub restart_to_healthy: f64,
    pub peak_rss_mib: f64,
    /// The same ruleset, as `nft list ruleset` printed it once the contender had
    /// synced, loaded by `nft -f` into an empty namespace (a process, from start
    /// to exit); `None` for iptables-nft's, which nft cannot load.
    pub nft_f: Option<f64>,
    /// What could not be measured after the first sync, and why (its rows
    /// say "—").
    pub notes: Vec<String>,
}

/// Each contender's figures at one size, or why it has none.
type Results = Vec<(Contender, Result<Figures, String>)>;

/// Prints a table per size as soon as it is measured.
pub fn versus(opts: &VersusOptions) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let client = runtime.block_on(client(&opts.kubeconfig))?;
    let listener = TcpListener::bind((opts.node_ip, PROBE_PORT))
        .map_err(|e| format!("the probe's listener on {}: {e}", opts.node_ip))?;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    std::fs::create_dir_all(&opts.logs).map_err(|e| e.to_string())?;
    let stage = opts
        .dataplane
        .map(|_| versus_dataplane::Stage::build("kbdp"))
        .transpose()?;
    let mut made = 0;
    let mut all = Vec::new();
    for &size in &opts.sizes {
        let t = Instant::now();
        runtime.block_on(create_namespaces(&client, made, size))?;
        // The probe is the last Service; an earlier size's becomes an ordinary one.
        if let Some(etcd) = &opts.etcd {
            store_services(&runtime, &client, etcd, made, size)?;
        }
        let services_exist = opts.etcd.is_some();
        runtime.block_on(async {
            populate(
                &client,
                made,
                size,
                Some(size - 1),
                opts.node_ip,
                services_exist,
            )
            .await?;
            if made > 0 && made < size {
                set_endpoints(&client, made - 1, &addresses(made - 1, false, opts.node_ip)).await?;
            }
            if stage.is_some() {
                // The pods serve the probe, through its ClusterIP and a NodePort,
                // which the earlier size's probe gives up.
                if made > 0 && made < size {
                    node_port(&client, made - 1, false).await?;
                }
                set_endpoints(&client, size - 1, &versus_dataplane::pod_addresses()).await?;
                node_port(&client, size - 1, true).await?;
            }
            Ok::<(), String>(())
        })?;
        made = made.max(size);
        eprintln!(
            "bench-kube-proxy: {size} Services × {ENDPOINTS} endpoints in the API server ({:.0} s)",
            t.elapsed().as_secs_f64()
        );
        let mut results = Vec::new();
        let mut rulesets = Vec::new();
        for (k, &c) in opts.contenders.iter().enumerate() {
            // Each contender changes and deletes Services of its own.
            let first = k * 2 * opts.runs;
            // A contender that fails (kube-proxy's iptables mode does not sync
            // 10k Services over iptables-nft in minutes) is reported, not fatal.
            let f = measure(opts, &runtime, &client, c, size, first).map(|(f, ruleset)| {
                rulesets.extend(ruleset.map(|r| (c, r)));
                f
            });
            eprintln!("bench-kube-proxy: {size}: {}: {f:?}", c.title());
            results.push((c, f));
        }
        print!("{}", table(size, opts.runs, &results));
        if let (Some(stage), Some(runs)) = (&stage, opts.dataplane) {
            let rounds = data_plane(stage, opts, &rulesets, size, runs)?;
            print!("{}", versus_dataplane::table(size, &rounds));
        }
        all.push((size, results));
    }
    if let Some(path) = &opts.plot {
        std::fs::write(path, plot(&all)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The cost of a first sync per 1k Services against the cluster size, log-log:
/// each contender's start → first traffic, and `nft -f` of kube-nft's ruleset.
/// A linear cost is a flat line.
fn plot(all: &[(usize, Results)]) -> String {
    use super::plot::{chart, Axes, Series};
    let per_1k = |get: &dyn Fn(&Figures) -> Option<f64>, c: Contender| -> Vec<(f64, f64)> {
        all.iter()
            .filter_map(|(size, results)| {
                let f = results.iter().find(|(k, _)| *k == c)?.1.as_ref().ok()?;
                let k = *size as f64 / 1000.0;
                Some((k, get(f)? * 1000.0 / k))
            })
            .collect()
    };
    let colors = ["#1f77b4", "#d62728", "#9467bd", "#2ca02c", "#8c564b"];
    let mut series: Vec<Series> = Contender::ALL
        .into_iter()
        .zip(colors)
        .map(|(c, color)| Series {
            name: format!("{}: start → first traffic", c.title()),
            color,
            points: per_1k(&|f| Some(f.start_to_traffic), c),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    series.push(Series {
        name: "nft -f of kube-nft's ruleset".into(),
        color: "#ff7f0e",
        points: per_1k(&|f| f.nft_f, Contender::KubeNft),
    });
    chart(
        "First sync of N Services × 10 endpoints, per 1k Services",
        "Services (thousands)",
        "ms per 1k Services",
        &series,
        Axes::LogLog,
    )
}

fn start(opts: &VersusOptions, c: Contender, log: &str) -> Result<Child, String> {
    let flags = proxy_flags(&opts.kubeconfig, &opts.node_name);
    let mut cmd = proxy_command(c, &opts.kube_proxy, None, &flags)?;
    let file = std::fs::File::create(opts.logs.join(log)).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", c.title()))
}

/// The command that runs contender `c` with `flags` (kube-proxy in its mode),
/// in network namespace `netns` if one is given, else in this process's.
pub(crate) fn proxy_command(
    c: Contender,
    kube_proxy: &std::path::Path,
    netns: Option<&str>,
    flags: &[String],
) -> Result<Command, String> {
    let program = if c.is_kube_nft() {
        std::env::current_exe().map_err(|e| e.to_string())?
    } else {
        kube_proxy.to_path_buf()
    };
    let mut cmd = match netns {
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns]).arg(program);
            cmd
        }
        None => Command::new(program),
    };
    if c.is_kube_nft() {
        cmd.arg("run");
    }
    cmd.args(flags);
    if let Some(mode) = c.proxy_mode() {
        cmd.args(["--proxy-mode", mode]);
    }
    Ok(cmd)
}

/// A contender's process, stopped when dropped (also when a measurement fails).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        super::stop_all(std::slice::from_mut(&mut self.0));
    }
}

/// Removes every table (kube-proxy's, iptables-nft's, ours) and every flow, so
/// that each contender starts on a bare node; where the kernel has IPVS, also
/// every virtual service, `kube-ipvs0` and kube-proxy's ipsets (which its
/// iptables rules held, so they go after the tables).
fn bare_node() -> Result<(), String> {
    nft(None, &["flush", "ruleset"])?;
    if IpvsSocket::open().map_err(|e| e.to_string())?.is_some() {
        let tool = |program: &str, args: &[&str]| {
            super::output_of(Command::new(program).args(args)).map(|_| ())
        };
        tool("ipvsadm", &["-C"])?;
        // Absent after a contender that never made it.
        let _ = tool("ip", &["link", "del", "kube-ipvs0"]);
        tool("ipset", &["destroy"])?;
    }
    flush_conntrack()
}

fn peak_rss_mib(child: &Child) -> f64 {
    crate::node::metrics::peak_rss_kib_of(&child.id().to_string()) as f64 / 1024.0
}

fn measure(
    opts: &VersusOptions,
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    c: Contender,
    size: usize,
    first: usize,
) -> Result<(Figures, Option<Vec<u8>>), String> {
    bare_node()?;
    let probe = SocketAddr::new(vip(size - 1), 80);
    let healthz = SocketAddr::new(IpAddr::V4(opts.node_ip), 10256);
    let tag = format!("{}-{size}", c.name());
    let started = Instant::now();
    let mut child = Running(start(opts, c, &format!("{tag}.log"))?);
    let start_to_traffic = first_traffic(probe, started, opts.start_limit)
        .map_err(|e| format!("{}: {e}", c.title()))?;
    wait_healthy(healthz, Instant::now(), Duration::from_secs(120))?;
    // A change made before the end of the first sync would wait behind it.
    let start_to_synced = c
        .ipvs()
        .then(|| first_sync_done(started, opts.start_limit))
        .transpose()
        .map_err(|e| format!("{}: {e}", c.title()))?;
    // Its first sync may be followed by another; let it settle.
    std::thread::sleep(Duration::from_secs(3));
    let nft_f = match c {
        _ if !c.nft_ruleset() => None,
        _ if size > opts.nft_f_max => None,
        _ => Some(nft_f_of_this_ruleset(
            &opts.logs.join(format!("{tag}.nft")),
        )?),
    };
    // The ruleset as it stands once synced, for the data plane's rounds.
    let ruleset = match c {
        _ if !c.nft_ruleset() => None,
        _ if opts.dataplane.is_none() => None,
        _ => Some(nft(None, &["list", "ruleset"])?),
    };

    let mut endpoint = Vec::new();
    let mut delete = Vec::new();
    let mut notes = Vec::new();
    // The Services it changes and deletes must leave the probe (the last) alone.
    let changes = if first + 2 * opts.runs < size {
        opts.runs
    } else {
        notes.push(format!(
            "{size} Services leave none to change beside the probe"
        ));
        0
    };
    for r in 0..changes {
        let i = first + r;
        // The last endpoint goes: the first, 10.128.0.0, is also written as the
        // cluster CIDR's network address, which never leaves the ruleset.
        let all = addresses(i, false, opts.node_ip);
        let (kept, gone) = all.split_at(all.len() - 1);
        let removed = to_kernel(
            c,
            Gone::Endpoint(vip(i), gone[0]),
            || read(runtime, slice_api(client, i), &slice_name(i)),
            || runtime.block_on(set_endpoints(client, i, kept)),
        );
        std::thread::sleep(SPACING);
        let j = first + opts.runs + r;
        let deleted = to_kernel(
            c,
            Gone::Service(vip(j)),
            || read(runtime, service_api(client, j), &service_name(j)),
            || {
                runtime
                    .block_on(
                        service_api(client, j).delete(&service_name(j), &DeleteParams::default()),
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        );
        std::thread::sleep(SPACING);
        // A contender too slow to program a change in time (kube-proxy at 100k)
        // keeps the figures it has; the next runs would only wait as long.
        match (removed, deleted) {
            (Ok(e), Ok(d)) => {
                endpoint.push(e);
                delete.push(d);
            }
            (e, d) => {
                notes.extend(e.err().map(|e| format!("endpoint removed: {e}")));
                notes.extend(d.err().map(|e| format!("Service deleted: {e}")));
                break;
            }
        }
    }
    let median_of = |v: Vec<f64>| if v.is_empty() { f64::NAN } else { median(v) };
    let peak_rss_mib = peak_rss_mib(&child.0);

    let mut restart = Vec::new();
    for r in 0..opts.runs {
        drop(child);
        let t = Instant::now();
        child = Running(start(opts, c, &format!("{tag}-restart-{r}.log"))?);
        // Not healthy in time is a figure too (kube-proxy's healthz waits for a
        // sync that takes minutes at 100k), not the end of the contender's.
        match wait_healthy(healthz, t, Duration::from_secs(120)) {
            Ok(s) => restart.push(s),
            Err(e) => {
                notes.push(format!("restart → healthy: {e}"));
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    drop(child);

    // Put back what this contender changed, for the next one.
    runtime.block_on(async {
        for r in 0..changes {
            let i = first + r;
            set_endpoints(client, i, &addresses(i, false, opts.node_ip)).await?;
        }
        Ok::<(), String>(())
    })?;
    runtime.block_on(populate(
        client,
        first + changes,
        first + 2 * changes,
        None,
        opts.node_ip,
        false,
    ))?;
    let figures = Figures {
        start_to_traffic,
        start_to_synced,
        endpoint_to_kernel: median_of(endpoint),
        delete_to_kernel: median_of(delete),
        restart_to_healthy: median_of(restart),
        peak_rss_mib,
        nft_f,
        notes,
    };
    Ok((figures, ruleset))
}

/// Makes Service `i` a NodePort Service (`versus_dataplane::NODE_PORT`), or
/// with `on` false a ClusterIP Service again.
async fn node_port(client: &Client, i: usize, on: bool) -> Result<(), String> {
    let mut port = json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": PROBE_PORT});
    if on {
        port["nodePort"] = json!(versus_dataplane::NODE_PORT);
    }
    let kind = if on { "NodePort" } else { "ClusterIP" };
    // A merge patch replaces the list of ports whole: without `nodePort`, none.
    let patch = json!({"spec": {"type": kind, "ports": [port]}});
    service_api(client, i)
        .patch(
            &service_name(i),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("making {} a NodePort Service: {e}", service_name(i)))
}

/// How long a ruleset just loaded waits before it is measured.
const SETTLE: Duration = Duration::from_secs(3);

/// The data plane's rounds at one size: in each, every kept ruleset on the
/// bare node (`nft -f` of its listing), then measured.
fn data_plane(
    stage: &versus_dataplane::Stage,
    opts: &VersusOptions,
    rulesets: &[(Contender, Vec<u8>)],
    size: usize,
    runs: DataplaneRuns,
) -> Result<Vec<Vec<(&'static str, versus_dataplane::Traffic)>>, String> {
    let mut rounds = Vec::new();
    for round in 0..runs.rounds {
        let mut measured = Vec::new();
        // Each contender goes first in turn, and each waits for the kernel to
        // free the ruleset before it (in work of its own, after the commit),
        // so that no contender is always the one measured beside that work.
        let mut order: Vec<&(Contender, Vec<u8>)> = rulesets.iter().collect();
        order.rotate_left(round % rulesets.len().max(1));
        for (c, ruleset) in order {
            bare_node()?;
            let file = opts.logs.join(format!("{}-{size}-dataplane.nft", c.name()));
            std::fs::write(&file, ruleset).map_err(|e| e.to_string())?;
            nft(None, &["-f", file.to_str().unwrap_or_default()])?;
            std::thread::sleep(SETTLE);
            let t = stage.measure(vip(size - 1), opts.node_ip, runs.seconds)?;
            eprintln!(
                "bench-kube-proxy: {size}: data plane, round {}: {}: {t:?}",
                round + 1,
                c.title()
            );
            measured.push((c.title(), t));
        }
        rounds.push(measured);
    }
    bare_node()?;
    Ok(rounds)
}

/// Lists the node's ruleset into `file`, then times `nft -f` of it into an
/// empty namespace, as a process: what the same ruleset costs through nft.
fn nft_f_of_this_ruleset(file: &std::path::Path) -> Result<f64, String> {
    std::fs::write(file, nft(None, &["list", "ruleset"])?).map_err(|e| e.to_string())?;
    let seconds = super::time_nft_file("kb-nft-f", file).map(|ms| ms / 1000.0);
    let _ = std::fs::remove_file(file);
    seconds
}

/// Seconds from `since` until a new connection to `target` is answered: one
/// attempt starts every 10 ms, each waiting at most 300 ms (before the rules are
/// in, the SYN leaves the node and is dropped upstream).
fn first_traffic(target: SocketAddr, since: Instant, limit: Duration) -> Result<f64, String> {
    let (tx, rx) = mpsc::channel::<Instant>();
    while since.elapsed() < limit {
        if let Ok(t) = rx.try_recv() {
            return Ok((t - since).as_secs_f64());
        }
        let tx = tx.clone();
        std::thread::spawn(move || {
            if TcpStream::connect_timeout(&target, Duration::from_millis(300)).is_ok() {
                let _ = tx.send(Instant::now());
            }
        });
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("no answer from {target} in {limit:?}"))
}

/// Seconds from `since` until `/healthz` answers 200, polled every 10 ms.
fn wait_healthy(healthz: SocketAddr, since: Instant, limit: Duration) -> Result<f64, String> {
    while since.elapsed() < limit {
        if status(healthz, "/healthz") == Some(200) {
            return Ok(since.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("{healthz} not healthy in {limit:?}"))
}

/// Seconds from `since` until the contender says that its first IPv4 sync has
/// ended: `kubeproxy_sync_proxy_rules_last_timestamp_seconds` on the metrics
/// address, which kube-proxy and kube-nft both serve, set at the end of each
/// sync of a family.
fn first_sync_done(since: Instant, limit: Duration) -> Result<f64, String> {
    let metrics: SocketAddr = crate::config::DEFAULT_METRICS_BIND_ADDRESS
        .parse()
        .expect("the default metrics address parses");
    while since.elapsed() < limit {
        let scraped =
            crate::lab::hostname_server::http_get_path(metrics, "/metrics", Duration::from_secs(5))
                .unwrap_or_default();
        let synced = super::samples(&scraped).any(|(metric, labels, value)| {
            metric == "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
                && (labels.is_empty() || labels.contains("ip_family=\"IPv4\""))
                && value.parse::<f64>().is_ok_and(|v| v > 0.0)
        });
        if synced {
            return Ok(since.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("its first sync had not ended after {limit:?}"))
}

/// The HTTP status of a GET (kube-proxy answers HTTP/1.0 with HTTP/1.0).
fn status(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let timeout = Duration::from_millis(500);
    let mut conn = TcpStream::connect_timeout(&addr, timeout).ok()?;
    conn.set_read_timeout(Some(timeout)).ok()?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0u8; 12];
    conn.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Seconds from just before `change` (an API request) to the commit of the
/// nf_tables transaction after which no packet can reach `removed` (the
/// endpoint's or the ClusterIP's address): after each commit of any process the
/// ruleset is listed and read (`reach::reaches`), the same way for both proxies.
/// A transaction that the proxy commits for another reason does not stop the clock.
///
/// `warm` goes first, off the clock: a read that leaves the bench's client a
/// live connection. At 100k the listings around each change take minutes, and
/// the first request after such a pause took 43 to 63 ms (the next, 5 to 9 ms):
/// the bench's own reconnection, which a controller's open connection does not
/// pay and which no proxy could shorten.
fn to_kernel(
    c: Contender,
    gone: Gone,
    warm: impl FnOnce() -> Result<(), String>,
    change: impl FnOnce() -> Result<(), String>,
) -> Result<f64, String> {
    if c.ipvs() {
        return to_ipvs(gone, warm, change);
    }
    let removed = gone.address();
    if !reaches(&listing()?, removed) {
        return Err(format!(
            "{removed} is not in the ruleset before its removal"
        ));
    }
    let t = Instant::now();
    warm()?;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "connection warmed");
    let mut monitor = Monitor::open().map_err(|e| format!("nf_tables monitor: {e}"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let gone = monitor
            .next_commit_after_which(|| listing().is_ok_and(|listed| !reaches(&listed, removed)));
        let _ = tx.send(gone);
    });
    // At debug, the clock's start for setting beside the proxy's own log.
    tracing::debug!(%removed, "change sent");
    let t0 = Instant::now();
    change()?;
    tracing::debug!(ms = t0.elapsed().as_secs_f64() * 1e3, "change answered");
    let gone = rx
        .recv_timeout(CHANGE_LIMIT)
        .map_err(|_| format!("{removed} was still reachable {CHANGE_LIMIT:?} after its removal"))?;
    match gone {
        Ok(Some(t1)) => Ok((t1 - t0).as_secs_f64()),
        Ok(None) => Err("the nf_tables monitor lost notifications".into()),
        Err(e) => Err(format!("the nf_tables monitor failed: {e}")),
    }
}

/// What a change takes away: an endpoint of the Service at a ClusterIP, or
/// the Service itself.
#[derive(Debug, Clone, Copy)]
enum Gone {
    Endpoint(IpAddr, IpAddr),
    Service(IpAddr),
}

impl Gone {
    /// The address that the ruleset no longer reaches once it is gone.
    fn address(self) -> IpAddr {
        match self {
            Gone::Endpoint(_, endpoint) => endpoint,
            Gone::Service(vip) => vip,
        }
    }

    fn key(self) -> VirtualKey {
        let (Gone::Endpoint(vip, _) | Gone::Service(vip)) = self;
        VirtualKey {
            addr: vip,
            protocol: Protocol::Tcp,
            port: 80,
        }
    }

    /// Whether IPVS still sends new connections to it: a real server at
    /// weight 0 takes none (kube-proxy's IPVS mode and kube-nft's keep one
    /// there while its connections last).
    fn in_ipvs(self, sock: &mut IpvsSocket) -> Result<bool, String> {
        let key = self.key();
        let ipvs = |e: crate::netlink::ipvs::IpvsError| format!("IPVS: {e}");
        match self {
            Gone::Endpoint(_, e) => Ok(sock
                .reals(&key)
                .map_err(ipvs)?
                .iter()
                .any(|r| r.addr == e && r.weight > 0)),
            Gone::Service(_) => Ok(sock.service(&key).map_err(ipvs)?.is_some()),
        }
    }
}

/// `to_kernel` for IPVS, which has no transactions to watch: its state is
/// read every 2 ms (one virtual service's real servers), and the time is that
/// of the first read without what went. Both IPVS contenders are timed so.
fn to_ipvs(
    gone: Gone,
    warm: impl FnOnce() -> Result<(), String>,
    change: impl FnOnce() -> Result<(), String>,
) -> Result<f64, String> {
    let mut sock = IpvsSocket::open()
        .map_err(|e| format!("IPVS: {e}"))?
        .ok_or("this kernel has no IPVS")?;
    if !gone.in_ipvs(&mut sock)? {
        return Err(format!("{gone:?} is not in IPVS before its removal"));
    }
    warm()?;
    let t0 = Instant::now();
    change()?;
    while gone.in_ipvs(&mut sock)? {
        if t0.elapsed() > CHANGE_LIMIT {
            return Err(format!(
                "{gone:?} was still in IPVS {CHANGE_LIMIT:?} after its removal"
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Reads one object, to no end but the connection it leaves open.
fn read<K>(runtime: &tokio::runtime::Runtime, api: Api<K>, name: &str) -> Result<(), String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    runtime
        .block_on(api.get(name))
        .map(|_| ())
        .map_err(|e| format!("reading {name}: {e}"))
}

/// `nft list ruleset` of this network namespace.
fn listing() -> Result<String, String> {
    String::from_utf8(nft(None, &["list", "ruleset"])?)
        .map_err(|e| format!("nft list ruleset: {e}"))
}

/// Milliseconds under a second, seconds above.
fn seconds(v: f64) -> String {
    match v {
        v if v < 0.01 => format!("{:.1} ms", v * 1000.0),
        v if v < 1.0 => format!("{:.0} ms", v * 1000.0),
        v => format!("{v:.2} s"),
    }
}

pub fn table(size: usize, runs: usize, results: &[(Contender, Result<Figures, String>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{size} Services × {ENDPOINTS} endpoints, real kube-apiserver (medians of {runs}; start and RSS: one run)\n"
    );
    // The ratios are to the first kube-nft of the run (its IPVS backend in an
    // IPVS comparison).
    let ours = results
        .iter()
        .find(|(c, _)| c.is_kube_nft())
        .and_then(|(_, f)| f.as_ref().ok());
    let others: Vec<&(Contender, Result<Figures, String>)> =
        results.iter().filter(|(c, _)| !c.is_kube_nft()).collect();
    let _ = write!(out, "| measure |");
    for (c, _) in results {
        let _ = write!(out, " {} |", c.title());
    }
    if ours.is_some() {
        for (c, _) in &others {
            let _ = write!(out, " {} ÷ kube-nft |", c.name());
        }
    }
    out.push('\n');
    let columns = results.len() + if ours.is_some() { others.len() } else { 0 };
    let _ = writeln!(out, "|---|{}", "---|".repeat(columns));
    type Row = (&'static str, fn(&Figures) -> f64, &'static str);
    let rows: [Row; 7] = [
        ("start → first traffic", |f| f.start_to_traffic, "s"),
        (
            "start → first sync ended (IPVS)",
            |f| f.start_to_synced.unwrap_or(f64::NAN),
            "s",
        ),
        (
            "`nft -f` of the ruleset it wrote (a process)",
            |f| f.nft_f.unwrap_or(f64::NAN),
            "s",
        ),
        ("endpoint removed → kernel", |f| f.endpoint_to_kernel, "s"),
        ("Service deleted → kernel", |f| f.delete_to_kernel, "s"),
        ("restart → healthy", |f| f.restart_to_healthy, "s"),
        ("peak RSS", |f| f.peak_rss_mib, "MiB"),
    ];
    for (name, get, unit) in rows {
        let measured =
            |r: &(Contender, Result<Figures, String>)| r.1.as_ref().is_ok_and(|f| !get(f).is_nan());
        // A row no contender has (the first sync's end, without IPVS) is left out.
        if !results.iter().any(measured) {
            continue;
        }
        let _ = write!(out, "| {name} |");
        for (_, f) in results {
            match f {
                Ok(f) if get(f).is_nan() => out.push_str(" — |"),
                Ok(f) if unit == "s" => {
                    let _ = write!(out, " {} |", seconds(get(f)));
                }
                Ok(f) => {
                    let _ = write!(out, " {:.0} {unit} |", get(f));
                }
                Err(_) => out.push_str(" — |"),
            }
        }
        if let Some(ours) = ours {
            for (_, f) in &others {
                match f {
                    Ok(f) if !(get(f) / get(ours)).is_nan() => {
                        let r = get(f) / get(ours);
                        let _ = if r < 10.0 {
                            write!(out, " {r:.1}× |")
                        } else {
                            write!(out, " {r:.0}× |")
                        };
                    }
                    _ => out.push_str(" — |"),
                }
            }
        }
        out.push('\n');
    }
    for (c, f) in results {
        match f {
            Err(e) => {
                let _ = writeln!(out, "\n{e}");
            }
            Ok(f) => {
                for note in &f.notes {
                    let _ = writeln!(out, "\n{}: {note}", c.title());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_ratios_and_reports_a_contender_that_failed() {
        let ours = Figures {
            start_to_traffic: 1.5,
            start_to_synced: None,
            endpoint_to_kernel: 0.0066,
            delete_to_kernel: 0.25,
            restart_to_healthy: 1.0,
            peak_rss_mib: 100.0,
            nft_f: Some(0.5),
            notes: Vec::new(),
        };
        let theirs = Figures {
            start_to_traffic: 15.0,
            start_to_synced: None,
            endpoint_to_kernel: 4.4,
            delete_to_kernel: 0.5,
            restart_to_healthy: 0.5,
            peak_rss_mib: 500.0,
            nft_f: None,
            notes: vec!["Service deleted: still reachable".into()],
        };
        let t = table(
            10_000,
            5,
            &[
                (Contender::KubeNft, Ok(ours)),
                (Contender::KubeProxyNftables, Ok(theirs)),
                (
                    Contender::KubeProxyIptables,
                    Err("no answer in 600s".into()),
                ),
            ],
        );
        assert!(
            t.contains("| start → first traffic | 1.50 s | 15.00 s | — | 10× | — |"),
            "{t}"
        );
        assert!(
            t.contains("| endpoint removed → kernel | 6.6 ms | 4.40 s | — | 667× | — |"),
            "{t}"
        );
        assert!(
            t.contains("| Service deleted → kernel | 250 ms | 500 ms | — | 2.0× | — |"),
            "{t}"
        );
        assert!(
            t.contains("| peak RSS | 100 MiB | 500 MiB | — | 5.0× | — |"),
            "{t}"
        );
        assert!(
            t.contains("| `nft -f` of the ruleset it wrote (a process) | 500 ms | — | — | — | — |"),
            "{t}"
        );
        assert!(
            t.contains("\nkube-proxy nftables: Service deleted: still reachable\n"),
            "{t}"
        );
        assert!(t.ends_with("\nno answer in 600s\n"), "{t}");
        // No contender has the IPVS row.
        assert!(!t.contains("first sync ended"), "{t}");
    }

    #[test]
    fn an_ipvs_table_compares_with_kube_nfts_ipvs_backend() {
        let figures = |start, synced| Figures {
            start_to_traffic: start,
            start_to_synced: Some(synced),
            endpoint_to_kernel: 0.01,
            delete_to_kernel: 0.01,
            restart_to_healthy: 1.0,
            peak_rss_mib: 10.0,
            nft_f: None,
            notes: Vec::new(),
        };
        let t = table(
            1000,
            3,
            &[
                (Contender::KubeNftIpvs, Ok(figures(2.0, 2.5))),
                (Contender::KubeProxyIpvs, Ok(figures(6.0, 25.0))),
            ],
        );
        assert!(
            t.contains("| measure | kube-nft IPVS | kube-proxy IPVS | ipvs ÷ kube-nft |"),
            "{t}"
        );
        assert!(
            t.contains("| start → first sync ended (IPVS) | 2.50 s | 25.00 s | 10× |"),
            "{t}"
        );
        assert!(!t.contains("`nft -f`"), "{t}");
    }

    #[test]
    fn the_plot_has_a_point_per_size_that_synced_per_1k_services() {
        let f = |start: f64| Figures {
            start_to_traffic: start,
            nft_f: Some(start / 2.0),
            ..Figures::default()
        };
        let svg = plot(&[
            (
                1_000,
                vec![
                    (Contender::KubeNft, Ok(f(0.2))),
                    (Contender::KubeProxyNftables, Ok(f(1.0))),
                ],
            ),
            (
                100_000,
                vec![
                    (Contender::KubeNft, Ok(f(10.0))),
                    (Contender::KubeProxyNftables, Err("did not sync".into())),
                ],
            ),
        ]);
        // kube-nft: 200 and 100 ms per 1k; kube-proxy: one point; nft -f: two.
        assert_eq!(svg.matches("<circle").count(), 2 + 1 + 2, "{svg}");
        assert!(svg.contains("kube-proxy nftables: start → first traffic"));
        assert!(!svg.contains("kube-proxy iptables"), "no points, no series");
        assert!(svg.contains(">100<") && svg.contains(">1000<"), "{svg}");
    }
}
