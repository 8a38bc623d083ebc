//! Helpers shared by the integration tests: manifests, namespaces, the binary.
//!
//! Every test builds its own namespaces (unique names) and removes them when it
//! ends, pass or fail; nothing here touches the host's namespace.

#![allow(dead_code)]

pub mod control_plane;
pub mod firewalld;
pub mod foreign_tables;
pub mod kube_proxy_ipvs;
pub mod sctp;
pub mod services;

use kube_nft::lab::hostname_server::{http_get, udp_ask, HostnameServer};
use kube_nft::lab::topology::Topology;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_kube-nft");
pub const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:10:244::/56";
pub const SERVICE_CIDRS: &str = "10.96.0.0/12,fd00:10:96::/112";
/// What `run` needs when its node is a network namespace, as kind gives
/// kube-proxy and the benchmarks give both proxies: `nf_conntrack_max` is the
/// host's, read-only there, so it is left alone (the timeouts are the
/// namespace's own and are set).
pub const IN_A_NETNS: [&str; 2] = ["--conntrack-max-per-core", "0"];

pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests create network namespaces: run them as root (the README's test command does)"
    );
}

/// A name unique to this test in this process: `kt<pid>-<tag>`. Two test
/// binaries, or two runs, never share one; the test command's leftover check
/// reads the pid back, to tell a namespace left behind by a test process that
/// has ended from one that a concurrent run still uses.
pub fn unique(tag: &str) -> String {
    format!("kt{}-{tag}", std::process::id())
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("kube-nft-{}", unique(tag)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `protocol` is TCP, UDP or SCTP; `target` the targetPort.
pub struct Port<'a> {
    pub name: &'a str,
    pub protocol: &'a str,
    pub port: u16,
    pub target: u16,
}

pub fn tcp(port: u16, target: u16) -> Port<'static> {
    Port {
        name: "http",
        protocol: "TCP",
        port,
        target,
    }
}

pub fn udp(port: u16, target: u16) -> Port<'static> {
    Port {
        name: "dns",
        protocol: "UDP",
        port,
        target,
    }
}

pub fn service(name: &str, vips: &[&str], ports: &[Port]) -> String {
    let mut y = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: {}\n  clusterIPs: [{}]\n  ports:\n",
        vips[0],
        vips.join(", ")
    );
    for p in ports {
        y += &format!(
            "  - {{name: {}, protocol: {}, port: {}, targetPort: {}}}\n",
            p.name, p.protocol, p.port, p.target
        );
    }
    y
}

/// One EndpointSlice with ready endpoints at `addrs` (all of one family).
pub fn slice(service: &str, suffix: &str, ports: &[Port], addrs: &[&str]) -> String {
    let family = if addrs.first().is_some_and(|a| a.contains(':')) {
        "IPv6"
    } else {
        "IPv4"
    };
    let mut y = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{suffix}\n  namespace: default\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n"
    );
    for p in ports {
        y += &format!(
            "- {{name: {}, protocol: {}, port: {}}}\n",
            p.name, p.protocol, p.target
        );
    }
    y += if addrs.is_empty() {
        "endpoints: []\n"
    } else {
        "endpoints:\n"
    };
    for a in addrs {
        y += &format!("- addresses: [\"{a}\"]\n  conditions: {{ready: true}}\n");
    }
    y
}

/// Runs the kube-nft binary inside a namespace.
pub fn kube_nft_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns, BIN])
        .args(args)
        .output()
        .expect("running kube-nft")
}

/// `kube-nft run --once` in the node namespace with the test CIDRs; asserts success.
pub fn sync_once(ns: &str, manifests: &Path) -> Output {
    sync_once_with(ns, manifests, &[])
}

/// `COMMAND --manifests PATH` with the test CIDRs: what `run`, `render` and
/// `explain` are given alike.
pub fn proxy_command<'a>(command: &'a str, manifests: &'a Path) -> Vec<&'a str> {
    let mut args = vec![
        command,
        "--manifests",
        manifests.to_str().unwrap(),
        "--cluster-cidr",
        CLUSTER_CIDRS,
        "--service-cidr",
        SERVICE_CIDRS,
    ];
    if command == "run" {
        args.extend(IN_A_NETNS);
    }
    args
}

/// The same, with more flags.
pub fn sync_once_with(ns: &str, manifests: &Path, extra: &[&str]) -> Output {
    let mut args = proxy_command("run", manifests);
    args.push("--once");
    args.extend_from_slice(extra);
    let out = kube_nft_in(ns, &args);
    assert!(
        out.status.success(),
        "kube-nft run --once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A topology with pods serving their names on `ports` (TCP and UDP each).
pub struct Cluster {
    pub servers: Vec<HostnameServer>,
    pub topo: Topology,
    pub scratch: Scratch,
}

impl Cluster {
    pub fn new(tag: &str, pods: &[(&str, &[&str])], ports: &[u16]) -> Cluster {
        require_root();
        let mut topo = Topology::build(&unique(tag)).expect("building the namespaces");
        let mut servers = Vec::new();
        for (name, addrs) in pods {
            let addrs: Vec<IpAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
            let pod = topo.add_pod(name, &addrs).expect("adding a pod");
            servers.push(
                HostnameServer::bind_in(&pod.ns.name, name, ports).expect("starting a pod server"),
            );
        }
        Cluster {
            servers,
            topo,
            scratch: Scratch::new(tag),
        }
    }

    pub fn node(&self) -> &str {
        &self.topo.node.name
    }

    pub fn client(&self) -> &str {
        &self.topo.client.name
    }

    pub fn pod_ns(&self, name: &str) -> String {
        self.topo
            .pods
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .ns
            .name
            .clone()
    }

    /// Writes the manifests and syncs them into the node namespace.
    pub fn apply(&self, manifests: &str) -> Output {
        self.apply_with(manifests, &[])
    }

    pub fn apply_with(&self, manifests: &str, extra: &[&str]) -> Output {
        let path = self.scratch.write("manifests.yaml", manifests);
        sync_once_with(self.node(), &path, extra)
    }
}

#[derive(Debug, Default)]
pub struct Tally {
    pub answers: BTreeMap<String, usize>,
    pub errors: Vec<String>,
}

/// Sends `n` requests (new connection or flow each) to `target` from namespace `ns`.
pub fn tally(ns: &str, target: &str, n: usize, udp_proto: bool) -> Tally {
    let target: SocketAddr = target.parse().unwrap();
    kube_nft::testbed::netns::in_netns(ns, move || {
        let mut t = Tally::default();
        for _ in 0..n {
            let r = if udp_proto {
                udp_ask(target, Duration::from_secs(2))
            } else {
                http_get(target, Duration::from_secs(2))
            };
            match r {
                Ok(name) => *t.answers.entry(name).or_default() += 1,
                Err(e) => t.errors.push(e.to_string()),
            }
        }
        t
    })
    .unwrap()
}

/// One TCP connection attempt from `ns`: how it failed, and how long it took.
pub fn connect_error(
    ns: &str,
    target: &str,
    timeout: Duration,
) -> (Option<std::io::ErrorKind>, Duration) {
    let target: SocketAddr = target.parse().unwrap();
    kube_nft::testbed::netns::in_netns(ns, move || {
        let start = std::time::Instant::now();
        let r = std::net::TcpStream::connect_timeout(&target, timeout);
        (r.err().map(|e| e.kind()), start.elapsed())
    })
    .unwrap()
}

/// A command inside a namespace, which must succeed; its standard output.
pub fn exec_in(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `nft CMD` in a namespace, which must succeed.
pub fn nft_in(ns: &str, cmd: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", cmd])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nft {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the running kernel is `major.minor` or newer.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// The tables of a namespace as `nft list tables` names them ("inet firewalld").
pub fn nft_tables(ns: &str) -> Vec<String> {
    exec_in(ns, &["nft", "list", "tables"])
        .lines()
        .filter_map(|l| l.strip_prefix("table "))
        .map(str::to_string)
        .collect()
}

/// How many NAT hold tables (`node::nat_hold`, one per family) a namespace has.
pub fn nat_holds(ns: &str) -> usize {
    nft_tables(ns)
        .iter()
        .filter(|t| t.ends_with(" kube-nft-nat-hold"))
        .count()
}

/// `nft list ruleset` in a namespace.
pub fn nft_list(ns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "ruleset"])
        .output()
        .expect("running nft (is nftables installed?)");
    assert!(
        out.status.success(),
        "nft list ruleset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The first chain whose name starts with `prefix` in `nft list ruleset` of `ns`,
/// as (`family table`, chain name): where a Service's chains are.
pub fn find_chain(ns: &str, prefix: &str) -> Option<(String, String)> {
    let mut table = None;
    for line in nft_list(ns).lines() {
        if let Some(t) = line.strip_prefix("table ") {
            table = Some(t.trim_end_matches(" {").to_string());
        } else if let Some(rest) = line.trim().strip_prefix("chain ") {
            if rest.starts_with(prefix) {
                return Some((table?, rest.trim_end_matches(" {").to_string()));
            }
        }
    }
    None
}

/// `kube-nft run` (the daemon) in a namespace, logging to a file; killed on drop.
pub struct Daemon {
    child: std::process::Child,
    pub log: PathBuf,
}

impl Daemon {
    /// `run --manifests MANIFESTS` with the test CIDRs and `extra`.
    pub fn start(ns: &str, manifests: &Path, log: PathBuf, extra: &[&str]) -> Daemon {
        let mut args = proxy_command("run", manifests);
        args.extend_from_slice(extra);
        Daemon::spawn(ns, &args, log)
    }

    /// The binary with exactly `args`.
    pub fn spawn(ns: &str, args: &[&str], log: PathBuf) -> Daemon {
        Daemon::spawn_command(Daemon::command(ns, args), log)
    }

    /// The command `spawn` runs, for a test to add to (its environment, say).
    pub fn command(ns: &str, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns, BIN]).args(args);
        command
    }

    /// Any command that ends up exec'ing kube-nft (so that the child is kube-nft).
    pub fn spawn_command(mut command: Command, log: PathBuf) -> Daemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    /// Sends SIGTERM (`ip netns exec` execs the binary: the child is kube-nft) and
    /// waits for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(rustix::process::Signal::TERM);
        self.child.wait().unwrap()
    }

    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics, with its log, if the daemon has exited: a test that waits for it
    /// to serve should say that it died, not that it waited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "kube-nft exited ({status}) while the test waited on it; its log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines of the log that report a sync of this kind ("Full" or "Partial").
    pub fn syncs(&self, kind: &str) -> usize {
        self.log_text()
            .lines()
            .filter(|l| l.contains("synced") && l.contains(&format!("kind={kind}")))
            .count()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 100 ms until it holds; returns how long that took.
/// Waits up to `limit` for `child` to exit: its status, or `None` after killing
/// it, for a test that must fail rather than hang on a process that never ends.
pub fn exit_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = std::time::Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// Whether one request to `target` from `ns` is answered.
pub fn answers(ns: &str, target: &str) -> bool {
    let t = tally(ns, target, 1, false);
    t.errors.is_empty()
}

/// One HTTP GET from inside `ns`: the status code and body, or `None` if there
/// was no answer.
pub fn http_status(ns: &str, addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr: SocketAddr = addr.parse().unwrap();
    let path = path.to_string();
    kube_nft::testbed::netns::in_netns(ns, move || {
        let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .ok()?;
        let mut resp = String::new();
        conn.read_to_string(&mut resp).ok()?;
        let (head, body) = resp.split_once("\r\n\r\n")?;
        let code = head.split(' ').nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    })
    .unwrap()
}

/// Three pods serving on 9376, behind the Service `web` at `WEB_VIP`.
pub const WEB_PODS: [(&str, &[&str]); 3] = [
    ("pod-a", &["10.244.0.11"]),
    ("pod-b", &["10.244.0.12"]),
    ("pod-c", &["10.244.0.13"]),
];
pub const WEB_VIP: &str = "10.96.0.10:80";

/// The Service `web` and its slice, with these endpoints.
pub fn web(endpoints: &[&str]) -> String {
    service("web", &["10.96.0.10"], &[tcp(80, 9376)])
        + &slice("web", "a", &[tcp(80, 9376)], endpoints)
}

/// `kube-nft run` serving `web` from the three pods once it answers, with a
/// resync period of an hour: only nf_tables notifications can start a repair.
/// The manifest file it reads is returned to be rewritten.
pub fn serve_web_on_notifications_only(tag: &str) -> (Cluster, PathBuf, Daemon) {
    let c = Cluster::new(tag, &WEB_PODS, &[9376]);
    let manifests = c.scratch.write(
        "web.yaml",
        &web(&["10.244.0.11", "10.244.0.12", "10.244.0.13"]),
    );
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("log"),
        &["--sync-period", "1h", "--min-sync-period", "100ms"],
    );
    wait_until(Duration::from_secs(10), "the first sync", || {
        answers(c.client(), WEB_VIP)
    });
    (c, manifests, d)
}

/// What a client opening a new connection to `target` every 20 ms saw
/// (`keep_connecting`).
pub struct Load {
    pub target: String,
    /// How long each answered request took.
    pub times: Vec<Duration>,
    /// How each failed request failed, and after how long.
    pub failed: Vec<(String, Duration)>,
}

impl Load {
    pub fn longest(&self) -> Duration {
        self.times.iter().max().copied().unwrap_or_default()
    }

    /// Requests answered only on their SYN's retransmission (TCP's first after 1 s).
    pub fn retried(&self) -> usize {
        self.times
            .iter()
            .filter(|t| **t >= Duration::from_millis(900))
            .count()
    }

    pub fn summary(&self) -> String {
        format!(
            "{}: {} requests, {} failed ({:?}), {} answered on a SYN retransmission, longest {:?}",
            self.target,
            self.times.len() + self.failed.len(),
            self.failed.len(),
            self.failed,
            self.retried(),
            self.longest()
        )
    }
}

/// A client in `client` opening a new connection every 20 ms to each of
/// `targets` while `disturb` runs `rounds` times, 2 s apart (after 1 s of load
/// alone): what each `disturb` returned, and what the client saw per target.
pub fn under_load<T>(
    client: &str,
    targets: &[&str],
    rounds: usize,
    mut disturb: impl FnMut() -> T,
) -> (Vec<T>, Vec<Load>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = targets
        .iter()
        .map(|target| keep_connecting(client, target, Duration::from_secs(5), stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let mut results = Vec::new();
    for _ in 0..rounds {
        results.push(disturb());
        std::thread::sleep(Duration::from_secs(2));
    }
    stop.store(true, Ordering::Relaxed);
    let loads = clients.into_iter().map(|c| c.join().unwrap()).collect();
    (results, loads)
}

/// What a flood of new connections saw (`flood_connections`).
#[derive(Debug, Default)]
pub struct Flood {
    pub answered: usize,
    /// Not answered within the connect timeout: a SYN that came while the
    /// rules were missing goes nowhere until its retransmission, 1 s later.
    pub unanswered: usize,
    /// Refused: when each connection began (since the epoch) and how long
    /// the refusal took.
    pub refused: Vec<(Duration, Duration)>,
    pub other: Vec<String>,
}

impl Flood {
    fn add(&mut self, other: Flood) {
        self.answered += other.answered;
        self.unanswered += other.unanswered;
        self.refused.extend(other.refused);
        self.other.extend(other.other);
    }
}

/// `threads` clients in `ns` each opening connections to `target` back to
/// back until `stop`, each given 300 ms to connect and reset once it has (a
/// reset leaves no client port waiting in TIME_WAIT): what they saw together.
pub fn flood_connections(
    ns: &str,
    target: &str,
    threads: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Flood> {
    let addr: SocketAddr = target.parse().unwrap();
    let clients: Vec<_> = (0..threads)
        .map(|_| {
            let (ns, stop) = (ns.to_string(), stop.clone());
            std::thread::spawn(move || {
                kube_nft::testbed::netns::in_netns(&ns, move || {
                    let mut seen = Flood::default();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let began = std::time::SystemTime::now();
                        let started = std::time::Instant::now();
                        match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                            Ok(s) => {
                                rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO))
                                    .unwrap();
                                seen.answered += 1;
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                                let at = began.duration_since(std::time::UNIX_EPOCH).unwrap();
                                seen.refused.push((at, started.elapsed()));
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                                seen.unanswered += 1
                            }
                            Err(e) => seen.other.push(e.to_string()),
                        }
                    }
                    seen
                })
                .unwrap()
            })
        })
        .collect();
    std::thread::spawn(move || {
        let mut all = Flood::default();
        for c in clients {
            all.add(c.join().unwrap());
        }
        all
    })
}

/// `web`'s NodePort (`serve_web_with_node_port`).
pub const WEB_NODE_PORT: u16 = 30080;

/// `kube-nft run` serving `web` from the three pods of `c` as a NodePort
/// Service too, on this node (its Node object gives the address), with a resync
/// period of an hour, once both answer the client.
pub fn serve_web_with_node_port(c: &Cluster) -> Daemon {
    use services::{node_object, node_port, svc, NODE};
    let manifests = c.scratch.write(
        "web.yaml",
        &(node_object("zone-a")
            + &svc(
                "web",
                &format!("  type: NodePort\n  clusterIP: 10.96.0.10\n  ports: [{{name: http, port: 80, targetPort: 9376, nodePort: {WEB_NODE_PORT}}}]"),
                "",
            )
            + &slice(
                "web",
                "a",
                &[tcp(80, 9376)],
                &["10.244.0.11", "10.244.0.12", "10.244.0.13"],
            )),
    );
    let d = Daemon::start(
        c.node(),
        &manifests,
        c.scratch.0.join("log"),
        &[
            "--node-name",
            NODE,
            "--sync-period",
            "1h",
            "--min-sync-period",
            "100ms",
        ],
    );
    let node_port = node_port(WEB_NODE_PORT);
    wait_until(Duration::from_secs(10), "the first sync", || {
        answers(c.client(), WEB_VIP) && answers(c.client(), &node_port)
    });
    d
}

/// A client in `ns` opening a new connection to `target` every 20 ms, each
/// given `timeout` to connect and to be answered, until `stop`: what it saw.
pub fn keep_connecting(
    ns: &str,
    target: &str,
    timeout: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Load> {
    let (ns, name) = (ns.to_string(), target.to_string());
    let addr: SocketAddr = target.parse().unwrap();
    std::thread::spawn(move || {
        kube_nft::testbed::netns::in_netns(&ns, move || {
            let mut load = Load {
                target: name,
                times: Vec::new(),
                failed: Vec::new(),
            };
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = std::time::Instant::now();
                match http_get(addr, timeout) {
                    Ok(_) => load.times.push(started.elapsed()),
                    Err(e) => load.failed.push((e.to_string(), started.elapsed())),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            load
        })
        .unwrap()
    })
}

/// `kube-nft cleanup --kube-proxy` in `node`, while a client in `client` keeps
/// connecting to `target`, from before it to after it: its log, once it has
/// succeeded and every connection was answered.
pub fn cleanup_kube_proxy_while_connecting(node: &str, client: &str, target: &str) -> String {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let asking = keep_connecting(client, target, Duration::from_secs(2), stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let out = kube_nft_in(node, &["cleanup", "--kube-proxy"]);
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let load = asking.join().unwrap();
    assert!(
        load.failed.is_empty(),
        "failed while cleaning up: {:?}\n{log}",
        load.failed
    );
    assert!(load.times.len() >= 10, "{}", load.summary());
    log
}

/// Notifications the kernel dropped for netfilter netlink sockets in `ns`
/// because their receive queue was full (the `Drops` column of
/// /proc/net/netlink, protocol 12).
pub fn netfilter_netlink_drops(ns: &str) -> u64 {
    exec_in(ns, &["cat", "/proc/net/netlink"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&"12")).then(|| f.get(8)?.parse::<u64>().ok())?
        })
        .sum()
}

/// The value of one metric sample (`name` with its labels, as exposed).
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
