//! Endpoint choice, shared by the Service ports of a table.
//!
//! Each way into a Service port (an entry: its ClusterIP, external or load
//! balancer IP, `ip daddr . meta l4proto . th dport`; its NodePort, `meta
//! l4proto . th dport`) has its endpoints in stable slots 0 … n−1, as the
//! elements `entry . slot : address . port` of an endpoint map. The chain of
//! its count, `pick-n`, DNATs to the endpoint in slot `numgen random mod n` of
//! the packet's entry, and the entry's dispatch element goes to that chain. So
//! each endpoint gets exactly 1/n, and nothing is made per Service.
//!
//! One map serves the counts of a power-of-two range (`endpoints-9-16` holds
//! the entries with 9 to 16 endpoints), which bounds both of the kernel's
//! per-table costs (docs/DESIGN.md, "Kernel scaling traps"):
//! - it finds a set by walking its table's sets, and a table has one map per
//!   range in use, however many Services it holds;
//! - it checks each new element of a map against every rule bound to the
//!   map: the pick chains of its counts (below), three rules each.
//!
//! A count change inside a range moves no element: one slot's element goes or
//! comes, and the dispatch element names the chain of the new count. Crossing
//! a power of two moves the entry's elements to the next map.
//!
//! A map of the ranges up to 16 comes with the pick chains of all its counts,
//! and they go with it. The kernel checks a map against each rule that newly
//! uses it by walking all its elements (`nf_tables_bind_set`): a chain made for
//! the first entry of a count, in a map already full, cost 18–26 ms at 100k
//! Services (62,500 elements a table). Made with the map, the chains bind it
//! while it is empty. The price is paid per element instead: the kernel checks
//! each new element against every rule bound to its map, so a range's chains
//! are not free (the cold sync of 100k × 10, 8 chains on `endpoints-9-16`, took
//! 14% longer). Above 16 a count's chain is made with its first entry, so that
//! a range of many counts, or one Service with thousands of endpoints, does not
//! bring a chain for each count it might have.
//!
//! What this does not own: which endpoints an entry gets (`core::policy`), and
//! which slot each takes (`slots`).

use crate::core::endpoint_key::EndpointKey;
use crate::core::net::{Family, Protocol};
use crate::nft::build::{DISPATCH_KEY, NODEPORT_KEY};
use crate::ruleset::{
    Chain, Element, Field, KeyType, KeyValue, MapData, Mapped, Rule, Set, Stmt, Verdict,
};

/// The protocols a Service port can have; each pick chain has a rule for each,
/// since `nft` needs the protocol matched before a port is rewritten.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// How a packet names the Service port it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKind {
    /// A ClusterIP, external IP or load balancer IP, its protocol and port.
    Address,
    /// A NodePort on any of the node's NodePort addresses: protocol and port.
    NodePort,
}

impl EntryKind {
    /// The packet fields that make the entry, in the order of its key.
    pub fn fields(self) -> &'static [Field] {
        match self {
            EntryKind::Address => &DISPATCH_KEY,
            EntryKind::NodePort => &NODEPORT_KEY,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            EntryKind::Address => "",
            EntryKind::NodePort => "nodeport-",
        }
    }
}

/// The entries that pick in one chain: of one kind, among all endpoints
/// (`cluster`) or this node's only (`local`), with `count` endpoints each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PickGroup {
    pub kind: EntryKind,
    pub local: bool,
    pub count: u32,
}

impl PickGroup {
    /// `pick-3`, `pick-local-3`, `nodeport-pick-3`, `nodeport-pick-local-3`.
    pub fn chain_name(&self) -> String {
        let local = if self.local { "local-" } else { "" };
        format!("{}pick-{local}{}", self.kind.prefix(), self.count)
    }

    /// The map its entries' endpoints are in.
    pub fn map(&self) -> EndpointMap {
        EndpointMap {
            kind: self.kind,
            local: self.local,
            up_to: self.count.next_power_of_two(),
        }
    }

    /// The chain that DNATs to slot `numgen random mod count` of the packet's
    /// entry in the map: one rule per protocol.
    pub fn chain(&self) -> Chain {
        let rules = PROTOCOLS
            .iter()
            .map(|p| {
                Rule::new(vec![
                    Stmt::L4Proto(*p),
                    Stmt::DnatPick {
                        fields: self.kind.fields().to_vec(),
                        modulus: self.count,
                        map: self.map().name(),
                    },
                ])
            })
            .collect();
        Chain {
            name: self.chain_name(),
            base: None,
            comment: None,
            rules,
        }
    }
}

/// The largest range whose pick chains are made with its map (above).
const PICKS_WITH_THE_MAP_UP_TO: u32 = 16;

/// An endpoint map: the entries of one kind and policy whose count is in
/// `up_to / 2 + 1 ..= up_to` (a power of two; 1 and 2 have maps of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointMap {
    pub kind: EntryKind,
    pub local: bool,
    pub up_to: u32,
}

impl EndpointMap {
    fn least(&self) -> u32 {
        self.up_to / 2 + 1
    }

    /// Whether the pick chains of every count in the range are made (and
    /// deleted) with the map, rather than each with its count's first entry.
    pub fn brings_its_picks(&self) -> bool {
        self.up_to <= PICKS_WITH_THE_MAP_UP_TO
    }

    /// The pick chains of the counts in the range.
    fn picks(&self) -> impl Iterator<Item = PickGroup> + '_ {
        (self.least()..=self.up_to).map(|count| PickGroup {
            kind: self.kind,
            local: self.local,
            count,
        })
    }

    /// `endpoints-1`, `endpoints-2`, `endpoints-3-4`, `local-endpoints-9-16`,
    /// `nodeport-endpoints-5-8`, `nodeport-local-endpoints-17-32`, …
    pub fn name(&self) -> String {
        let local = if self.local { "local-" } else { "" };
        let range = if self.least() == self.up_to {
            self.up_to.to_string()
        } else {
            format!("{}-{}", self.least(), self.up_to)
        };
        format!("{}{local}endpoints-{range}", self.kind.prefix())
    }

    /// The map of this name, if it is one of these.
    pub fn of_name(name: &str) -> Option<EndpointMap> {
        let (kind, rest) = match name.strip_prefix("nodeport-") {
            Some(rest) => (EntryKind::NodePort, rest),
            None => (EntryKind::Address, name),
        };
        let (local, rest) = match rest.strip_prefix("local-") {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        let range = rest.strip_prefix("endpoints-")?;
        let up_to: u32 = range.rsplit('-').next()?.parse().ok()?;
        let map = EndpointMap { kind, local, up_to };
        // Only the canonical spelling: "endpoints-03" is someone else's.
        (up_to.is_power_of_two() && map.name() == name).then_some(map)
    }

    /// The map, without elements.
    pub fn set(&self, family: Family) -> Set {
        let mut key: Vec<KeyType> = self
            .kind
            .fields()
            .iter()
            .map(|f| match f {
                Field::Daddr => family.addr_type(),
                Field::L4Proto => KeyType::InetProto,
                _ => KeyType::InetService,
            })
            .collect();
        key.push(KeyType::Slot);
        // Short: the kernel takes at most 256 bytes of a set's userdata, and
        // the key's and the data's "typeof" take 170 of them.
        let ports = match self.kind {
            EntryKind::Address => "Service ports",
            EntryKind::NodePort => "NodePorts",
        };
        let count = if self.least() == self.up_to {
            format!("{}", self.up_to)
        } else {
            format!("{}-{}", self.least(), self.up_to)
        };
        let here = if self.local { " on this node" } else { "" };
        Set {
            name: self.name(),
            key,
            data: Some(MapData::Endpoint(family)),
            comment: Some(format!(
                "{ports} with {count} endpoints{here}: slot -> endpoint"
            )),
            timeout: None,
            elements: Vec::new(),
        }
    }
}

/// What several Services of a table share, and each Service that uses it
/// counts: a pick chain, an endpoint map, or a chain that marks external
/// traffic for masquerading before it picks (`externalTrafficPolicy: Cluster`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shared {
    Map(EndpointMap),
    Pick(PickGroup),
    /// Always among all endpoints; its pick is counted on its own.
    Masquerade {
        kind: EntryKind,
        count: u32,
    },
}

impl Shared {
    /// `masquerade-pick-3`, `nodeport-masquerade-pick-3`.
    pub fn masquerade_chain_name(kind: EntryKind, count: u32) -> String {
        format!("{}masquerade-pick-{count}", kind.prefix())
    }

    /// The names of the chains it makes (`chains`).
    pub fn chain_names(&self) -> Vec<String> {
        self.chains(0).into_iter().map(|c| c.name).collect()
    }

    /// The chains it makes, given the masquerade mark: a map of a small range
    /// makes the pick chains of its counts, and a count of such a range makes
    /// none of its own.
    pub fn chains(&self, mark: u32) -> Vec<Chain> {
        match self {
            Shared::Map(m) if m.brings_its_picks() => m.picks().map(|g| g.chain()).collect(),
            Shared::Map(_) => Vec::new(),
            Shared::Pick(g) if g.map().brings_its_picks() => Vec::new(),
            Shared::Pick(g) => vec![g.chain()],
            Shared::Masquerade { kind, count } => {
                let pick = PickGroup {
                    kind: *kind,
                    local: false,
                    count: *count,
                };
                vec![Chain {
                    name: Shared::masquerade_chain_name(*kind, *count),
                    base: None,
                    comment: None,
                    rules: vec![
                        Rule::new(vec![Stmt::MarkOr(mark)]),
                        Rule::new(vec![Stmt::Verdict(Verdict::Goto(pick.chain_name()))]),
                    ],
                }]
            }
        }
    }
}

/// One entry's endpoints, by slot, in the endpoint map of its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySlots {
    pub map: EndpointMap,
    /// The entry's key: the first fields of each element's key.
    pub entry: Vec<KeyValue>,
    pub endpoints: Vec<EndpointKey>,
}

impl EntrySlots {
    /// The map's elements for this entry: `entry . slot : address . port`.
    pub fn elements(&self) -> impl Iterator<Item = Element> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(slot, EndpointKey { addr, port })| Element {
                key: slot_key(&self.entry, slot as u32),
                value: Some(Mapped::Endpoint(*addr, *port)),
                comment: None,
            })
    }
}

/// An element's key: the entry, then the slot.
pub fn slot_key(entry: &[KeyValue], slot: u32) -> Vec<KeyValue> {
    let mut key = entry.to_vec();
    key.push(KeyValue::Slot(slot));
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(count: u32) -> String {
        PickGroup {
            kind: EntryKind::Address,
            local: false,
            count,
        }
        .map()
        .name()
    }

    #[test]
    fn counts_share_a_map_up_to_the_next_power_of_two() {
        let names: Vec<String> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 5000].map(map).to_vec();
        assert_eq!(
            names,
            [
                "endpoints-1",
                "endpoints-2",
                "endpoints-3-4",
                "endpoints-3-4",
                "endpoints-5-8",
                "endpoints-5-8",
                "endpoints-9-16",
                "endpoints-9-16",
                "endpoints-17-32",
                "endpoints-4097-8192"
            ]
        );
    }

    #[test]
    fn a_map_name_names_its_map_and_nothing_else_does() {
        for kind in [EntryKind::Address, EntryKind::NodePort] {
            for local in [false, true] {
                for up_to in [1, 2, 4, 16, 1 << 20] {
                    let m = EndpointMap { kind, local, up_to };
                    assert_eq!(EndpointMap::of_name(&m.name()), Some(m));
                }
            }
        }
        for other in [
            "endpoints-0",
            "endpoints-3",
            "endpoints-03-04",
            "endpoints-1-4",
            "endpoints-",
            "local-endpoints-x",
            "service-ips",
            "ep-ABCDEFGHIJKLM",
            "nodeport-local-endpoints-+4",
        ] {
            assert_eq!(EndpointMap::of_name(other), None, "{other}");
        }
    }

    #[test]
    fn every_maps_definition_fits_the_kernels_userdata_limit() {
        // NFT_USERDATA_MAXLEN: a longer one is refused with ERANGE. Up to
        // 16M endpoints, far beyond any Service.
        for kind in [EntryKind::Address, EntryKind::NodePort] {
            for local in [false, true] {
                for family in Family::ALL {
                    let m = EndpointMap {
                        kind,
                        local,
                        up_to: 1 << 24,
                    };
                    let set = crate::nft::lower::lower_set(&m.set(family));
                    let len = set.userdata.unwrap().len();
                    assert!(len <= 256, "{}: {len} bytes", m.name());
                }
            }
        }
    }

    #[test]
    fn a_pick_chain_has_a_rule_per_protocol_over_its_map() {
        let g = PickGroup {
            kind: EntryKind::NodePort,
            local: false,
            count: 3,
        };
        let chain = g.chain();
        assert_eq!(chain.name, "nodeport-pick-3");
        let protocols: Vec<Stmt> = chain.rules.iter().map(|r| r.stmts[0].clone()).collect();
        assert_eq!(protocols, PROTOCOLS.map(Stmt::L4Proto).to_vec());
        for r in &chain.rules {
            assert_eq!(
                r.stmts[1],
                Stmt::DnatPick {
                    fields: vec![Field::L4Proto, Field::Dport],
                    modulus: 3,
                    map: "nodeport-endpoints-3-4".into(),
                }
            );
        }
        let map = g.map().set(Family::Ip6);
        assert_eq!(
            map.key,
            vec![KeyType::InetProto, KeyType::InetService, KeyType::Slot]
        );
        assert_eq!(map.data, Some(MapData::Endpoint(Family::Ip6)));
    }
}
