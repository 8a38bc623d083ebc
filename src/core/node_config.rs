//! This node's settings that shape what every dataplane programs: the cluster's
//! and the Services' CIDRs, the addresses NodePorts are served on, masquerading,
//! and which proxy mode runs (with the IPVS scheduler check, shared by the flag,
//! the config file and the per-Service annotation).

use crate::core::model::{ClusterState, NodeInfo};
use crate::core::net::Family;
use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;

/// The schedulers kube-proxy offers (`--ipvs-scheduler`), each an `ip_vs_<name>` module.
pub const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh",
];

/// `Err` with what is wrong when `name` is not one of `SCHEDULERS`.
pub fn check_scheduler(name: &str) -> Result<(), String> {
    if SCHEDULERS.contains(&name) {
        return Ok(());
    }
    Err(format!(
        "{name:?} is not an IPVS scheduler ({})",
        SCHEDULERS.join(", ")
    ))
}

/// kube-proxy's default masquerade bit (`--iptables-masquerade-bit`), 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;

/// This node's settings that shape the ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Pod CIDRs: traffic from outside them to a ClusterIP is masqueraded.
    pub cluster_cidrs: Vec<IpNet>,
    /// Service CIDRs: traffic to an unallocated address in them is dropped.
    pub service_cidrs: Vec<IpNet>,
    pub masquerade_bit: u8,
    /// Which of this node's addresses accept NodePort traffic.
    pub nodeport_addresses: NodePortAddresses,
    /// This node's interface addresses (read from the kernel by the caller), which
    /// `--nodeport-addresses` CIDRs select from.
    pub local_addresses: Vec<IpAddr>,
    /// `--counters`: a named counter per Service port, counting every packet of
    /// its connections in both directions.
    pub counters: bool,
    /// `--masquerade-all`: masquerade every connection to a ClusterIP, not only
    /// those from outside the cluster CIDRs.
    pub masquerade_all: bool,
    /// Who picks endpoints and rewrites destinations.
    pub mode: ProxyMode,
    /// How many Service tables each family has: set by the nftables dataplane
    /// against the count the kernel has (`nft::service_tables`); `None`, what
    /// a cold start chooses for the state's size. Not a setting of the user's.
    pub service_tables: Option<u16>,
    /// Whose established flows are offloaded to a flowtable.
    pub fast_path: FastPath,
}

/// `--fast-path`: which Services' established flows the fast path (a
/// flowtable) takes; `Off` too where the kernel has no flowtables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FastPath {
    #[default]
    Off,
    /// Services annotated `kube-nft.io/traffic-hint: LongLived`.
    LongLived,
    /// Every Service.
    All,
}

impl FastPath {
    /// Whether this Service's flows are offloaded (nftables backend only).
    pub fn offloads(self, svc: &crate::core::model::Service) -> bool {
        match self {
            FastPath::Off => false,
            FastPath::LongLived => svc.long_lived,
            FastPath::All => true,
        }
    }
}

/// `--proxy-mode`: nftables does everything; with IPVS, IPVS balances and the
/// nftables table keeps the rest (masquerade, firewall, rejects).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProxyMode {
    #[default]
    Nftables,
    Ipvs(IpvsSettings),
}

/// The proxy modes by the names `--proxy-mode` and the config file's `mode`
/// take: the one list of them (clap's `ValueEnum` lowercases the variants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ModeName {
    #[default]
    Nftables,
    Ipvs,
    /// kube-proxy's default mode: kube-nft runs nftables in its place, with
    /// the settings kube-proxy reads in that mode (`config`).
    Iptables,
}

impl ModeName {
    /// The mode with its default settings.
    pub fn mode(self) -> ProxyMode {
        match self {
            ModeName::Nftables | ModeName::Iptables => ProxyMode::Nftables,
            ModeName::Ipvs => ProxyMode::Ipvs(IpvsSettings::default()),
        }
    }

    pub fn names() -> Vec<String> {
        use clap::ValueEnum;
        ModeName::value_variants()
            .iter()
            .filter_map(|m| m.to_possible_value())
            .map(|v| v.get_name().to_string())
            .collect()
    }
}

impl ProxyMode {
    /// Its name, as `--proxy-mode` takes it.
    pub fn name(&self) -> String {
        use clap::ValueEnum;
        let name = match self {
            ProxyMode::Nftables => ModeName::Nftables,
            ProxyMode::Ipvs(_) => ModeName::Ipvs,
        };
        name.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// `--ipvs-scheduler`, for Services without the scheduler annotation.
    pub scheduler: String,
    /// `--ipvs-strict-arp`: answer ARP only for addresses on the asked interface.
    pub strict_arp: bool,
    /// `--ipvs-exclude-cidrs`: virtual services there are someone else's.
    pub exclude_cidrs: Vec<IpNet>,
    pub timeouts: IpvsTimeouts,
}

/// IPVS's idle timeouts, in seconds, for the whole namespace (`ipvsadm
/// --set`): established TCP (`--ipvs-tcp-timeout`), TCP after a FIN
/// (`--ipvs-tcpfin-timeout`) and UDP (`--ipvs-udp-timeout`). 0 leaves the
/// kernel's value (900, 120 and 300 s unless someone changed them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpvsTimeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

impl IpvsTimeouts {
    pub fn any(&self) -> bool {
        *self != IpvsTimeouts::default()
    }

    /// Whether `have` holds every timeout asked for here (those at 0 aside).
    pub fn held_by(&self, have: &IpvsTimeouts) -> bool {
        [
            (self.tcp, have.tcp),
            (self.tcp_fin, have.tcp_fin),
            (self.udp, have.udp),
        ]
        .iter()
        .all(|(want, have)| *want == 0 || want == have)
    }
}

impl Default for IpvsSettings {
    fn default() -> Self {
        IpvsSettings {
            scheduler: "rr".into(),
            strict_arp: false,
            exclude_cidrs: Vec::new(),
            timeouts: IpvsTimeouts::default(),
        }
    }
}

impl ProxyMode {
    pub fn is_ipvs(&self) -> bool {
        matches!(self, ProxyMode::Ipvs(_))
    }
}

/// `--nodeport-addresses` / `nodePortAddresses`, as kube-proxy 1.37 takes it:
/// any combination of CIDRs and the keywords `primary` (the Node object's
/// primary IPs, kube-proxy's nftables default), `all` (every address) and
/// `localhost`. NodePorts are served on the union, never on loopback: kube-proxy
/// serves them there only behind an alpha gate, so `localhost` is accepted and
/// serves nothing (`run` warns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePortAddresses {
    pub primary: bool,
    pub localhost: bool,
    /// Local addresses inside these are served (`all` is 0.0.0.0/0 and ::/0).
    pub cidrs: Vec<IpNet>,
}

impl Default for NodePortAddresses {
    fn default() -> Self {
        NodePortAddresses {
            primary: true,
            localhost: false,
            cidrs: Vec::new(),
        }
    }
}

impl NodePortAddresses {
    /// The list as the config file writes it.
    pub fn items(&self) -> Vec<String> {
        let keywords = [("primary", self.primary), ("localhost", self.localhost)];
        keywords
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(k, _)| k.to_string())
            .chain(self.cidrs.iter().map(|c| c.to_string()))
            .collect()
    }
}

impl std::str::FromStr for NodePortAddresses {
    type Err = String;

    /// A comma-separated list; empty is `primary`. A keyword given twice is
    /// refused, as kube-proxy's validation refuses it.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut out = NodePortAddresses {
            primary: false,
            localhost: false,
            cidrs: Vec::new(),
        };
        let mut seen = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if ["primary", "all", "localhost"].contains(&item) {
                if seen.contains(&item) {
                    return Err(format!("{item:?} is given twice"));
                }
                seen.push(item);
            }
            match item {
                "primary" => out.primary = true,
                "localhost" => out.localhost = true,
                "all" => out
                    .cidrs
                    .extend(["0.0.0.0/0", "::/0"].map(|c| c.parse::<IpNet>().unwrap())),
                cidr => out.cidrs.push(
                    cidr.parse::<IpNet>()
                        .map_err(|_| {
                            format!("{cidr:?} is not a CIDR or one of \"primary\", \"all\", \"localhost\"")
                        })?
                        .trunc(),
                ),
            }
        }
        if !out.primary && !out.localhost && out.cidrs.is_empty() {
            out.primary = true;
        }
        Ok(out)
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cluster_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            nodeport_addresses: NodePortAddresses::default(),
            local_addresses: Vec::new(),
            counters: false,
            masquerade_all: false,
            mode: ProxyMode::Nftables,
            service_tables: None,
            fast_path: FastPath::Off,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl NodeConfig {
    /// The IPVS settings of the IPVS mode (the defaults in another mode).
    pub fn ipvs_settings(&self) -> IpvsSettings {
        match &self.mode {
            ProxyMode::Ipvs(s) => s.clone(),
            ProxyMode::Nftables => IpvsSettings::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        // Local traffic detection (as kube-proxy's) takes one pod CIDR per
        // family; a cluster may have any number of ServiceCIDRs.
        for family in Family::ALL {
            let n = self
                .cluster_cidrs
                .iter()
                .filter(|c| Family::of_net(c) == family)
                .count();
            if n > 1 {
                return Err(ConfigError(format!(
                    "--cluster-cidr: {n} {} CIDRs given; one per family is supported (dual-stack: one IPv4 and one IPv6)",
                    family.keyword()
                )));
            }
        }
        for (flag, cidrs) in [
            ("--cluster-cidr", &self.cluster_cidrs),
            ("--service-cidr", &self.service_cidrs),
        ] {
            if let Some(c) = cidrs.iter().find(|c| c.prefix_len() == 0) {
                return Err(ConfigError(format!("{flag}: {c} covers every address")));
            }
        }
        if self.masquerade_bit > 31 {
            return Err(ConfigError(format!(
                "masquerade bit {} is not in 0..31",
                self.masquerade_bit
            )));
        }
        if let ProxyMode::Ipvs(ipvs) = &self.mode {
            check_scheduler(&ipvs.scheduler)
                .map_err(|e| ConfigError(format!("--ipvs-scheduler: {e}")))?;
        }
        Ok(())
    }

    pub fn masquerade_mark(&self) -> u32 {
        1 << self.masquerade_bit
    }

    /// The addresses NodePorts are served on, in one family.
    pub fn nodeport_ips(&self, node: Option<&NodeInfo>, family: Family) -> Vec<IpAddr> {
        let wanted = &self.nodeport_addresses;
        let primary = node
            .filter(|_| wanted.primary)
            .map(|n| n.primary_ips.as_slice())
            .unwrap_or_default();
        let in_cidrs = self
            .local_addresses
            .iter()
            .filter(|a| wanted.cidrs.iter().any(|c| c.contains(*a)));
        let mut ips: Vec<IpAddr> = primary.iter().chain(in_cidrs).copied().collect();
        ips.retain(|a| Family::of(a) == family && !a.is_loopback());
        ips.sort();
        ips.dedup();
        ips
    }

    /// Why NodePorts are served on no address of this node, when they are not
    /// and some Service has one: said once by `run`, and by `explain`.
    pub fn nodeports_unserved(&self, state: &ClusterState) -> Option<String> {
        let node = state.node.as_ref();
        // The addresses first: the Services are read only on a node with none,
        // so that a sync at 100k Services does not walk them all for nothing.
        if Family::ALL
            .into_iter()
            .any(|f| !self.nodeport_ips(node, f).is_empty())
        {
            return None;
        }
        let wanted = state
            .services
            .values()
            .any(|s| s.ports.iter().any(|p| p.node_port.is_some()));
        if !wanted {
            return None;
        }
        let wanted = &self.nodeport_addresses;
        let why_primary = match node {
            Some(n) => format!(
                "this node's Node object ({:?}) has no InternalIP to give its primary addresses",
                n.name
            ),
            None => "there is no Node object for this node to give its primary addresses (name it with --hostname-override)".into(),
        };
        let why_cidrs = format!(
            "none of this node's addresses is in {}",
            wanted
                .cidrs
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let why = match (wanted.primary, wanted.cidrs.is_empty()) {
            (true, true) => format!("{why_primary}, or set --nodeport-addresses to CIDRs"),
            (true, false) => format!("{why_primary}, and {why_cidrs}"),
            (false, false) => why_cidrs,
            (false, true) => {
                "--nodeport-addresses names loopback only, where NodePorts are not served".into()
            }
        };
        Some(format!("NodePorts are served on no address: {why}"))
    }

    /// The first CIDR of `family` among `cidrs`, host bits cleared.
    pub fn cidr(cidrs: &[IpNet], family: Family) -> Option<IpNet> {
        Self::cidrs(cidrs, family).next()
    }

    /// Each CIDR of `family`, truncated to its network, once, in the given order.
    pub fn cidrs(cidrs: &[IpNet], family: Family) -> impl Iterator<Item = IpNet> + '_ {
        let mut seen = Vec::new();
        cidrs
            .iter()
            .filter(move |c| Family::of_net(c) == family)
            .map(|c| c.trunc())
            .filter(move |c| {
                let new = !seen.contains(c);
                seen.push(*c);
                new
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{Service, ServiceKey, ServicePort, TargetPort};
    use crate::core::net::Protocol;

    fn with_nodeport(node: Option<NodeInfo>) -> ClusterState {
        let key = ServiceKey {
            namespace: "default".into(),
            name: "web".into(),
        };
        let svc = Service {
            key: key.clone(),
            ports: vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                target_port: TargetPort::Number(8080),
                node_port: Some(30080),
            }],
            ..Service::default()
        };
        ClusterState {
            services: [(key, std::sync::Arc::new(svc))].into_iter().collect(),
            node,
            ..ClusterState::default()
        }
    }

    #[test]
    fn nodeports_without_an_address_to_serve_them_on_are_explained() {
        let config = NodeConfig::default();
        let why = config.nodeports_unserved(&with_nodeport(None)).unwrap();
        assert!(why.contains("no Node object"), "{why}");
        let nameless = NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        };
        let why = config
            .nodeports_unserved(&with_nodeport(Some(nameless.clone())))
            .unwrap();
        assert!(why.contains("\"node-a\""), "{why}");
        let addressed = NodeInfo {
            primary_ips: vec!["192.0.2.1".parse().unwrap()],
            ..nameless
        };
        assert_eq!(
            config.nodeports_unserved(&with_nodeport(Some(addressed))),
            None
        );
        assert_eq!(config.nodeports_unserved(&ClusterState::default()), None);
    }
}
