//! The start's probe of the kernel: before the first sync, one transaction
//! writes every kind of object and expression kube-nft writes into scratch
//! tables of their own, the tables are read back and compared with what was
//! written, and deleted. A kernel that refuses any of it, or keeps less than
//! it was given (an older kernel drops attributes it does not know, such as a
//! table's comment, without an error), stops the start with a message naming
//! what it lacked and the kernel kube-nft needs; without the probe such a
//! kernel would refuse every sync, or keep syncing what it silently drops.
//!
//! What is written is the ruleset of a sample cluster with every feature
//! (`SAMPLE`), translated as the daemon translates, so the probe follows what
//! the translation writes without a list to keep in step. Its addresses are in
//! the documentation ranges, and every rule is moved out of the base chains
//! into a regular chain, while the base chains themselves (each hook, type and
//! family kube-nft registers) stay, empty: the probe's tables see packets but
//! never act on them.

use crate::core::convert::build_state;
use crate::core::net::Family;
use crate::core::node_config::{NodeConfig, NodePortAddresses};
use crate::netlink::batch::{write_table, Batch};
use crate::netlink::objects::{KernelChain, KernelTable};
use crate::netlink::{NftError, NftSocket};
use crate::nft::kernel::{difference, lowered, same_table, Difference};
use crate::nft::translate::translate;
use std::collections::HashMap;

/// The oldest kernel kube-nft runs on: comments on tables, chains and named
/// objects (NFTA_TABLE_USERDATA, NFTA_CHAIN_USERDATA, NFTA_OBJ_USERDATA) came in
/// 5.10, the newest of what kube-nft writes; the packet suites run on Debian
/// 11's 5.10 (docs/OPERATIONS.md, "Kernel"). kube-proxy's nftables mode asks
/// for 5.13, for the host's `nft` binary rather than the kernel.
pub const MIN_KERNEL: &str = "5.10";

/// The prefix of the probe's tables, which no other part of kube-nft reads.
pub const PROBE_PREFIX: &str = "kube-nft-probe-";

/// A cluster with one of everything the translation writes: dual-stack
/// ClusterIPs, a NodePort, external and load balancer IPs with source ranges,
/// `externalTrafficPolicy: Local` with its health check, an entry of 20 ready
/// endpoints (blocks, and `numgen random mod N < B`), one of 3 (a range map),
/// session affinity, a Service without endpoints (rejects), and conntrack
/// timeouts of a Service's own.
const SAMPLE: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: probe-node}
spec: {podCIDRs: [192.0.2.0/26, "2001:db8:0:1::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.0.2.1}
  - {type: InternalIP, address: "2001:db8::1"}
---
apiVersion: v1
kind: Service
metadata:
  name: every-shape
  namespace: probe
  annotations: {kube-nft.io/conntrack-udp-timeout: 5s, kube-nft.io/conntrack-tcp-established-timeout: 1h}
spec:
  type: LoadBalancer
  clusterIP: 198.51.100.1
  clusterIPs: [198.51.100.1, "2001:db8:96::1"]
  ipFamilies: [IPv4, IPv6]
  externalIPs: [203.0.113.1]
  loadBalancerSourceRanges: [203.0.113.128/25]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353, nodePort: 30053}
  - {name: sctp, port: 9, protocol: SCTP, targetPort: 9, nodePort: 30009}
status: {loadBalancer: {ingress: [{ip: 203.0.113.2}]}}
---
apiVersion: v1
kind: Service
metadata: {name: three, namespace: probe}
spec:
  clusterIP: 198.51.100.2
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: probe}
spec:
  clusterIP: 198.51.100.4
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: none, namespace: probe}
spec:
  clusterIP: 198.51.100.3
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

/// The sample's endpoints: 21 for `every-shape` over IPv4 (some local, one
/// terminating), 2 over IPv6, 3 for `three`, 2 for `sticky`.
fn sample_slices() -> String {
    let endpoint = |addr: String, node: &str, ready: bool| {
        format!(
            "- {{addresses: [\"{addr}\"], nodeName: {node}, conditions: {{ready: {ready}, serving: true, terminating: {}}}}}\n",
            !ready
        )
    };
    let slice = |name: &str, service: &str, family: &str, endpoints: String| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: probe, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: {family}\nports:\n- {{name: http, port: 8080, protocol: TCP}}\n- {{name: dns, port: 5353, protocol: UDP}}\n- {{name: sctp, port: 9, protocol: SCTP}}\nendpoints:\n{endpoints}"
        )
    };
    let v4: String = (0..21)
        .map(|i| {
            let node = if i % 3 == 0 { "probe-node" } else { "other" };
            endpoint(format!("192.0.2.{}", 100 + i), node, i != 20)
        })
        .collect();
    let v6: String = (0..2)
        .map(|i| endpoint(format!("2001:db8:1::{}", 10 + i), "probe-node", true))
        .collect();
    let three: String = (0..3)
        .map(|i| endpoint(format!("192.0.2.{}", 80 + i), "other", true))
        .collect();
    let sticky: String = (0..2)
        .map(|i| endpoint(format!("192.0.2.{}", 90 + i), "other", true))
        .collect();
    slice("every-shape-v4", "every-shape", "IPv4", v4)
        + &slice("every-shape-v6", "every-shape", "IPv6", v6)
        + &slice("three", "three", "IPv4", three)
        + &slice("sticky", "sticky", "IPv4", sticky)
}

/// The sample's node config: every option that changes what is written, on.
fn sample_config() -> NodeConfig {
    let net = |s: &str| s.parse().expect("a CIDR");
    NodeConfig {
        cluster_cidrs: vec![net("192.0.2.0/25"), net("2001:db8:1::/56")],
        service_cidrs: vec![net("198.51.100.0/24"), net("2001:db8:96::/112")],
        nodeport_addresses: NodePortAddresses::default(),
        counters: true,
        ..NodeConfig::default()
    }
}

/// The probe's tables: the sample's ruleset, lowered (the main tables and the
/// Service tables that hold the sample's Services), renamed, and with every
/// base chain's rules in a regular chain of its own.
pub fn probe_tables() -> Vec<KernelTable> {
    let text = format!("{SAMPLE}{}", sample_slices());
    let loaded = crate::source::files::parse(&text, "the probe's sample")
        .expect("the probe's sample parses");
    let validated = build_state(&loaded.objects, Some("probe-node"));
    debug_assert!(
        validated.rejected.is_empty() && validated.skipped_values.is_empty(),
        "{:?}",
        validated.rejected
    );
    let ruleset = translate(&validated.state, &sample_config());
    lowered(&ruleset)
        .into_iter()
        // A Service table without the sample's Services is the skeleton that
        // the others have too: registering its hooks would only cost time.
        .filter(|t| t.id().shard.is_none() || t.sets.iter().any(|s| !s.elements.is_empty()))
        .map(|mut t| {
            t.name = format!("{PROBE_PREFIX}{}", t.name);
            let mut moved = Vec::new();
            for chain in t.chains.iter_mut().filter(|c| c.base.is_some()) {
                moved.push(KernelChain {
                    name: format!("{}-rules", chain.name),
                    base: None,
                    userdata: chain.userdata.clone(),
                    rules: std::mem::take(&mut chain.rules),
                });
            }
            t.chains.extend(moved);
            t
        })
        .collect()
}

/// What stopped the probe, to be said once and end the start.
#[derive(Debug)]
pub struct Unsupported(pub String);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Writes the probe's tables, reads them back, and deletes them. `Ok` if this
/// kernel takes and keeps everything kube-nft writes.
pub fn probe(sock: &mut NftSocket) -> Result<(), Unsupported> {
    let tables = probe_tables();
    let needs = |what: String| {
        Unsupported(format!(
            "this kernel ({}) {what}; kube-nft needs Linux {MIN_KERNEL} or later (docs/OPERATIONS.md, \"Kernel\")",
            kernel_release()
        ))
    };
    let mut batch = Batch::new();
    for t in &tables {
        // A probe that died before its cleanup left its tables: start afresh.
        batch.destroy_table(t.family, &t.name);
        write_table(&mut batch, t);
    }
    let written = sock.commit(batch);
    let outcome = match written {
        Err(NftError::Refused {
            what,
            source,
            detail,
        }) => {
            // Distributions build it in; a kernel without it has no timeout objects.
            let config = if what.contains("ct timeout") {
                " (a kernel built without CONFIG_NF_CONNTRACK_TIMEOUT)"
            } else {
                ""
            };
            Err(needs(format!(
                "refused to {what}: {source}{}{config}",
                detail.map(|d| format!(" ({d})")).unwrap_or_default()
            )))
        }
        Err(e) => Err(Unsupported(format!("probing the kernel: {e}"))),
        Ok(_) => {
            let mut read = 1;
            loop {
                match kept(sock, &tables) {
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                    Ok(Some(lost)) if read == READS => break Err(needs(lost)),
                    Ok(Some(_)) => {
                        read += 1;
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                }
            }
        }
    };
    let mut cleanup = Batch::new();
    for t in &tables {
        cleanup.destroy_table(t.family, &t.name);
    }
    if let Err(e) = sock.commit(cleanup) {
        tracing::warn!("deleting the kernel probe's tables ({PROBE_PREFIX}*): {e}");
    }
    outcome
}

/// How often the probe reads its tables back before it believes a difference.
/// A hash set that grew in the commit is resized afterwards by a kernel
/// worker, and an element dump that meets the resize walks the set again from
/// its start (`rhashtable_walk_next`'s -EAGAIN) and may give elements twice.
/// What a kernel does not keep is missing from every read.
const READS: usize = 3;

/// What the kernel holds otherwise than `tables`, said as `needs` says it;
/// `None` if it kept all of them.
fn kept(sock: &mut NftSocket, tables: &[KernelTable]) -> Result<Option<String>, Unsupported> {
    let mut read = read_back(sock)?;
    Ok(tables.iter().find_map(
        |want| match read.remove(&(want.family, want.name.clone())) {
            Some(got) if same_table(want, &got) => None,
            Some(got) => Some(format!(
                "kept less than it was given: {}",
                first_difference(want, &got)
            )),
            None => Some(format!("lost table {} as it was written", want.name)),
        },
    ))
}

/// The probe's tables as the kernel holds them: one walk per family.
fn read_back(sock: &mut NftSocket) -> Result<HashMap<(Family, String), KernelTable>, Unsupported> {
    let mut read = HashMap::new();
    for family in Family::ALL {
        let walked = sock
            .walk_tables(family, None, |h| {
                h.name
                    .starts_with(PROBE_PREFIX)
                    .then(|| KernelTable::empty(family, &h.name))
            })
            .map_err(|e| Unsupported(format!("probing the kernel: reading back: {e}")))?;
        read.extend(walked.into_iter().map(|(name, t)| ((family, name), t)));
    }
    Ok(read)
}

/// The first thing `got` lacks or holds otherwise than `want`, named as `nft`
/// would name it, with the kernel that brought what a kernel may drop.
fn first_difference(want: &KernelTable, got: &KernelTable) -> String {
    let table = format!("table {} {}", want.family.keyword(), want.name);
    match difference(want, got) {
        None | Some(Difference::Table) => table,
        Some(Difference::TableComment) => format!(
            "the comment of {table} (a table's comment, NFTA_TABLE_USERDATA, came in Linux 5.10)"
        ),
        Some(Difference::Object(o)) => format!(
            "object {o} of {table} (a named object's comment, NFTA_OBJ_USERDATA, came in Linux 5.10)"
        ),
        Some(Difference::Set(s)) => format!("set {s} of {table}"),
        Some(Difference::SetComment(s)) => format!("the typeof and comment of set {s} of {table}"),
        Some(Difference::SetContent(s)) => {
            let count = |t: &KernelTable| {
                t.sets
                    .iter()
                    .find(|x| x.name == s)
                    .map_or(0, |x| x.elements.len())
            };
            format!(
                "the elements of set {s} of {table} ({} given, {} read)",
                count(want),
                count(got)
            )
        }
        Some(Difference::Chain(c)) => format!("chain {c} of {table}"),
        Some(Difference::ChainComment(c)) => format!(
            "the comment of chain {c} of {table} (a chain's comment, NFTA_CHAIN_USERDATA, came in Linux 5.10)"
        ),
        Some(Difference::ChainHook(c)) => format!("the hook of chain {c} of {table}"),
        Some(Difference::ChainRules(c)) => format!("a rule of chain {c} of {table}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::Stmt;

    /// The sample is whole (nothing rejected) and its ruleset has every
    /// statement kube-nft writes, so that the probe tries each one.
    #[test]
    fn the_sample_writes_every_statement_kind() {
        let text = format!("{SAMPLE}{}", sample_slices());
        let loaded = crate::source::files::parse(&text, "sample").unwrap();
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        let validated = build_state(&loaded.objects, Some("probe-node"));
        assert!(validated.rejected.is_empty(), "{:?}", validated.rejected);
        assert!(validated.skipped_values.is_empty());
        let ruleset = translate(&validated.state, &sample_config());
        let mut kinds = std::collections::BTreeSet::new();
        for t in &ruleset.tables {
            for c in &t.chains {
                for r in &c.rules {
                    for s in &r.stmts {
                        kinds.insert(stmt_kind(s));
                    }
                }
            }
        }
        let missing: Vec<&str> = STMT_KINDS
            .iter()
            .copied()
            .filter(|k| !kinds.contains(k))
            .collect();
        assert!(missing.is_empty(), "the sample never writes {missing:?}");
    }

    /// Every statement the translation writes. `Counter` is not among them:
    /// it is only lifted (an anonymous counter in a rule someone added); nor
    /// are the fast path's, which `fast_path::kernel_has_it` probes apart,
    /// as a kernel without them serves all the same.
    const STMT_KINDS: [&str; 21] = [
        "AddrMatch",
        "L4Proto",
        "CtStateNew",
        "CtDirection",
        "FibSaddrLocal",
        "MarkHas",
        "NumgenEq",
        "NumgenBelow",
        "InSet",
        "Vmap",
        "SetUpdate",
        "MarkOr",
        "MarkXor",
        "Dnat",
        "DnatPick",
        "Masquerade",
        "Reject",
        "RejectTcpReset",
        "CounterByMap",
        "CtTimeoutSet",
        "Verdict",
    ];

    /// Each variant by name; a new one fails to compile here until it is named,
    /// and added to `STMT_KINDS` once the translation writes it.
    fn stmt_kind(s: &Stmt) -> &'static str {
        match s {
            Stmt::AddrMatch { .. } => "AddrMatch",
            Stmt::L4Proto(_) => "L4Proto",
            Stmt::CtStateNew => "CtStateNew",
            Stmt::CtDirection(_) => "CtDirection",
            Stmt::FibSaddrLocal => "FibSaddrLocal",
            Stmt::MarkHas(_) => "MarkHas",
            Stmt::NumgenEq { .. } => "NumgenEq",
            Stmt::NumgenBelow { .. } => "NumgenBelow",
            Stmt::InSet { .. } => "InSet",
            Stmt::Vmap { .. } => "Vmap",
            Stmt::SetUpdate { .. } => "SetUpdate",
            Stmt::MarkOr(_) => "MarkOr",
            Stmt::MarkXor(_) => "MarkXor",
            Stmt::Dnat { .. } => "Dnat",
            Stmt::DnatPick { .. } => "DnatPick",
            Stmt::Masquerade { .. } => "Masquerade",
            Stmt::Reject => "Reject",
            Stmt::RejectTcpReset => "RejectTcpReset",
            Stmt::Counter => "Counter",
            Stmt::CounterByMap { .. } => "CounterByMap",
            Stmt::CtTimeoutSet(_) => "CtTimeoutSet",
            Stmt::CtLabelSet(_) => "CtLabelSet",
            Stmt::CtLabelHas(_) => "CtLabelHas",
            Stmt::CtPacketsAbove { .. } => "CtPacketsAbove",
            Stmt::FlowAdd(_) => "FlowAdd",
            Stmt::Verdict(_) => "Verdict",
        }
    }

    /// What a kernel that drops an attribute it does not know keeps is named.
    #[test]
    fn what_the_kernel_did_not_keep_is_named() {
        let want = probe_tables().remove(0);
        let mut got = want.clone();
        got.userdata = None;
        assert!(
            first_difference(&want, &got).starts_with("the comment of table ip kube-nft-probe-"),
            "{}",
            first_difference(&want, &got)
        );
        let mut got = want.clone();
        let commented = got
            .chains
            .iter_mut()
            .find(|c| c.userdata.is_some())
            .unwrap();
        commented.userdata = None;
        let name = commented.name.clone();
        assert!(
            first_difference(&want, &got).starts_with(&format!("the comment of chain {name} ")),
            "{}",
            first_difference(&want, &got)
        );
    }

    /// No rule of the probe is in a base chain: its tables never act on a packet.
    #[test]
    fn the_probe_s_base_chains_are_empty() {
        let tables = probe_tables();
        assert!(tables.iter().all(|t| t.name.starts_with(PROBE_PREFIX)));
        let base: Vec<&KernelChain> = tables
            .iter()
            .flat_map(|t| &t.chains)
            .filter(|c| c.base.is_some())
            .collect();
        assert!(!base.is_empty());
        assert!(base.iter().all(|c| c.rules.is_empty()));
    }
}
