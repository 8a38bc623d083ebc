//! What kube-proxy leaves on a node once it no longer runs there, removed by
//! `kube-nft cleanup --kube-proxy` (the step after kube-nft serves and
//! kube-proxy is stopped, docs/OPERATIONS.md): the names are those kube-proxy
//! 1.36's own `--cleanup` removes (`pkg/proxy/{nftables,iptables,ipvs}/cleanup.go`).
//!
//! - its nftables mode's tables, `ip kube-proxy` and `ip6 kube-proxy`;
//! - the chains its iptables and IPVS modes make, as iptables-nft writes them
//!   (an nf_tables table per iptables table), with every rule elsewhere that
//!   jumps to one; the kubelet's chains beside them (`KUBE-FIREWALL`,
//!   `KUBE-KUBELET-CANARY`, `KUBE-MARK-DROP`) and everyone else's stay;
//! - IPVS's virtual services on this node's addresses, and `kube-ipvs0`.
//!
//! The nf_tables part is one transaction: kube-proxy's rules go all at once or
//! not at all. Rules iptables-legacy wrote and the IPVS mode's ipsets are out
//! of netlink's nf_tables reach; `kube-proxy --cleanup` removes those.

use crate::core::net::Family;
use crate::netlink::batch::Batch;
use crate::netlink::expr::{Data, Expr};
use crate::netlink::nftables::{Committed, NftError, NftSocket};
use crate::netlink::objects::KernelTable;
use crate::ruleset::Verdict;

/// kube-proxy's nftables mode's table, in each family.
const NFTABLES_TABLE: &str = "kube-proxy";

/// The chains of kube-proxy's iptables and IPVS modes, per iptables table.
const CHAINS: [(&str, &[&str]); 3] = [
    (
        "nat",
        &[
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-PROXY-CANARY",
            "KUBE-NODE-PORT",
            "KUBE-LOAD-BALANCER",
        ],
    ),
    (
        "filter",
        &[
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
            "KUBE-NODE-PORT",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "KUBE-IPVS-FILTER",
            "KUBE-IPVS-OUT-FILTER",
        ],
    ),
    ("mangle", &["KUBE-PROXY-CANARY"]),
];

/// The iptables mode's chains per Service port and endpoint (nat only).
const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-SEP-",
];

fn is_kube_proxy_chain(table: &str, chain: &str) -> bool {
    CHAINS
        .iter()
        .any(|(t, names)| *t == table && names.contains(&chain))
        || (table == "nat" && SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p)))
}

/// What to remove from one family, found in what the kernel holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// kube-proxy's nftables table is there.
    pub nftables_table: bool,
    /// (table, chain) of each kube-proxy chain.
    pub chains: Vec<(String, String)>,
    /// (table, chain, handle) of each rule outside those chains that jumps to one.
    pub jumps: Vec<(String, String, u64)>,
}

impl Leftovers {
    /// Finds them in the iptables-nft tables read (`nat`, `filter`, `mangle`).
    pub fn find(nftables_table: bool, iptables: &[KernelTable]) -> Leftovers {
        let mut out = Leftovers {
            nftables_table,
            ..Leftovers::default()
        };
        for t in iptables {
            let ours = |c: &str| is_kube_proxy_chain(&t.name, c);
            for chain in &t.chains {
                if ours(&chain.name) {
                    out.chains.push((t.name.clone(), chain.name.clone()));
                    continue;
                }
                for rule in &chain.rules {
                    let jumps = rule.exprs.iter().any(|e| match e {
                        Expr::Immediate {
                            data: Data::Verdict(Verdict::Jump(to) | Verdict::Goto(to)),
                            ..
                        } => ours(to),
                        _ => false,
                    });
                    if let (true, Some(handle)) = (jumps, rule.handle) {
                        out.jumps.push((t.name.clone(), chain.name.clone(), handle));
                    }
                }
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        !self.nftables_table && self.chains.is_empty() && self.jumps.is_empty()
    }

    /// The removal, in the order the kernel accepts it: the jumps into the
    /// chains, then the chains' rules (which jump between them), then the chains.
    pub fn write(&self, family: Family, b: &mut Batch) {
        for (table, chain, handle) in &self.jumps {
            b.delete_rule(family, table, chain, *handle);
        }
        for (table, chain) in &self.chains {
            b.flush_chain(family, table, chain);
        }
        for (table, chain) in &self.chains {
            b.delete_chain(family, table, chain);
        }
        if self.nftables_table {
            b.delete_table(family, NFTABLES_TABLE);
        }
    }

    /// One line for the log: what goes, by family.
    pub fn describe(&self, family: Family) -> String {
        let mut parts = Vec::new();
        if self.nftables_table {
            parts.push(format!("table {} {NFTABLES_TABLE}", family.keyword()));
        }
        if !self.chains.is_empty() {
            let mut tables: Vec<String> = self
                .chains
                .iter()
                .map(|(t, _)| format!("{} {t}", family.keyword()))
                .collect();
            tables.dedup();
            parts.push(format!(
                "{} iptables chains ({})",
                self.chains.len(),
                tables.join(", ")
            ));
        }
        if !self.jumps.is_empty() {
            parts.push(format!("{} rules jumping to them", self.jumps.len()));
        }
        parts.join(", ")
    }
}

/// What `remove` did.
#[derive(Debug, Default)]
pub struct Removed {
    /// One line per family that had leftovers.
    pub nftables: Vec<String>,
    pub ipvs_services: usize,
    /// The iptables-legacy tables this network namespace has, which may hold
    /// kube-proxy rules that only `kube-proxy --cleanup` can see.
    pub legacy_tables: Vec<String>,
}

/// Removes kube-proxy's leftovers from this network namespace.
pub fn remove(sock: &mut NftSocket) -> Result<Removed, String> {
    let mut b = Batch::new();
    let mut out = Removed::default();
    for family in Family::ALL {
        let found = find(sock, family).map_err(|e| format!("reading the ruleset: {e}"))?;
        if !found.is_empty() {
            out.nftables.push(found.describe(family));
            found.write(family, &mut b);
        }
    }
    if !b.is_empty() {
        let _: Committed = sock.commit(b).map_err(|e| {
            format!("removing kube-proxy's nf_tables objects (nothing was removed): {e}")
        })?;
    }
    out.ipvs_services =
        crate::ipvs::cleanup().map_err(|e| format!("removing IPVS's virtual services: {e}"))?;
    for file in ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"] {
        let names = std::fs::read_to_string(file).unwrap_or_default();
        out.legacy_tables
            .extend(names.lines().map(|t| format!("{file}: {t}")));
    }
    Ok(out)
}

fn find(sock: &mut NftSocket, family: Family) -> Result<Leftovers, NftError> {
    let nftables_table = sock.find_table(family, NFTABLES_TABLE)?.is_some();
    let mut iptables = Vec::new();
    for (table, _) in CHAINS {
        if let Some(t) = sock.read_table(family, table)? {
            iptables.push(t);
        }
    }
    Ok(Leftovers::find(nftables_table, &iptables))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::objects::{KernelChain, KernelRule};

    fn jump(handle: u64, to: &str) -> KernelRule {
        KernelRule {
            handle: Some(handle),
            exprs: vec![
                Expr::Other("match".into()),
                Expr::Immediate {
                    dreg: 0,
                    data: Data::Verdict(Verdict::Jump(to.into())),
                },
            ],
            userdata: None,
        }
    }

    fn chain(name: &str, rules: Vec<KernelRule>) -> KernelChain {
        KernelChain {
            name: name.into(),
            base: None,
            userdata: None,
            rules,
        }
    }

    fn table(name: &str, chains: Vec<KernelChain>) -> KernelTable {
        let mut t = KernelTable::empty(Family::Ip, name);
        t.chains = chains;
        t
    }

    #[test]
    fn kube_proxy_s_chains_and_the_jumps_to_them_go_the_kubelet_s_and_others_stay() {
        let nat = table(
            "nat",
            vec![
                chain(
                    "PREROUTING",
                    vec![jump(1, "KUBE-SERVICES"), jump(2, "DOCKER")],
                ),
                chain("KUBE-SERVICES", vec![jump(3, "KUBE-SVC-ABC")]),
                chain("KUBE-SVC-ABC", vec![jump(4, "KUBE-SEP-DEF")]),
                chain("KUBE-SEP-DEF", vec![jump(5, "KUBE-MARK-MASQ")]),
                chain("KUBE-MARK-MASQ", vec![]),
                chain("KUBE-MARK-DROP", vec![]),
                chain("DOCKER", vec![]),
            ],
        );
        let filter = table(
            "filter",
            vec![
                chain(
                    "FORWARD",
                    vec![jump(6, "KUBE-FORWARD"), jump(7, "KUBE-FIREWALL")],
                ),
                chain("KUBE-FORWARD", vec![]),
                chain("KUBE-FIREWALL", vec![]),
                // A Service chain name means nothing outside nat.
                chain("KUBE-SVC-ABC", vec![]),
            ],
        );
        let found = Leftovers::find(true, &[nat, filter]);
        let pairs = |l: &[(&str, &str)]| -> Vec<(String, String)> {
            l.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            found.chains,
            pairs(&[
                ("nat", "KUBE-SERVICES"),
                ("nat", "KUBE-SVC-ABC"),
                ("nat", "KUBE-SEP-DEF"),
                ("nat", "KUBE-MARK-MASQ"),
                ("filter", "KUBE-FORWARD"),
            ])
        );
        assert_eq!(
            found.jumps,
            vec![
                ("nat".to_string(), "PREROUTING".to_string(), 1),
                ("filter".to_string(), "FORWARD".to_string(), 6),
            ]
        );
        assert_eq!(
            found.describe(Family::Ip),
            "table ip kube-proxy, 5 iptables chains (ip nat, ip filter), 2 rules jumping to them"
        );
        assert!(Leftovers::find(false, &[]).is_empty());
    }
}
