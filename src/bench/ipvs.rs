//! `kube-nft bench-ipvs`: what the IPVS backend's syncs cost per cluster size
//! (issue #50, item 4), beside the same state written by the tools an operator
//! has. It needs a kernel with IPVS; `benches/ipvs_scale.sh` runs it in the
//! guest (Debian's 6.1 under qemu without KVM, so only the ratios within one
//! run carry over to real hardware).
//!
//! Per size (N Services of E endpoints, one TCP port each), medians of `runs`:
//! - cold: `bench-child --proxy-mode ipvs` in a fresh namespace, the process
//!   timed from its start to its exit;
//! - the tools: the same state in a fresh namespace, each tool a process timed
//!   the same way, added up: `ipvsadm -R` of what the cold sync left
//!   (`ipvsadm -S -n`: the virtual services and real servers), `ip -batch` of
//!   `kube-ipvs0` and its addresses, `nft -f` of the table beside IPVS;
//! - restart: `bench-child` again over the state in place (it reads IPVS,
//!   `kube-ipvs0` and the table back, and writes nothing);
//! - changes in one long-lived proxy, from the model's change to the last
//!   acknowledgement: an endpoint replaced, an endpoint removed, a Service
//!   added, a Service deleted.

use super::{fmt_ms, incremental_changes, median, node_config, run_child, timed_in};
use crate::core::node_config::ModeName;
use crate::nft::translate::translate;
use crate::testbed::netns::{in_netns, Netns};
use crate::testbed::synthetic;
use std::fmt::Write as _;

pub struct IpvsBenchOptions {
    pub sizes: Vec<usize>,
    pub endpoints: usize,
    pub runs: usize,
    pub prefix: String,
}

/// One size's figures, in ms.
struct Row {
    services: usize,
    endpoints: usize,
    cold: f64,
    cold_in_process: f64,
    tools: f64,
    ipvsadm: f64,
    ip: f64,
    nft: f64,
    restart: f64,
    restart_bytes: usize,
    endpoint_replaced: f64,
    endpoint_removed: f64,
    service_added: f64,
    service_deleted: f64,
}

fn measure(opts: &IpvsBenchOptions, services: usize) -> Result<Row, String> {
    let runs = opts.runs.max(1);
    let e = opts.endpoints;
    // bench-child and the synthetic state count endpoints in all.
    let all = services * e;
    let tag = |what: &str, r: usize| format!("{}-{what}{r}", opts.prefix);
    let dir = std::env::temp_dir().join(format!("{}-files", opts.prefix));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let saved = dir.join("ipvsadm.rules");
    let (mut cold, mut restart) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let ns = Netns::create(&tag("cold", r)).map_err(|e| e.to_string())?;
        cold.push(run_child(&ns.name, services, all, ModeName::Ipvs, &[])?);
        restart.push(run_child(&ns.name, services, all, ModeName::Ipvs, &[])?);
        if r == 0 {
            let (_, rules) = timed_in(&ns.name, &["ipvsadm", "-S", "-n"], None)?;
            let reals = rules.lines().filter(|l| l.starts_with("-a ")).count();
            if reals != all {
                let virtuals = rules.lines().filter(|l| l.starts_with("-A ")).count();
                let head: Vec<&str> = rules.lines().take(14).collect();
                return Err(format!(
                    "the cold sync left {virtuals} virtual services and {reals} real servers, not {services} and {all}:\n{}",
                    head.join("\n")
                ));
            }
            std::fs::write(&saved, rules).map_err(|e| e.to_string())?;
        }
    }

    let state = synthetic::state(services, all);
    let config = node_config(ModeName::Ipvs);
    let addresses = dir.join("kube-ipvs0.batch");
    let mut batch = String::from("link add kube-ipvs0 type dummy\n");
    for svc in state.services.values() {
        for ip in &svc.cluster_ips {
            writeln!(batch, "address add {ip}/32 dev kube-ipvs0").unwrap();
        }
    }
    std::fs::write(&addresses, batch).map_err(|e| e.to_string())?;
    let table = dir.join("table.nft");
    let script = crate::ruleset::text::replace_script(&translate(&state, &config).tables);
    std::fs::write(&table, script).map_err(|e| e.to_string())?;
    let (mut ipvsadm, mut ip, mut nft) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs {
        let ns = Netns::create(&tag("tools", r)).map_err(|e| e.to_string())?;
        ipvsadm.push(timed_in(&ns.name, &["ipvsadm", "-R"], Some(&saved))?.0);
        let batch = addresses.to_str().unwrap();
        ip.push(timed_in(&ns.name, &["ip", "-batch", batch], None)?.0);
        nft.push(timed_in(&ns.name, &["nft", "-f", table.to_str().unwrap()], None)?.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tools: Vec<f64> = (0..runs).map(|r| ipvsadm[r] + ip[r] + nft[r]).collect();

    let ns = Netns::create(&tag("inc", 0)).map_err(|e| e.to_string())?;
    let changes = in_netns(&ns.name, move || {
        incremental_changes(state, config, runs.max(11))
    })
    .map_err(|e| e.to_string())??;
    Ok(Row {
        services,
        endpoints: e,
        cold: median(cold.iter().map(|c| c.process_ms).collect()),
        cold_in_process: median(cold.iter().map(|c| c.ms).collect()),
        tools: median(tools),
        ipvsadm: median(ipvsadm),
        ip: median(ip),
        nft: median(nft),
        restart: median(restart.iter().map(|c| c.process_ms).collect()),
        restart_bytes: restart
            .iter()
            .map(|c| c.bytes + c.other_bytes)
            .max()
            .unwrap_or(0),
        endpoint_replaced: changes.endpoint_replaced.0,
        endpoint_removed: changes.endpoint_removed.0,
        service_added: changes.service_added.0,
        service_deleted: changes.service_deleted.0,
    })
}

/// Measures every size; the report, as Markdown.
pub fn run(opts: &IpvsBenchOptions) -> Result<String, String> {
    let mut rows = Vec::new();
    for &services in &opts.sizes {
        eprintln!("IPVS: {services} Services × {} endpoints…", opts.endpoints);
        rows.push(measure(opts, services)?);
    }
    let mut out = format!(
        "IPVS backend, medians of {} runs (processes timed from start to exit)\n\n",
        opts.runs.max(1)
    );
    out += "| Services × endpoints | cold sync | per Service | the tools: ipvsadm -R + ip -batch + nft -f | ours ÷ tools | restart (bytes written) | endpoint replaced | endpoint removed | Service added | Service deleted |\n";
    out += "|---|---|---|---|---|---|---|---|---|---|\n";
    for r in &rows {
        writeln!(
            out,
            "| {} × {} | {} ({} in process) | {:.0} µs | {} ({} + {} + {}) | {:.2} | {} ({} B) | {} | {} | {} | {} |",
            r.services,
            r.endpoints,
            fmt_ms(r.cold),
            fmt_ms(r.cold_in_process),
            r.cold_in_process * 1000.0 / r.services as f64,
            fmt_ms(r.tools),
            fmt_ms(r.ipvsadm),
            fmt_ms(r.ip),
            fmt_ms(r.nft),
            r.cold / r.tools,
            fmt_ms(r.restart),
            r.restart_bytes,
            fmt_ms(r.endpoint_replaced),
            fmt_ms(r.endpoint_removed),
            fmt_ms(r.service_added),
            fmt_ms(r.service_deleted),
        )
        .unwrap();
    }
    Ok(out)
}
