//! The nftables objects kube-nft programs: tables, chains, rules, sets and elements.
//!
//! This is the vocabulary shared by `nft::translate` (which builds it), `nft::lower`
//! (which turns it into kernel objects), `text` (its submodule, which prints it as `nft -f` input)
//! and `explain` (which walks it). It speaks at the level a reader of
//! `nft list ruleset` thinks in (`ip daddr @cluster-ips`, `dnat to A:P`); how each
//! statement becomes kernel bytecode is `nft::lower`'s business, not this one's.

pub mod text;

use crate::core::net::{Family, Protocol};
use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;

/// The name of kube-nft's main table, one per family: everything but the
/// Service port chains.
pub const TABLE_NAME: &str = "kube-nft";

/// How many tables per family may share the Service port chains (see
/// `TableId`); `nft::service_tables` chooses how many of them a cluster uses.
pub const SERVICE_SHARDS: u16 = 16;

/// The names of the Service tables, `kube-nft-services-NN`.
const SHARD_NAMES: [&str; SERVICE_SHARDS as usize] = [
    "kube-nft-services-00",
    "kube-nft-services-01",
    "kube-nft-services-02",
    "kube-nft-services-03",
    "kube-nft-services-04",
    "kube-nft-services-05",
    "kube-nft-services-06",
    "kube-nft-services-07",
    "kube-nft-services-08",
    "kube-nft-services-09",
    "kube-nft-services-10",
    "kube-nft-services-11",
    "kube-nft-services-12",
    "kube-nft-services-13",
    "kube-nft-services-14",
    "kube-nft-services-15",
];

/// One of the tables kube-nft owns: the main table of a family, or one of its
/// Service tables. The Service port chains are spread over up to
/// `SERVICE_SHARDS` tables because the kernel validates a whole table (every
/// chain reachable from its base chains) in any commit that adds a rule with a
/// NAT or verdict statement: spread out, an endpoint change validates one
/// shard, not every Service (docs/DESIGN.md, "Kernel scaling traps").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableId {
    pub family: Family,
    /// `None` for the main table.
    pub shard: Option<u16>,
}

impl TableId {
    pub fn main(family: Family) -> TableId {
        TableId {
            family,
            shard: None,
        }
    }

    pub fn shard(family: Family, shard: u16) -> TableId {
        TableId {
            family,
            shard: Some(shard % SERVICE_SHARDS),
        }
    }

    /// The main table, then the Service tables.
    pub fn all_of(family: Family) -> impl Iterator<Item = TableId> {
        std::iter::once(TableId::main(family))
            .chain((0..SERVICE_SHARDS).map(move |n| TableId::shard(family, n)))
    }

    pub fn name(self) -> &'static str {
        match self.shard {
            None => TABLE_NAME,
            Some(n) => SHARD_NAMES[n as usize],
        }
    }

    /// The table of this family with this name, if it is one of ours.
    pub fn named(family: Family, name: &str) -> Option<TableId> {
        TableId::all_of(family).find(|t| t.name() == name)
    }

    /// Whether a table of this name (in either family) is one of ours.
    pub fn is_ours(name: &str) -> bool {
        TableId::named(Family::Ip, name).is_some()
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family.keyword(), self.name())
    }
}

/// The size `nft` gives a dynamic set (the kernel's default would be unbounded).
pub const DYNAMIC_SET_SIZE: u32 = 65535;

/// nftables caps element, rule and chain comments at 128 bytes including the NUL.
pub const MAX_COMMENT_LEN: usize = 127;

/// What nftables calls and numbers each family.
impl Family {
    /// The `nft` keyword, which is also the payload-expression prefix (`ip6 daddr`).
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    /// `NFPROTO_IPV4` / `NFPROTO_IPV6`.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::Ip => 2,
            Family::Ip6 => 10,
        }
    }

    pub fn addr_type(self) -> KeyType {
        match self {
            Family::Ip => KeyType::Ipv4Addr,
            Family::Ip6 => KeyType::Ipv6Addr,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub comment: Option<String>,
    /// Listed (and created) in this order, like `nft -f` does: named objects,
    /// sets, chains.
    pub objects: Vec<NamedObject>,
    pub sets: Vec<Set>,
    pub chains: Vec<Chain>,
}

/// A named object of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedObject {
    pub name: String,
    pub comment: Option<String>,
    pub kind: ObjectDef,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectDef {
    /// `counter NAME { }`: rules and counter maps add to it, and it keeps its
    /// values while rules around it are rewritten.
    Counter,
    /// `ct timeout NAME { }`: the conntrack timeouts that `ct timeout set`
    /// gives the flows of the rule's packets.
    CtTimeout(CtTimeoutPolicy),
}

/// A conntrack timeout policy of one protocol: the states it sets, in seconds;
/// every other state keeps the kernel's default, which `nft` sends with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtTimeoutPolicy {
    pub protocol: Protocol,
    /// In the kernel's order of states (`CtTimeoutPolicy::states`).
    pub set: Vec<(&'static str, u32)>,
}

impl CtTimeoutPolicy {
    /// The states of a protocol that a policy may set, in the kernel's order
    /// (`CTA_TIMEOUT_TCP_*`, `CTA_TIMEOUT_UDP_*`), with the defaults `nft`
    /// sends for those it does not set (the kernel's built-in ones).
    pub fn states(protocol: Protocol) -> &'static [(&'static str, u32)] {
        match protocol {
            Protocol::Tcp => &[
                ("syn_sent", 120),
                ("syn_recv", 60),
                ("established", 432000),
                ("fin_wait", 120),
                ("close_wait", 60),
                ("last_ack", 30),
                ("time_wait", 120),
                ("close", 10),
                ("syn_sent2", 120),
                ("retrans", 300),
                ("unacknowledged", 300),
            ],
            Protocol::Udp => &[("unreplied", 30), ("replied", 120)],
            Protocol::Sctp => &[],
        }
    }

    /// Every state's timeout, in the kernel's order: what goes on the wire.
    pub fn timeouts(&self) -> Vec<u32> {
        CtTimeoutPolicy::states(self.protocol)
            .iter()
            .map(|(state, default)| {
                let set = self.set.iter().find(|(s, _)| s == state);
                set.map_or(*default, |(_, t)| *t)
            })
            .collect()
    }

    /// The policy of a wire array: the states whose timeout is not the
    /// default (what `nft` lists). `None` if the array is not one we write.
    pub fn from_timeouts(protocol: Protocol, timeouts: &[u32]) -> Option<CtTimeoutPolicy> {
        let states = CtTimeoutPolicy::states(protocol);
        if states.is_empty() || timeouts.len() != states.len() {
            return None;
        }
        let set = states
            .iter()
            .zip(timeouts)
            .filter(|((_, default), t)| *t != default)
            .map(|((state, _), t)| (*state, *t))
            .collect();
        Some(CtTimeoutPolicy { protocol, set })
    }
}

impl Table {
    pub fn id(&self) -> TableId {
        TableId::named(self.family, &self.name).expect("one of our tables")
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }
}

/// The types a set key (or a field of a concatenated key) can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    /// An endpoint map's slot: what `numgen random mod N` yields, a 32-bit
    /// integer in host byte order (`typeof numgen random mod 1`).
    Slot,
    /// `ct state`: a 32-bit bitmask in host byte order.
    CtState,
}

impl KeyType {
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Slot => "integer",
            KeyType::CtState => "ct_state",
        }
    }
}

/// What the elements of a map map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapData {
    Verdict,
    /// The name of a counter object (an object map: `type K : counter`).
    Counter,
    /// An endpoint, address and port, to DNAT to: the data of an endpoint map
    /// (`typeof … : ip daddr . th dport`), whose key is a Service port's entry
    /// and a slot (`ip daddr . meta l4proto . th dport . numgen random mod 1`, or
    /// `meta l4proto . th dport . numgen random mod 1` for NodePorts).
    Endpoint(Family),
}

/// A named set, or a map when `data` says what its elements map to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    pub key: Vec<KeyType>,
    pub data: Option<MapData>,
    pub comment: Option<String>,
    /// A set the rules fill as packets pass (`flags dynamic,timeout`), whose
    /// elements expire after this many seconds. Its elements are the kernel's.
    pub timeout: Option<u32>,
    /// The most elements the kernel lets it hold (`size`): a dynamic set's, as
    /// `nft` gives one, and a large endpoint map's (`endpoint_map_size`). None
    /// is no bound.
    pub size: Option<u32>,
    pub elements: Vec<Element>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyValue {
    Addr(IpAddr),
    Proto(Protocol),
    Port(u16),
    /// An endpoint map's slot.
    Slot(u32),
    /// `ct state new`, the one state kube-nft keys by.
    CtStateNew,
}

impl fmt::Display for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyValue::Addr(a) => write!(f, "{a}"),
            KeyValue::Proto(p) => write!(f, "{p}"),
            KeyValue::Port(p) => write!(f, "{p}"),
            KeyValue::Slot(n) => write!(f, "{n}"),
            KeyValue::CtStateNew => write!(f, "new"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub key: Vec<KeyValue>,
    /// Present exactly when the element belongs to a map, and of its kind.
    pub value: Option<Mapped>,
    pub comment: Option<String>,
}

/// The value of a map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Mapped {
    Verdict(Verdict),
    /// A counter object's name.
    Counter(String),
    /// An endpoint to DNAT to.
    Endpoint(IpAddr, u16),
}

impl fmt::Display for Mapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mapped::Verdict(v) => v.fmt(f),
            Mapped::Counter(name) => write!(f, "\"{name}\""),
            Mapped::Endpoint(addr, port) => write!(f, "{addr} . {port}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainType {
    Filter,
    Nat,
}

impl ChainType {
    pub fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    /// `NF_INET_*` hook numbers.
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

/// What makes a chain a base chain: where the kernel calls it. Policy is always accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(stmts: Vec<Stmt>) -> Self {
        Rule {
            stmts,
            comment: None,
        }
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }
}

/// Packet fields usable in matches and as (concatenated) set keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Saddr,
    Daddr,
    L4Proto,
    /// `th dport`: the transport destination port, whatever the protocol.
    Dport,
    /// `th sport`.
    Sport,
    /// `ct state`.
    CtState,
}

/// A packet's direction in its connection (`ct direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Original,
    Reply,
}

impl Direction {
    /// `IP_CT_DIR_*`.
    pub fn code(self) -> u8 {
        match self {
            Direction::Original => 0,
            Direction::Reply => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Direction::Original => "original",
            Direction::Reply => "reply",
        }
    }
}

/// One statement of a rule; a rule is a sequence of them, matches first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// `ip saddr != 10.244.0.0/16`, `ip daddr 10.0.0.1`.
    AddrMatch {
        field: Field,
        net: IpNet,
        negate: bool,
    },
    /// `meta l4proto tcp`.
    L4Proto(Protocol),
    /// `ct state new`.
    CtStateNew,
    /// `ct direction original`.
    CtDirection(Direction),
    /// `fib saddr type local`: the packet comes from one of this host's addresses.
    FibSaddrLocal,
    /// `meta mark & M == M`.
    MarkHas(u32),
    /// `numgen random mod N V`, true with probability 1/N.
    NumgenEq {
        modulus: u32,
        value: u32,
    },
    /// `numgen random mod N < B`, true with probability B/N.
    NumgenBelow {
        modulus: u32,
        bound: u32,
    },
    /// `ip daddr @cluster-ips`.
    InSet {
        fields: Vec<Field>,
        set: String,
    },
    /// `ip daddr . meta l4proto . th dport vmap @service-ips`.
    Vmap {
        fields: Vec<Field>,
        map: String,
    },
    /// `update @set { ip saddr }`: add the field to a dynamic set, or refresh its timeout.
    SetUpdate {
        field: Field,
        set: String,
    },
    /// `meta mark set meta mark | M`.
    MarkOr(u32),
    /// `meta mark set meta mark ^ M`.
    MarkXor(u32),
    /// `dnat to ADDR:PORT`; needs an `L4Proto` match earlier in the rule.
    Dnat {
        addr: IpAddr,
        port: u16,
    },
    /// `dnat ip to ip daddr . meta l4proto . th dport . numgen random mod N map
    /// @MAP`: DNAT to the endpoint the map holds for the packet's `fields` and
    /// the slot `numgen random mod N`; needs an `L4Proto` match earlier.
    DnatPick {
        fields: Vec<Field>,
        modulus: u32,
        map: String,
    },
    Masquerade {
        fully_random: bool,
    },
    /// ICMP port unreachable (ICMPv6 in `ip6` tables), what `nft` writes for `reject`.
    Reject,
    /// `reject with tcp reset`: a TCP RST (matches only TCP). Unlike ICMP errors,
    /// resets are not rate-limited by the kernel, so every refused connection is
    /// refused at once.
    RejectTcpReset,
    Counter,
    /// `counter name ip daddr . meta l4proto . th dport map @service-counters`:
    /// adds the packet to the counter object the map names; no match, no count.
    CounterByMap {
        fields: Vec<Field>,
        map: String,
    },
    /// `ct timeout set "NAME"`: the flow of an unconfirmed packet takes the
    /// timeouts of the `ct timeout` object NAME.
    CtTimeoutSet(String),
    /// `ct label set N`: sets label bit N of the connection, leaving the others.
    CtLabelSet(u8),
    /// `ct label N`: the connection has label bit N.
    CtLabelHas(u8),
    /// `ct original packets > N`: more than N packets counted in that
    /// direction (the kernel turns conntrack accounting on for this).
    CtPacketsAbove {
        direction: Direction,
        count: u64,
    },
    /// `flow add @NAME`: the connection goes into the flowtable NAME, and its
    /// later packets bypass the forward path.
    FlowAdd(String),
    Verdict(Verdict),
}

/// Truncates a comment to what nftables accepts, on a character boundary.
pub fn clamp_comment(s: &str) -> String {
    if s.len() <= MAX_COMMENT_LEN {
        return s.to_string();
    }
    let mut end = MAX_COMMENT_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A whole ruleset of ours: per family, the main table and (nftables
/// backend) the Service tables.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_comments_are_cut_on_a_character_boundary() {
        let s = "é".repeat(100);
        let c = clamp_comment(&s);
        assert!(c.len() <= MAX_COMMENT_LEN);
        assert!(s.starts_with(&c));
    }
}
