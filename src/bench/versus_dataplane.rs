//! The data plane of `bench-kube-proxy` (issue #49): once each contender has
//! synced a size, its ruleset as `nft list ruleset` printed it is kept, and in
//! rounds every kept ruleset is loaded again with `nft -f` on the bare node and
//! measured with the same client and the same pods:
//!
//! - new connections per second through the probe's ClusterIP, and the connect
//!   latency (the SYN's trip through NAT to the SYN-ACK), p50 and p99;
//! - one long TCP flow's throughput through the ClusterIP, and 16 at once;
//! - the connections and one flow through the probe's NodePort, from outside.
//!
//! The client is a namespace outside the node (an address outside the cluster
//! CIDR, routed to the node), the pods one namespace with ten addresses on a
//! veth to the node. The probe Service's endpoints are those addresses. Ratios
//! are taken within a round (the machine's drift cancels), and the medians of
//! the rounds reported. A contender that is not running cannot repair or
//! change its rules: the ruleset is what it wrote, frozen.

use super::dataplane::{bulk, hammer, percentile, EchoServer};
use super::{flush_conntrack, median};
use crate::testbed::netns::{in_netns, sysctl_in, Netns};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The probe Service's NodePort.
pub const NODE_PORT: u16 = 30080;
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const CLIENT_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

/// The pods' addresses: the probe Service's ten endpoints, inside the cluster
/// CIDR (10.128.0.0/9) and clear of the synthetic endpoints (10.128.0.0 on).
pub fn pod_addresses() -> Vec<IpAddr> {
    (1..=10).map(|k| IpAddr::from([10, 200, 0, k])).collect()
}

/// One ruleset's figures in one round.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    pub conns_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub gbit_1: f64,
    pub gbit_16: f64,
    pub np_conns_per_sec: f64,
    pub np_p50_us: f64,
    pub np_p99_us: f64,
    pub np_gbit_1: f64,
    pub failed: usize,
}

/// The client and the pods around this (the node's) namespace; gone when dropped.
pub struct Stage {
    /// Accepts connections to the pods for the whole run (the contenders'
    /// first traffic goes to them), except while a long flow's sink listens.
    /// Dropped before the namespaces.
    resident: std::cell::RefCell<Option<EchoServer>>,
    client: Netns,
    pods: Netns,
}

/// `ip ARGS` in this (the node's) namespace, its error as text.
fn ip(args: &[&str]) -> Result<(), String> {
    crate::testbed::netns::ip(args).map_err(|e| e.to_string())
}

impl Stage {
    /// Built from inside the node's namespace, which the process is in.
    pub fn build(tag: &str) -> Result<Stage, String> {
        let client = Netns::create(&format!("{tag}-client")).map_err(|e| e.to_string())?;
        let pods = Netns::create(&format!("{tag}-pods")).map_err(|e| e.to_string())?;
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
        ] {
            std::fs::write(format!("/proc/sys/{}", key.replace('.', "/")), value)
                .map_err(|e| format!("{key}: {e}"))?;
        }
        let (c, p) = (client.name.as_str(), pods.name.as_str());
        ip(&[
            "link", "add", "kbdp-c", "type", "veth", "peer", "name", "eth0", "netns", c,
        ])?;
        ip(&[
            "link", "add", "kbdp-p", "type", "veth", "peer", "name", "eth0", "netns", p,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{CLIENT_GATEWAY}/24"),
            "dev",
            "kbdp-c",
        ])?;
        for dev in ["kbdp-c", "kbdp-p"] {
            ip(&["link", "set", dev, "up"])?;
        }
        for a in pod_addresses() {
            ip(&["route", "add", &format!("{a}/32"), "dev", "kbdp-p"])?;
        }
        ip(&[
            "-n",
            c,
            "addr",
            "add",
            &format!("{CLIENT}/24"),
            "dev",
            "eth0",
        ])?;
        for ns in [c, p] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        ip(&[
            "-n",
            c,
            "route",
            "add",
            "default",
            "via",
            &CLIENT_GATEWAY.to_string(),
        ])?;
        for a in pod_addresses() {
            ip(&["-n", p, "addr", "add", &format!("{a}/32"), "dev", "eth0"])?;
        }
        ip(&["-n", p, "route", "add", "default", "dev", "eth0"])?;
        // The pods answer for every address on the link, as a CNI's pods do.
        sysctl_in(p, "net.ipv4.conf.all.rp_filter", "0").map_err(|e| e.to_string())?;
        let resident = EchoServer::start(p)?;
        Ok(Stage {
            resident: std::cell::RefCell::new(Some(resident)),
            client,
            pods,
        })
    }

    /// The figures of whatever ruleset the node has now: `vip` is the probe's
    /// ClusterIP, `node_ip` this node's, where its NodePort is served.
    pub fn measure(&self, vip: IpAddr, node_ip: Ipv4Addr, seconds: f64) -> Result<Traffic, String> {
        let cluster_ip = SocketAddr::new(vip, 80);
        let node_port = SocketAddr::new(IpAddr::V4(node_ip), NODE_PORT);
        let connect = |target: SocketAddr| -> Result<(f64, f64, f64, usize), String> {
            flush_conntrack()?;
            let (mut lat, failed) = in_netns(&self.client.name, move || hammer(target, seconds))
                .map_err(|e| e.to_string())?;
            lat.sort_by(|a, b| a.total_cmp(b));
            let rate = lat.len() as f64 / seconds;
            Ok((rate, percentile(&lat, 0.5), percentile(&lat, 0.99), failed))
        };
        let flows = |target: SocketAddr, n: usize| -> Result<f64, String> {
            drop(self.resident.borrow_mut().take());
            let sink = EchoServer::sink(&self.pods.name)?;
            flush_conntrack()?;
            let gbit = in_netns(&self.client.name, move || bulk(target, seconds, n))
                .map_err(|e| e.to_string());
            drop(sink);
            *self.resident.borrow_mut() = Some(EchoServer::start(&self.pods.name)?);
            gbit?
        };
        let (conns_per_sec, p50_us, p99_us, f1) = connect(cluster_ip)?;
        let (np_conns_per_sec, np_p50_us, np_p99_us, f2) = connect(node_port)?;
        Ok(Traffic {
            conns_per_sec,
            p50_us,
            p99_us,
            gbit_1: flows(cluster_ip, 1)?,
            gbit_16: flows(cluster_ip, 16)?,
            np_conns_per_sec,
            np_p50_us,
            np_p99_us,
            np_gbit_1: flows(node_port, 1)?,
            failed: f1 + f2,
        })
    }
}

impl Stage {
    /// One long TCP flow to `target` from the client: its throughput in
    /// Gbit/s, and the CPU time the whole machine spent meanwhile (client,
    /// node and pods), in seconds, from /proc/stat.
    pub fn flow_and_cpu(&self, target: SocketAddr, seconds: f64) -> Result<(f64, f64), String> {
        drop(self.resident.borrow_mut().take());
        let sink = EchoServer::sink(&self.pods.name)?;
        flush_conntrack()?;
        let before = busy_cpu_seconds()?;
        let gbit = in_netns(&self.client.name, move || bulk(target, seconds, 1))
            .map_err(|e| e.to_string());
        let cpu = busy_cpu_seconds()? - before;
        drop(sink);
        *self.resident.borrow_mut() = Some(EchoServer::start(&self.pods.name)?);
        Ok((gbit??, cpu))
    }
}

/// CPU time spent so far by every CPU out of idle (/proc/stat's first line:
/// all but idle and iowait), in seconds.
fn busy_cpu_seconds() -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| e.to_string())?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 5 {
        return Err(format!("/proc/stat: {stat:.80}"));
    }
    let idle = ticks[3] + ticks[4];
    // USER_HZ is 100 on every Linux architecture kube-nft runs on.
    Ok((ticks.iter().sum::<f64>() - idle) / 100.0)
}

/// A column of the table: its title, its figure, and whether higher is better.
type Column = (&'static str, fn(&Traffic) -> f64, bool);

/// The rows of one size: each contender's medians over the rounds, and the
/// median of kube-nft's ratio to each other contender within a round.
pub fn table(size: usize, rounds: &[Vec<(&'static str, Traffic)>]) -> String {
    let names: Vec<&'static str> = rounds
        .first()
        .map(|r| r.iter().map(|(n, _)| *n).collect())
        .unwrap_or_default();
    let of = |name: &str, get: fn(&Traffic) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| r.iter().find(|(n, _)| *n == name).map(|(_, t)| get(t)))
            .collect()
    };
    let columns: [Column; 9] = [
        ("conn/s", |t| t.conns_per_sec, true),
        ("connect p50 µs", |t| t.p50_us, false),
        ("connect p99 µs", |t| t.p99_us, false),
        ("1 flow Gbit/s", |t| t.gbit_1, true),
        ("16 flows Gbit/s", |t| t.gbit_16, true),
        ("NodePort conn/s", |t| t.np_conns_per_sec, true),
        ("NodePort p50 µs", |t| t.np_p50_us, false),
        ("NodePort p99 µs", |t| t.np_p99_us, false),
        ("NodePort 1 flow Gbit/s", |t| t.np_gbit_1, true),
    ];
    let mut out = format!(
        "\nData plane at {size} Services × 10 (medians of {} rounds; each ruleset as its proxy wrote it, loaded again by `nft -f`):\n\n| ruleset |",
        rounds.len()
    );
    for (title, _, _) in &columns {
        let _ = write!(out, " {title} |");
    }
    out.push_str(" failed |\n|---|");
    out.push_str(&"---|".repeat(columns.len() + 1));
    out.push('\n');
    for name in &names {
        let _ = write!(out, "| {name} |");
        for (_, get, _) in &columns {
            let _ = write!(out, " {:.2} |", median(of(name, *get)));
        }
        let failed: usize = of(name, |t| t.failed as f64).iter().sum::<f64>() as usize;
        let _ = writeln!(out, " {failed} |");
    }
    // kube-nft ÷ the others, per round, as "better than" ratios (> 1 is ahead).
    for other in names.iter().skip(1) {
        let _ = write!(out, "| kube-nft vs {other} (>1: kube-nft ahead) |");
        for (_, get, higher_is_better) in &columns {
            let ratios: Vec<f64> = of(names[0], *get)
                .into_iter()
                .zip(of(other, *get))
                .map(|(a, b)| if *higher_is_better { a / b } else { b / a })
                .collect();
            let _ = write!(out, " {:.2} |", median(ratios));
        }
        out.push_str(" |\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_medians_and_ratios_that_say_which_is_ahead() {
        let t = |conns: f64, p50: f64| Traffic {
            conns_per_sec: conns,
            p50_us: p50,
            ..Traffic::default()
        };
        let rounds = vec![
            vec![
                ("kube-nft", t(1000.0, 50.0)),
                ("kube-proxy", t(500.0, 100.0)),
            ],
            vec![("kube-nft", t(900.0, 60.0)), ("kube-proxy", t(900.0, 60.0))],
            vec![
                ("kube-nft", t(1100.0, 40.0)),
                ("kube-proxy", t(550.0, 80.0)),
            ],
        ];
        let text = table(10, &rounds);
        assert!(text.contains("| kube-nft | 1000.00 | 50.00 |"), "{text}");
        assert!(text.contains("| kube-proxy | 550.00 | 80.00 |"), "{text}");
        // Ratios per round: 2, 1, 2 for the rate; 2, 1, 2 for the latency.
        assert!(
            text.contains("| kube-nft vs kube-proxy (>1: kube-nft ahead) | 2.00 | 2.00 |"),
            "{text}"
        );
    }
}
