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
//! - IPVS's virtual services on this node's addresses, and `kube-ipvs0`, unless
//!   kube-nft serves this node with IPVS: then they are its own;
//! - the IPVS mode's ipsets, after the rules that match on them.
//!
//! The nf_tables part is one transaction: kube-proxy's rules go all at once or
//! not at all. Rules iptables-legacy wrote are out of nf_tables' reach;
//! `kube-proxy --cleanup` removes those (and an ipset they use stays, named).

use crate::core::net::Family;
use crate::netlink::batch::Batch;
use crate::netlink::expr::{Data, Expr};
use crate::netlink::ipset::{self, Destroyed, IpsetSocket};
use crate::netlink::nftables::{Committed, NftError, NftSocket};
use crate::netlink::objects::KernelTable;
use crate::ruleset::{Verdict, TABLE_NAME};
use std::time::{Duration, Instant};

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

/// The IPVS mode's ipsets (`ipsetInfo` in `pkg/proxy/ipvs/proxier.go`).
const IPSETS: [&str; 17] = [
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// Every ipset name kube-proxy's IPVS mode uses: each of `IPSETS`, and its IPv6
/// twin, "KUBE-6-…" cut to ipset's 31 characters as kube-proxy cuts it
/// (kube-proxy's own cleanup forgets the twins).
fn ipset_names() -> Vec<String> {
    let mut names: Vec<String> = IPSETS.iter().map(|n| n.to_string()).collect();
    for n in IPSETS {
        let mut twin = n.replacen("KUBE-", "KUBE-6-", 1);
        twin.truncate(ipset::MAX_NAME_LEN);
        names.push(twin);
    }
    names
}

/// How long an ipset may stay referenced after the transaction that removed
/// the last rule using it: the kernel releases a removed rule's matches from a
/// work queue, after the commit has returned.
const IPSET_RELEASE: Duration = Duration::from_secs(3);

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
    /// kube-nft serves this node with IPVS, so IPVS and `kube-ipvs0` stayed.
    pub ipvs_kept: bool,
    pub ipsets: Vec<String>,
    /// ipsets still referenced after the rules kube-nft can see went.
    pub ipsets_in_use: Vec<String>,
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
    out.ipvs_kept = served_by_ipvs(sock).map_err(|e| format!("reading the ruleset: {e}"))?;
    if !out.ipvs_kept {
        out.ipvs_services =
            crate::ipvs::cleanup().map_err(|e| format!("removing IPVS's virtual services: {e}"))?;
    }
    (out.ipsets, out.ipsets_in_use) =
        remove_ipsets().map_err(|e| format!("removing kube-proxy's ipsets: {e}"))?;
    for file in ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"] {
        let names = std::fs::read_to_string(file).unwrap_or_default();
        out.legacy_tables
            .extend(names.lines().map(|t| format!("{file}: {t}")));
    }
    Ok(out)
}

/// Whether kube-nft serves this node with its IPVS backend, whose table has
/// the set of what IPVS serves: then the virtual services and `kube-ipvs0`
/// that kube-proxy made are kube-nft's now.
fn served_by_ipvs(sock: &mut NftSocket) -> Result<bool, NftError> {
    for family in Family::ALL {
        if sock.find_table(family, TABLE_NAME)?.is_some()
            && sock
                .set_names(family, TABLE_NAME)?
                .iter()
                .any(|n| n == crate::nft::names::SET_SERVICE_PORTS)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Destroys kube-proxy's ipsets: (destroyed, still in use). A set the removed
/// rules used is asked again until the kernel has released it.
fn remove_ipsets() -> Result<(Vec<String>, Vec<String>), ipset::IpsetError> {
    let (mut gone, mut in_use) = (Vec::new(), Vec::new());
    let Some(mut sock) = IpsetSocket::open()? else {
        return Ok((gone, in_use));
    };
    let until = Instant::now() + IPSET_RELEASE;
    for name in ipset_names() {
        loop {
            match sock.destroy(&name)? {
                Destroyed::Gone => gone.push(name),
                Destroyed::NotThere => {}
                Destroyed::InUse if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Destroyed::InUse => in_use.push(name),
            }
            break;
        }
    }
    Ok((gone, in_use))
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

    #[test]
    fn ipset_names_are_kube_proxy_s_in_both_families_within_ipset_s_limit() {
        let names = ipset_names();
        assert_eq!(names.len(), 2 * IPSETS.len());
        assert!(names.iter().all(|n| n.len() <= ipset::MAX_NAME_LEN));
        for name in [
            "KUBE-CLUSTER-IP",
            "KUBE-6-CLUSTER-IP",
            "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS",
            "KUBE-6-LOAD-BALANCER-SOURCE-CID",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
}
