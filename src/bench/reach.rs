//! Whether a ruleset, as `nft list ruleset` prints it, can still send a packet
//! to an address. The bench against kube-proxy stops its clock when a removed
//! endpoint or ClusterIP is no longer reachable, whatever shape each proxy gives
//! its rules: kube-proxy replaces a Service's endpoint map whole (the anonymous
//! set's elements are not notified) and deletes the endpoint's own chain only at
//! a later full sync, so neither a deletion message nor the address's absence
//! from the listing tells when traffic stops going there.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// A chain, a set or a map of one table.
struct Block<'a> {
    table: &'a str,
    /// The chain's name; None for a set or a map.
    chain: Option<&'a str>,
    body: Vec<&'a str>,
}

/// True if `addr` appears in a set or a map, or in a rule of a chain that a
/// packet can reach: a base chain, a chain that a set's or map's element jumps
/// to, or one that a reachable chain jumps to. An unreferenced chain (kube-proxy's
/// stale endpoint chains) leads nowhere.
pub fn reaches(listing: &str, addr: IpAddr) -> bool {
    let blocks = blocks(listing);
    let mut live: HashSet<(&str, &str)> = HashSet::new();
    let mut next: Vec<(&str, &str)> = Vec::new();
    for b in &blocks {
        match b.chain {
            Some(name) if b.body.iter().any(|l| l.contains(" hook ")) => next.push((b.table, name)),
            Some(_) => {}
            None => next.extend(targets(&b.body).map(|t| (b.table, t))),
        }
    }
    let chains: HashMap<(&str, &str), &Block> = blocks
        .iter()
        .filter_map(|b| Some(((b.table, b.chain?), b)))
        .collect();
    while let Some(c) = next.pop() {
        if live.insert(c) {
            if let Some(b) = chains.get(&c) {
                next.extend(targets(&b.body).map(|t| (b.table, t)));
            }
        }
    }
    blocks
        .iter()
        .filter(|b| b.chain.is_none_or(|name| live.contains(&(b.table, name))))
        .any(|b| b.body.iter().any(|l| holds_address(l, addr)))
}

/// The blocks of a listing: a table opens at no indentation, its chains, sets
/// and maps at one tab, and each closes with a line of its own.
fn blocks(listing: &str) -> Vec<Block<'_>> {
    let mut out = Vec::new();
    let mut table = "";
    let mut open: Option<Block> = None;
    for line in listing.lines() {
        if let Some(head) = line.strip_prefix("table ") {
            table = head.trim_end_matches(" {");
        } else if let Some(head) = line.strip_prefix('\t').filter(|l| !l.starts_with('\t')) {
            if head == "}" {
                out.extend(open.take());
            } else if let Some(name) = head.strip_prefix("chain ") {
                let name = name.trim_end_matches(" {").trim_matches('"');
                open = Some(Block {
                    table,
                    chain: Some(name),
                    body: Vec::new(),
                });
            } else if head.starts_with("set ") || head.starts_with("map ") {
                open = Some(Block {
                    table,
                    chain: None,
                    body: Vec::new(),
                });
            }
        } else if let Some(b) = open.as_mut() {
            b.body.push(line);
        }
    }
    out
}

/// The chains that `goto` and `jump` verdicts in `lines` name.
fn targets<'a>(lines: &'a [&'a str]) -> impl Iterator<Item = &'a str> + 'a {
    lines.iter().flat_map(|line| {
        line.split(['{', '}', ','])
            .flat_map(|part| {
                let mut words = part.split_whitespace();
                std::iter::from_fn(move || {
                    words.by_ref().find(|w| *w == "goto" || *w == "jump")?;
                    words.next()
                })
            })
            .map(|name| name.trim_matches('"'))
    })
}

/// Whether `addr` is written in `line` as a whole: not as the start or the end
/// of a longer address (10.0.0.1 in 10.0.0.10 or 110.0.0.1). An IPv4 address
/// may be followed by a port (`10.0.0.1:80`), an IPv6 one is then in brackets.
fn holds_address(line: &str, addr: IpAddr) -> bool {
    let text = addr.to_string();
    let part = |c: Option<u8>| {
        c.is_some_and(|c| match addr {
            IpAddr::V4(_) => c.is_ascii_digit() || c == b'.',
            IpAddr::V6(_) => c.is_ascii_hexdigit() || c == b'.' || c == b':',
        })
    };
    let bytes = line.as_bytes();
    line.match_indices(&text).any(|(i, _)| {
        !part(i.checked_sub(1).map(|j| bytes[j])) && !part(bytes.get(i + text.len()).copied())
    })
}

#[cfg(test)]
mod tests {
    use super::{holds_address, reaches};

    #[test]
    fn an_address_is_found_whole_only() {
        let addr = |a: &str| a.parse().unwrap();
        let rule = "goto endpoint-ABCD1234-ns/web/tcp/http__10.0.0.10/80";
        assert!(holds_address(rule, addr("10.0.0.10")));
        assert!(!holds_address(rule, addr("10.0.0.1")));
        assert!(!holds_address(rule, addr("0.0.0.10")));
        assert!(holds_address("dnat ip to 10.0.0.10:80", addr("10.0.0.10")));
        assert!(holds_address("dnat ip6 to [fd00::a]:80", addr("fd00::a")));
        assert!(!holds_address("ip6 daddr fd00::ab", addr("fd00::a")));
    }

    /// kube-proxy's shape after an endpoint went: the Service's map no longer
    /// names the endpoint's chain, which still exists and still holds the address.
    const AFTER_REMOVAL: &str = "table ip kube-proxy {
\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 172.30.0.1 . tcp . 80 : goto service-X-ns/web/tcp/http }
\t}

\tchain services {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tip daddr . meta l4proto . th dport vmap @service-ips
\t}

\tchain service-X-ns/web/tcp/http {
\t\tnumgen random mod 1 vmap { 0 : goto endpoint-B-ns/web/tcp/http__10.1.0.8/80 }
\t}

\tchain endpoint-A-ns/web/tcp/http__10.1.0.7/80 {
\t\tmeta l4proto tcp dnat to 10.1.0.7:80
\t}

\tchain endpoint-B-ns/web/tcp/http__10.1.0.8/80 {
\t\tmeta l4proto tcp dnat to 10.1.0.8:80
\t}
}
";

    #[test]
    fn an_unreferenced_chain_leads_nowhere() {
        let addr = |a: &str| a.parse().unwrap();
        assert!(reaches(AFTER_REMOVAL, addr("10.1.0.8")));
        assert!(reaches(AFTER_REMOVAL, addr("172.30.0.1")));
        assert!(!reaches(AFTER_REMOVAL, addr("10.1.0.7")));
        let before = AFTER_REMOVAL.replace(
            "0 : goto endpoint-B",
            "0 : goto endpoint-A-ns/web/tcp/http__10.1.0.7/80, 1 : goto endpoint-B",
        );
        assert!(reaches(&before, addr("10.1.0.7")));
        // A chain that only a dead chain jumps to is dead too.
        let dead_service =
            AFTER_REMOVAL.replace("172.30.0.1 . tcp . 80 : goto service-X-ns/web/tcp/http", "");
        assert!(!reaches(&dead_service, addr("10.1.0.8")));
    }
}
