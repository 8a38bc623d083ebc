//! The text backend: ruleset objects as `nft -f` input, laid out the way
//! `nft list ruleset` prints them.
//!
//! `kube-nft render` prints this, and the parity tests load it with `nft -f` to
//! check that our netlink encoder programs exactly what this text means.

use crate::core::net::Family;
use crate::ruleset::{
    Chain, Direction, Element, Field, Hook, KeyType, MapData, NamedObject, ObjectDef, Rule, Set,
    Stmt, Table,
};
use std::fmt::Write;

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

fn field(family: Family, f: Field) -> String {
    match f {
        Field::Saddr => format!("{} saddr", family.keyword()),
        Field::Daddr => format!("{} daddr", family.keyword()),
        Field::L4Proto => "meta l4proto".to_string(),
        Field::Dport => "th dport".to_string(),
        Field::Sport => "th sport".to_string(),
        Field::CtState => "ct state".to_string(),
    }
}

fn fields(family: Family, fs: &[Field]) -> String {
    fs.iter()
        .map(|f| field(family, *f))
        .collect::<Vec<_>>()
        .join(" . ")
}

fn hex(v: u32) -> String {
    format!("0x{v:08x}")
}

pub fn stmt(family: Family, s: &Stmt) -> String {
    match s {
        Stmt::AddrMatch {
            field: f,
            net,
            negate,
        } => {
            let value = if net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.trunc().to_string()
            };
            let op = if *negate { "!= " } else { "" };
            format!("{} {op}{value}", field(family, *f))
        }
        Stmt::L4Proto(p) => format!("meta l4proto {p}"),
        Stmt::CtStateNew => "ct state new".to_string(),
        Stmt::CtDirection(Direction::Original) => "ct direction original".to_string(),
        Stmt::CtDirection(Direction::Reply) => "ct direction reply".to_string(),
        Stmt::FibSaddrLocal => "fib saddr type local".to_string(),
        Stmt::MarkHas(m) => format!("meta mark & {} == {}", hex(*m), hex(*m)),
        Stmt::NumgenEq { modulus, value } => format!("numgen random mod {modulus} {value}"),
        Stmt::NumgenBelow { modulus, bound } => format!("numgen random mod {modulus} < {bound}"),
        Stmt::InSet { fields: fs, set } => format!("{} @{set}", fields(family, fs)),
        Stmt::Vmap { fields: fs, map } => format!("{} vmap @{map}", fields(family, fs)),
        Stmt::SetUpdate { field: f, set } => {
            format!("update @{set} {{ {} }}", field(family, *f))
        }
        Stmt::MarkOr(m) => format!("meta mark set meta mark | {}", hex(*m)),
        Stmt::MarkXor(m) => format!("meta mark set meta mark ^ {}", hex(*m)),
        Stmt::Dnat { addr, port } => match family {
            Family::Ip => format!("dnat to {addr}:{port}"),
            Family::Ip6 => format!("dnat to [{addr}]:{port}"),
        },
        Stmt::DnatPick {
            fields: fs,
            modulus,
            map,
        } => {
            format!(
                "dnat {} to {} . numgen random mod {modulus} map @{map}",
                family.keyword(),
                fields(family, fs)
            )
        }
        Stmt::Masquerade { fully_random: true } => "masquerade fully-random".to_string(),
        Stmt::Masquerade {
            fully_random: false,
        } => "masquerade".to_string(),
        Stmt::Reject => "reject".to_string(),
        // nft implies (and does not list) the `meta l4proto tcp` this needs.
        Stmt::RejectTcpReset => "reject with tcp reset".to_string(),
        Stmt::Counter => "counter packets 0 bytes 0".to_string(),
        Stmt::CounterByMap { fields: fs, map } => {
            format!("counter name {} map @{map}", fields(family, fs))
        }
        Stmt::CtTimeoutSet(name) => format!("ct timeout set {}", quote(name)),
        Stmt::CtLabelSet(bit) => format!("ct label set {bit}"),
        Stmt::CtLabelHas(bit) => format!("ct label {bit}"),
        Stmt::CtPacketsAbove { direction, count } => {
            format!("ct {} packets > {count}", direction.name())
        }
        Stmt::FlowAdd(flowtable) => format!("flow add @{flowtable}"),
        Stmt::Verdict(v) => v.to_string(),
    }
}

pub fn rule(family: Family, r: &Rule) -> String {
    let mut out = match r.stmts.as_slice() {
        // nft folds the protocol match into the port it guards: `meta l4proto
        // tcp` … `th dport` lists as `tcp dport`.
        [Stmt::L4Proto(p), pick @ Stmt::DnatPick { .. }] => {
            stmt(family, pick).replace("th dport", &format!("{p} dport"))
        }
        stmts => stmts
            .iter()
            .map(|s| stmt(family, s))
            .collect::<Vec<_>>()
            .join(" "),
    };
    if let Some(c) = &r.comment {
        write!(out, " comment {}", quote(c)).unwrap();
    }
    out
}

fn element(e: &Element) -> String {
    let mut out = e
        .key
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(" . ");
    if let Some(c) = &e.comment {
        write!(out, " comment {}", quote(c)).unwrap();
    }
    if let Some(v) = &e.value {
        write!(out, " : {v}").unwrap();
    }
    out
}

/// As `nft` prints a time: `3h`, `1h30m`, `10s`.
fn duration(secs: u32) -> String {
    let mut out = String::new();
    let mut rest = secs;
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if rest >= n {
            out += &format!("{}{unit}", rest / n);
            rest %= n;
        }
    }
    if out.is_empty() {
        out = "0s".into();
    }
    out
}

fn write_set(out: &mut String, s: &Set) {
    let kw = if s.data.is_some() { "map" } else { "set" };
    let key = s
        .key
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(" . ");
    writeln!(out, "\t{kw} {} {{", s.name).unwrap();
    match s.data {
        Some(MapData::Verdict) => writeln!(out, "\t\ttype {key} : verdict").unwrap(),
        Some(MapData::Counter) => writeln!(out, "\t\ttype {key} : counter").unwrap(),
        Some(MapData::Endpoint(family)) => {
            let fields: Vec<&str> = s
                .key
                .iter()
                .map(|k| match k {
                    KeyType::Ipv4Addr | KeyType::Ipv6Addr => "daddr",
                    KeyType::InetProto => "meta l4proto",
                    KeyType::InetService => "th dport",
                    KeyType::Slot => "numgen random mod 1",
                    KeyType::CtState => {
                        unreachable!("an endpoint map's key is a Service port and a slot")
                    }
                })
                .collect();
            let kw = family.keyword();
            let key = fields.join(" . ").replace("daddr", &format!("{kw} daddr"));
            writeln!(out, "\t\ttypeof {key} : {kw} daddr . th dport").unwrap()
        }
        None => writeln!(out, "\t\ttype {key}").unwrap(),
    }
    if let Some(size) = s.size {
        writeln!(out, "\t\tsize {size}").unwrap();
    }
    if let Some(t) = s.timeout {
        writeln!(out, "\t\tflags dynamic,timeout").unwrap();
        writeln!(out, "\t\ttimeout {}", duration(t)).unwrap();
    }
    if let Some(c) = &s.comment {
        writeln!(out, "\t\tcomment {}", quote(c)).unwrap();
    }
    if !s.elements.is_empty() && s.timeout.is_none() {
        let items: Vec<String> = s.elements.iter().map(element).collect();
        writeln!(out, "\t\telements = {{ {} }}", items.join(",\n\t\t\t     ")).unwrap();
    }
    writeln!(out, "\t}}").unwrap();
}

fn write_object(out: &mut String, family: Family, o: &NamedObject) {
    match &o.kind {
        ObjectDef::Counter => writeln!(out, "\tcounter {} {{", o.name).unwrap(),
        ObjectDef::CtTimeout(_) => writeln!(out, "\tct timeout {} {{", o.name).unwrap(),
    }
    if let Some(comment) = &o.comment {
        writeln!(out, "\t\tcomment {}", quote(comment)).unwrap();
    }
    match &o.kind {
        ObjectDef::Counter => writeln!(out, "\t\tpackets 0 bytes 0").unwrap(),
        ObjectDef::CtTimeout(p) => {
            writeln!(out, "\t\tprotocol {}", p.protocol).unwrap();
            writeln!(out, "\t\tl3proto {}", family.keyword()).unwrap();
            let set: Vec<String> = p.set.iter().map(|(s, t)| format!("{s} : {t}")).collect();
            writeln!(out, "\t\tpolicy = {{ {} }}", set.join(", ")).unwrap();
        }
    }
    writeln!(out, "\t}}").unwrap();
}

/// As `nft` prints a priority: a standard name the hook allows, with an offset of
/// at most 10 (`dstnat - 10`), else the number.
fn priority(hook: Hook, p: i32) -> String {
    let mut named = vec![
        ("raw", -300),
        ("mangle", -150),
        ("filter", 0),
        ("security", 50),
    ];
    match hook {
        Hook::Prerouting => named.push(("dstnat", -100)),
        Hook::Postrouting => named.push(("srcnat", 100)),
        _ => {}
    }
    match named.iter().find(|(_, v)| (p - v).abs() <= 10) {
        Some((name, v)) if p == *v => name.to_string(),
        Some((name, v)) if p > *v => format!("{name} + {}", p - v),
        Some((name, v)) => format!("{name} - {}", v - p),
        None => p.to_string(),
    }
}

fn write_chain(out: &mut String, family: Family, c: &Chain) {
    writeln!(out, "\tchain {} {{", c.name).unwrap();
    if let Some(c) = &c.comment {
        writeln!(out, "\t\tcomment {}", quote(c)).unwrap();
    }
    if let Some(b) = c.base {
        writeln!(
            out,
            "\t\ttype {} hook {} priority {}; policy accept;",
            b.kind.name(),
            b.hook.name(),
            priority(b.hook, b.priority)
        )
        .unwrap();
    }
    for r in &c.rules {
        writeln!(out, "\t\t{}", rule(family, r)).unwrap();
    }
    writeln!(out, "\t}}").unwrap();
}

/// One table, as `nft list table` prints it.
pub fn table(t: &Table) -> String {
    let mut out = String::new();
    writeln!(out, "table {} {} {{", t.family.keyword(), t.name).unwrap();
    if let Some(c) = &t.comment {
        writeln!(out, "\tcomment {}", quote(c)).unwrap();
    }
    let mut first = true;
    for o in &t.objects {
        if !first {
            out.push('\n');
        }
        first = false;
        write_object(&mut out, t.family, o);
    }
    for s in &t.sets {
        if !first {
            out.push('\n');
        }
        first = false;
        write_set(&mut out, s);
    }
    for c in &t.chains {
        if !first {
            out.push('\n');
        }
        first = false;
        write_chain(&mut out, t.family, c);
    }
    out.push_str("}\n");
    out
}

/// A script for `nft -f` that replaces our tables atomically: each is created if
/// missing, deleted, and written again, all in one transaction.
pub fn replace_script(tables: &[Table]) -> String {
    let mut out = String::new();
    for t in tables {
        writeln!(out, "add table {} {}", t.family.keyword(), t.name).unwrap();
        writeln!(out, "delete table {} {}", t.family.keyword(), t.name).unwrap();
    }
    for t in tables {
        out.push_str(&table(t));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::net::Protocol;
    use crate::ruleset::Verdict;

    #[test]
    fn statements_read_as_nft_lists_them() {
        let f = Family::Ip6;
        assert_eq!(
            rule(
                f,
                &Rule::new(vec![
                    Stmt::L4Proto(Protocol::Udp),
                    Stmt::NumgenEq {
                        modulus: 2,
                        value: 0
                    },
                    Stmt::Dnat {
                        addr: "fd00::7".parse().unwrap(),
                        port: 9376
                    }
                ])
            ),
            "meta l4proto udp numgen random mod 2 0 dnat to [fd00::7]:9376"
        );
        assert_eq!(
            stmt(
                Family::Ip,
                &Stmt::AddrMatch {
                    field: Field::Saddr,
                    net: "10.244.0.0/16".parse().unwrap(),
                    negate: true
                }
            ),
            "ip saddr != 10.244.0.0/16"
        );
        assert_eq!(stmt(f, &Stmt::Verdict(Verdict::Goto("x".into()))), "goto x");
    }
}
