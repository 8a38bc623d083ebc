//! Translate: from the validated model and this node's settings to the desired
//! nftables objects. A pure function, no I/O: every Service semantic lives here and
//! is unit-tested without a kernel.
//!
//! The layout follows kube-proxy's nftables mode (its users know the names) with
//! the kernel's scaling traps avoided (see docs/DESIGN.md): the number of sets, and
//! of rules bound to any one set, does not grow with the number of Services.
//! - `service-ips` dispatches `daddr . l4proto . dport` to one chain per Service port.
//!   The port chains and the dispatch maps are spread over `SERVICE_SHARDS` Service
//!   tables by a hash of the Service's name (see `ruleset::TableId`); the main table
//!   keeps everything else.
//! - Each Service port chain picks an endpoint with a `numgen` cascade: rule k of n
//!   matches with probability 1/(n-k), so every endpoint gets exactly 1/n.
//! - Masquerade is a mark (kube-proxy's 0x4000 by default) set in the dispatch
//!   chain and acted on in postrouting; hairpin traffic is found by one set lookup.
//! - Filter chains reject Services with no endpoints and wrong ports on live
//!   ClusterIPs, and drop traffic to unallocated addresses in the service CIDRs.

use crate::model::{ClusterState, NodeInfo, PortEndpoint, Service, ServicePort};
use crate::ruleset::{
    clamp_comment, BaseChain, Chain, ChainType, Direction, Element, Family, Field, Hook, KeyType,
    KeyValue, MapData, Mapped, NamedCounter, Rule, Set, Stmt, Table, TableId, Verdict,
    SERVICE_SHARDS, TABLE_NAME,
};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

pub const SET_CLUSTER_IPS: &str = "cluster-ips";
pub const MAP_SERVICE_IPS: &str = "service-ips";
pub const MAP_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const SET_HAIRPIN: &str = "hairpin";
pub const SET_NODEPORT_IPS: &str = "nodeport-ips";
pub const MAP_SERVICE_NODEPORTS: &str = "service-nodeports";
pub const MAP_NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const MAP_FIREWALL_IPS: &str = "firewall-ips";
pub const MAP_SERVICE_COUNTERS: &str = "service-counters";
pub const MAP_NODEPORT_COUNTERS: &str = "nodeport-counters";
pub const CHAIN_SERVICES: &str = "services";
pub const CHAIN_SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const CHAIN_NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const CHAIN_FIREWALL_CHECK: &str = "firewall-check";
pub const CHAIN_CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub const CHAIN_REJECT: &str = "reject-chain";
/// IPVS backend: Service address . protocol . port that IPVS serves.
pub const SET_SERVICE_PORTS: &str = "service-ports";
/// IPVS backend: external addresses and NodePorts whose traffic is masqueraded
/// (`externalTrafficPolicy: Cluster`).
pub const SET_MASQUERADE_SERVICES: &str = "masquerade-services";
pub const SET_MASQUERADE_NODEPORTS: &str = "masquerade-nodeports";
pub const CHAIN_SERVICE_PORTS_CHECK: &str = "service-ports-check";

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
    pub backend: Backend,
}

/// `--proxy-mode`: nftables does everything; with IPVS, IPVS balances and the
/// nftables table keeps the rest (masquerade, firewall, rejects).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Nftables,
    Ipvs(IpvsSettings),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// `--ipvs-scheduler`, for Services without the scheduler annotation.
    pub scheduler: String,
    /// `--ipvs-strict-arp`: answer ARP only for addresses on the asked interface.
    pub strict_arp: bool,
    /// `--ipvs-exclude-cidrs`: virtual services there are someone else's.
    pub exclude_cidrs: Vec<IpNet>,
}

impl Default for IpvsSettings {
    fn default() -> Self {
        IpvsSettings {
            scheduler: "rr".into(),
            strict_arp: false,
            exclude_cidrs: Vec::new(),
        }
    }
}

impl Backend {
    pub fn is_ipvs(&self) -> bool {
        matches!(self, Backend::Ipvs(_))
    }
}

/// `--nodeport-addresses`: `primary` (the Node object's primary IPs, kube-proxy's
/// nftables default) or the local addresses inside some CIDRs. Loopback never.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    #[default]
    Primary,
    Cidrs(Vec<IpNet>),
}

impl std::str::FromStr for NodePortAddresses {
    type Err = String;

    /// kube-proxy's list: `primary` alone, or CIDRs and `all` (every address).
    fn from_str(s: &str) -> Result<Self, String> {
        let items: Vec<&str> = s
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .collect();
        if items.is_empty() || items == ["primary"] {
            return Ok(NodePortAddresses::Primary);
        }
        let mut cidrs = Vec::new();
        for item in items {
            match item {
                "all" => cidrs.extend(["0.0.0.0/0", "::/0"].map(|c| c.parse::<IpNet>().unwrap())),
                "primary" => {
                    return Err(
                        "\"primary\" together with CIDRs is not supported; give either".into(),
                    )
                }
                "localhost" => {
                    return Err(
                        "\"localhost\" is not supported: NodePorts are never served on loopback"
                            .into(),
                    )
                }
                cidr => cidrs.push(
                    cidr.parse::<IpNet>()
                        .map_err(|_| format!("{cidr:?} is not a CIDR, \"primary\" or \"all\""))?
                        .trunc(),
                ),
            }
        }
        Ok(NodePortAddresses::Cidrs(cidrs))
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cluster_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            nodeport_addresses: NodePortAddresses::Primary,
            local_addresses: Vec::new(),
            counters: false,
            masquerade_all: false,
            backend: Backend::Nftables,
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (flag, cidrs) in [
            ("--cluster-cidr", &self.cluster_cidrs),
            ("--service-cidr", &self.service_cidrs),
        ] {
            for family in Family::ALL {
                let n = cidrs.iter().filter(|c| Family::of_net(c) == family).count();
                if n > 1 {
                    return Err(ConfigError(format!(
                        "{flag}: {n} {} CIDRs given; one per family is supported (dual-stack: one IPv4 and one IPv6)",
                        family.keyword()
                    )));
                }
            }
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
        if let Backend::Ipvs(ipvs) = &self.backend {
            crate::netlink::ipvs::check_scheduler(&ipvs.scheduler)
                .map_err(|e| ConfigError(format!("--ipvs-scheduler: {e}")))?;
        }
        Ok(())
    }

    pub fn masquerade_mark(&self) -> u32 {
        1 << self.masquerade_bit
    }

    /// The addresses NodePorts are served on, in one family.
    pub fn nodeport_ips(&self, node: Option<&NodeInfo>, family: Family) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = match &self.nodeport_addresses {
            NodePortAddresses::Primary => node.map(|n| n.primary_ips.clone()).unwrap_or_default(),
            NodePortAddresses::Cidrs(cidrs) => self
                .local_addresses
                .iter()
                .filter(|a| cidrs.iter().any(|c| c.contains(*a)))
                .copied()
                .collect(),
        };
        ips.retain(|a| Family::of(a) == family && !a.is_loopback());
        ips.sort();
        ips.dedup();
        ips
    }

    fn cidr(cidrs: &[IpNet], family: Family) -> Option<IpNet> {
        cidrs
            .iter()
            .find(|c| Family::of_net(c) == family)
            .map(|c| c.trunc())
    }
}

/// The desired state: per family, the main table and (nftables backend) the
/// Service tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: Vec<Table>,
}

impl Ruleset {
    /// The main table of a family.
    pub fn table(&self, family: Family) -> Option<&Table> {
        self.get(TableId::main(family))
    }

    pub fn get(&self, id: TableId) -> Option<&Table> {
        self.tables
            .iter()
            .find(|t| t.family == id.family && t.name == id.name())
    }

    /// The tables of one family, main first.
    pub fn of_family(&self, family: Family) -> impl Iterator<Item = &Table> {
        self.tables.iter().filter(move |t| t.family == family)
    }
}

/// The Service table that holds a Service's port chains, by a stable hash of
/// its namespace and name (both families use the same number).
pub fn shard_of(key: &crate::model::ServiceKey) -> u16 {
    (fnv1a(format!("{}/{}", key.namespace, key.name).as_bytes()) % SERVICE_SHARDS as u64) as u16
}

/// The tables a family has under these settings: the main one, and the Service
/// tables unless IPVS (which has no Service chains) is the backend.
pub fn table_ids(family: Family, config: &NodeConfig) -> Vec<TableId> {
    if config.backend.is_ipvs() {
        vec![TableId::main(family)]
    } else {
        TableId::all_of(family).collect()
    }
}

/// FNV-1a, 64 bits: stable across versions and platforms, which chain names need.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Eight base32 characters of the hash of `s`.
fn short_hash(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let h = fnv1a(s.as_bytes());
    (0..8)
        .map(|i| ALPHABET[((h >> (59 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// nftables chain names may be up to 255 bytes.
const MAX_CHAIN_NAME: usize = 255;

/// `svc-<hash>-ns/name/proto/port`: readable, and unique through the hash even
/// when truncated. The chain that picks among all (cluster) endpoints.
pub fn service_chain_name(svc: &Service, port: &ServicePort) -> String {
    port_chain_name("svc", svc, port)
}

/// `<kind>-<hash>-ns/name/proto/port`, the chains of one Service port.
fn port_chain_name(kind: &str, svc: &Service, port: &ServicePort) -> String {
    chain_name(kind, &port_id(svc, port))
}

/// `ns/name/proto/port` (the port's name, or its number when unnamed).
fn port_id(svc: &Service, port: &ServicePort) -> String {
    let port_id = if port.name.is_empty() {
        port.port.to_string()
    } else {
        port.name.clone()
    };
    format!(
        "{}/{}/{}/{}",
        svc.key.namespace, svc.key.name, port.protocol, port_id
    )
}

fn chain_name(kind: &str, id: &str) -> String {
    let mut name = format!("{kind}-{}-{id}", short_hash(id));
    if name.len() > MAX_CHAIN_NAME {
        let mut end = MAX_CHAIN_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// Endpoints that receive new connections: the ready ones, or, when none is
/// ready, the ones still serving while terminating (kube-proxy's fallback).
pub fn usable_endpoints(eps: &[PortEndpoint]) -> Vec<&PortEndpoint> {
    usable(eps.iter())
}

fn usable<'a>(eps: impl Iterator<Item = &'a PortEndpoint> + Clone) -> Vec<&'a PortEndpoint> {
    let ready: Vec<&PortEndpoint> = eps.clone().filter(|e| e.conditions.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    eps.filter(|e| e.conditions.serving_terminating()).collect()
}

/// The endpoints of one Service port, as each traffic policy sees them.
#[derive(Debug, Default)]
pub struct Categorized<'a> {
    /// For `Cluster` policies, topology hints applied.
    pub cluster: Vec<&'a PortEndpoint>,
    /// This node's, for `Local` policies.
    pub local: Vec<&'a PortEndpoint>,
    /// Whether the Service port has any usable endpoint anywhere.
    pub has_any: bool,
}

/// Which topology hints apply on this node.
enum Topology<'a> {
    Any,
    SameNode(&'a str),
    SameZone(&'a str),
}

impl Topology<'_> {
    fn allows(&self, e: &PortEndpoint) -> bool {
        match self {
            Topology::Any => true,
            Topology::SameNode(n) => e.hints.for_nodes().iter().any(|h| h == n),
            Topology::SameZone(z) => e.hints.for_zones().iter().any(|h| h == z),
        }
    }
}

/// kube-proxy's rules: hints count only when every ready endpoint has them, and
/// some endpoint is hinted for this node (or zone); same-node before same-zone.
fn topology<'a>(eps: &[PortEndpoint], node: Option<&'a NodeInfo>) -> Topology<'a> {
    let Some(node) = node else {
        return Topology::Any;
    };
    let ready: Vec<&PortEndpoint> = eps.iter().filter(|e| e.conditions.ready).collect();
    let applies = |t: &Topology, hinted: fn(&PortEndpoint) -> bool| {
        !ready.is_empty() && ready.iter().all(|e| hinted(e)) && ready.iter().any(|e| t.allows(e))
    };
    let same_node = Topology::SameNode(&node.name);
    if applies(&same_node, |e| !e.hints.for_nodes().is_empty()) {
        return same_node;
    }
    if let Some(zone) = &node.zone {
        let same_zone = Topology::SameZone(zone);
        if applies(&same_zone, |e| !e.hints.for_zones().is_empty()) {
            return same_zone;
        }
    }
    Topology::Any
}

/// kube-proxy's endpoint categorisation: cluster endpoints (ready, topology
/// hints honoured, else serving-terminating), local ones (this node's ready,
/// else its serving-terminating), and whether any endpoint is usable at all.
pub fn categorize<'a>(
    svc: &Service,
    eps: &'a [PortEndpoint],
    node: Option<&'a NodeInfo>,
) -> Categorized<'a> {
    let mut out = Categorized::default();
    if svc.uses_cluster_endpoints() {
        let topology = topology(eps, node);
        out.cluster = eps
            .iter()
            .filter(|e| e.conditions.ready && topology.allows(e))
            .collect();
        if out.cluster.is_empty() {
            out.cluster = eps
                .iter()
                .filter(|e| e.conditions.serving_terminating())
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if svc.uses_local_endpoints() {
        out.local = usable(eps.iter().filter(|e| e.is_on(node)));
        out.has_any |= !usable_endpoints(eps).is_empty();
    }
    out
}

fn base(name: &str, kind: ChainType, hook: Hook, priority: i32, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.to_string(),
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
        comment: None,
        rules,
    }
}

fn regular(name: &str, rules: Vec<Rule>) -> Chain {
    Chain {
        name: name.to_string(),
        base: None,
        comment: None,
        rules,
    }
}

fn set(name: &str, key: Vec<KeyType>, data: Option<MapData>, comment: &str) -> Set {
    Set {
        name: name.to_string(),
        key,
        data,
        comment: Some(comment.to_string()),
        timeout: None,
        elements: Vec::new(),
    }
}

const DISPATCH_KEY: [Field; 3] = [Field::Daddr, Field::L4Proto, Field::Dport];
const NODEPORT_KEY: [Field; 2] = [Field::L4Proto, Field::Dport];

fn vmap(fields: &[Field], map: &str) -> Stmt {
    Stmt::Vmap {
        fields: fields.to_vec(),
        map: map.into(),
    }
}

fn jump(chain: &str) -> Stmt {
    Stmt::Verdict(Verdict::Jump(chain.to_string()))
}

/// The node's addresses that serve NodePorts: in the main table (the
/// no-endpoint checks and counters read it) and in each Service table (dispatch).
fn nodeport_ips_set(addr: KeyType) -> Set {
    set(
        SET_NODEPORT_IPS,
        vec![addr],
        None,
        "this node's addresses that accept NodePort traffic",
    )
}

/// The static part of a family's table: every set (empty) and every chain that
/// does not depend on Services. `nft-templates/skeleton.nft` shows it as text.
pub fn skeleton(family: Family, config: &NodeConfig) -> Table {
    let addr = family.addr_type();
    let dispatch_key = vec![addr, KeyType::InetProto, KeyType::InetService];
    let nodeport_key = vec![KeyType::InetProto, KeyType::InetService];
    let mark = config.masquerade_mark();
    let new_conn_jump = |chain: &str| Rule::new(vec![Stmt::CtStateNew, jump(chain)]);
    let in_set = |field: Field, set: &str| Stmt::InSet {
        fields: vec![field],
        set: set.into(),
    };

    let mut services = Vec::new();
    if config.masquerade_all {
        services.push(
            Rule::new(vec![
                in_set(Field::Daddr, SET_CLUSTER_IPS),
                Stmt::MarkOr(mark),
            ])
            .with_comment("masquerade all traffic to ClusterIPs"),
        );
    } else if let Some(cidr) = NodeConfig::cidr(&config.cluster_cidrs, family) {
        services.push(
            Rule::new(vec![
                in_set(Field::Daddr, SET_CLUSTER_IPS),
                Stmt::AddrMatch {
                    field: Field::Saddr,
                    net: cidr,
                    negate: true,
                },
                Stmt::MarkOr(mark),
            ])
            .with_comment("masquerade traffic to ClusterIPs from outside the cluster"),
        );
    }
    let ipvs = config.backend.is_ipvs();
    if ipvs {
        // IPVS rewrites the destination later (local input); this only marks.
        services.push(Rule::new(vec![
            Stmt::InSet {
                fields: DISPATCH_KEY.to_vec(),
                set: SET_MASQUERADE_SERVICES.into(),
            },
            Stmt::MarkOr(mark),
        ]));
        services.push(Rule::new(vec![
            in_set(Field::Daddr, SET_NODEPORT_IPS),
            Stmt::InSet {
                fields: NODEPORT_KEY.to_vec(),
                set: SET_MASQUERADE_NODEPORTS.into(),
            },
            Stmt::MarkOr(mark),
        ]));
    }

    let mut cluster_ips_check = vec![
        Rule::new(vec![
            in_set(Field::Daddr, SET_CLUSTER_IPS),
            Stmt::RejectTcpReset,
        ])
        .with_comment("reject traffic to invalid ports of ClusterIPs"),
        Rule::new(vec![in_set(Field::Daddr, SET_CLUSTER_IPS), Stmt::Reject]),
    ];
    if let Some(cidr) = NodeConfig::cidr(&config.service_cidrs, family) {
        cluster_ips_check.push(
            Rule::new(vec![
                Stmt::AddrMatch {
                    field: Field::Daddr,
                    net: cidr,
                    negate: false,
                },
                Stmt::Verdict(Verdict::Drop),
            ])
            .with_comment("drop traffic to unallocated ClusterIPs"),
        );
    }

    // Prerouting and output alike, before DNAT: the destination is still the
    // Service's, which the firewall and the request counters look up.
    let mut before_dnat = vec![new_conn_jump(CHAIN_FIREWALL_CHECK)];
    if config.counters {
        before_dnat.extend(counting_rules(
            Direction::Original,
            Field::Daddr,
            Field::Dport,
        ));
    }

    let mut table = Table {
        family,
        name: TABLE_NAME.to_string(),
        comment: Some("kube-nft: Kubernetes Services (managed by kube-nft, do not edit)".into()),
        counters: Vec::new(),
        sets: vec![
            set(SET_CLUSTER_IPS, vec![addr], None, "active ClusterIPs"),
            nodeport_ips_set(addr),
            set(
                MAP_NO_ENDPOINT_SERVICES,
                dispatch_key.clone(),
                Some(MapData::Verdict),
                "IP . protocol . port of Service ports with no (local) endpoints",
            ),
            set(
                MAP_NO_ENDPOINT_NODEPORTS,
                nodeport_key,
                Some(MapData::Verdict),
                "protocol . NodePort of Service ports with no (local) endpoints",
            ),
            set(
                MAP_FIREWALL_IPS,
                dispatch_key,
                Some(MapData::Verdict),
                "load balancer IP . protocol . port: the Service's source-range firewall",
            ),
            set(
                SET_HAIRPIN,
                vec![addr, addr],
                None,
                "endpoint . endpoint: a pod reaching itself through a Service",
            ),
        ],
        chains: vec![
            base(
                "nat-prerouting",
                ChainType::Nat,
                Hook::Prerouting,
                -100,
                vec![Rule::new(vec![jump(CHAIN_SERVICES)])],
            ),
            base(
                "nat-output",
                ChainType::Nat,
                Hook::Output,
                -100,
                vec![Rule::new(vec![jump(CHAIN_SERVICES)])],
            ),
            base(
                "nat-postrouting",
                ChainType::Nat,
                Hook::Postrouting,
                100,
                vec![
                    Rule::new(vec![
                        Stmt::MarkHas(mark),
                        Stmt::MarkXor(mark),
                        Stmt::Masquerade { fully_random: true },
                    ]),
                    Rule::new(vec![
                        Stmt::InSet {
                            fields: vec![Field::Saddr, Field::Daddr],
                            set: SET_HAIRPIN.into(),
                        },
                        Stmt::Masquerade { fully_random: true },
                    ]),
                ],
            ),
            // Before DNAT: the load balancer IP is still the destination.
            base(
                "filter-prerouting",
                ChainType::Filter,
                Hook::Prerouting,
                -110,
                before_dnat.clone(),
            ),
            // What reaches these after DNAT was not DNATed: no (local) endpoints.
            base(
                "filter-input",
                ChainType::Filter,
                Hook::Input,
                -110,
                vec![
                    new_conn_jump(CHAIN_NODEPORT_ENDPOINTS_CHECK),
                    new_conn_jump(CHAIN_SERVICE_ENDPOINTS_CHECK),
                ],
            ),
            base(
                "filter-forward",
                ChainType::Filter,
                Hook::Forward,
                -110,
                vec![
                    new_conn_jump(CHAIN_SERVICE_ENDPOINTS_CHECK),
                    new_conn_jump(CHAIN_CLUSTER_IPS_CHECK),
                ],
            ),
            base(
                "filter-output",
                ChainType::Filter,
                Hook::Output,
                -110,
                before_dnat,
            ),
            base(
                "filter-output-post-dnat",
                ChainType::Filter,
                Hook::Output,
                -90,
                vec![
                    new_conn_jump(CHAIN_SERVICE_ENDPOINTS_CHECK),
                    new_conn_jump(CHAIN_NODEPORT_ENDPOINTS_CHECK),
                    new_conn_jump(CHAIN_CLUSTER_IPS_CHECK),
                ],
            ),
            regular(CHAIN_SERVICES, services),
            regular(
                CHAIN_SERVICE_ENDPOINTS_CHECK,
                vec![Rule::new(vec![vmap(
                    &DISPATCH_KEY,
                    MAP_NO_ENDPOINT_SERVICES,
                )])],
            ),
            regular(
                CHAIN_NODEPORT_ENDPOINTS_CHECK,
                vec![Rule::new(vec![
                    in_set(Field::Daddr, SET_NODEPORT_IPS),
                    vmap(&NODEPORT_KEY, MAP_NO_ENDPOINT_NODEPORTS),
                ])],
            ),
            regular(
                CHAIN_FIREWALL_CHECK,
                vec![Rule::new(vec![vmap(&DISPATCH_KEY, MAP_FIREWALL_IPS)])],
            ),
            regular(CHAIN_CLUSTER_IPS_CHECK, cluster_ips_check),
            // TCP gets a reset: ICMP errors are rate-limited (a burst of 6, then one
            // a second per peer), which would make refusals wait for SYN retries.
            regular(
                CHAIN_REJECT,
                vec![
                    Rule::new(vec![Stmt::RejectTcpReset]),
                    Rule::new(vec![Stmt::Reject]),
                ],
            ),
        ],
    };
    if ipvs {
        adapt_for_ipvs(&mut table);
    }
    if config.counters {
        add_counting(&mut table);
    }
    table
}

/// NAT priority of the Service tables: just after the main table's NAT chains,
/// which mark traffic to ClusterIPs for masquerading before any DNAT.
const SERVICE_TABLE_NAT_PRIORITY: i32 = -99;

/// One Service table: its share of the dispatch maps and the port chains they
/// lead to. The kernel's NAT hook runs the NAT chains of every table in priority
/// order and stops at the first one that sets up a binding; a Service is in one
/// table only, so at most one table DNATs a connection.
pub fn service_table_skeleton(id: TableId) -> Table {
    let family = id.family;
    let addr = family.addr_type();
    let enter = || vec![Rule::new(vec![jump(CHAIN_SERVICES)])];
    Table {
        family,
        name: id.name().to_string(),
        comment: Some(format!(
            "kube-nft: port chains of 1/{SERVICE_SHARDS} of the Services, by name hash (managed by kube-nft, do not edit)"
        )),
        counters: Vec::new(),
        sets: vec![
            nodeport_ips_set(addr),
            set(
                MAP_SERVICE_IPS,
                vec![addr, KeyType::InetProto, KeyType::InetService],
                Some(MapData::Verdict),
                "ClusterIP, external IP or load balancer IP . protocol . port: the Service port's chain",
            ),
            set(
                MAP_SERVICE_NODEPORTS,
                vec![KeyType::InetProto, KeyType::InetService],
                Some(MapData::Verdict),
                "protocol . NodePort: the Service port's external chain",
            ),
        ],
        chains: vec![
            base(
                "nat-prerouting",
                ChainType::Nat,
                Hook::Prerouting,
                SERVICE_TABLE_NAT_PRIORITY,
                enter(),
            ),
            base(
                "nat-output",
                ChainType::Nat,
                Hook::Output,
                SERVICE_TABLE_NAT_PRIORITY,
                enter(),
            ),
            regular(
                CHAIN_SERVICES,
                vec![
                    Rule::new(vec![vmap(&DISPATCH_KEY, MAP_SERVICE_IPS)]),
                    Rule::new(vec![
                        Stmt::InSet {
                            fields: vec![Field::Daddr],
                            set: SET_NODEPORT_IPS.into(),
                        },
                        vmap(&NODEPORT_KEY, MAP_SERVICE_NODEPORTS),
                    ]),
                ],
            ),
        ],
    }
}

/// The static part of any of our tables.
pub fn skeleton_of(id: TableId, config: &NodeConfig) -> Table {
    match id.shard {
        None => skeleton(id.family, config),
        Some(_) => service_table_skeleton(id),
    }
}

/// The IPVS backend's table: no dispatch maps (IPVS picks endpoints), but the
/// sets that say which Service ports IPVS serves and which external traffic is
/// masqueraded. Service addresses are local (on `kube-ipvs0`), so filter-input
/// (before IPVS, which runs late in local input) also refuses other ports of a
/// ClusterIP: no node-local listener is reachable through a Service address.
fn adapt_for_ipvs(table: &mut Table) {
    let addr = table.family.addr_type();
    let dispatch_key = vec![addr, KeyType::InetProto, KeyType::InetService];
    let at = 2; // after cluster-ips and nodeport-ips
    table.sets.splice(
        at..at,
        [
            set(
                SET_SERVICE_PORTS,
                dispatch_key.clone(),
                None,
                "Service IP . protocol . port that IPVS serves",
            ),
            set(
                SET_MASQUERADE_SERVICES,
                dispatch_key,
                None,
                "external IP or load balancer IP . protocol . port: masquerade (externalTrafficPolicy: Cluster)",
            ),
            set(
                SET_MASQUERADE_NODEPORTS,
                vec![KeyType::InetProto, KeyType::InetService],
                None,
                "protocol . NodePort: masquerade (externalTrafficPolicy: Cluster)",
            ),
        ],
    );
    if let Some(input) = table.chains.iter_mut().find(|c| c.name == "filter-input") {
        input.rules.push(Rule::new(vec![
            Stmt::CtStateNew,
            jump(CHAIN_SERVICE_PORTS_CHECK),
        ]));
    }
    table.chains.push(regular(
        CHAIN_SERVICE_PORTS_CHECK,
        vec![
            Rule::new(vec![
                Stmt::InSet {
                    fields: DISPATCH_KEY.to_vec(),
                    set: SET_SERVICE_PORTS.into(),
                },
                Stmt::Verdict(Verdict::Return),
            ]),
            Rule::new(vec![jump(CHAIN_CLUSTER_IPS_CHECK)]),
        ],
    ));
}

/// `--counters`: every packet of a Service port's connections, both directions,
/// adds to the port's named counter. Requests are counted before DNAT (their
/// destination is still the Service's, see `skeleton`), replies after the reverse
/// NAT (their source is the Service's again): one map lookup keyed like
/// `service-ips` serves both. Only maps and a fixed number of rules: no chain per
/// Service. This adds the maps and the reply chains.
fn add_counting(table: &mut Table) {
    let addr = table.family.addr_type();
    table.sets.push(set(
        MAP_SERVICE_COUNTERS,
        vec![addr, KeyType::InetProto, KeyType::InetService],
        Some(MapData::Counter),
        "Service IP . protocol . port: the Service port's counter",
    ));
    table.sets.push(set(
        MAP_NODEPORT_COUNTERS,
        vec![KeyType::InetProto, KeyType::InetService],
        Some(MapData::Counter),
        "protocol . NodePort: the Service port's counter",
    ));
    let replies = counting_rules(Direction::Reply, Field::Saddr, Field::Sport);
    // After the NAT hooks at 100, which restore the Service's address on replies.
    table.chains.push(base(
        "counters-input",
        ChainType::Filter,
        Hook::Input,
        110,
        replies.clone(),
    ));
    table.chains.push(base(
        "counters-postrouting",
        ChainType::Filter,
        Hook::Postrouting,
        110,
        replies,
    ));
}

/// The two counting rules of one direction: `addr` and `port` are the Service's
/// side of the packet (destination for requests, source for replies).
fn counting_rules(direction: Direction, addr: Field, port: Field) -> Vec<Rule> {
    vec![
        Rule::new(vec![
            Stmt::CtDirection(direction),
            Stmt::CounterByMap {
                fields: vec![addr, Field::L4Proto, port],
                map: MAP_SERVICE_COUNTERS.into(),
            },
        ]),
        Rule::new(vec![
            Stmt::CtDirection(direction),
            Stmt::InSet {
                fields: vec![addr],
                set: SET_NODEPORT_IPS.into(),
            },
            Stmt::CounterByMap {
                fields: vec![Field::L4Proto, port],
                map: MAP_NODEPORT_COUNTERS.into(),
            },
        ]),
    ]
}

fn dispatch_key(vip: std::net::IpAddr, port: &ServicePort) -> Vec<KeyValue> {
    vec![
        KeyValue::Addr(vip),
        KeyValue::Proto(port.protocol),
        KeyValue::Port(port.port),
    ]
}

/// An endpoint's identity in a cascade slot.
pub type SlotKey = (IpAddr, u16);

/// Where the kernel's cascade currently has each endpoint of a chain, by slot
/// (slot 0 = the last rule); `None` for a chain it does not have.
pub trait SlotHints {
    fn slots(&self, table: TableId, chain: &str) -> Option<Vec<SlotKey>>;
}

/// No hints: a ruleset computed from scratch (render, a cold start).
pub struct NoHints;

impl SlotHints for NoHints {
    fn slots(&self, _: TableId, _: &str) -> Option<Vec<SlotKey>> {
        None
    }
}

/// Assigns the usable endpoints to cascade slots, keeping every endpoint that
/// stays where it was. A leaving endpoint's slot is taken by the one in the last
/// slot; newcomers take new slots. So one endpoint change moves at most one other
/// endpoint, and the chain changes by one or two rules. From scratch, slots are
/// filled so the chain lists endpoints in ascending order.
pub fn assign_slots<'a>(
    previous: Option<Vec<SlotKey>>,
    usable: &[&'a PortEndpoint],
) -> Vec<&'a PortEndpoint> {
    let by_key: BTreeMap<SlotKey, &PortEndpoint> =
        usable.iter().map(|e| ((e.addr, e.port), *e)).collect();
    let mut slots: Vec<SlotKey> = Vec::new();
    for k in previous.unwrap_or_default() {
        if !slots.contains(&k) {
            slots.push(k);
        }
    }
    for i in (0..slots.len()).rev() {
        if !by_key.contains_key(&slots[i]) {
            slots.swap_remove(i);
        }
    }
    let newcomers: Vec<SlotKey> = by_key
        .keys()
        .rev()
        .filter(|k| !slots.contains(k))
        .copied()
        .collect();
    slots.extend(newcomers);
    slots.iter().map(|k| by_key[k]).collect()
}

/// Session affinity of one Service port: the clients each endpoint has seen.
struct Affinity<'a> {
    /// `ns/name/proto/port`, which with the endpoint names its set.
    port_id: &'a str,
    timeout: u32,
}

impl Affinity<'_> {
    fn set_name(&self, ep: &PortEndpoint) -> String {
        chain_name(
            "affinity",
            // nft set names take no ':' (IPv6). The timeout is in the name: a
            // new timeout is a new set.
            &format!(
                "{}/{}/{}/{}s",
                self.port_id,
                ep.addr.to_string().replace(':', "-"),
                ep.port,
                self.timeout
            ),
        )
    }

    fn set(&self, family: Family, ep: &PortEndpoint) -> Set {
        Set {
            name: self.set_name(ep),
            key: vec![family.addr_type()],
            data: None,
            comment: None,
            timeout: Some(self.timeout),
            elements: Vec::new(),
        }
    }
}

/// The endpoint-selection chain of one Service port: a `numgen` cascade, one rule
/// per slot from the highest down. The rule of slot k matches with probability
/// 1/(k+1) (slot 0 always), so each of n endpoints gets exactly 1/n.
///
/// With session affinity, each endpoint also has a timeout set of the clients it
/// served: a client found in one goes back to that endpoint, and the cascade
/// records the client in the set of the endpoint it picks. An endpoint that leaves
/// takes its set with it, so no client is ever sent back to it.
fn service_port_chain(
    name: String,
    label: &str,
    port: &ServicePort,
    slots: &[&PortEndpoint],
    affinity: Option<&Affinity>,
) -> Chain {
    let dnat = |ep: &PortEndpoint| Stmt::Dnat {
        addr: ep.addr,
        port: ep.port,
    };
    let mut rules = Vec::new();
    if let Some(a) = affinity {
        for ep in slots.iter().rev() {
            rules.push(Rule::new(vec![
                Stmt::L4Proto(port.protocol),
                Stmt::InSet {
                    fields: vec![Field::Saddr],
                    set: a.set_name(ep),
                },
                dnat(ep),
            ]));
        }
    }
    for (k, ep) in slots.iter().enumerate().rev() {
        let mut stmts = vec![Stmt::L4Proto(port.protocol)];
        if k > 0 {
            stmts.push(Stmt::NumgenEq {
                modulus: k as u32 + 1,
                value: 0,
            });
        }
        if let Some(a) = affinity {
            stmts.push(Stmt::SetUpdate {
                field: Field::Saddr,
                set: a.set_name(ep),
            });
        }
        stmts.push(dnat(ep));
        rules.push(Rule::new(stmts));
    }
    Chain {
        name,
        base: None,
        comment: Some(clamp_comment(label)),
        rules,
    }
}

/// What one Service contributes to one family's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRules {
    /// The Service table that holds this Service's port chains, its dispatch
    /// elements and its sets (the main table with the IPVS backend).
    pub table: TableId,
    /// Chains in `table`.
    pub chains: Vec<Chain>,
    /// Chains in the main table: the source-range firewall, which the filter
    /// hooks reach.
    pub main_chains: Vec<Chain>,
    /// Sets of this Service alone (session affinity), in `table`, created and
    /// deleted with it.
    pub sets: Vec<Set>,
    /// Elements, with the name of the set or map they belong to (in the table
    /// `home` says).
    pub elements: Vec<(&'static str, Element)>,
    /// Endpoints that need a hairpin element (shared between Services).
    pub hairpin: Vec<IpAddr>,
    /// One per Service port with `--counters`.
    pub counters: Vec<NamedCounter>,
}

impl ServiceRules {
    fn new(table: TableId) -> ServiceRules {
        ServiceRules {
            table,
            chains: Vec::new(),
            main_chains: Vec::new(),
            sets: Vec::new(),
            elements: Vec::new(),
            hairpin: Vec::new(),
            counters: Vec::new(),
        }
    }

    /// The table whose set or map `set` this Service's element belongs to: the
    /// dispatch maps are in its Service table, every other set in the main one.
    pub fn home(&self, set: &str) -> TableId {
        if set == MAP_SERVICE_IPS || set == MAP_SERVICE_NODEPORTS {
            self.table
        } else {
            TableId::main(self.table.family)
        }
    }
}

fn element(key: Vec<KeyValue>, verdict: Option<Verdict>, comment: &str) -> Element {
    Element {
        key,
        value: verdict.map(Mapped::Verdict),
        comment: Some(clamp_comment(comment)),
    }
}

fn nodeport_key(port: &ServicePort, node_port: u16) -> Vec<KeyValue> {
    vec![KeyValue::Proto(port.protocol), KeyValue::Port(node_port)]
}

/// The source-range firewall of a load balancer: listed sources return to the
/// caller (`firewall-check`), every other source is dropped.
fn firewall_chain(name: String, svc: &Service, ranges: &[IpNet]) -> Chain {
    let mut rules: Vec<Rule> = ranges
        .iter()
        .map(|r| {
            Rule::new(vec![
                Stmt::AddrMatch {
                    field: Field::Saddr,
                    net: *r,
                    negate: false,
                },
                Stmt::Verdict(Verdict::Return),
            ])
        })
        .collect();
    rules.push(
        Rule::new(vec![Stmt::Verdict(Verdict::Drop)])
            .with_comment("source outside loadBalancerSourceRanges"),
    );
    Chain {
        name,
        base: None,
        comment: Some(clamp_comment(&svc.key.to_string())),
        rules,
    }
}

/// The endpoint-picking chains of one Service port, by traffic policy.
struct PolicyChains {
    cluster: Option<String>,
    local: Option<String>,
}

impl PolicyChains {
    fn internal(&self, svc: &Service) -> Option<&str> {
        if svc.internal_policy_local {
            self.local.as_deref()
        } else {
            self.cluster.as_deref()
        }
    }

    fn external(&self, svc: &Service) -> Option<&str> {
        if svc.external_policy_local {
            self.local.as_deref()
        } else {
            self.cluster.as_deref()
        }
    }
}

/// The chain external traffic (NodePorts, external IPs, load balancer IPs) enters.
/// With `externalTrafficPolicy: Cluster` it is masqueraded and may go anywhere.
/// With `Local`, clients outside the node keep their source address and reach only
/// this node's endpoints, while pods and the node itself are served like internal
/// traffic (kube-proxy's short-circuit) so the Service works from everywhere.
fn external_chain(
    name: String,
    label: &str,
    svc: &Service,
    config: &NodeConfig,
    family: Family,
    chains: &PolicyChains,
) -> Option<Chain> {
    let internal = chains.internal(svc);
    let (local, cluster) = (chains.local.as_deref(), chains.cluster.as_deref());
    let mark = config.masquerade_mark();
    let goto = |c: &str| Stmt::Verdict(Verdict::Goto(c.to_string()));
    let mut rules = Vec::new();
    if !svc.external_policy_local {
        let cluster = cluster?;
        rules.push(Rule::new(vec![Stmt::MarkOr(mark)]));
        rules.push(Rule::new(vec![goto(cluster)]));
    } else {
        if let Some(internal) = internal {
            if let Some(cidr) = NodeConfig::cidr(&config.cluster_cidrs, family) {
                rules.push(
                    Rule::new(vec![
                        Stmt::AddrMatch {
                            field: Field::Saddr,
                            net: cidr,
                            negate: false,
                        },
                        goto(internal),
                    ])
                    .with_comment("pods reach the Service like internal traffic"),
                );
            }
            rules.push(Rule::new(vec![Stmt::FibSaddrLocal, Stmt::MarkOr(mark)]));
            rules.push(Rule::new(vec![Stmt::FibSaddrLocal, goto(internal)]));
        }
        if let Some(local) = local {
            rules.push(Rule::new(vec![goto(local)]));
        }
    }
    if rules.is_empty() {
        return None;
    }
    Some(Chain {
        name,
        base: None,
        comment: Some(clamp_comment(label)),
        rules,
    })
}

/// The IPVS backend's elements for a port's external addresses and NodePort:
/// served by IPVS, and masqueraded unless `externalTrafficPolicy: Local`.
fn ipvs_external_elements(
    out: &mut ServiceRules,
    svc: &Service,
    port: &ServicePort,
    label: &str,
    external_keys: &[Vec<KeyValue>],
    chains: &PolicyChains,
) {
    if chains.external(svc).is_none() {
        return;
    }
    for key in external_keys {
        out.elements
            .push((SET_SERVICE_PORTS, element(key.clone(), None, label)));
        if !svc.external_policy_local {
            out.elements
                .push((SET_MASQUERADE_SERVICES, element(key.clone(), None, label)));
        }
    }
    if let (Some(node_port), false) = (port.node_port, svc.external_policy_local) {
        out.elements.push((
            SET_MASQUERADE_NODEPORTS,
            element(nodeport_key(port, node_port), None, label),
        ));
    }
}

/// Only a pod on this node reaches itself through this node's rules (other
/// nodes' pods go through their own node's), so only endpoints that may be here
/// need a hairpin element: this node's, and any whose node is unknown.
fn may_hairpin(e: &PortEndpoint, node: Option<&NodeInfo>) -> bool {
    node.is_none() || e.node_name.is_none() || e.is_on(node)
}

/// The chains and elements of one Service in one family.
pub fn service_rules(
    state: &ClusterState,
    svc: &Service,
    family: Family,
    config: &NodeConfig,
    hints: &dyn SlotHints,
) -> ServiceRules {
    let mut out = ServiceRules::new(if config.backend.is_ipvs() {
        TableId::main(family)
    } else {
        TableId::shard(family, shard_of(&svc.key))
    });
    let Some(vip) = svc.cluster_ip_of(family) else {
        return out;
    };
    let node = state.node.as_ref();
    let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
        ips.iter()
            .copied()
            .filter(|ip| Family::of(ip) == family)
            .collect()
    };
    let external_ips = of_family(&svc.external_ips);
    let lb_ips = of_family(&svc.load_balancer_ips);
    let ranges: Vec<IpNet> = svc
        .source_ranges
        .iter()
        .copied()
        .filter(|r| Family::of_net(r) == family)
        .collect();
    out.elements.push((
        SET_CLUSTER_IPS,
        element(vec![KeyValue::Addr(vip)], None, &svc.key.to_string()),
    ));
    let firewall = (!lb_ips.is_empty() && !ranges.is_empty()).then(|| {
        let name = chain_name(
            "firewall",
            &format!("{}/{}", svc.key.namespace, svc.key.name),
        );
        out.main_chains
            .push(firewall_chain(name.clone(), svc, &ranges));
        name
    });
    for port in &svc.ports {
        let label = svc.port_label(port);
        let in_family: Vec<PortEndpoint> = state
            .endpoints_for(svc, port)
            .into_iter()
            .filter(|e| Family::of(&e.addr) == family)
            .collect();
        let eps = categorize(svc, &in_family, node);
        let port_id = port_id(svc, port);
        let affinity = svc.affinity_timeout.map(|timeout| Affinity {
            port_id: &port_id,
            timeout,
        });
        let ipvs = config.backend.is_ipvs();
        // Names the chain that picks among `chosen` (IPVS: only names whom
        // IPVS serves; it has no chain).
        let mut policy_chain = |kind: &str, chosen: &[&PortEndpoint]| -> Option<String> {
            if chosen.is_empty() {
                return None;
            }
            let name = chain_name(kind, &port_id);
            let here = chosen.iter().filter(|e| may_hairpin(e, node));
            out.hairpin.extend(here.map(|e| e.addr));
            if ipvs {
                return Some(name);
            }
            let slots = assign_slots(hints.slots(out.table, &name), chosen);
            if let Some(a) = &affinity {
                for ep in chosen {
                    let set = a.set(family, ep);
                    if !out.sets.iter().any(|s| s.name == set.name) {
                        out.sets.push(set);
                    }
                }
            }
            out.chains.push(service_port_chain(
                name.clone(),
                &label,
                port,
                &slots,
                affinity.as_ref(),
            ));
            Some(name)
        };
        let chains = PolicyChains {
            cluster: policy_chain("svc", &eps.cluster),
            local: policy_chain("local", &eps.local),
        };
        // What happens to traffic no chain DNATs: no endpoints at all is refused
        // at once; endpoints only elsewhere (a Local policy) is dropped.
        let unserved = |target: Option<&str>| match (eps.has_any, target) {
            (false, _) => Some(Verdict::Goto(CHAIN_REJECT.into())),
            (true, None) => Some(Verdict::Drop),
            (true, Some(_)) => None,
        };

        let vip_key = dispatch_key(vip, port);
        let internal = chains.internal(svc);
        match internal {
            Some(_) if ipvs => out
                .elements
                .push((SET_SERVICE_PORTS, element(vip_key.clone(), None, &label))),
            Some(chain) => out.elements.push((
                MAP_SERVICE_IPS,
                element(
                    vip_key.clone(),
                    Some(Verdict::Goto(chain.to_string())),
                    &label,
                ),
            )),
            None => out.elements.push((
                MAP_NO_ENDPOINT_SERVICES,
                element(vip_key.clone(), unserved(internal), &label),
            )),
        }

        let external_keys: Vec<Vec<KeyValue>> = external_ips
            .iter()
            .chain(&lb_ips)
            .map(|ip| dispatch_key(*ip, port))
            .collect();
        if config.counters {
            // Every address and NodePort of the port counts into one counter.
            let name = port_chain_name("svc", svc, port);
            let counted = |key: Vec<KeyValue>| Element {
                key,
                value: Some(Mapped::Counter(name.clone())),
                comment: None,
            };
            for key in std::iter::once(&vip_key).chain(&external_keys) {
                out.elements
                    .push((MAP_SERVICE_COUNTERS, counted(key.clone())));
            }
            if let Some(np) = port.node_port {
                out.elements
                    .push((MAP_NODEPORT_COUNTERS, counted(nodeport_key(port, np))));
            }
            out.counters.push(NamedCounter {
                name,
                comment: Some(clamp_comment(&label)),
            });
        }
        if external_keys.is_empty() && port.node_port.is_none() {
            continue;
        }
        if ipvs {
            ipvs_external_elements(&mut out, svc, port, &label, &external_keys, &chains);
        }
        let external_chain = if eps.has_any && !ipvs {
            external_chain(
                port_chain_name("external", svc, port),
                &label,
                svc,
                config,
                family,
                &chains,
            )
        } else {
            None
        };
        let unserved = unserved(chains.external(svc));
        for key in external_keys {
            if let Some(chain) = &external_chain {
                out.elements.push((
                    MAP_SERVICE_IPS,
                    element(key.clone(), Some(Verdict::Goto(chain.name.clone())), &label),
                ));
            }
            if let Some(v) = &unserved {
                out.elements.push((
                    MAP_NO_ENDPOINT_SERVICES,
                    element(key, Some(v.clone()), &label),
                ));
            }
        }
        if let Some(node_port) = port.node_port {
            if let Some(chain) = &external_chain {
                out.elements.push((
                    MAP_SERVICE_NODEPORTS,
                    element(
                        nodeport_key(port, node_port),
                        Some(Verdict::Goto(chain.name.clone())),
                        &label,
                    ),
                ));
            }
            if let Some(v) = &unserved {
                out.elements.push((
                    MAP_NO_ENDPOINT_NODEPORTS,
                    element(nodeport_key(port, node_port), Some(v.clone()), &label),
                ));
            }
        }
        if let Some(fw) = &firewall {
            for ip in &lb_ips {
                out.elements.push((
                    MAP_FIREWALL_IPS,
                    element(
                        dispatch_key(*ip, port),
                        Some(Verdict::Jump(fw.clone())),
                        &label,
                    ),
                ));
            }
        }
        out.chains.extend(external_chain);
    }
    out.hairpin.sort();
    out.hairpin.dedup();
    out
}

/// The node's own elements: the addresses NodePorts are served on.
pub fn node_elements(
    state: &ClusterState,
    config: &NodeConfig,
    family: Family,
) -> Vec<(&'static str, Element)> {
    config
        .nodeport_ips(state.node.as_ref(), family)
        .into_iter()
        .map(|ip| {
            (
                SET_NODEPORT_IPS,
                Element {
                    key: vec![KeyValue::Addr(ip)],
                    value: None,
                    comment: None,
                },
            )
        })
        .collect()
}

pub fn hairpin_element(addr: IpAddr) -> Element {
    Element {
        key: vec![KeyValue::Addr(addr), KeyValue::Addr(addr)],
        value: None,
        comment: None,
    }
}

/// The tables of one family.
fn tables_for(
    state: &ClusterState,
    config: &NodeConfig,
    family: Family,
    hints: &dyn SlotHints,
) -> Vec<Table> {
    let ids = table_ids(family, config);
    let mut tables: Vec<Table> = ids.iter().map(|id| skeleton_of(*id, config)).collect();
    let index = |id: TableId| {
        ids.iter()
            .position(|t| *t == id)
            .expect("one of our tables")
    };
    let mut elements: BTreeMap<(usize, &str), Vec<Element>> = BTreeMap::new();
    let mut hairpin = BTreeSet::new();
    for (set, e) in node_elements(state, config, family) {
        // Every table that dispatches NodePorts has its own copy of the addresses.
        for i in 0..ids.len() {
            elements.entry((i, set)).or_default().push(e.clone());
        }
    }
    for svc in state.services.values() {
        let mut rules = service_rules(state, svc, family, config, hints);
        let (main, own) = (index(TableId::main(family)), index(rules.table));
        for (set, e) in std::mem::take(&mut rules.elements) {
            elements
                .entry((index(rules.home(set)), set))
                .or_default()
                .push(e);
        }
        hairpin.extend(rules.hairpin);
        tables[own].chains.extend(rules.chains);
        tables[own].sets.extend(rules.sets);
        tables[main].chains.extend(rules.main_chains);
        tables[main].counters.extend(rules.counters);
    }
    elements.insert(
        (index(TableId::main(family)), SET_HAIRPIN),
        hairpin.into_iter().map(hairpin_element).collect(),
    );
    for ((i, name), mut els) in elements {
        els.sort_by(|a, b| a.key.cmp(&b.key));
        els.dedup_by(|a, b| a.key == b.key);
        if let Some(s) = tables[i].sets.iter_mut().find(|s| s.name == name) {
            s.elements = els;
        }
    }
    tables
}

/// The whole desired ruleset: the tables for IPv4, then those for IPv6.
pub fn translate(state: &ClusterState, config: &NodeConfig) -> Ruleset {
    translate_with_hints(state, config, &NoHints)
}

/// The same, keeping endpoints in the cascade slots the kernel has them in.
pub fn translate_with_hints(
    state: &ClusterState,
    config: &NodeConfig,
    hints: &dyn SlotHints,
) -> Ruleset {
    Ruleset {
        tables: Family::ALL
            .iter()
            .flat_map(|f| tables_for(state, config, *f, hints))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Conditions, Endpoint, EndpointPort, EndpointSlice, ServiceKey, TargetPort};
    use crate::ruleset::Protocol;
    use std::net::IpAddr;

    fn key(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state_with(name: &str, vips: &[&str], eps: &[(&str, Conditions)]) -> ClusterState {
        let mut state = ClusterState::default();
        let svc = Service {
            key: key(name),
            cluster_ips: vips.iter().map(|v| ip(v)).collect(),
            ports: vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                target_port: TargetPort::Number(9376),
                node_port: None,
            }],
            ..Service::default()
        };
        state.services.insert(svc.key.clone(), svc);
        for family in Family::ALL {
            let endpoints: Vec<Endpoint> = eps
                .iter()
                .filter(|(a, _)| Family::of(&ip(a)) == family)
                .map(|(a, c)| Endpoint {
                    addr: ip(a),
                    conditions: *c,
                    node_name: None,
                    zone: None,
                    hints: Default::default(),
                })
                .collect();
            state
                .slices
                .entry(key(name))
                .or_default()
                .insert(EndpointSlice {
                    name: format!("{name}-{}", family.keyword()),
                    service: key(name),
                    family,
                    ports: vec![EndpointPort {
                        name: "http".into(),
                        protocol: Protocol::Tcp,
                        port: 9376,
                    }],
                    endpoints,
                });
        }
        state
    }

    const READY: Conditions = Conditions {
        ready: true,
        serving: true,
        terminating: false,
    };
    const TERMINATING: Conditions = Conditions {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// The one Service port chain of a family in a ruleset built from one
    /// single-port Service (in whichever Service table holds it).
    fn service_chain(rs: &Ruleset, family: Family) -> &Chain {
        rs.of_family(family)
            .flat_map(|t| &t.chains)
            .find(|c| c.name.starts_with("svc-"))
            .expect("a Service port chain")
    }

    fn dnat_targets(chain: &Chain) -> Vec<String> {
        chain
            .rules
            .iter()
            .filter_map(|r| {
                r.stmts.iter().find_map(|s| match s {
                    Stmt::Dnat { addr, port } => Some(format!("{addr}:{port}")),
                    _ => None,
                })
            })
            .collect()
    }

    #[test]
    fn numgen_cascade_gives_every_endpoint_an_equal_share() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[
                ("10.244.0.1", READY),
                ("10.244.0.2", READY),
                ("10.244.0.3", READY),
            ],
        );
        let rs = translate(&state, &NodeConfig::default());
        let chain = service_chain(&rs, Family::Ip);
        let moduli: Vec<Option<u32>> = chain
            .rules
            .iter()
            .map(|r| {
                r.stmts.iter().find_map(|s| match s {
                    Stmt::NumgenEq { modulus, .. } => Some(*modulus),
                    _ => None,
                })
            })
            .collect();
        assert_eq!(moduli, vec![Some(3), Some(2), None]);
        // P(k) = prod_{j<k}(1 - 1/(n-j)) * 1/(n-k) = 1/n for every k.
        let n = 3.0;
        let mut reach = 1.0;
        for m in moduli {
            let p = m.map(|m| 1.0 / m as f64).unwrap_or(1.0);
            assert!((reach * p - 1.0 / n).abs() < 1e-12);
            reach *= 1.0 - p;
        }
        assert_eq!(
            dnat_targets(chain),
            vec!["10.244.0.1:9376", "10.244.0.2:9376", "10.244.0.3:9376"]
        );
        assert_eq!(chain.comment.as_deref(), Some("default/web:http"));
        assert!(chain.name.ends_with("-default/web/tcp/http"));
    }

    #[test]
    fn service_without_endpoints_goes_to_the_reject_map_and_has_no_chain() {
        let state = state_with("empty", &["10.0.0.11"], &[]);
        let rs = translate(&state, &NodeConfig::default());
        let t = rs.table(Family::Ip).unwrap();
        assert!(rs
            .of_family(Family::Ip)
            .filter_map(|t| t.set(MAP_SERVICE_IPS))
            .all(|m| m.elements.is_empty()));
        let ne = &t.set(MAP_NO_ENDPOINT_SERVICES).unwrap().elements;
        assert_eq!(ne.len(), 1);
        assert_eq!(
            ne[0].value,
            Some(Mapped::Verdict(Verdict::Goto(CHAIN_REJECT.into())))
        );
        assert!(!rs
            .tables
            .iter()
            .flat_map(|t| &t.chains)
            .any(|c| c.name.starts_with("svc-")));
        assert_eq!(t.set(SET_CLUSTER_IPS).unwrap().elements.len(), 1);
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[("10.244.0.1", READY), ("10.244.0.2", TERMINATING)],
        );
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(
            dnat_targets(service_chain(&rs, Family::Ip)),
            vec!["10.244.0.1:9376"]
        );

        let state = state_with("web", &["10.0.0.10"], &[("10.244.0.2", TERMINATING)]);
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(
            dnat_targets(service_chain(&rs, Family::Ip)),
            vec!["10.244.0.2:9376"]
        );
    }

    #[test]
    fn dual_stack_service_gets_a_chain_in_each_family_with_its_own_endpoints() {
        let state = state_with(
            "web",
            &["10.0.0.10", "fd00:10:96::10"],
            &[("10.244.0.1", READY), ("fd00:10:244::1", READY)],
        );
        let rs = translate(&state, &NodeConfig::default());
        for (family, ep) in [
            (Family::Ip, "10.244.0.1:9376"),
            (Family::Ip6, "fd00:10:244::1:9376"),
        ] {
            assert_eq!(dnat_targets(service_chain(&rs, family)), vec![ep]);
        }
    }

    #[test]
    fn a_services_chains_and_dispatch_elements_share_its_service_table() {
        let mut state = state_with("web", &["10.0.0.10"], &[("10.244.0.1", READY)]);
        let other = state_with("api", &["10.0.0.11"], &[("10.244.0.2", READY)]);
        state.services.extend(other.services);
        state.slices.extend(other.slices);
        assert_ne!(shard_of(&key("web")), shard_of(&key("api")));
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(rs.tables.len(), 2 * (1 + SERVICE_SHARDS as usize));
        for name in ["web", "api"] {
            let home = rs
                .get(TableId::shard(Family::Ip, shard_of(&key(name))))
                .unwrap();
            let chain = home
                .chains
                .iter()
                .find(|c| c.name.contains(&format!("default/{name}/")))
                .expect("its chain in its Service table");
            let dispatch = &home.set(MAP_SERVICE_IPS).unwrap().elements;
            assert_eq!(dispatch.len(), 1);
            assert_eq!(
                dispatch[0].value,
                Some(Mapped::Verdict(Verdict::Goto(chain.name.clone())))
            );
        }
        // No Service chain anywhere else, and the main table has no dispatch map.
        let chains = rs.tables.iter().flat_map(|t| &t.chains);
        assert_eq!(chains.filter(|c| c.name.starts_with("svc-")).count(), 2);
        assert!(rs.table(Family::Ip).unwrap().set(MAP_SERVICE_IPS).is_none());
    }

    #[test]
    fn only_endpoints_that_may_be_on_this_node_get_a_hairpin_element() {
        let mut state = state_with(
            "web",
            &["10.0.0.10"],
            &[
                ("10.244.0.1", READY),
                ("10.244.0.2", READY),
                ("10.244.0.3", READY),
            ],
        );
        let hairpin = |state: &ClusterState| {
            let rs = translate(state, &NodeConfig::default());
            let set = rs.table(Family::Ip).unwrap().set(SET_HAIRPIN).unwrap();
            set.elements
                .iter()
                .map(|e| e.key[0].to_string())
                .collect::<Vec<_>>()
        };
        let nodes = [Some("node-a"), Some("node-b"), None];
        for slice in state.slices.values_mut().flat_map(|s| s.values_mut()) {
            for (e, node) in slice.endpoints.iter_mut().zip(nodes) {
                e.node_name = node.map(String::from);
            }
        }
        // This node unknown: any endpoint may be here.
        assert_eq!(hairpin(&state).len(), 3);
        state.node = Some(NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        });
        assert_eq!(hairpin(&state), vec!["10.244.0.1", "10.244.0.3"]);
    }

    #[test]
    fn masquerade_rule_and_unallocated_drop_follow_the_cidrs() {
        let config = NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            masquerade_bit: 14,
            ..NodeConfig::default()
        };
        let v4 = skeleton(Family::Ip, &config);
        let services = v4.chain(CHAIN_SERVICES).unwrap();
        assert_eq!(services.rules.len(), 1);
        assert!(services.rules[0].stmts.contains(&Stmt::MarkOr(0x4000)));
        assert_eq!(v4.chain(CHAIN_CLUSTER_IPS_CHECK).unwrap().rules.len(), 3);
        // No IPv6 CIDRs were given: no masquerade rule and no drop rule there.
        let v6 = skeleton(Family::Ip6, &config);
        assert!(v6.chain(CHAIN_SERVICES).unwrap().rules.is_empty());
        assert_eq!(v6.chain(CHAIN_CLUSTER_IPS_CHECK).unwrap().rules.len(), 2);
    }

    #[test]
    fn hairpin_set_holds_each_endpoint_once() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[("10.244.0.1", READY), ("10.244.0.2", READY)],
        );
        let t = translate(&state, &NodeConfig::default()).tables.remove(0);
        let hp = &t.set(SET_HAIRPIN).unwrap().elements;
        assert_eq!(hp.len(), 2);
        assert_eq!(
            hp[0].key,
            vec![
                KeyValue::Addr(ip("10.244.0.1")),
                KeyValue::Addr(ip("10.244.0.1"))
            ]
        );
    }

    #[test]
    fn two_cidrs_of_one_family_are_a_clear_error() {
        let config = NodeConfig {
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "10.245.0.0/16".parse().unwrap(),
            ],
            ..NodeConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert!(err.0.starts_with("--cluster-cidr: 2 ip CIDRs"), "{err}");
    }

    fn ep(last: u8) -> PortEndpoint {
        PortEndpoint {
            addr: IpAddr::from([10, 244, 0, last]),
            port: 80,
            conditions: READY,
            node_name: None,
            zone: None,
            hints: Default::default(),
        }
    }

    fn keys(slots: &[&PortEndpoint]) -> Vec<u8> {
        slots
            .iter()
            .map(|e| match e.addr {
                IpAddr::V4(a) => a.octets()[3],
                IpAddr::V6(_) => 0,
            })
            .collect()
    }

    #[test]
    fn slots_from_scratch_list_endpoints_in_ascending_order() {
        let eps = [ep(1), ep(2), ep(3)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        // Slot 0 is the last rule, so the highest slot holds the lowest address.
        assert_eq!(keys(&assign_slots(None, &refs)), vec![3, 2, 1]);
    }

    #[test]
    fn a_leaving_endpoint_is_replaced_by_the_last_slot_and_others_stay() {
        let eps = [ep(1), ep(2), ep(4), ep(5)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        let previous: Vec<SlotKey> = [5, 4, 3, 2, 1]
            .iter()
            .map(|l| (IpAddr::from([10, 244, 0, *l]), 80))
            .collect();
        // 3 (slot 2) leaves: 1 (slot 4, the last) moves into slot 2.
        assert_eq!(
            keys(&assign_slots(Some(previous.clone()), &refs)),
            vec![5, 4, 1, 2]
        );
        // A newcomer takes a new slot at the end; nobody moves.
        let eps = [ep(1), ep(2), ep(3), ep(4), ep(5), ep(6)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        assert_eq!(
            keys(&assign_slots(Some(previous), &refs)),
            vec![5, 4, 3, 2, 1, 6]
        );
    }

    #[test]
    fn chain_names_are_stable_and_bounded() {
        let mut svc = Service {
            key: key("web"),
            ..Service::default()
        };
        let port = ServicePort {
            name: String::new(),
            protocol: Protocol::Udp,
            port: 53,
            target_port: TargetPort::Number(53),
            node_port: None,
        };
        let a = service_chain_name(&svc, &port);
        assert_eq!(a, service_chain_name(&svc, &port));
        assert!(a.ends_with("-default/web/udp/53"), "{a}");
        svc.key.name = "x".repeat(300);
        assert!(service_chain_name(&svc, &port).len() <= 255);
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;

    /// `nft-templates/skeleton.nft` is the readable form of `skeleton()` and
    /// `service_table_skeleton()`; this keeps
    /// the two from drifting apart.
    #[test]
    fn skeleton_matches_its_template() {
        let template = include_str!("../nft-templates/skeleton.nft");
        let config = NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            ..NodeConfig::default()
        };
        let body: String = template
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let tables = [
            skeleton(Family::Ip, &config),
            service_table_skeleton(TableId::shard(Family::Ip, 0)),
        ];
        let text: String = tables.iter().map(crate::text::table).collect();
        assert_eq!(text, body.trim_start());
    }
}
