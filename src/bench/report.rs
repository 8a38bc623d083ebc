//! `kube-nft bench`'s report: each part measured in turn and printed as a
//! markdown section, with the full-sync plot as SVG.

use crate::bench::{self, plot as chart};
use std::path::PathBuf;

/// What `kube-nft bench` measures.
pub struct Report {
    pub control: bench::BenchOptions,
    /// Services programmed in the data-plane runs (none: skipped).
    pub dataplane_sizes: Vec<usize>,
    pub dataplane_seconds: f64,
    /// Where the full-sync plot goes, if anywhere.
    pub plot: Option<PathBuf>,
    /// Services fed through the loopback API server.
    pub api_sizes: Vec<usize>,
    /// Grow from the first to the second number of Services, the first at a
    /// time, while a client connects.
    pub growth: Option<(usize, usize)>,
}

/// A cluster size: SERVICES (10 endpoints each) or SERVICESxENDPOINTS (total).
pub fn parse_size(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not SERVICES or SERVICESxENDPOINTS");
    match s.split_once('x') {
        Some((a, b)) => Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?)),
        None => {
            let n: usize = s.parse().map_err(|_| bad())?;
            Ok((n, n * 10))
        }
    }
}

/// Runs every part of `kube-nft bench` and prints its report, in markdown, as
/// each part ends (progress goes to stderr).
pub fn run(report: &Report) -> Result<(), String> {
    let opts = &report.control;
    let runs = opts.runs;
    let prefix = &opts.prefix;
    let mut results = Vec::new();
    for (services, endpoints) in &opts.sizes {
        eprintln!("control plane: {services} Services, {endpoints} endpoints…");
        results.push(bench::control_plane(opts, *services, *endpoints)?);
    }
    println!("## Control plane (median of {})\n", runs_text(runs));
    print!("{}", bench::control_table(&results));
    println!("\n{}", bench::linearity(&results));
    let operator: Vec<_> = results
        .iter()
        .filter_map(|r| Some((r.services, r.endpoints, r.ours_view?, r.kube_proxy_view)))
        .collect();
    if !operator.is_empty() {
        println!("\n## What an operator lives with: `nft list ruleset` and `nft monitor` (nft {}), each ruleset loaded with `nft -f`, one run\n", nft_version());
        print!("{}", bench::operator::operator_table(&operator));
    }
    if let Some(path) = &report.plot {
        let per_ten = |f: &dyn Fn(&bench::ControlResult) -> Option<f64>| -> Vec<(f64, f64)> {
            results
                .iter()
                .filter(|r| r.endpoints == r.services * 10)
                .filter_map(|r| f(r).map(|ms| (r.services as f64 / 1000.0, ms / 1000.0)))
                .collect()
        };
        let svg = chart::line_chart(
            "Full sync of N Services × 10 endpoints into an empty namespace",
            "Services (thousands)",
            "seconds",
            &[
                chart::Series {
                    name: "kube-nft (netlink), a process".into(),
                    color: "#1f77b4",
                    points: per_ten(&|r| Some(r.cold_process_ms)),
                },
                chart::Series {
                    name: "nft -f, same rules".into(),
                    color: "#ff7f0e",
                    points: per_ten(&|r| Some(r.nft_f_ms)),
                },
                chart::Series {
                    name: "a numgen map per Service (nft -f)".into(),
                    color: "#d62728",
                    points: per_ten(&|r| r.kube_proxy_shape_ms),
                },
            ],
        );
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if !report.dataplane_sizes.is_empty() {
        let (sizes, seconds) = (&report.dataplane_sizes, report.dataplane_seconds);
        eprintln!("data plane: {sizes:?} Services…");
        let data =
            bench::dataplane::data_plane(sizes, seconds, runs.min(5), &format!("{prefix}-dp"))?;
        println!("\n## Data plane: new TCP connections through one ClusterIP ({seconds} s per run; {} rounds, each running every size and ruleset once; medians)\n", data.rounds);
        print!("{}", bench::dataplane::data_table(&data));
    }
    if let Some((from, to)) = report.growth {
        eprintln!("growth: {from} to {to} Services while a client connects…");
        let g = bench::dataplane::growth(from, to, &format!("{prefix}-gr"))?;
        println!("\n## Growth from {from} to {to} Services × 10, {from} per partial sync, while a client opens new connections through one ClusterIP\n");
        print!("{}", bench::dataplane::growth_table(&g));
    }
    if !report.api_sizes.is_empty() {
        let mut api = Vec::new();
        for services in &report.api_sizes {
            eprintln!("API path: {services} Services through the loopback API server…");
            let mut all = Vec::new();
            for r in 0..runs.max(1) {
                all.push(bench::api_path::api_path(
                    &format!("{prefix}{r}"),
                    *services,
                    10,
                )?);
            }
            api.push(all);
        }
        println!("\n## API path: `kube-nft run --once` fed N Services × 10 endpoints by the loopback API server, in pages of 500 (median of {})\n", runs_text(runs));
        print!("{}", bench::api_path::api_table(&api));
    }
    Ok(())
}

/// The `nft` binary's version, as `nft --version` prints it.
fn nft_version() -> String {
    std::process::Command::new("nft")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// "1 run", "3 runs".
fn runs_text(runs: usize) -> String {
    match runs.max(1) {
        1 => "1 run".into(),
        n => format!("{n} runs"),
    }
}
