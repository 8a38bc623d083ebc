//! What an operator lives with once a ruleset is in place: how long `nft list
//! ruleset` takes and how much it prints, and how long `nft monitor` needs before
//! it can report an event (it loads the whole ruleset into its cache first). Both
//! are measured with the `nft` binary the node has, on a ruleset loaded with
//! `nft -f` into a scratch namespace, for our ruleset and for kube-proxy 1.36's
//! shape of the same Services.

use super::nft;
use crate::testbed::netns::Netns;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Past this, `nft monitor` is reported as not ready.
const MONITOR_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy)]
pub struct OperatorView {
    pub list_ms: f64,
    pub lines: usize,
    pub bytes: usize,
    /// From `nft monitor`'s start to its first event; `None` past the limit.
    pub monitor_ms: Option<f64>,
}

/// Loads `ruleset` with `nft -f` into a scratch namespace, then lists it and
/// starts `nft monitor` there.
pub fn operator_view(tag: &str, ruleset: &Path) -> Result<OperatorView, String> {
    let ns = Netns::create(tag).map_err(|e| e.to_string())?;
    nft(Some(&ns.name), &["-f", &ruleset.display().to_string()])?;
    let start = Instant::now();
    let listing = nft(Some(&ns.name), &["list", "ruleset"])?;
    let list_ms = start.elapsed().as_secs_f64() * 1000.0;
    let monitor_ms = monitor_ready(&ns.name)?;
    Ok(OperatorView {
        list_ms,
        lines: listing.iter().filter(|b| **b == b'\n').count(),
        bytes: listing.len(),
        monitor_ms,
    })
}

/// The state and CPU ticks of a process (`/proc/PID/stat`).
fn cpu_state(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((fields.first()?.chars().next()?, ticks))
}

/// Starts `nft monitor` and waits until it has loaded its cache: asleep, its CPU
/// time still for 100 ms. Probing it with changes instead would restart its
/// cache load (it starts over when the ruleset's generation moves). One change
/// then confirms that it reports events. The time from its start to then.
fn monitor_ready(ns: &str) -> Result<Option<f64>, String> {
    nft(
        Some(ns),
        &["add table ip kn-probe { set s { type ipv4_addr; }; }"],
    )?;
    let start = Instant::now();
    let mut monitor = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "monitor"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("running nft monitor: {e}"))?;
    let stdout = monitor.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("kn-probe") && tx.send(()).is_err() {
                return;
            }
        }
    });
    let pid = monitor.id();
    let mut idle_since: Option<(Instant, u64)> = None;
    let mut ready = None;
    while start.elapsed() < MONITOR_LIMIT {
        std::thread::sleep(Duration::from_millis(20));
        let Some((state, ticks)) = cpu_state(pid) else {
            break; // it exited
        };
        match idle_since {
            Some((since, t)) if state == 'S' && t == ticks => {
                if since.elapsed() >= Duration::from_millis(100) {
                    ready = Some(since.duration_since(start).as_secs_f64() * 1000.0);
                    break;
                }
            }
            _ if state == 'S' => idle_since = Some((Instant::now(), ticks)),
            _ => idle_since = None,
        }
    }
    if ready.is_some() {
        nft(
            Some(ns),
            &["add", "element", "ip", "kn-probe", "s", "{ 192.0.2.1 }"],
        )?;
        if rx.recv_timeout(Duration::from_secs(5)).is_err() {
            ready = None; // idle, but not reporting: not ready
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    Ok(ready)
}

fn fmt_s(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

fn fmt_monitor(v: &OperatorView) -> String {
    v.monitor_ms
        .map(fmt_s)
        .unwrap_or_else(|| format!("not within {} s", MONITOR_LIMIT.as_secs()))
}

/// The operator's table: ours beside an anonymous `numgen` map per Service
/// (kube-proxy 1.36's dispatch, simplified), with ratios.
pub fn operator_table(rows: &[(usize, usize, OperatorView, Option<OperatorView>)]) -> String {
    let mut out = String::from(
        "| Services × endpoints | `nft list ruleset` | vs a `numgen` map per Service | lines, bytes | a `numgen` map per Service: list, lines, bytes | `nft monitor` ready | a `numgen` map per Service: monitor ready |\n|---|---|---|---|---|---|---|\n",
    );
    for (services, endpoints, ours, kp) in rows {
        let (ratio, kp_list, kp_monitor) = match kp {
            Some(k) => (
                format!("{:.2}×", ours.list_ms / k.list_ms),
                format!(
                    "{}, {}, {:.1} MiB",
                    fmt_s(k.list_ms),
                    k.lines,
                    k.bytes as f64 / 1048576.0
                ),
                fmt_monitor(k),
            ),
            None => ("not run".into(), "not run".into(), "not run".into()),
        };
        out += &format!(
            "| {} × {} | {} | {} | {}, {:.1} MiB | {} | {} | {} |\n",
            services,
            endpoints,
            fmt_s(ours.list_ms),
            ratio,
            ours.lines,
            ours.bytes as f64 / 1048576.0,
            kp_list,
            fmt_monitor(ours),
            kp_monitor,
        );
    }
    out
}
