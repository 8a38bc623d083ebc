//! The static part of our tables: every set (empty) and chain that does not
//! depend on Services, for the main table and for a Service table, and the
//! `--counters` additions. `nft-templates/skeleton.nft` shows it as text.

use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::nft::build::{base, jump, regular, set, vmap, DISPATCH_KEY, NODEPORT_KEY};
use crate::nft::ipvs_table::adapt_for_ipvs;
use crate::nft::names::*;
use crate::ruleset::{
    ChainType, Direction, Field, Hook, KeyType, MapData, Rule, Set, Stmt, Table, TableId, Verdict,
    TABLE_NAME,
};

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
    let ipvs = config.mode.is_ipvs();
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

    // The verdict comes from a map, not a `reject` statement: while a
    // transaction deletes our tables (`nft flush ruleset`), the kernel runs the
    // deleted chains' old rules until it unhooks each, and then a map's lookup
    // misses (the Service tables' DNAT already does) while a set's still hits.
    // With `reject` here, a connection opened in that instant was refused.
    let mut cluster_ips_check = vec![Rule::new(vec![
        in_set(Field::Daddr, SET_CLUSTER_IPS),
        vmap(&[Field::CtState], MAP_CLUSTER_IPS_REJECT),
    ])
    .with_comment("reject traffic to invalid ports of ClusterIPs")];
    // One rule per ServiceCIDR of the family (kube-proxy puts them in one rule's
    // anonymous set): a cluster has a handful, and this shape is one we encode.
    for cidr in NodeConfig::cidrs(&config.service_cidrs, family) {
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
        objects: Vec::new(),
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
            set(
                MAP_CLUSTER_IPS_REJECT,
                vec![KeyType::CtState],
                Some(MapData::Verdict),
                "what a new connection to an invalid port of a ClusterIP meets (see cluster-ips-check)",
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

/// One Service table: its share of the dispatch maps, and the pick chains and
/// endpoint maps (one per endpoint count in use, `pick`) they lead to. The
/// kernel's NAT hook runs the NAT chains of every table in priority order and
/// stops at the first one that sets up a binding; a Service is in one table
/// only, so at most one table DNATs a connection.
///
/// Its comment names the layout and the count of Service tables: a table of
/// an earlier layout (a chain and an endpoint map per Service port), or of
/// another count (`nft::service_tables`), has another, and is replaced whole by
/// the first full sync, in its one transaction, instead of set by set (deleting
/// 6,000 named sets of a table one by one walks its sets 6,000 times).
pub fn service_table_skeleton(id: TableId, count: u16) -> Table {
    let family = id.family;
    let addr = family.addr_type();
    let enter = || vec![Rule::new(vec![jump(CHAIN_SERVICES)])];
    Table {
        family,
        name: id.name().to_string(),
        comment: Some(format!(
            "kube-nft: 1/{count} of the Services by name hash, their endpoints in a map per endpoint count (managed by kube-nft, do not edit)"
        )),
        objects: Vec::new(),
        sets: vec![
            nodeport_ips_set(addr),
            set(
                MAP_SERVICE_IPS,
                vec![addr, KeyType::InetProto, KeyType::InetService],
                Some(MapData::Verdict),
                "ClusterIP, external IP or load balancer IP . protocol . port: the chain that picks its endpoint",
            ),
            set(
                MAP_SERVICE_NODEPORTS,
                vec![KeyType::InetProto, KeyType::InetService],
                Some(MapData::Verdict),
                "protocol . NodePort: the chain that picks its endpoint",
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

/// The static part of any of our tables, with `count` Service tables.
pub fn skeleton_of(id: TableId, config: &NodeConfig, count: u16) -> Table {
    match id.shard {
        None => skeleton(id.family, config),
        Some(_) => service_table_skeleton(id, count),
    }
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
