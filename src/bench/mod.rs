//! `kube-nft bench`: what a sync costs, and what a packet costs, measured against
//! the kernel in scratch network namespaces (never the host's).
//!
//! Control plane, per cluster size: a cold full sync (in a fresh process, for its
//! peak RSS), the same ruleset through `nft -f`, an anonymous `numgen` map per
//! Service (the dispatch of kube-proxy 1.36's nftables mode, simplified) through
//! `nft -f`, a restart over the ruleset in place, and one endpoint changed, one
//! Service added and one deleted. Data plane: see `dataplane`.
//! Every figure is the median of several runs.
//!
//! Ours against `nft -f` is timed the same way on both sides: a process started
//! with `ip netns exec`, from its start to its exit, so start-up and reading the
//! input count for both (the model is made in memory, nft parses its file). The
//! in-process sync time is reported beside it, never divided by nft's.

pub mod api_cluster;
pub mod api_path;
pub mod apiserver;
pub mod dataplane;
pub mod etcd_load;
pub mod fast_path;
pub mod ipvs;
pub mod nodes;
pub mod operator;
pub mod plot;
pub mod reach;
pub mod report;
pub mod verification;
pub mod versus;
pub mod versus_dataplane;

use crate::core::model::{ClusterState, Endpoint, ServiceKey};
use crate::core::node_config::{FastPath, ModeName, NodeConfig};
use crate::engine::Proxy;
use crate::nft::translate::translate;
use crate::testbed::netns::{in_netns, Netns};
use crate::testbed::synthetic;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Stops processes as a node stops its proxies: SIGTERM to all, up to 10 s
/// for them to exit, then SIGKILL; each is reaped.
pub(crate) fn stop_all(children: &mut [std::process::Child]) {
    for child in children.iter() {
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    for child in children.iter_mut() {
        while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs `nft ARGS` in network namespace `netns` (through `ip netns exec`), or
/// in this process's: what it printed, or an error with what it said.
pub(crate) fn nft(netns: Option<&str>, args: &[&str]) -> Result<Vec<u8>, String> {
    let mut command = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    command.args(args);
    output_of(&mut command)
}

/// Runs a node tool: what it printed, or an error naming the command with
/// what it said.
pub(crate) fn output_of(command: &mut Command) -> Result<Vec<u8>, String> {
    let named = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = command
        .output()
        .map_err(|e| format!("running {named}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{named}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// Deletes every conntrack entry of this process's namespace. `conntrack -F`
/// says so on stderr, and fails when there is nothing to flush: only a missing
/// binary is an error.
pub(crate) fn flush_conntrack() -> Result<(), String> {
    Command::new("conntrack")
        .arg("-F")
        .output()
        .map(|_| ())
        .map_err(|e| format!("conntrack: {e}"))
}

/// A scrape's samples: each line's metric name, its labels (inside the
/// braces, empty without), and its value as written.
pub(crate) fn samples(text: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((metric, labels)) => (metric, labels.strip_suffix('}')?),
                None => (series, ""),
            };
            Some((metric, labels, value))
        })
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn median_usize(v: Vec<usize>) -> usize {
    median(v.into_iter().map(|x| x as f64).collect()) as usize
}

/// The synthetic node's settings under a proxy mode.
pub fn node_config(mode: ModeName) -> NodeConfig {
    NodeConfig {
        mode: mode.mode(),
        ..synthetic::node_config()
    }
}

/// The hidden `bench-child` command: one full sync in a fresh process, printed as
/// `sync_ms messages bytes peak_rss_kib kernel_ms other_bytes` (the last: what
/// dataplanes other than nf_tables sent, IPVS's commands).
pub fn child_sync(
    netns: &str,
    services: usize,
    endpoints: usize,
    counters: bool,
    mode: ModeName,
    fast_path: FastPath,
) -> Result<(), String> {
    crate::testbed::netns::enter(netns).map_err(|e| e.to_string())?;
    let config = NodeConfig {
        counters,
        fast_path,
        ..node_config(mode)
    };
    let mut p = crate::assemble::proxy(config).map_err(|e| e.to_string())?;
    p.replace_state(synthetic::state(services, endpoints));
    let r = p.sync().map_err(|e| e.to_string())?;
    let other_bytes: usize = r
        .written
        .iter()
        .flat_map(|(_, w)| &w.counts)
        .filter(|(name, _)| *name == "bytes")
        .map(|(_, n)| n)
        .sum();
    println!(
        "{:.3} {} {} {} {:.3} {other_bytes}",
        r.duration.as_secs_f64() * 1000.0,
        r.committed.messages,
        r.committed.bytes,
        crate::node::metrics::peak_rss_kib(),
        r.committed.kernel.as_secs_f64() * 1000.0,
    );
    Ok(())
}

struct ChildSync {
    ms: f64,
    /// From starting the process to its exit, as `nft -f` is timed.
    process_ms: f64,
    kernel_ms: f64,
    bytes: usize,
    rss_kib: u64,
    /// Bytes sent to dataplanes other than nf_tables (IPVS).
    other_bytes: usize,
}

fn run_child(
    netns: &str,
    services: usize,
    endpoints: usize,
    mode: ModeName,
    extra: &[&str],
) -> Result<ChildSync, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(exe)
        .args([
            "bench-child",
            "--netns",
            netns,
            "--services",
            &services.to_string(),
            "--endpoints",
            &endpoints.to_string(),
            "--proxy-mode",
            &mode.mode().name(),
        ])
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let process_ms = start.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        return Err(format!(
            "bench-child failed: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    let bad = || format!("bench-child printed {text:?}");
    Ok(ChildSync {
        ms: f.first().and_then(|x| x.parse().ok()).ok_or_else(bad)?,
        process_ms,
        bytes: f.get(2).and_then(|x| x.parse().ok()).ok_or_else(bad)?,
        rss_kib: f.get(3).and_then(|x| x.parse().ok()).ok_or_else(bad)?,
        kernel_ms: f.get(4).and_then(|x| x.parse().ok()).ok_or_else(bad)?,
        other_bytes: f.get(5).and_then(|x| x.parse().ok()).ok_or_else(bad)?,
    })
}

/// Runs `argv` in `ns` (through `ip netns exec`) with `stdin` from a file: its
/// wall time in ms, start to exit, as `run_child` times ours, and what it printed.
pub(crate) fn timed_in(
    ns: &str,
    argv: &[&str],
    stdin: Option<&std::path::Path>,
) -> Result<(f64, String), String> {
    let input = match stdin {
        Some(p) => Stdio::from(std::fs::File::open(p).map_err(|e| format!("{p:?}: {e}"))?),
        None => Stdio::null(),
    };
    let start = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .stdin(input)
        .output()
        .map_err(|e| format!("running {argv:?}: {e}"))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        return Err(format!(
            "{argv:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((ms, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Loads a file with `nft -f` inside a fresh namespace; returns the wall time in
/// ms of the process.
pub(crate) fn time_nft_file(tag: &str, path: &std::path::Path) -> Result<f64, String> {
    let ns = Netns::create(tag).map_err(|e| e.to_string())?;
    Ok(timed_in(&ns.name, &["nft", "-f", path.to_str().unwrap()], None)?.0)
}

/// The dispatch of kube-proxy 1.36's nftables mode for the same Services,
/// simplified: one anonymous `numgen … map` per Service chain (the shape the
/// kernel binds quadratically), without its endpoint chains, masquerade marks,
/// filter chains and other maps. What real kube-proxy writes and costs is
/// measured by `bench-kube-proxy` (`versus`).
pub fn kube_proxy_shape(state: &ClusterState) -> String {
    let mut out = String::from("table ip kube-proxy {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n");
    let mut elements = Vec::new();
    for (i, (key, svc)) in state.services.iter().enumerate() {
        let eps = state.endpoints_for(svc, &svc.ports[0]);
        if eps.is_empty() {
            continue;
        }
        let chain = format!("service-{i}-{}/{}/tcp/http", key.namespace, key.name);
        let map: Vec<String> = eps
            .iter()
            .enumerate()
            .map(|(k, e)| format!("{k} : {} . {}", e.addr, e.port))
            .collect();
        writeln!(
            out,
            "\tchain {chain} {{\n\t\tmeta l4proto tcp dnat ip to numgen random mod {} map {{ {} }}\n\t}}",
            eps.len(),
            map.join(", ")
        )
        .unwrap();
        elements.push(format!("{} . tcp . 80 : goto {chain}", svc.cluster_ips[0]));
    }
    out.push_str("}\n");
    for chunk in elements.chunks(1000) {
        writeln!(
            out,
            "add element ip kube-proxy service-ips {{ {} }}",
            chunk.join(", ")
        )
        .unwrap();
    }
    out
}

#[derive(Debug, Clone)]
pub struct ControlResult {
    pub services: usize,
    pub endpoints: usize,
    pub cold_ms: f64,
    /// The same cold sync timed as `nft -f` is: the process, start to exit.
    pub cold_process_ms: f64,
    /// The kernel's share of the cold sync: from sending the batch to its ack.
    pub cold_kernel_ms: f64,
    pub cold_bytes: usize,
    pub cold_rss_mib: f64,
    pub nft_f_ms: f64,
    pub kube_proxy_shape_ms: Option<f64>,
    pub restart_ms: f64,
    pub restart_bytes: usize,
    pub endpoint_change_ms: f64,
    pub endpoint_change_bytes: usize,
    /// One endpoint of ten removed: the Service port's count changes.
    pub endpoint_remove_ms: f64,
    pub endpoint_remove_bytes: usize,
    pub service_add_ms: f64,
    pub service_add_bytes: usize,
    pub service_delete_ms: f64,
    pub service_delete_bytes: usize,
    /// Listing and monitoring our ruleset, and the `numgen`-map shape of it.
    pub ours_view: Option<operator::OperatorView>,
    pub kube_proxy_view: Option<operator::OperatorView>,
}

pub struct BenchOptions {
    pub sizes: Vec<(usize, usize)>,
    pub runs: usize,
    /// The largest cluster for which the `numgen`-map shape is loaded (it is quadratic).
    pub kube_proxy_shape_max: usize,
    /// The largest cluster whose ruleset is listed and monitored with `nft`.
    pub operator_max: usize,
    pub prefix: String,
}

/// Measures one cluster size.
pub fn control_plane(
    opts: &BenchOptions,
    services: usize,
    endpoints: usize,
) -> Result<ControlResult, String> {
    let runs = opts.runs.max(1);
    let tag = |what: &str, r: usize| format!("{}-{what}{r}", opts.prefix);
    let mut cold = Vec::new();
    let mut restart = Vec::new();
    for r in 0..runs {
        let ns = Netns::create(&tag("cold", r)).map_err(|e| e.to_string())?;
        cold.push(run_child(
            &ns.name,
            services,
            endpoints,
            ModeName::Nftables,
            &[],
        )?);
        restart.push(run_child(
            &ns.name,
            services,
            endpoints,
            ModeName::Nftables,
            &[],
        )?);
    }

    let state = synthetic::state(services, endpoints);
    let dir = std::env::temp_dir().join(format!("{}-files", opts.prefix));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ours = dir.join("ruleset.nft");
    let script =
        crate::ruleset::text::replace_script(&translate(&state, &synthetic::node_config()).tables);
    std::fs::File::create(&ours)
        .and_then(|mut f| f.write_all(script.as_bytes()))
        .map_err(|e| e.to_string())?;
    drop(script);
    let nft_f: Vec<f64> = (0..runs)
        .map(|r| time_nft_file(&tag("nft", r), &ours))
        .collect::<Result<_, _>>()?;
    let operator = services <= opts.operator_max;
    let ours_view = if operator {
        eprintln!("  listing and monitoring our ruleset with nft…");
        Some(operator::operator_view(&tag("lso", 0), &ours)?)
    } else {
        None
    };
    let (kube_proxy_shape_ms, kube_proxy_view) = if services <= opts.kube_proxy_shape_max {
        let kp = dir.join("kube-proxy-shape.nft");
        std::fs::write(&kp, kube_proxy_shape(&state)).map_err(|e| e.to_string())?;
        let v: Vec<f64> = (0..runs)
            .map(|r| time_nft_file(&tag("kp", r), &kp))
            .collect::<Result<_, _>>()?;
        let view = if operator {
            eprintln!("  listing and monitoring the numgen-map shape with nft…");
            Some(operator::operator_view(&tag("lsk", 0), &kp)?)
        } else {
            None
        };
        (Some(median(v)), view)
    } else {
        (None, None)
    };
    let _ = std::fs::remove_dir_all(&dir);

    // Incremental changes, in one long-lived proxy.
    let ns = Netns::create(&tag("inc", 0)).map_err(|e| e.to_string())?;
    let config = synthetic::node_config();
    let incremental = in_netns(&ns.name, move || {
        incremental_changes(state, config, runs.max(11))
    })
    .map_err(|e| e.to_string())??;
    Ok(ControlResult {
        services,
        endpoints,
        cold_ms: median(cold.iter().map(|c| c.ms).collect()),
        cold_process_ms: median(cold.iter().map(|c| c.process_ms).collect()),
        cold_kernel_ms: median(cold.iter().map(|c| c.kernel_ms).collect()),
        cold_bytes: median_usize(cold.iter().map(|c| c.bytes).collect()),
        cold_rss_mib: median(cold.iter().map(|c| c.rss_kib as f64 / 1024.0).collect()),
        nft_f_ms: median(nft_f),
        kube_proxy_shape_ms,
        restart_ms: median(restart.iter().map(|c| c.ms).collect()),
        restart_bytes: median_usize(restart.iter().map(|c| c.bytes).collect()),
        endpoint_change_ms: incremental.endpoint_replaced.0,
        endpoint_change_bytes: incremental.endpoint_replaced.1,
        endpoint_remove_ms: incremental.endpoint_removed.0,
        endpoint_remove_bytes: incremental.endpoint_removed.1,
        service_add_ms: incremental.service_added.0,
        service_add_bytes: incremental.service_added.1,
        service_delete_ms: incremental.service_deleted.0,
        service_delete_bytes: incremental.service_deleted.1,
        ours_view,
        kube_proxy_view,
    })
}

type Cost = (f64, usize);

/// The endpoints of synthetic Service `i` (its one slice's).
fn endpoints_of(s: &mut ClusterState, i: usize) -> Option<&mut Vec<Endpoint>> {
    let slices = s.slices.get_mut(&synthetic::service_key(i))?;
    slices.values_mut().next().map(|slice| &mut slice.endpoints)
}

/// The costs `incremental_changes` measures.
struct Incremental {
    endpoint_replaced: Cost,
    endpoint_removed: Cost,
    service_added: Cost,
    service_deleted: Cost,
}

/// From the change to the model to the kernel's commit, median over `runs`
/// changes each: one endpoint replaced, one endpoint removed (its Service's
/// count changes), one Service added, one deleted.
fn incremental_changes(
    state: ClusterState,
    config: NodeConfig,
    runs: usize,
) -> Result<Incremental, String> {
    let services = state.services.len();
    let mut p = crate::assemble::proxy(config).map_err(|e| e.to_string())?;
    p.replace_state(state);
    p.sync().map_err(|e| e.to_string())?;
    let measure = |p: &mut Proxy,
                   key: &ServiceKey,
                   change: &dyn Fn(&mut ClusterState)|
     -> Result<Cost, String> {
        let start = Instant::now();
        p.update(key, change);
        let r = p.sync().map_err(|e| e.to_string())?;
        Ok((start.elapsed().as_secs_f64() * 1000.0, r.committed.bytes))
    };
    let (mut ep, mut removed, mut add, mut del) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs {
        // One endpoint of a Service replaced by a new address (a pod rescheduled).
        let i = (r * 7919) % services;
        let key = synthetic::service_key(i);
        let new_addr = IpAddr::from((0x0b00_0000u32 + r as u32).to_be_bytes());
        ep.push(measure(&mut p, &key, &|s: &mut ClusterState| {
            if let Some(e) = endpoints_of(s, i).and_then(|eps| eps.first_mut()) {
                e.addr = new_addr;
            }
        })?);
        // The last endpoint of another Service goes: 10 endpoints become 9.
        let k = (i + services / 2) % services;
        removed.push(measure(
            &mut p,
            &synthetic::service_key(k),
            &|s: &mut ClusterState| {
                if let Some(eps) = endpoints_of(s, k) {
                    eps.pop();
                }
            },
        )?);
        let j = services + r;
        let key = synthetic::service_key(j);
        add.push(measure(&mut p, &key, &|s: &mut ClusterState| {
            let addrs: Vec<IpAddr> = (0..10)
                .map(|k| IpAddr::from((0x0c00_0000u32 + (j * 16 + k) as u32).to_be_bytes()))
                .collect();
            s.put_service(synthetic::service(j));
            s.slices
                .entry(synthetic::service_key(j))
                .or_default()
                .insert(synthetic::slice(j, &addrs));
        })?);
        del.push(measure(&mut p, &key, &|s: &mut ClusterState| {
            s.services.remove(&synthetic::service_key(j));
            s.slices.remove(&synthetic::service_key(j));
        })?);
    }
    let summarize = |v: Vec<Cost>| {
        (
            median(v.iter().map(|c| c.0).collect()),
            median_usize(v.iter().map(|c| c.1).collect()),
        )
    };
    Ok(Incremental {
        endpoint_replaced: summarize(ep),
        endpoint_removed: summarize(removed),
        service_added: summarize(add),
        service_deleted: summarize(del),
    })
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

fn fmt_bytes(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// `2.03× faster` or `1.25× slower`: how `ours` compares with `theirs`, two times
/// of the same thing.
pub fn speedup(ours: f64, theirs: f64) -> String {
    if ours <= theirs {
        format!("{:.2}× faster", theirs / ours)
    } else {
        format!("{:.2}× slower", ours / theirs)
    }
}

/// The control-plane results as a Markdown table.
pub fn control_table(results: &[ControlResult]) -> String {
    let mut out = String::new();
    out.push_str("| Services × endpoints | cold full sync | of which the kernel's commit | bytes | peak RSS | the same, timed as a process | `nft -f` same ruleset (a process) | ours vs `nft -f`, both processes | an anonymous `numgen` map per Service via `nft -f` | restart: time, bytes | 1 endpoint changed | 1 endpoint removed | 1 Service added | 1 Service deleted |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        writeln!(
            out,
            "| {} × {} | {} | {} | {} | {:.0} MiB | {} | {} | {} | {} | {}, {} | {}, {} | {}, {} | {}, {} | {}, {} |",
            thousands(r.services),
            if r.endpoints % r.services == 0 { format!("{}", r.endpoints / r.services) } else { format!("{:.1} ({}k)", r.endpoints as f64 / r.services as f64, r.endpoints / 1000) },
            fmt_ms(r.cold_ms),
            fmt_ms(r.cold_kernel_ms),
            fmt_bytes(r.cold_bytes),
            r.cold_rss_mib,
            fmt_ms(r.cold_process_ms),
            fmt_ms(r.nft_f_ms),
            speedup(r.cold_process_ms, r.nft_f_ms),
            r.kube_proxy_shape_ms.map(fmt_ms).unwrap_or_else(|| "not run".into()),
            fmt_ms(r.restart_ms),
            fmt_bytes(r.restart_bytes),
            fmt_ms(r.endpoint_change_ms),
            fmt_bytes(r.endpoint_change_bytes),
            fmt_ms(r.endpoint_remove_ms),
            fmt_bytes(r.endpoint_remove_bytes),
            fmt_ms(r.service_add_ms),
            fmt_bytes(r.service_add_bytes),
            fmt_ms(r.service_delete_ms),
            fmt_bytes(r.service_delete_bytes),
        )
        .unwrap();
    }
    out
}

/// `200`, `10k`, `2.5k`: a count as the tables show it.
pub fn thousands(n: usize) -> String {
    match n {
        n if n < 1000 => n.to_string(),
        n if n % 1000 == 0 => format!("{}k", n / 1000),
        n => format!("{:.1}k", n as f64 / 1000.0),
    }
}

/// Time per 1000 Services at each size: flat when the cost is linear.
pub fn linearity(results: &[ControlResult]) -> String {
    let mut out = String::from("Cold full sync per 1000 Services (flat = linear):");
    for r in results {
        let size = if r.endpoints == r.services * 10 {
            thousands(r.services)
        } else {
            format!("{} × {}", thousands(r.services), thousands(r.endpoints))
        };
        write!(
            out,
            " {size}: {:.1} ms;",
            r.cold_ms / (r.services as f64 / 1000.0)
        )
        .unwrap();
    }
    out.pop();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::speedup;

    #[test]
    fn a_ratio_below_one_prints_as_slower() {
        assert_eq!(speedup(1.0, 2.03), "2.03× faster");
        assert_eq!(speedup(2.5, 2.0), "1.25× slower");
        assert_eq!(speedup(3.0, 3.0), "1.00× faster");
    }
}
