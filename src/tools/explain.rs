//! `kube-nft explain`: what the desired ruleset does with the first packet of a
//! new connection, rule by rule, as the kernel would walk it.
//!
//! The walk is an interpreter over `ruleset` objects (the same ones the netlink
//! and text backends write), so it explains exactly what kube-nft programs. The
//! only randomness, `numgen` (an endpoint map's slot, or a cascade's rule), is
//! enumerated: each way through it is a path with its share of connections. Dynamic sets (session affinity) start
//! empty here: the walk shows where a client new to the Service goes.

use crate::core::net::{Family, Protocol};
use crate::nft::names::{MAP_NO_ENDPOINT_NODEPORTS, MAP_NO_ENDPOINT_SERVICES};
use crate::ruleset::text;
use crate::ruleset::Ruleset;
use crate::ruleset::{
    Chain, ChainType, Direction, Element, Field, Hook, KeyValue, Mapped, Rule, Stmt, Table, Verdict,
};
use std::fmt::{self, Write};
use std::net::IpAddr;

/// The packet to explain: the first of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub saddr: IpAddr,
    pub daddr: IpAddr,
    pub protocol: Protocol,
    pub dport: u16,
}

impl std::str::FromStr for Packet {
    type Err = String;

    /// `SRC DST:PORT/PROTO`, e.g. `10.244.1.5 10.96.0.10:53/udp`.
    fn from_str(s: &str) -> Result<Packet, String> {
        let bad = || format!("{s:?} is not SRC DST:PORT/PROTO (e.g. 10.244.1.5 10.96.0.10:53/udp)");
        let (src, dst) = s.trim().split_once(' ').ok_or_else(bad)?;
        let (dst, proto) = dst.trim().rsplit_once('/').ok_or_else(bad)?;
        let dst: std::net::SocketAddr = dst.parse().map_err(|_| bad())?;
        let protocol = match proto.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => return Err(bad()),
        };
        let saddr: IpAddr = src.trim().parse().map_err(|_| bad())?;
        if Family::of(&saddr) != Family::of(&dst.ip()) {
            return Err(format!(
                "{s:?}: source and destination are of different families"
            ));
        }
        Ok(Packet {
            saddr,
            daddr: dst.ip(),
            protocol,
            dport: dst.port(),
        })
    }
}

/// The verdict-map element that sent a packet on, and the comment of the rule
/// that looked it up.
#[derive(Debug, Clone)]
struct Via {
    map: String,
    element: Element,
    why: Option<String>,
}

/// How a path ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Through every hook; `to` is the destination after DNAT (if any).
    Delivered {
        to: (IpAddr, u16),
        dnat: bool,
        masquerade: bool,
    },
    Dropped(String),
    Rejected(String),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Delivered {
                to: (addr, port),
                dnat,
                masquerade,
            } => {
                let to = match addr {
                    IpAddr::V4(a) => format!("{a}:{port}"),
                    IpAddr::V6(a) => format!("[{a}]:{port}"),
                };
                let how = if *dnat {
                    "endpoint"
                } else {
                    "not a Service: to"
                };
                write!(f, "{how} {to}")?;
                if *masquerade {
                    f.write_str(", masqueraded")?;
                }
                Ok(())
            }
            End::Dropped(why) => write!(f, "dropped: {why}"),
            End::Rejected(why) => write!(f, "rejected: {why}"),
        }
    }
}

/// One way through the ruleset.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    /// Its share of new connections (the `numgen` choices along it).
    pub share: f64,
    pub end: End,
    /// The Service port whose dispatch element the packet met, if any.
    pub service: Option<String>,
    pub trace: Vec<String>,
}

/// Every way the packet can go, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub packet: Packet,
    /// Whether the source is this node (the output path) rather than arriving.
    pub from_node: bool,
    pub paths: Vec<Path>,
}

/// Explains `packet`. `local` are this node's addresses: a packet from one of them
/// starts on the output path, one to one of them ends on the input path.
pub fn explain(ruleset: &Ruleset, packet: &Packet, local: &[IpAddr]) -> Explanation {
    let from_node = local.contains(&packet.saddr);
    let family = Family::of(&packet.daddr);
    let mut paths = Vec::new();
    let tables: Vec<&Table> = ruleset.of_family(family).collect();
    let Some(main) = tables.first().copied() else {
        return Explanation {
            packet: packet.clone(),
            from_node,
            paths,
        };
    };
    // Depth-first over the numgen choices: a walk that reaches an undecided one
    // comes back and is run again with each outcome appended.
    let mut pending: Vec<Vec<bool>> = vec![Vec::new()];
    while let Some(choices) = pending.pop() {
        let mut walk = Walk::new(&tables, main, packet, local, from_node, &choices);
        match walk.run() {
            Ok(end) => paths.push(Path {
                share: walk.share,
                end,
                service: walk.service,
                trace: walk.trace,
            }),
            Err(Undecided) => {
                for c in [false, true] {
                    let mut next = choices.clone();
                    next.push(c);
                    pending.push(next);
                }
            }
        }
    }
    // Shares are products of numgen's odds: equal ones differ in the last bits.
    let rounded = |p: &Path| (p.share * 1e9).round();
    paths.sort_by(|a, b| {
        rounded(b)
            .total_cmp(&rounded(a))
            .then_with(|| a.end.to_string().cmp(&b.end.to_string()))
    });
    Explanation {
        packet: packet.clone(),
        from_node,
        paths,
    }
}

/// A walk needs a numgen outcome it was not given.
struct Undecided;

/// What a chain did with the packet.
enum Flow {
    /// Fell off its end: the caller goes on.
    Continue,
    /// `return`, or a `goto` whose target fell off its end: this chain stops
    /// and its caller goes on.
    Return,
    /// `accept`: this base chain is done; later base chains still see the packet.
    Accept,
    Stop(End),
}

struct Walk<'a> {
    tables: &'a [&'a Table],
    /// The table of the chain being run: jumps and lookups stay inside it.
    table: &'a Table,
    local: &'a [IpAddr],
    from_node: bool,
    choices: &'a [bool],
    used: usize,
    share: f64,
    saddr: IpAddr,
    daddr: IpAddr,
    protocol: Protocol,
    dport: u16,
    dnat: bool,
    mark: u32,
    masquerade: bool,
    service: Option<String>,
    /// The map element that sent the packet where it is, for reasons.
    via: Option<Via>,
    trace: Vec<String>,
}

impl<'a> Walk<'a> {
    fn new(
        tables: &'a [&'a Table],
        table: &'a Table,
        p: &Packet,
        local: &'a [IpAddr],
        from_node: bool,
        choices: &'a [bool],
    ) -> Walk<'a> {
        Walk {
            tables,
            table,
            local,
            from_node,
            choices,
            used: 0,
            share: 1.0,
            saddr: p.saddr,
            daddr: p.daddr,
            protocol: p.protocol,
            dport: p.dport,
            dnat: false,
            mark: 0,
            masquerade: false,
            service: None,
            via: None,
            trace: Vec::new(),
        }
    }

    fn run(&mut self) -> Result<End, Undecided> {
        let first = if self.from_node {
            Hook::Output
        } else {
            Hook::Prerouting
        };
        if let Some(end) = self.hook(first)? {
            return Ok(end);
        }
        // Routing, after DNAT: to this node, or on.
        let delivered_here = self.local.contains(&self.daddr);
        let rest: &[Hook] = match (self.from_node, delivered_here) {
            (false, true) => &[Hook::Input],
            (false, false) => &[Hook::Forward, Hook::Postrouting],
            (true, true) => &[Hook::Postrouting, Hook::Input],
            (true, false) => &[Hook::Postrouting],
        };
        for h in rest {
            if let Some(end) = self.hook(*h)? {
                return Ok(end);
            }
        }
        Ok(End::Delivered {
            to: (self.daddr, self.dport),
            dnat: self.dnat,
            masquerade: self.masquerade,
        })
    }

    /// The base chains of one hook, of every table, in priority order. Like the
    /// kernel's NAT hook, once a NAT chain has set up a destination NAT, the
    /// later NAT chains of the hook (other tables') do not see the connection.
    fn hook(&mut self, hook: Hook) -> Result<Option<End>, Undecided> {
        let mut chains: Vec<(&'a Table, &'a Chain)> = self
            .tables
            .iter()
            .flat_map(|t| t.chains.iter().map(move |c| (*t, c)))
            .filter(|(_, c)| c.base.is_some_and(|b| b.hook == hook))
            .collect();
        chains.sort_by_key(|(_, c)| c.base.map(|b| b.priority));
        let dnat_before = self.dnat;
        for (table, chain) in chains {
            let nat = chain.base.is_some_and(|b| b.kind == ChainType::Nat);
            if nat && self.dnat && !dnat_before {
                continue;
            }
            self.table = table;
            match self.chain(chain, 0)? {
                Flow::Stop(end) => return Ok(Some(end)),
                Flow::Continue | Flow::Accept | Flow::Return => {}
            }
        }
        Ok(None)
    }

    fn chain(&mut self, chain: &Chain, depth: usize) -> Result<Flow, Undecided> {
        // Our ruleset nests a few levels; a loop would be a translate bug.
        assert!(depth < 16, "chain nesting too deep at {}", chain.name);
        for rule in &chain.rules {
            match self.rule(chain, rule, depth)? {
                Flow::Continue => {}
                Flow::Return => return Ok(Flow::Continue),
                other => return Ok(other),
            }
        }
        Ok(Flow::Continue)
    }

    fn note(&mut self, chain: &Chain, rule: &Rule, what: impl fmt::Display) {
        let family = self.table.family;
        self.trace.push(format!(
            "{}: {}  ⇒ {what}",
            chain.name,
            text::rule(family, rule)
        ));
    }

    /// Runs one rule; `Continue` when a match fails or the rule falls through.
    fn rule(&mut self, chain: &Chain, rule: &Rule, depth: usize) -> Result<Flow, Undecided> {
        for stmt in &rule.stmts {
            match stmt {
                Stmt::AddrMatch { field, net, negate } => {
                    let addr = self.addr(*field);
                    if net.contains(&addr) == *negate {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::L4Proto(p) => {
                    if *p != self.protocol {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::CtStateNew => {}
                Stmt::CtDirection(d) => {
                    if *d != Direction::Original {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::FibSaddrLocal => {
                    if !self.local.contains(&self.saddr) {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::MarkHas(m) => {
                    if self.mark & m != *m {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::NumgenEq { modulus, value: _ } => {
                    if !self.choose(1.0 / f64::from(*modulus))? {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::NumgenBelow { modulus, bound } => {
                    if !self.choose(f64::from(*bound) / f64::from(*modulus))? {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::InSet { fields, set } => {
                    if self.lookup(fields, set).is_none() {
                        return Ok(Flow::Continue);
                    }
                }
                Stmt::Vmap { fields, map } => {
                    let Some(element) = self.lookup(fields, map).cloned() else {
                        return Ok(Flow::Continue);
                    };
                    let Some(Mapped::Verdict(v)) = &element.value else {
                        return Ok(Flow::Continue);
                    };
                    let label = element.comment.clone().unwrap_or_default();
                    self.note(chain, rule, format_args!("{v} ({label})"));
                    // Every dispatch map's elements are commented with their Service port.
                    if element.comment.is_some() {
                        self.service = element.comment.clone();
                    }
                    self.via = Some(Via {
                        map: map.clone(),
                        element: element.clone(),
                        why: rule.comment.clone(),
                    });
                    return self.verdict(v, rule, depth);
                }
                Stmt::SetUpdate { .. } | Stmt::Counter | Stmt::CounterByMap { .. } => {}
                Stmt::CtTimeoutSet(name) => {
                    self.note(
                        chain,
                        rule,
                        format_args!("its flow takes the timeouts of {name}"),
                    );
                }
                Stmt::CtLabelSet(_) => {
                    self.note(chain, rule, "its flow may take the fast path");
                }
                // A new connection has neither the label nor packets counted yet.
                Stmt::CtLabelHas(_) | Stmt::CtPacketsAbove { .. } => {
                    return Ok(Flow::Continue);
                }
                Stmt::FlowAdd(_) => {}
                Stmt::MarkOr(m) => self.mark |= m,
                Stmt::MarkXor(m) => self.mark ^= m,
                Stmt::Dnat { addr, port } => {
                    self.note(chain, rule, "DNAT");
                    self.daddr = *addr;
                    self.dport = *port;
                    self.dnat = true;
                    return Ok(Flow::Accept);
                }
                Stmt::DnatPick {
                    fields,
                    modulus,
                    map,
                } => {
                    let slot = self.pick_slot(*modulus)?;
                    let mut key = self.key(fields);
                    key.push(KeyValue::Slot(slot));
                    let endpoint = self
                        .table
                        .set(map)
                        .and_then(|m| m.elements.iter().find(|e| e.key == key));
                    let Some(Mapped::Endpoint(addr, port)) =
                        endpoint.and_then(|e| e.value.as_ref())
                    else {
                        return Ok(Flow::Continue);
                    };
                    self.note(chain, rule, format_args!("slot {slot}: DNAT"));
                    self.daddr = *addr;
                    self.dport = *port;
                    self.dnat = true;
                    return Ok(Flow::Accept);
                }
                Stmt::Masquerade { .. } => {
                    self.note(chain, rule, "masquerade");
                    self.masquerade = true;
                    return Ok(Flow::Accept);
                }
                Stmt::Reject | Stmt::RejectTcpReset => {
                    if *stmt == Stmt::RejectTcpReset && self.protocol != Protocol::Tcp {
                        return Ok(Flow::Continue);
                    }
                    self.note(chain, rule, "reject");
                    let how = if *stmt == Stmt::RejectTcpReset {
                        "TCP reset"
                    } else {
                        "ICMP port unreachable"
                    };
                    return Ok(Flow::Stop(End::Rejected(format!(
                        "{} ({how})",
                        self.reason(rule)
                    ))));
                }
                Stmt::Verdict(v) => {
                    if !matches!(v, Verdict::Jump(_) | Verdict::Goto(_)) {
                        self.note(chain, rule, v);
                    }
                    return self.verdict(v, rule, depth);
                }
            }
        }
        if rule
            .stmts
            .iter()
            .any(|s| matches!(s, Stmt::MarkOr(_) | Stmt::MarkXor(_)))
        {
            let mark = self.mark;
            self.note(chain, rule, format_args!("mark {mark:#x}"));
        }
        Ok(Flow::Continue)
    }

    /// This path's next binary choice, true with probability `p`: the path's
    /// share is multiplied by that of the side it takes.
    fn choose(&mut self, p: f64) -> Result<bool, Undecided> {
        let Some(&hit) = self.choices.get(self.used) else {
            return Err(Undecided);
        };
        self.used += 1;
        self.share *= if hit { p } else { 1.0 - p };
        Ok(hit)
    }

    /// The slot `numgen random mod n` picks on this path, as the same binary
    /// choices a cascade makes: slot k (from the top) with 1/(k+1) of what is
    /// left, so each path carries exactly 1/n.
    fn pick_slot(&mut self, n: u32) -> Result<u32, Undecided> {
        for k in (1..n).rev() {
            if self.choose(1.0 / f64::from(k + 1))? {
                return Ok(k);
            }
        }
        Ok(0)
    }

    fn verdict(&mut self, v: &Verdict, rule: &Rule, depth: usize) -> Result<Flow, Undecided> {
        Ok(match v {
            Verdict::Accept => Flow::Accept,
            Verdict::Drop => Flow::Stop(End::Dropped(self.reason(rule))),
            Verdict::Return => Flow::Return,
            Verdict::Jump(target) | Verdict::Goto(target) => {
                let Some(next) = self.table.chain(target) else {
                    return Ok(Flow::Stop(End::Dropped(format!("no chain {target}"))));
                };
                match self.chain(next, depth + 1)? {
                    // After a jump the caller's next rule runs; after a goto the
                    // caller's caller's does: either way, the walk goes on.
                    Flow::Continue if matches!(v, Verdict::Goto(_)) => Flow::Return,
                    other => other,
                }
            }
        })
    }

    /// Why a rule dropped or rejected: its comment, or the map element that led
    /// there.
    fn reason(&self, rule: &Rule) -> String {
        if let Some(c) = &rule.comment {
            return c.clone();
        }
        match &self.via {
            Some(Via {
                map, element: e, ..
            }) if map == MAP_NO_ENDPOINT_SERVICES || map == MAP_NO_ENDPOINT_NODEPORTS => {
                let label = e.comment.clone().unwrap_or_default();
                match e.value {
                    Some(Mapped::Verdict(Verdict::Drop)) => {
                        format!("{label} has no endpoints for this traffic on this node (a Local traffic policy)")
                    }
                    _ => format!("{label} has no endpoints"),
                }
            }
            // The ClusterIP reject's element says nothing; its rule does.
            Some(Via {
                element: Element { comment: None, .. },
                why: Some(why),
                ..
            }) => why.clone(),
            Some(Via {
                map, element: e, ..
            }) => {
                format!("{map} {}", e.comment.clone().unwrap_or_default())
            }
            None => "by rule".into(),
        }
    }

    fn addr(&self, field: Field) -> IpAddr {
        match field {
            Field::Saddr => self.saddr,
            _ => self.daddr,
        }
    }

    fn lookup(&self, fields: &[Field], set: &str) -> Option<&'a Element> {
        let set = self.table.set(set)?;
        // A dynamic set's elements are the kernel's; a new client is in none.
        if set.timeout.is_some() {
            return None;
        }
        let key = self.key(fields);
        set.elements.iter().find(|e| e.key == key)
    }

    /// The packet's values of `fields`, as a set key.
    fn key(&self, fields: &[Field]) -> Vec<KeyValue> {
        fields
            .iter()
            .map(|f| match f {
                Field::Saddr | Field::Daddr => KeyValue::Addr(self.addr(*f)),
                Field::L4Proto => KeyValue::Proto(self.protocol),
                Field::Dport => KeyValue::Port(self.dport),
                // Only reply-direction rules read the source port.
                Field::Sport => KeyValue::Port(0),
                // The packet explained opens a connection.
                Field::CtState => KeyValue::CtStateNew,
            })
            .collect()
    }
}

/// The explanation as `kube-nft explain` prints it.
pub fn render(e: &Explanation) -> String {
    let p = &e.packet;
    let mut out = String::new();
    let origin = if e.from_node {
        "from this node (output path)"
    } else {
        "arriving at this node (prerouting)"
    };
    writeln!(
        out,
        "new {} connection {} → {}:{}, {origin}",
        p.protocol, p.saddr, p.daddr, p.dport
    )
    .unwrap();
    let services: Vec<&str> = {
        let mut v: Vec<&str> = e
            .paths
            .iter()
            .filter_map(|p| p.service.as_deref())
            .collect();
        v.dedup();
        v
    };
    match services.as_slice() {
        [] => writeln!(out, "service: none").unwrap(),
        list => writeln!(out, "service: {}", list.join(", ")).unwrap(),
    }
    // What every path shares, once; then each path's own steps and end.
    let common = e
        .paths
        .first()
        .map(|first| {
            (0..first.trace.len())
                .take_while(|&i| e.paths.iter().all(|p| p.trace.get(i) == first.trace.get(i)))
                .count()
        })
        .unwrap_or(0);
    if let Some(first) = e.paths.first() {
        for line in &first.trace[..common] {
            writeln!(out, "  {line}").unwrap();
        }
    }
    for path in &e.paths {
        writeln!(out, "{:5.1}%  {}", path.share * 100.0, path.end).unwrap();
        for line in &path.trace[common..] {
            writeln!(out, "         {line}").unwrap();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_parse_with_either_family_and_bad_ones_say_the_form() {
        let p: Packet = "fd00::5 [fd00:10:96::1]:53/UDP".parse().unwrap();
        assert_eq!(p.daddr, "fd00:10:96::1".parse::<IpAddr>().unwrap());
        assert_eq!((p.dport, p.protocol), (53, Protocol::Udp));
        let e = "10.0.0.1 10.96.0.1:80".parse::<Packet>().unwrap_err();
        assert!(e.contains("SRC DST:PORT/PROTO"), "{e}");
        let e = "10.0.0.1 [fd00::1]:80/tcp".parse::<Packet>().unwrap_err();
        assert!(e.contains("different families"), "{e}");
    }

    #[test]
    fn n_endpoints_get_one_nth_each() {
        // 7: one map and its pick chain; 21 and 37: a pick among blocks
        // (16 + 4 + 1, 32 + 4 + 1), each with its own chain and map.
        for n in [7, 21, 37] {
            let mut m = String::from("---\napiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: d}\nspec: {clusterIP: 10.96.0.9, ports: [{port: 80}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s-a, namespace: d, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{port: 80}]\nendpoints:\n");
            for i in 1..=n {
                m += &format!("- addresses: [10.244.0.{i}]\n");
            }
            let loaded = crate::source::files::parse(&m, "t.yaml").unwrap();
            let config = crate::core::node_config::NodeConfig {
                cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
                ..Default::default()
            };
            let (ruleset, _) = crate::nft::translate::desired(&loaded.objects, None, &config);
            let packet = "10.244.0.1 10.96.0.9:80/tcp".parse().unwrap();
            let e = explain(&ruleset, &packet, &[]);
            assert_eq!(e.paths.len(), n, "{n} endpoints");
            for p in &e.paths {
                let share = 1.0 / n as f64;
                assert!((p.share - share).abs() < 1e-9, "{n} endpoints: {p:?}");
                assert_eq!(p.service.as_deref(), Some("d/s:80"));
            }
            let mut to: Vec<String> = e.paths.iter().map(|p| p.end.to_string()).collect();
            to.sort();
            to.dedup();
            assert_eq!(to.len(), n, "{to:?}");
        }
    }
}
