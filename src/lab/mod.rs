//! `kube-nft lab`: the whole Service path on one machine, in network namespaces.
//!
//! It builds a node, pods and an outside client (see `topology`), starts a hostname
//! server in every pod, runs one proxy sync in the node namespace, sends requests
//! to each Service port's ClusterIP from the client, and reports which pod answered.
//! It never touches the host's own namespace.

pub mod hostname_server;
pub mod topology;

use crate::core::convert::{build_state, Objects};
use crate::core::net::{Family, Protocol};
use crate::core::node_config::NodeConfig;
use crate::core::policy::usable_endpoints;
use crate::nft::dataplane::NftDataplane;
use crate::nft::names::CHAIN_SERVICES;
use crate::source::files::{self, Loaded};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use topology::Topology;

/// The embedded default: the `hostnames` Service and its three pods.
pub const DEFAULT_MANIFESTS: &str = include_str!("hostnames.yaml");
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
pub const DEFAULT_SERVICE_CIDR: &str = "10.0.0.0/16";

pub struct LabOptions {
    pub manifests: Vec<PathBuf>,
    pub requests: usize,
    pub keep: bool,
    pub prefix: String,
    pub config: NodeConfig,
}

/// A pod process serving its name; killed when dropped.
struct PodServer(Child);

impl Drop for PodServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kube-nft serve` inside a pod namespace and waits until it listens.
fn start_pod_server(netns: &str, name: &str, ports: &BTreeSet<u16>) -> io::Result<PodServer> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--netns", netns, "--name", name]);
    for p in ports {
        cmd.args(["--port", &p.to_string()]);
    }
    // Not the lab's stderr: with --keep the server outlives the lab, and would
    // hold a pipe the lab's output goes into open (`kube-nft lab --keep 2>&1 | cat`).
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(io::Error::other(format!(
            "pod server in {netns} did not start"
        )));
    }
    Ok(PodServer(child))
}

/// One pod to create: its name (from the endpoint's targetRef) and what it serves.
struct PodPlan {
    name: String,
    addrs: Vec<IpAddr>,
    ports: BTreeSet<u16>,
}

/// Pods from EndpointSlices: one per endpoint address, serving every slice port.
fn plan_pods(objects: &Objects) -> Vec<PodPlan> {
    let mut by_addr: BTreeMap<IpAddr, PodPlan> = BTreeMap::new();
    for slice in &objects.slices {
        let ports: BTreeSet<u16> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
            .filter(|p| *p != 0)
            .collect();
        for ep in slice.endpoints.iter().flatten() {
            let Some(addr) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let name = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_else(|| format!("pod-{addr}"));
            let plan = by_addr.entry(addr).or_insert_with(|| PodPlan {
                name,
                addrs: vec![addr],
                ports: BTreeSet::new(),
            });
            plan.ports.extend(ports.iter().copied());
        }
    }
    by_addr.into_values().collect()
}

fn load_objects(manifests: &[PathBuf]) -> io::Result<Loaded> {
    if manifests.is_empty() {
        let loaded = files::parse(DEFAULT_MANIFESTS, "(built-in hostnames example)")
            .expect("the built-in example parses");
        Ok(loaded)
    } else {
        files::load(manifests).map_err(io::Error::other)
    }
}

struct PortResult {
    label: String,
    target: SocketAddr,
    protocol: Protocol,
    expected: BTreeMap<IpAddr, String>,
    answers: BTreeMap<String, usize>,
    failures: Vec<String>,
}

/// Runs the lab and returns whether every check passed.
pub fn run(opts: &LabOptions) -> Result<bool, Box<dyn std::error::Error>> {
    if !rustix::process::geteuid().is_root() {
        return Err(
            "kube-nft lab creates network namespaces and needs root (try: sudo kube-nft lab)"
                .into(),
        );
    }
    opts.config.validate()?;
    let loaded = load_objects(&opts.manifests)?;
    for r in &loaded.rejected {
        println!("rejected: {r}");
    }
    let validated = build_state(&loaded.objects, None);
    for r in &validated.rejected {
        println!("rejected: {r}");
    }
    for r in &validated.skipped_values {
        println!("skipped: {r}; the rest of the object is proxied");
    }
    let plans = plan_pods(&loaded.objects);
    let started = Instant::now();
    let mut topo = Topology::build(&opts.prefix)?;
    let mut servers = Vec::new();
    for plan in &plans {
        let pod = topo.add_pod(&plan.name, &plan.addrs)?;
        servers.push(start_pod_server(&pod.ns.name, &plan.name, &plan.ports)?);
    }
    println!(
        "lab: node {}, client {}, {} pod(s), built in {} ms",
        topo.node.name,
        topo.client.name,
        topo.pods.len(),
        started.elapsed().as_millis()
    );
    for p in &topo.pods {
        let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
        println!("  pod {:<32} {}  ({})", p.name, addrs.join(", "), p.ns.name);
    }

    // The proxy: one sync in the node namespace, through the same path as `run`.
    if let Some(why) = opts.config.nodeports_unserved(&validated.state) {
        println!("note: {why}");
    }
    let state = validated.state.clone();
    let config = opts.config.clone();
    let (ruleset, report, matches) =
        crate::testbed::netns::in_netns(&topo.node.name, move || -> Result<_, String> {
            let mut proxy = crate::assemble::proxy(config.clone()).map_err(|e| e.to_string())?;
            proxy.replace_state(state);
            let report = proxy.sync().map_err(|e| e.to_string())?;
            let matches = proxy.verify().map_err(|e| e.to_string())?;
            let mut nft = NftDataplane::open().map_err(|e| e.to_string())?;
            let ruleset = nft
                .desired_as_placed(proxy.state(), &config)
                .map_err(|e| e.to_string())?;
            Ok((ruleset, report, matches))
        })??;
    println!(
        "proxy: programmed {} netlink messages ({} bytes) in one transaction; kernel readback {}",
        report.committed.messages,
        report.committed.bytes,
        if matches {
            "matches the desired ruleset"
        } else {
            "DIFFERS from the desired ruleset"
        }
    );
    if let Some((_, ipvs)) = report.written.iter().find(|(name, _)| *name == "ipvs") {
        let count = |k: &str| ipvs.counts.iter().find(|(n, _)| *n == k).map_or(0, |c| c.1);
        println!(
            "proxy: IPVS: {} commands ({} bytes), {} addresses on {}",
            count("commands"),
            count("bytes"),
            count("addresses"),
            crate::ipvs::INTERFACE
        );
    }

    let pod_names: BTreeMap<IpAddr, String> = plans
        .iter()
        .flat_map(|p| p.addrs.iter().map(|a| (*a, p.name.clone())))
        .collect();
    let mut results = Vec::new();
    for svc in validated.state.services.values() {
        for vip in &svc.cluster_ips {
            for port in &svc.ports {
                if port.protocol == Protocol::Sctp {
                    println!(
                        "{}: SCTP is not exercised by the lab yet",
                        svc.port_label(port)
                    );
                    continue;
                }
                let eps = validated.state.endpoints_for(svc, port);
                let expected = usable_endpoints(&eps)
                    .into_iter()
                    .filter(|e| Family::of(&e.addr) == Family::of(vip))
                    .map(|e| (e.addr, pod_names.get(&e.addr).cloned().unwrap_or_default()))
                    .collect();
                results.push(PortResult {
                    label: svc.port_label(port),
                    target: SocketAddr::new(*vip, port.port),
                    protocol: port.protocol,
                    expected,
                    answers: BTreeMap::new(),
                    failures: Vec::new(),
                });
            }
        }
    }
    let requests = opts.requests;
    let results = crate::testbed::netns::in_netns(&topo.client.name, move || {
        let mut results = results;
        for r in &mut results {
            for i in 1..=requests {
                let t = Instant::now();
                let answer = match r.protocol {
                    Protocol::Udp => hostname_server::udp_ask(r.target, Duration::from_secs(2)),
                    _ => hostname_server::http_get(r.target, Duration::from_secs(2)),
                };
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                match answer {
                    Ok(name) => {
                        println!(
                            "  {:>3}  {} {}/{}  →  {name}  ({ms:.1} ms)",
                            i, r.label, r.target, r.protocol
                        );
                        *r.answers.entry(name).or_default() += 1;
                    }
                    Err(e) => {
                        println!(
                            "  {:>3}  {} {}/{}  →  error: {e}  ({ms:.1} ms)",
                            i, r.label, r.target, r.protocol
                        );
                        r.failures.push(e.to_string());
                    }
                }
            }
        }
        results
    })?;

    let mut ok = matches;
    // Why the lab failed, in words, for its last line.
    let mut reasons: Vec<String> = Vec::new();
    if !matches {
        reasons.push("the kernel's readback differs from the desired ruleset".into());
    }
    println!("\nsummary");
    for r in &results {
        let answered: usize = r.answers.values().sum();
        println!(
            "  {} ({}/{}): {answered}/{requests} answered",
            r.label, r.target, r.protocol
        );
        if r.expected.is_empty() {
            // No endpoints: every request must have been refused at once.
            let refused = r.failures.iter().filter(|f| f.contains("refused")).count();
            println!("    no endpoints: {refused}/{requests} refused");
            if refused != requests && r.protocol != Protocol::Udp {
                reasons.push(format!(
                    "{}: {} of {requests} requests were not refused",
                    r.label,
                    requests - refused
                ));
            }
            continue;
        }
        let mut idle = Vec::new();
        for (addr, name) in &r.expected {
            let n = r.answers.get(name).copied().unwrap_or(0);
            println!("    {name:<32} {addr:<15} {n:>4}");
            if n == 0 {
                idle.push(name.as_str());
            }
        }
        if !idle.is_empty() {
            let hint = if requests < r.expected.len() {
                format!(
                    " ({requests} requests for {} pods: use more)",
                    r.expected.len()
                )
            } else {
                String::new()
            };
            reasons.push(format!(
                "{}: {} pod(s) got no request: {}{hint}",
                r.label,
                idle.len(),
                idle.join(", ")
            ));
        }
        if !r.failures.is_empty() {
            reasons.push(format!(
                "{}: {} request(s) failed",
                r.label,
                r.failures.len()
            ));
        }
    }
    ok &= reasons.is_empty();

    let families: BTreeSet<Family> = results.iter().map(|r| Family::of(&r.target.ip())).collect();
    // The main table, and the Service tables that hold the demo's Services.
    let shown = ruleset.tables.iter().filter(|t| {
        families.contains(&t.family)
            && (t.id().shard.is_none()
                || t.chains
                    .iter()
                    .any(|c| c.base.is_none() && c.name != CHAIN_SERVICES))
    });
    for table in shown {
        let family = table.family.keyword();
        println!(
            "\n# nft list table {family} {}   (in {})",
            table.name, topo.node.name
        );
        match Command::new("ip")
            .args([
                "netns",
                "exec",
                &topo.node.name,
                "nft",
                "list",
                "table",
                family,
                &table.name,
            ])
            .output()
        {
            Ok(out) if out.status.success() => print!("{}", String::from_utf8_lossy(&out.stdout)),
            _ => {
                println!(
                    "# (nft is not installed; this is kube-nft's rendering of what it programmed)"
                );
                print!("{}", crate::ruleset::text::table(table));
            }
        }
    }

    if opts.config.mode.is_ipvs() {
        println!(
            "\n# IPVS   (in {}; as `ipvsadm -Ln` lists it)",
            topo.node.name
        );
        let listing = crate::testbed::netns::in_netns(&topo.node.name, crate::ipvs::listing)?;
        print!("{}", listing.map_err(|e| e.to_string())?);
    }

    if opts.keep {
        topo.keep();
        // Let the pod servers outlive the lab.
        std::mem::forget(servers);
        println!("\nkept: {} (remove with: for n in {}; do ip netns pids $n | xargs -r kill; ip netns del $n; done)",
            topo.namespaces().join(" "), topo.namespaces().join(" "));
    }
    if ok {
        println!("\nlab passed: every pod answered");
    } else {
        println!("\nlab FAILED: {}", reasons.join("; "));
    }
    Ok(ok)
}
