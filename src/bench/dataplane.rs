//! Data plane: new TCP connections per second, and the connect latency (the first
//! packet's trip through NAT), through one ClusterIP while 1, 1k, 10k… Services are
//! programmed, with kube-nft's ruleset, with kube-nft's ruleset as it was before
//! issue #31 (a chain and map per Service port, loaded by `nft -f`), and with
//! kube-proxy's iptables-mode shape (KUBE-SERVICES → KUBE-SVC-* with `statistic`
//! → KUBE-SEP-* DNAT) loaded by `iptables-legacy-restore`, in the same topology
//! and the same run.

use super::median;
use crate::core::model::ClusterState;
use crate::core::net::Family;
use crate::lab::topology::Topology;
use crate::nft::service_tables::shard_of;
use crate::ruleset::{TableId, SERVICE_SHARDS};
use crate::testbed::netns::{in_netns, sysctl_in};
use crate::testbed::synthetic::{self, service_key, vip};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BACKEND_PORT: u16 = 8080;

#[derive(Debug, Clone)]
pub struct DataResult {
    pub services: usize,
    pub ruleset: &'static str,
    pub load_ms: f64,
    pub conns_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub failed: usize,
}

/// The pods' server on `BACKEND_PORT`: accepts connections and drops them, as
/// cheaply as possible, or (`sink`) reads each to its end, for long flows.
pub(crate) struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    netns: String,
}

impl EchoServer {
    pub(crate) fn start(netns: &str) -> Result<EchoServer, String> {
        EchoServer::serve(netns, false)
    }

    pub(crate) fn sink(netns: &str) -> Result<EchoServer, String> {
        EchoServer::serve(netns, true)
    }

    fn serve(netns: &str, sink: bool) -> Result<EchoServer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = netns.to_string();
        let thread = std::thread::spawn(move || {
            let listener = crate::testbed::netns::enter(&ns).and_then(|_| listen(BACKEND_PORT));
            let listener = match listener {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) if sink => {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut conn, &mut std::io::sink());
                        });
                    }
                    _ => {}
                }
            }
        });
        rx.recv().map_err(|e| e.to_string())??;
        Ok(EchoServer {
            stop,
            thread: Some(thread),
            netns: netns.to_string(),
        })
    }
}

/// A listener with a deep accept queue. std's holds 128 connections: at 19k
/// new connections a second, 7 ms without a turn for the accepting thread (a
/// sync busy on both cores) overflowed it, the kernel dropped the handshake's
/// last packet (`TcpExtListenOverflows`), and the client's connect timed out.
fn listen(port: u16) -> std::io::Result<TcpListener> {
    use rustix::net::{
        bind, listen, socket, sockopt::set_socket_reuseaddr, AddressFamily, SocketAddrV4,
        SocketType,
    };
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None)?;
    set_socket_reuseaddr(&fd, true)?;
    bind(
        &fd,
        &SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, port),
    )?;
    listen(&fd, 4096)?;
    Ok(TcpListener::from(fd))
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocked accept from inside the pod's namespace, on its loopback.
        let _ = in_netns(&self.netns, || {
            TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], BACKEND_PORT)),
                Duration::from_secs(1),
            )
        });
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Opens and resets connections to `target` for `seconds`; returns the connect
/// latencies in µs and the number of failures.
pub(crate) fn hammer(target: SocketAddr, seconds: f64) -> (Vec<f64>, usize) {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut lat, mut failed) = (Vec::new(), 0);
    while Instant::now() < deadline {
        let t = Instant::now();
        match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
            Ok(s) => {
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                // Reset instead of closing: no TIME_WAIT, so ports never run out.
                let _ = rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO));
            }
            Err(_) => failed += 1,
        }
    }
    (lat, failed)
}

/// `hammer` until `stop` is set.
fn hammer_until(target: SocketAddr, stop: &AtomicBool) -> (Vec<f64>, usize) {
    let (mut lat, mut failed) = (Vec::new(), 0);
    while !stop.load(Ordering::Relaxed) {
        let (l, f) = hammer(target, 0.1);
        lat.extend(l);
        failed += f;
    }
    (lat, failed)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `flows` TCP connections to `target` that each send as fast as they can for
/// `seconds`: their total throughput in Gbit/s (bytes the client wrote).
/// Its threads start in the network namespace of the thread that calls it.
pub(crate) fn bulk(target: SocketAddr, seconds: f64, flows: usize) -> Result<f64, String> {
    let senders: Vec<_> = (0..flows)
        .map(|_| {
            std::thread::spawn(move || -> Result<u64, String> {
                let mut conn = TcpStream::connect_timeout(&target, Duration::from_secs(3))
                    .map_err(|e| format!("{target}: {e}"))?;
                let buf = vec![0u8; 128 * 1024];
                let deadline = Instant::now() + Duration::from_secs_f64(seconds);
                let mut sent = 0u64;
                while Instant::now() < deadline {
                    sent += conn.write(&buf).map_err(|e| e.to_string())? as u64;
                }
                Ok(sent)
            })
        })
        .collect();
    let mut total = 0;
    for s in senders {
        total += s.join().map_err(|_| "a sender panicked".to_string())??;
    }
    Ok(total as f64 * 8.0 / seconds / 1e9)
}

/// kube-proxy's iptables-mode nat and filter tables for the same Services, for
/// iptables-restore.
pub fn iptables_shape(state: &ClusterState, cluster_cidr: &str) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for (i, (key, svc)) in state.services.iter().enumerate() {
        let eps = state.endpoints_for(svc, &svc.ports[0]);
        let vip = svc.cluster_ips[0];
        let svc_chain = format!("KUBE-SVC-{i:011X}");
        writeln!(chains, ":{svc_chain} - [0:0]").unwrap();
        writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"{}/{}:http cluster IP\" -m tcp --dport 80 -j {svc_chain}",
            key.namespace, key.name
        )
        .unwrap();
        writeln!(rules, "-A {svc_chain} ! -s {cluster_cidr} -d {vip}/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ").unwrap();
        let n = eps.len();
        for (k, e) in eps.iter().enumerate() {
            let sep = format!("KUBE-SEP-{i:07X}{k:04X}");
            writeln!(chains, ":{sep} - [0:0]").unwrap();
            if k + 1 < n {
                writeln!(
                    rules,
                    "-A {svc_chain} -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / (n - k) as f64
                )
                .unwrap();
            } else {
                writeln!(rules, "-A {svc_chain} -j {sep}").unwrap();
            }
            writeln!(rules, "-A {sep} -s {}/32 -j KUBE-MARK-MASQ", e.addr).unwrap();
            writeln!(
                rules,
                "-A {sep} -p tcp -m tcp -j DNAT --to-destination {}:{}",
                e.addr, e.port
            )
            .unwrap();
        }
    }
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n{chains}\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
-A KUBE-POSTROUTING -j MASQUERADE --random-fully\n{rules}COMMIT\n{KUBE_PROXY_FILTER}"
    )
}

/// The filter table kube-proxy's iptables mode writes beside its nat table; every
/// packet through the node meets it. Its Service chains are empty here (every
/// Service has endpoints, none has a NodePort or a load balancer). Without the
/// `nfacct` counter on the INVALID drop: this kernel has no xt_nfacct.
const KUBE_PROXY_FILTER: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
";

/// kube-nft's ruleset as it was before issue #31, for `nft -f`: today's main
/// tables, and Service tables that hold a chain and an endpoint map per Service
/// port, the dispatch element going to the port's chain (docs/DESIGN.md, "The
/// Service chain's shape, chosen again"). IPv4 and TCP, as the synthetic
/// cluster is.
pub fn per_service_layout(state: &ClusterState) -> String {
    let config = synthetic::node_config();
    let rs = crate::nft::translate::translate(state, &config);
    let mut out: String = rs
        .tables
        .iter()
        .filter(|t| t.id().shard.is_none())
        .map(crate::ruleset::text::table)
        .collect();
    let mut shards: BTreeMap<u16, (String, Vec<String>)> = BTreeMap::new();
    for (i, (key, svc)) in state.services.iter().enumerate() {
        let port = &svc.ports[0];
        let eps = state.endpoints_for(svc, port);
        if eps.is_empty() {
            continue;
        }
        let (body, dispatch) = shards.entry(shard_of(key, SERVICE_SHARDS)).or_default();
        let chain = format!("svc-{i:06}");
        let pick = match eps.as_slice() {
            [e] => format!("dnat to {}:{}", e.addr, e.port),
            _ => {
                let slots: Vec<String> = eps
                    .iter()
                    .enumerate()
                    .map(|(k, e)| format!("{k} : {} . {}", e.addr, e.port))
                    .collect();
                writeln!(
                    body,
                    "\tmap ep-{i:06} {{ typeof numgen random mod 1 : ip daddr . tcp dport; elements = {{ {} }} }}",
                    slots.join(", ")
                )
                .unwrap();
                format!("dnat ip to numgen random mod {} map @ep-{i:06}", eps.len())
            }
        };
        writeln!(body, "\tchain {chain} {{ meta l4proto tcp {pick}; }}").unwrap();
        dispatch.push(format!(
            "{} . tcp . {} : goto {chain}",
            svc.cluster_ips[0], port.port
        ));
    }
    for (shard, (body, dispatch)) in shards {
        let table = TableId::shard(Family::Ip, shard).name();
        let _ = write!(
            out,
            "table ip {table} {{\n\tmap service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; }}\n\
             \tchain nat-prerouting {{ type nat hook prerouting priority -99; policy accept; jump services; }}\n\
             \tchain nat-output {{ type nat hook output priority -99; policy accept; jump services; }}\n\
             \tchain services {{ ip daddr . meta l4proto . th dport vmap @service-ips; }}\n{body}}}\n"
        );
        for part in dispatch.chunks(1000) {
            let _ = writeln!(
                out,
                "add element ip {table} service-ips {{ {} }}",
                part.join(", ")
            );
        }
    }
    out
}

fn run_in(ns: &str, program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Where a data-plane run happens: the lab's node and client, and one pod with
/// ten addresses whose server accepts every connection.
struct Stage {
    // Dropped first: it wakes its accept from inside the pod's namespace.
    _server: EchoServer,
    topo: Topology,
    backend: Vec<IpAddr>,
}

impl Stage {
    fn build(prefix: &str) -> Result<Stage, String> {
        let mut topo = Topology::build(prefix).map_err(|e| e.to_string())?;
        let backend: Vec<IpAddr> = (1..=10).map(|k| IpAddr::from([10, 200, 0, k])).collect();
        let pod_ns = topo
            .add_pod("backend", &backend)
            .map_err(|e| e.to_string())?
            .ns
            .name
            .clone();
        let server = EchoServer::start(&pod_ns)?;
        // Reset connections leave no entry that a new one could collide with.
        sysctl_in(
            &topo.node.name,
            "net.netfilter.nf_conntrack_tcp_timeout_close",
            "1",
        )
        .ok();
        Ok(Stage {
            _server: server,
            topo,
            backend,
        })
    }
}

/// The Services of a data-plane run: `services` of them, the one in the middle
/// (what the client talks to) backed by the pod's ten addresses.
fn cluster(services: usize, backend: &[IpAddr]) -> (ClusterState, SocketAddr) {
    let mut state = synthetic::state(services, services * 10);
    let m = services / 2;
    state.slices.insert(
        service_key(m),
        [synthetic::slice(m, backend)].into_iter().collect(),
    );
    (state, SocketAddr::new(vip(m), 80))
}

/// Every size and ruleset once per round, rounds repeated: a slow drift of the
/// machine (two shared cores) then touches every configuration alike, and the
/// ratios are taken within a round, where it cancels.
pub fn data_plane(
    sizes: &[usize],
    seconds: f64,
    runs: usize,
    prefix: &str,
) -> Result<DataPlane, String> {
    let stage = Stage::build(prefix)?;
    let (topo, backend) = (&stage.topo, &stage.backend);
    let node = topo.node.name.clone();
    let client = topo.client.name.clone();
    let clusters: Vec<(usize, ClusterState, SocketAddr)> = sizes
        .iter()
        .map(|&n| {
            let (state, target) = cluster(n, backend);
            (n, state, target)
        })
        .collect();
    let mut rounds: Vec<Vec<Sample>> = Vec::new();
    // Rulesets the kernel would not take at a size, and why: not tried again.
    let mut unloadable: BTreeMap<(usize, &str), String> = BTreeMap::new();
    for _ in 0..runs.max(1) {
        let mut round = Vec::new();
        for (n, state, target) in &clusters {
            for ruleset in RULESETS {
                if unloadable.contains_key(&(*n, ruleset)) {
                    continue;
                }
                let start = Instant::now();
                let loaded = match ruleset {
                    KUBE_NFT => {
                        let s = state.clone();
                        in_netns(&node, move || -> Result<(), String> {
                            let mut p = crate::assemble::proxy(synthetic::node_config())
                                .map_err(|e| e.to_string())?;
                            p.replace_state(s);
                            p.sync().map(|_| ()).map_err(|e| e.to_string())
                        })
                        .map_err(|e| e.to_string())??;
                        Ok(())
                    }
                    PER_SERVICE => {
                        run_in(&node, "nft", &["-f", "-"], Some(&per_service_layout(state)))
                    }
                    _ => run_in(
                        &node,
                        "iptables-legacy-restore",
                        &[],
                        Some(&iptables_shape(state, synthetic::CLUSTER_CIDR)),
                    ),
                };
                if let Err(e) = loaded {
                    // Another's ruleset the kernel refuses (kube-proxy's iptables
                    // shape at 100k passes legacy iptables' 512 MiB table limit)
                    // is reported, and the run goes on.
                    eprintln!("  {ruleset} at {n} Services: {e}");
                    unloadable.insert((*n, ruleset), e);
                    continue;
                }
                let load_ms = start.elapsed().as_secs_f64() * 1000.0;
                run_in(&node, "conntrack", &["-F"], None).ok();
                let target = *target;
                let (latencies, failed) = in_netns(&client, move || hammer(target, seconds))
                    .map_err(|e| e.to_string())?;
                round.push(Sample {
                    services: *n,
                    ruleset,
                    load_ms,
                    rate: latencies.len() as f64 / seconds,
                    latencies,
                    failed,
                });
                if ruleset != IPTABLES {
                    in_netns(&node, || {
                        let mut s = crate::netlink::NftSocket::open()?;
                        crate::nft::kernel::cleanup(&mut s).map_err(std::io::Error::other)
                    })
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                } else {
                    for table in ["nat", "filter"] {
                        run_in(&node, "iptables-legacy", &["-t", table, "-F"], None)?;
                        run_in(&node, "iptables-legacy", &["-t", table, "-X"], None)?;
                    }
                }
            }
        }
        rounds.push(round);
    }
    let mut dp = DataPlane::from_rounds(sizes, rounds);
    dp.unloadable = unloadable
        .into_iter()
        .map(|((n, rs), e)| (n, rs.to_string(), e))
        .collect();
    Ok(dp)
}

/// Growing the cluster while a client connects: one step of Services added.
pub struct GrowthStep {
    pub services: usize,
    pub sync_ms: f64,
    pub bytes: usize,
}

/// The growth's steps, and the client's connections through all of them.
pub struct Growth {
    pub from: usize,
    pub steps: Vec<GrowthStep>,
    pub connections: usize,
    pub failed: usize,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The cluster grown from `from` Services to `to`, `from` at a time, each step
/// one partial sync of one long-lived proxy, while a client opens new
/// connections through one ClusterIP from before the first step to after the
/// last: every step's sync, and the connections made and failed meanwhile.
pub fn growth(from: usize, to: usize, prefix: &str) -> Result<Growth, String> {
    let stage = Stage::build(prefix)?;
    let (topo, backend) = (&stage.topo, &stage.backend);
    let (state, target) = cluster(from, backend);
    let node = topo.node.name.clone();
    let client = topo.client.name.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready, programmed) = std::sync::mpsc::channel::<()>();
    let clients = std::thread::spawn({
        let stop = stop.clone();
        move || {
            // From the first full sync on.
            programmed.recv().map_err(|e| e.to_string())?;
            in_netns(&client, move || hammer_until(target, &stop)).map_err(|e| e.to_string())
        }
    });
    let steps = in_netns(&node, move || -> Result<Vec<GrowthStep>, String> {
        let mut p = crate::assemble::proxy(synthetic::node_config()).map_err(|e| e.to_string())?;
        p.replace_state(state);
        p.sync().map_err(|e| e.to_string())?;
        let _ = ready.send(());
        std::thread::sleep(Duration::from_millis(500));
        let mut steps = Vec::new();
        let mut n = from;
        while n < to {
            let next = (n + from).min(to);
            for i in n..next {
                synthetic::add_service(&mut p, i, 10);
            }
            let r = p.sync().map_err(|e| e.to_string())?;
            steps.push(GrowthStep {
                services: next,
                sync_ms: r.duration.as_secs_f64() * 1000.0,
                bytes: r.committed.bytes,
            });
            n = next;
        }
        Ok(steps)
    })
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let steps = steps?;
    let (mut latencies, failed) = clients
        .join()
        .map_err(|_| "the client thread panicked".to_string())??;
    latencies.sort_by(|a, b| a.total_cmp(b));
    Ok(Growth {
        from,
        steps,
        connections: latencies.len(),
        failed,
        p50_us: percentile(&latencies, 0.5),
        p99_us: percentile(&latencies, 0.99),
    })
}

pub fn growth_table(g: &Growth) -> String {
    let mut out = format!(
        "Connections through one ClusterIP all along: {} made, {} failed; connect p50 {:.0} µs, p99 {:.0} µs.\n\n| Services after the step | partial sync | bytes |\n|---|---|---|\n",
        g.connections, g.failed, g.p50_us, g.p99_us
    );
    for s in &g.steps {
        let _ = writeln!(
            out,
            "| {} | {:.0} ms | {} |",
            s.services, s.sync_ms, s.bytes
        );
    }
    out
}

const KUBE_NFT: &str = "kube-nft";
const PER_SERVICE: &str = "kube-nft before #31 (a chain and map per Service)";
const IPTABLES: &str = "iptables (kube-proxy shape)";
const RULESETS: [&str; 3] = [KUBE_NFT, PER_SERVICE, IPTABLES];

/// One size and ruleset in one round.
struct Sample {
    services: usize,
    ruleset: &'static str,
    load_ms: f64,
    rate: f64,
    latencies: Vec<f64>,
    failed: usize,
}

/// The data-plane results: per size and ruleset, and the paired ratios.
pub struct DataPlane {
    pub results: Vec<DataResult>,
    /// Size, ruleset and the load's error, for what the kernel refused.
    pub unloadable: Vec<(usize, String, String)>,
    pub rounds: usize,
    /// Per size above the smallest, per round: kube-nft at that size over
    /// kube-nft at the smallest, and kube-nft over the iptables shape.
    pub ratios: Vec<PairedRatios>,
    pub smallest: usize,
}

pub struct PairedRatios {
    pub services: usize,
    pub scale: Vec<f64>,
    pub per_service: Vec<f64>,
    pub iptables: Vec<f64>,
}

impl DataPlane {
    fn from_rounds(sizes: &[usize], rounds: Vec<Vec<Sample>>) -> DataPlane {
        let rate = |round: &[Sample], n: usize, rs: &str| {
            round
                .iter()
                .find(|s| s.services == n && s.ruleset == rs)
                .map(|s| s.rate)
        };
        let smallest = sizes[0];
        let ratio = |round: &[Sample], (n1, rs1): (usize, &str), (n2, rs2): (usize, &str)| {
            Some(rate(round, n1, rs1)? / rate(round, n2, rs2)?)
        };
        let ratios = sizes[1..]
            .iter()
            .map(|&n| PairedRatios {
                services: n,
                scale: rounds
                    .iter()
                    .filter_map(|r| ratio(r, (n, KUBE_NFT), (smallest, KUBE_NFT)))
                    .collect(),
                per_service: rounds
                    .iter()
                    .filter_map(|r| ratio(r, (n, KUBE_NFT), (n, PER_SERVICE)))
                    .collect(),
                iptables: rounds
                    .iter()
                    .filter_map(|r| ratio(r, (n, KUBE_NFT), (n, IPTABLES)))
                    .collect(),
            })
            .collect();
        let mut results = Vec::new();
        for &n in sizes {
            for ruleset in RULESETS {
                let samples: Vec<&Sample> = rounds
                    .iter()
                    .flatten()
                    .filter(|s| s.services == n && s.ruleset == ruleset)
                    .collect();
                if samples.is_empty() {
                    continue;
                }
                let mut all: Vec<f64> = samples
                    .iter()
                    .flat_map(|s| s.latencies.iter().copied())
                    .collect();
                all.sort_by(|a, b| a.total_cmp(b));
                results.push(DataResult {
                    services: n,
                    ruleset,
                    load_ms: median(samples.iter().map(|s| s.load_ms).collect()),
                    conns_per_sec: median(samples.iter().map(|s| s.rate).collect()),
                    p50_us: percentile(&all, 0.5),
                    p99_us: percentile(&all, 0.99),
                    failed: samples.iter().map(|s| s.failed).sum(),
                });
            }
        }
        DataPlane {
            results,
            unloadable: Vec::new(),
            rounds: rounds.len(),
            ratios,
            smallest,
        }
    }
}

pub fn data_table(dp: &DataPlane) -> String {
    let mut out = String::from("| Services programmed | ruleset | load time | new connections/s | connect p50 | connect p99 | failed |\n|---|---|---|---|---|---|---|\n");
    for r in &dp.results {
        writeln!(
            out,
            "| {} | {} | {:.0} ms | {:.0} | {:.0} µs | {:.0} µs | {} |",
            r.services, r.ruleset, r.load_ms, r.conns_per_sec, r.p50_us, r.p99_us, r.failed
        )
        .unwrap();
    }
    for (n, ruleset, e) in &dp.unloadable {
        writeln!(
            out,
            "| {n} | {ruleset} | the kernel refused it: {} | | | | |",
            e.trim().replace('\n', " ")
        )
        .unwrap();
    }
    let spread = |v: &[f64]| {
        if v.is_empty() {
            return "—".to_string();
        }
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let list: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        format!("{:.2}× (rounds: {})", median(v), list.join(", "))
    };
    let _ = write!(
        out,
        "\nRatios of connection rates paired within each of {} rounds (median, then each round):\n\n| Services | kube-nft / kube-nft at {} | kube-nft / kube-nft before #31 | kube-nft / iptables shape |\n|---|---|---|---|\n",
        dp.rounds, dp.smallest
    );
    for r in dp.ratios.iter().filter(|r| !r.scale.is_empty()) {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            r.services,
            spread(&r.scale),
            spread(&r.per_service),
            spread(&r.iptables)
        )
        .unwrap();
    }
    out
}
