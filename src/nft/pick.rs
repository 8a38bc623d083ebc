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
//! Up to 16 endpoints, one map serves the counts of a power-of-two range
//! (`endpoints-9-16` holds the entries with 9 to 16 endpoints), which bounds
//! both of the kernel's per-table costs (docs/DESIGN.md, "Kernel scaling
//! traps"):
//! - it finds a set by walking its table's sets, and a table has one map per
//!   range in use, however many Services it holds;
//! - it checks each new element of a map against every rule bound to the
//!   map: the pick chains of its counts (below), three rules each.
//!
//! A count change inside a range moves no element: one slot's element goes or
//! comes, and the dispatch element names the chain of the new count. Crossing
//! a power of two moves the entry's elements to the next map.
//!
//! A range's map comes with the pick chains of all its counts, and they go
//! with it. The kernel checks a map against each rule that newly uses it by
//! walking all its elements (`nf_tables_bind_set`): a chain made for the first
//! entry of a count, in a map already full, cost 18–26 ms at 100k Services
//! (62,500 elements a table). Made with the map, the chains bind it while it
//! is empty. The price is paid per element instead: the kernel checks each new
//! element against every rule bound to its map, so a range's chains are not
//! free (the cold sync of 100k × 10, 8 chains on `endpoints-9-16`, took 14%
//! longer).
//!
//! Above 16 endpoints an entry's slots are split into blocks, each in a map of
//! its own (`endpoints-block-<size>-<index>`) with the one pick chain that
//! reads it, made and deleted together, so no chain ever binds a full map:
//! blocks of 1024 (`BLOCK`) from slot 0, then one block for each bit of the
//! rest, largest first (3000 = 2 × 1024 + 512 + 256 + 128 + 32 + 16 + 8). The
//! chain of the count, `pick-3000`, picks a block with one rule per block,
//! `numgen random mod m < size goto pick-block-…`, where `m` is the slots the
//! rules before it left (each rule's chance is its block's share of those, so
//! every slot gets exactly 1/n). It reads no map, so making it for a count's
//! first entry costs the kernel no walk of elements (a chain over a range's
//! map of 100,000 did: 28–59 ms). A count change moves the slots of the blocks
//! that differ between the two layouts: those of the lowest bits, a few on
//! average and fewer than `2 × BLOCK` at worst. A new connection to such an
//! entry meets one rule per block before it is DNATed (100 at 100,000
//! endpoints, half of them on average); only its first packet does.
//!
//! What this does not own: which endpoints an entry gets (`core::policy`), and
//! which slot each takes (`slots`).

use crate::core::endpoint_key::EndpointKey;
use crate::core::net::{Family, Protocol};
use crate::nft::build::{regular, DISPATCH_KEY, NODEPORT_KEY};
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

    /// Whether its entries' slots are in blocks (above), not in a range's map.
    fn in_blocks(&self) -> bool {
        self.count > PICKS_WITH_THE_MAP_UP_TO
    }

    /// Where its entries' slots are: each map, with the first slot it holds
    /// and how many, in slot order.
    pub fn layout(&self) -> Layout {
        Layout {
            group: *self,
            start: 0,
        }
    }

    /// The chain the entries' dispatch elements go to. Up to 16 endpoints: a
    /// DNAT to slot `numgen random mod count` of the range's map, one rule per
    /// protocol. Above: the choice of a block, one rule per block.
    pub fn chain(&self) -> Chain {
        let layout: Vec<Block> = self.layout().collect();
        if !self.in_blocks() {
            return regular(&self.chain_name(), layout[0].map.dnat_rules(self.count));
        }
        let last = layout.len() - 1;
        let rules = layout
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let goto = Stmt::Verdict(Verdict::Goto(b.map.pick_chain_name()));
                if i == last {
                    return Rule::new(vec![goto]);
                }
                let below = Stmt::NumgenBelow {
                    modulus: self.count - b.start,
                    bound: b.size,
                };
                Rule::new(vec![below, goto])
            })
            .collect();
        regular(&self.chain_name(), rules)
    }
}

/// A count's blocks, in slot order (`PickGroup::layout`): made as they are
/// walked, since a full sync walks the layout of every entry.
pub struct Layout {
    group: PickGroup,
    /// The first slot not yet laid.
    start: u32,
}

impl Iterator for Layout {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        let PickGroup { kind, local, count } = self.group;
        let left = count - self.start;
        if left == 0 {
            return None;
        }
        let (size, shape) = if !self.group.in_blocks() {
            let up_to = count.next_power_of_two();
            (left, MapShape::Range { up_to })
        } else if self.start < count / BLOCK * BLOCK {
            let index = self.start / BLOCK;
            (BLOCK, MapShape::Block { size: BLOCK, index })
        } else {
            // The highest bit of what is left (less than a block).
            let size = 1 << left.ilog2();
            (size, MapShape::Block { size, index: 0 })
        };
        let block = Block {
            map: EndpointMap { kind, local, shape },
            start: self.start,
            size,
        };
        self.start += size;
        Some(block)
    }
}

/// The size of the blocks a count above 16 is split into first.
pub const BLOCK: u32 = 1024;

/// A run of an entry's slots held by one map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub map: EndpointMap,
    /// The entry's slot the map's slot 0 stands for.
    pub start: u32,
    pub size: u32,
}

impl Block {
    /// Of an entry's endpoints by slot, those this block holds.
    pub fn held<'a, T>(&self, by_slot: &'a [T]) -> &'a [T] {
        &by_slot[self.start as usize..(self.start + self.size) as usize]
    }
}

/// The fewest elements for which an endpoint map is made with a size.
const SIZED_FROM: usize = 4096;

/// The size to make an endpoint map with for `elements` elements, if any.
///
/// A map made with a size is a hash table of fixed buckets, laid out once; one
/// without grows, rehashing every element each time it doubles. At 100k
/// Services the cold sync took 0.85 of its time with the largest map sized
/// (docs/BENCHMARKS.md). The size is also the most the kernel lets it hold
/// (ENFILE past it), so it leaves room to double before the map must be made
/// again: a table rebuilt, once per doubling (`planner`). Small maps stay
/// unbounded: their growth costs little, and they never need a rebuild.
pub fn endpoint_map_size(elements: usize) -> Option<u32> {
    (elements >= SIZED_FROM).then(|| (2 * elements).next_power_of_two() as u32)
}

/// The largest count in a range's map, whose pick chains are made with the
/// map (above); larger counts are in blocks.
const PICKS_WITH_THE_MAP_UP_TO: u32 = 16;

/// An endpoint map: of the entries of one kind and policy, those whose count
/// is in `up_to / 2 + 1 ..= up_to` (`Range`, a power of two up to 16; 1 and 2
/// have maps of their own), or one block of the entries above 16 (`Block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointMap {
    pub kind: EntryKind,
    pub local: bool,
    pub shape: MapShape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapShape {
    Range {
        up_to: u32,
    },
    /// Block `index` of `size` slots: `index` counts the blocks of `BLOCK`
    /// slots; a smaller block, one to an entry, has index 0.
    Block {
        size: u32,
        index: u32,
    },
}

impl EndpointMap {
    /// The pick chains made (and deleted) with the map: every count of a
    /// range, or a block's own.
    fn picks(&self) -> Vec<Chain> {
        match self.shape {
            MapShape::Range { up_to } => (up_to / 2 + 1..=up_to)
                .map(|count| {
                    PickGroup {
                        kind: self.kind,
                        local: self.local,
                        count,
                    }
                    .chain()
                })
                .collect(),
            MapShape::Block { size, .. } => {
                vec![regular(&self.pick_chain_name(), self.dnat_rules(size))]
            }
        }
    }

    /// A DNAT to slot `numgen random mod modulus` of the packet's entry in
    /// this map, one rule per protocol.
    fn dnat_rules(&self, modulus: u32) -> Vec<Rule> {
        PROTOCOLS
            .iter()
            .map(|p| {
                Rule::new(vec![
                    Stmt::L4Proto(*p),
                    Stmt::DnatPick {
                        fields: self.kind.fields().to_vec(),
                        modulus,
                        map: self.name(),
                    },
                ])
            })
            .collect()
    }

    /// A block's pick chain: `pick-block-16-0`, `nodeport-pick-local-block-1024-2`.
    fn pick_chain_name(&self) -> String {
        let local = if self.local { "local-" } else { "" };
        let (size, index) = match self.shape {
            MapShape::Block { size, index } => (size, index),
            MapShape::Range { .. } => unreachable!("a range's picks are named by their count"),
        };
        format!("{}pick-{local}block-{size}-{index}", self.kind.prefix())
    }

    /// `endpoints-1`, `endpoints-2`, `endpoints-3-4`, `local-endpoints-9-16`,
    /// `nodeport-endpoints-5-8`, `endpoints-block-1024-0`,
    /// `nodeport-local-endpoints-block-32-0`, …
    pub fn name(&self) -> String {
        let local = if self.local { "local-" } else { "" };
        let which = match self.shape {
            MapShape::Range { up_to } if up_to <= 2 => up_to.to_string(),
            MapShape::Range { up_to } => format!("{}-{up_to}", up_to / 2 + 1),
            MapShape::Block { size, index } => format!("block-{size}-{index}"),
        };
        format!("{}{local}endpoints-{which}", self.kind.prefix())
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
        let which = rest.strip_prefix("endpoints-")?;
        let shape = match which.strip_prefix("block-") {
            Some(block) => {
                let (size, index) = block.split_once('-')?;
                let (size, index): (u32, u32) = (size.parse().ok()?, index.parse().ok()?);
                let whole = size == BLOCK;
                let fits = size < BLOCK && size.is_power_of_two() && index == 0;
                (whole || fits).then_some(MapShape::Block { size, index })?
            }
            None => {
                let up_to: u32 = which.rsplit('-').next()?.parse().ok()?;
                let ranged = up_to.is_power_of_two() && up_to <= PICKS_WITH_THE_MAP_UP_TO;
                ranged.then_some(MapShape::Range { up_to })?
            }
        };
        let map = EndpointMap { kind, local, shape };
        // Only the canonical spelling: "endpoints-03" is someone else's.
        (map.name() == name).then_some(map)
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
        let here = if self.local { " on this node" } else { "" };
        let comment = match self.shape {
            MapShape::Range { up_to } if up_to <= 2 => {
                format!("{ports} with {up_to} endpoints{here}: slot -> endpoint")
            }
            MapShape::Range { up_to } => format!(
                "{ports} with {}-{up_to} endpoints{here}: slot -> endpoint",
                up_to / 2 + 1
            ),
            MapShape::Block { size, index } if size == BLOCK => format!(
                "{ports}{here}, slots from {}: slot -> endpoint",
                index * BLOCK
            ),
            MapShape::Block { size, .. } => {
                format!("{ports}{here}, a block of {size}: slot -> endpoint")
            }
        };
        Set {
            name: self.name(),
            key,
            data: Some(MapData::Endpoint(family)),
            comment: Some(comment),
            timeout: None,
            size: None,
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

    /// The chains it makes, given the masquerade mark: a map makes the pick
    /// chains that read it, and a count makes its own only when it picks a
    /// block.
    pub fn chains(&self, mark: u32) -> Vec<Chain> {
        match self {
            Shared::Map(m) => m.picks(),
            Shared::Pick(g) if g.in_blocks() => vec![g.chain()],
            Shared::Pick(_) => Vec::new(),
            Shared::Masquerade { kind, count } => {
                let pick = PickGroup {
                    kind: *kind,
                    local: false,
                    count: *count,
                };
                let rules = vec![
                    Rule::new(vec![Stmt::MarkOr(mark)]),
                    Rule::new(vec![Stmt::Verdict(Verdict::Goto(pick.chain_name()))]),
                ];
                vec![regular(
                    &Shared::masquerade_chain_name(*kind, *count),
                    rules,
                )]
            }
        }
    }
}

/// One entry's endpoints, by slot, in the endpoint maps of its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySlots {
    pub kind: EntryKind,
    pub local: bool,
    /// The entry's key: the first fields of each element's key.
    pub entry: Vec<KeyValue>,
    pub endpoints: Vec<EndpointKey>,
}

impl EntrySlots {
    /// The entries that pick as this one does.
    pub fn group(&self) -> PickGroup {
        PickGroup {
            kind: self.kind,
            local: self.local,
            count: self.endpoints.len() as u32,
        }
    }

    /// Each map's elements for this entry: `entry . slot : address . port`,
    /// the slot counted from the map's first.
    pub fn elements(&self) -> impl Iterator<Item = (EndpointMap, Element)> + '_ {
        self.group().layout().flat_map(move |b| {
            b.held(&self.endpoints).iter().enumerate().map(
                move |(slot, EndpointKey { addr, port })| {
                    let element = Element {
                        key: slot_key(&self.entry, slot as u32),
                        value: Some(Mapped::Endpoint(*addr, *port)),
                        comment: None,
                    };
                    (b.map, element)
                },
            )
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

    fn group(count: u32) -> PickGroup {
        PickGroup {
            kind: EntryKind::Address,
            local: false,
            count,
        }
    }

    fn maps(count: u32) -> Vec<String> {
        group(count).layout().map(|b| b.map.name()).collect()
    }

    #[test]
    fn counts_share_a_map_up_to_16_and_larger_ones_are_split_into_blocks() {
        let one = |count| maps(count).join(" ");
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 16].map(one),
            [
                "endpoints-1",
                "endpoints-2",
                "endpoints-3-4",
                "endpoints-3-4",
                "endpoints-5-8",
                "endpoints-5-8",
                "endpoints-9-16",
                "endpoints-9-16",
            ]
        );
        assert_eq!(one(17), "endpoints-block-16-0 endpoints-block-1-0");
        assert_eq!(
            one(3000),
            "endpoints-block-1024-0 endpoints-block-1024-1 endpoints-block-512-0 \
             endpoints-block-256-0 endpoints-block-128-0 endpoints-block-32-0 \
             endpoints-block-16-0 endpoints-block-8-0"
        );
        assert_eq!(one(2048), "endpoints-block-1024-0 endpoints-block-1024-1");
    }

    #[test]
    fn a_layout_covers_every_slot_once_in_order() {
        for count in (1..=2100).chain([10_000, 100_000, 100_001]) {
            let layout: Vec<Block> = group(count).layout().collect();
            let mut next = 0;
            for b in &layout {
                assert_eq!(b.start, next, "count {count}");
                assert!(b.size > 0);
                next += b.size;
            }
            assert_eq!(next, count);
            let distinct: std::collections::HashSet<_> = layout.iter().map(|b| b.map).collect();
            assert_eq!(distinct.len(), layout.len(), "count {count}: a map twice");
        }
    }

    #[test]
    fn a_count_change_moves_the_slots_of_few_blocks() {
        // The slots whose map or place in it differ between the two layouts.
        let moved = |a: u32, b: u32| {
            let (la, lb): (Vec<Block>, Vec<Block>) =
                (group(a).layout().collect(), group(b).layout().collect());
            let same = |x: &Block| lb.contains(x);
            la.iter().filter(|x| !same(x)).map(|x| x.size).sum::<u32>()
                + lb.iter()
                    .filter(|x| !la.contains(x))
                    .map(|x| x.size)
                    .sum::<u32>()
        };
        let mut worst = 0;
        let mut total = 0;
        for n in 18..=10_000 {
            let m = moved(n, n - 1);
            worst = worst.max(m);
            total += m;
        }
        assert!(worst < 2 * BLOCK, "worst {worst}");
        // Mostly the lowest bits: a few slots on average.
        assert!(
            total / (10_000 - 17) < 16,
            "average {}",
            total / (10_000 - 17)
        );
    }

    #[test]
    fn a_block_pick_gives_each_slot_exactly_its_share() {
        // The chance of each rule, after those before it missed, times the
        // block's own 1/size: every slot gets 1/count.
        for count in [17, 100, 1024, 1025, 3000, 10_000] {
            let chain = group(count).chain();
            let layout: Vec<Block> = group(count).layout().collect();
            assert_eq!(chain.rules.len(), layout.len());
            let mut left = 1.0f64;
            for (rule, block) in chain.rules.iter().zip(&layout) {
                let chance = match &rule.stmts[0] {
                    Stmt::NumgenBelow { modulus, bound } => {
                        assert_eq!((*modulus, *bound), (count - block.start, block.size));
                        f64::from(*bound) / f64::from(*modulus)
                    }
                    Stmt::Verdict(_) => 1.0,
                    other => panic!("{other:?}"),
                };
                let per_slot = left * chance / f64::from(block.size);
                assert!(
                    (per_slot * f64::from(count) - 1.0).abs() < 1e-9,
                    "count {count}"
                );
                left *= 1.0 - chance;
                let goto = rule.stmts.last().unwrap();
                assert_eq!(
                    *goto,
                    Stmt::Verdict(Verdict::Goto(block.map.pick_chain_name()))
                );
            }
        }
    }

    #[test]
    fn a_map_name_names_its_map_and_nothing_else_does() {
        for kind in [EntryKind::Address, EntryKind::NodePort] {
            for local in [false, true] {
                let shapes = [1, 2, 4, 16]
                    .map(|up_to| MapShape::Range { up_to })
                    .into_iter()
                    .chain([1, 2, 512].map(|size| MapShape::Block { size, index: 0 }))
                    .chain([0, 7, 1 << 20].map(|index| MapShape::Block { size: BLOCK, index }));
                for shape in shapes {
                    let m = EndpointMap { kind, local, shape };
                    assert_eq!(EndpointMap::of_name(&m.name()), Some(m));
                }
            }
        }
        for other in [
            "endpoints-0",
            "endpoints-3",
            "endpoints-03-04",
            "endpoints-1-4",
            "endpoints-17-32",
            "endpoints-",
            "endpoints-block-3-0",
            "endpoints-block-512-1",
            "endpoints-block-2048-0",
            "endpoints-block-1024-01",
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
        // NFT_USERDATA_MAXLEN: a longer one is refused with ERANGE.
        for kind in [EntryKind::Address, EntryKind::NodePort] {
            for local in [false, true] {
                for family in Family::ALL {
                    for shape in [
                        MapShape::Range { up_to: 16 },
                        MapShape::Block {
                            size: 512,
                            index: 0,
                        },
                        MapShape::Block {
                            size: BLOCK,
                            index: u32::MAX / BLOCK,
                        },
                    ] {
                        let m = EndpointMap { kind, local, shape };
                        let set = crate::nft::lower::lower_set(&m.set(family));
                        let len = set.userdata.unwrap().len();
                        assert!(len <= 256, "{}: {len} bytes", m.name());
                    }
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
        let map = g.layout().next().unwrap().map.set(Family::Ip6);
        assert_eq!(
            map.key,
            vec![KeyType::InetProto, KeyType::InetService, KeyType::Slot]
        );
        assert_eq!(map.data, Some(MapData::Endpoint(Family::Ip6)));
    }
}
