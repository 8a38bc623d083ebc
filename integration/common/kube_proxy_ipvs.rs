//! What kube-proxy's IPVS mode leaves on a node once it stops, for one ClusterIP
//! Service: its ipsets, and its iptables rules (written with iptables-nft, the
//! default of nft-only distributions) that match on them, as `ipset save` and
//! `iptables-save` list them on such a node. The virtual services and
//! `kube-ipvs0` are the caller's, where the kernel has IPVS.

use super::*;

/// kube-proxy's sets for `vip`:`port`/TCP with one endpoint, and the IPv6 one
/// it makes on a dual-stack node; the entries are what its sync adds.
fn ipsets(vip: &str, port: u16, endpoint: &str, target: u16) -> String {
    format!(
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 comment
add KUBE-CLUSTER-IP {vip},tcp:{port} comment \"default/web:http\"
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK {endpoint},tcp:{target},{endpoint}
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536
add KUBE-IPVS-IPS {vip}
create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536
create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536
create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
"
    )
}

/// kube-proxy's IPVS-mode rules, as `iptables-save` lists them.
fn iptables(cluster_cidr: &str) -> String {
    format!(
        r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES ! -s {cluster_cidr} -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m comment --comment "kubernetes ipv4 access filter" -j KUBE-IPVS-OUT-FILTER
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
COMMIT
"#
    )
}

/// The ipsets written, in `ipset list -n`'s order (creation order).
pub const IPSETS: [&str; 8] = [
    "KUBE-CLUSTER-IP",
    "KUBE-LOOP-BACK",
    "KUBE-IPVS-IPS",
    "KUBE-LOAD-BALANCER",
    "KUBE-EXTERNAL-IP",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-NODE-PORT-TCP",
    "KUBE-6-CLUSTER-IP",
];

/// The chains written, and the rules outside them that jump to them, as
/// `kube-nft cleanup --kube-proxy` counts them.
pub const CHAINS: usize = 11;
pub const JUMPS: usize = 10;

/// Writes kube-proxy's ipsets and iptables-nft rules for `vip`:`port` served
/// by `endpoint`:`target` into `ns`, and checks that the kernel holds them.
pub fn write(ns: &str, scratch: &Scratch, vip: &str, port: u16, endpoint: &str, target: u16) {
    let sets = scratch.write("kube-proxy.ipset", &ipsets(vip, port, endpoint, target));
    exec_in(ns, &["ipset", "restore", "-file", sets.to_str().unwrap()]);
    let rules = scratch.write("kube-proxy.iptables", &iptables("10.244.0.0/16"));
    exec_in(
        ns,
        &["iptables-nft-restore", "--noflush", rules.to_str().unwrap()],
    );
    assert_eq!(ipset_names(ns), IPSETS);
    let saved = exec_in(ns, &["iptables-nft-save"]);
    assert_eq!(saved.matches("--match-set").count(), 9, "{saved}");
}

/// `ipset list -n`.
pub fn ipset_names(ns: &str) -> Vec<String> {
    exec_in(ns, &["ipset", "list", "-n"])
        .lines()
        .map(str::to_string)
        .collect()
}
