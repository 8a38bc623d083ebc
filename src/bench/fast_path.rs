//! `kube-nft bench-fast-path`: what the fast path (`kube-nft.io/traffic-hint:
//! LongLived`, docs/SERVICES.md) does for a Service's traffic, on the
//! data-plane bench's stage (`versus_dataplane::Stage`: a client outside the
//! node, ten pods on a veth). In rounds, the node is programmed by `run
//! --once` with the probe Service annotated, once with `--fast-path
//! long-lived` and once with `--fast-path off`, in an order that alternates,
//! and measured the same way: one long TCP flow through the ClusterIP with
//! the CPU time the machine spent for it, 16 flows at once, one flow through
//! the NodePort, and new connections (which end before they are offloaded).
//! Ratios are taken within a round; medians of the rounds are reported.
//!
//! It needs a kernel with flowtables: `benches/fast_path.sh` runs it in the
//! 6.1 guest (qemu without KVM: read the ratios, not the figures).

use super::versus_dataplane::{pod_addresses, Stage, Traffic, NODE_PORT};
use super::{median, nft};
use crate::testbed::netns::{in_netns, Netns};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;

pub struct FastPathBenchOptions {
    /// Cluster sizes for the shape's check (Services of 10 endpoints).
    pub sizes: Vec<usize>,
    /// Cold syncs per size and mode.
    pub runs: usize,
    /// Rounds of traffic; 0 skips it (no flowtables needed then).
    pub rounds: usize,
    pub seconds: f64,
    pub prefix: String,
}

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The node's address on the client's side, where the NodePort is served.
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

/// The probe Service, on the fast path, and its ten endpoints.
fn manifests() -> String {
    let endpoints: Vec<String> = pod_addresses()
        .iter()
        .map(|a| format!("- {{addresses: [\"{a}\"], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: probe, namespace: bench, annotations: {{kube-nft.io/traffic-hint: LongLived}}}}\nspec:\n  type: NodePort\n  clusterIP: {VIP}\n  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: probe-a, namespace: bench, labels: {{kubernetes.io/service-name: probe}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n{}\n",
        endpoints.join("\n")
    )
}

/// One mode's figures in one round.
#[derive(Debug, Clone, Default)]
struct Figures {
    traffic: Traffic,
    /// One flow through the ClusterIP, with its CPU.
    gbit: f64,
    cpu_seconds_per_gbit: f64,
    /// Packets the forward hook saw per MB of that flow: what the fast path
    /// takes off it.
    forwarded_per_mb: f64,
}

/// Counts what the forward hook sees, first of every chain there: `nft`'s
/// commands, in one argument.
const COUNT_TABLE: &str = "add table inet bench-forwarded; add chain inet bench-forwarded forward { type filter hook forward priority -400; policy accept; }; add rule inet bench-forwarded forward counter";

/// The count table's packets, and the table deleted.
fn forwarded_packets() -> Result<f64, String> {
    let listed =
        String::from_utf8_lossy(&nft(None, &["list", "table", "inet", "bench-forwarded"])?)
            .into_owned();
    nft(None, &["delete", "table", "inet", "bench-forwarded"])?;
    listed
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no counter in: {listed}"))
}

const MODES: [&str; 2] = ["long-lived", "off"];

pub fn run(opts: &FastPathBenchOptions) -> Result<String, String> {
    let mut out = String::new();
    if !opts.sizes.is_empty() {
        out += &shape(opts)?;
    }
    if opts.rounds > 0 {
        let node = Netns::create(&format!("{}-node", opts.prefix)).map_err(|e| e.to_string())?;
        let opts = FastPathBenchOptions {
            sizes: Vec::new(),
            prefix: opts.prefix.clone(),
            ..*opts
        };
        out += &in_netns(&node.name, move || measure(&opts)).map_err(|e| e.to_string())??;
    }
    Ok(out)
}

/// The Service tables' share, checked for the kernel's quadratic traps: a
/// cold sync of N Services × 10 endpoints (one TCP port) in a fresh
/// namespace and process (`bench-child`), every Service on the fast path
/// (`fast-` chains) or none. The commit is the kernel's work.
fn shape(opts: &FastPathBenchOptions) -> Result<String, String> {
    let mut out = format!(
        "\nCold sync, every Service on the fast path or none (medians of {}):\n\n| Services × 10 | commit, off | commit, all | all ÷ off | sync, off | sync, all | commit per 1k Services, off / all |\n|---|---|---|---|---|---|---|\n",
        opts.runs.max(1)
    );
    for &n in &opts.sizes {
        let mut commits = [Vec::new(), Vec::new()];
        let mut syncs = [Vec::new(), Vec::new()];
        for r in 0..opts.runs.max(1) {
            for (m, mode) in ["off", "all"].iter().enumerate() {
                let ns = Netns::create(&format!("{}-shape-{mode}{r}", opts.prefix))
                    .map_err(|e| e.to_string())?;
                let c = super::run_child(
                    &ns.name,
                    n,
                    n * 10,
                    crate::core::node_config::ModeName::Nftables,
                    &["--fast-path", mode],
                )?;
                commits[m].push(c.kernel_ms);
                syncs[m].push(c.ms);
            }
        }
        let [c_off, c_all] = commits.map(median);
        let [s_off, s_all] = syncs.map(median);
        writeln!(
            out,
            "| {n} | {c_off:.0} ms | {c_all:.0} ms | {:.2} | {s_off:.0} ms | {s_all:.0} ms | {:.1} / {:.1} ms |",
            c_all / c_off,
            c_off / n as f64 * 1000.0,
            c_all / n as f64 * 1000.0
        )
        .unwrap();
        eprintln!("{n} Services: commit {c_off:.0} / {c_all:.0} ms");
    }
    Ok(out)
}

fn program(manifests: &std::path::Path, mode: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(["run", "--once", "--manifests"])
        .arg(manifests)
        .args([
            "--cluster-cidr",
            crate::testbed::synthetic::CLUSTER_CIDR,
            "--nodeport-addresses",
            &format!("{NODE_IP}/32"),
            "--fast-path",
            mode,
            // The node's own sysctls are not the bench's to set.
            "--conntrack-max-per-core",
            "0",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "run --once --fast-path {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let listed = nft(None, &["list", "tables"])?;
    let has = String::from_utf8_lossy(&listed).contains(crate::node::fast_path::TABLE);
    if has != (mode != "off") {
        return Err(format!(
            "--fast-path {mode}: the fast path's table is {}there",
            if has { "" } else { "not " }
        ));
    }
    Ok(())
}

fn measure(opts: &FastPathBenchOptions) -> Result<String, String> {
    let stage = Stage::build(&opts.prefix)?;
    let dir = std::env::temp_dir().join(format!("{}-files", opts.prefix));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("probe.yaml");
    std::fs::write(&path, manifests()).map_err(|e| e.to_string())?;
    let vip = IpAddr::V4(VIP);
    let mut rounds: Vec<[Figures; 2]> = Vec::new();
    for r in 0..opts.rounds.max(1) {
        let mut round: [Figures; 2] = Default::default();
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for m in order {
            program(&path, MODES[m])?;
            nft(None, &[COUNT_TABLE])?;
            let (gbit, cpu) = stage.flow_and_cpu(SocketAddr::new(vip, 80), opts.seconds)?;
            let forwarded = forwarded_packets()?;
            let traffic = stage.measure(vip, NODE_IP, opts.seconds)?;
            round[m] = Figures {
                traffic,
                gbit,
                cpu_seconds_per_gbit: cpu / (gbit * opts.seconds),
                forwarded_per_mb: forwarded / (gbit * opts.seconds * 1e3 / 8.0),
            };
        }
        eprintln!(
            "round {}: 1 flow {:.2} vs {:.2} Gbit/s",
            r + 1,
            round[0].gbit,
            round[1].gbit
        );
        rounds.push(round);
    }
    Ok(table(&rounds, opts))
}

type Column = (&'static str, fn(&Figures) -> f64, bool);

fn table(rounds: &[[Figures; 2]], opts: &FastPathBenchOptions) -> String {
    let columns: [Column; 9] = [
        ("1 flow, Gbit/s", |f| f.gbit, true),
        ("CPU s per Gbit", |f| f.cpu_seconds_per_gbit, false),
        (
            "forward hook, packets per MB",
            |f| f.forwarded_per_mb,
            false,
        ),
        ("16 flows, Gbit/s", |f| f.traffic.gbit_16, true),
        ("NodePort 1 flow, Gbit/s", |f| f.traffic.np_gbit_1, true),
        ("conn/s", |f| f.traffic.conns_per_sec, true),
        ("connect p50, µs", |f| f.traffic.p50_us, false),
        ("connect p99, µs", |f| f.traffic.p99_us, false),
        ("failed", |f| f.traffic.failed as f64, false),
    ];
    let mut out = format!(
        "\nThe fast path, one Service of 10 endpoints ({} rounds of {} s; medians):\n\n| --fast-path |",
        rounds.len(),
        opts.seconds
    );
    for (title, _, _) in &columns {
        write!(out, " {title} |").unwrap();
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for (m, mode) in MODES.iter().enumerate() {
        write!(out, "| {mode} |").unwrap();
        for (_, f, _) in &columns {
            let v = median(rounds.iter().map(|r| f(&r[m])).collect());
            write!(out, " {} |", figure(v)).unwrap();
        }
        out.push('\n');
    }
    out.push_str("| long-lived / off (>1: the fast path ahead) |");
    for (title, f, higher) in &columns {
        if *title == "failed" {
            out.push_str(" |");
            continue;
        }
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| {
                let (on, off) = (f(&r[0]), f(&r[1]));
                if *higher {
                    on / off
                } else {
                    off / on
                }
            })
            .collect();
        write!(out, " {:.2} |", median(ratios)).unwrap();
    }
    out.push('\n');
    out
}

fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
