//! The nftables table that runs beside IPVS (`--proxy-mode ipvs`): no dispatch
//! maps (IPVS picks endpoints), but the sets that say which Service ports IPVS
//! serves and which external traffic is masqueraded. It is the nftables
//! translator's other flavour, so it lives here; `ipvs/` programs IPVS itself.

use crate::core::model::{Service, ServicePort};
use crate::nft::names::*;
use crate::nft::service::*;
use crate::nft::skeleton::*;
use crate::ruleset::{KeyType, KeyValue, Rule, Stmt, Table, Verdict};

/// The IPVS backend's table: no dispatch maps (IPVS picks endpoints), but the
/// sets that say which Service ports IPVS serves and which external traffic is
/// masqueraded. Service addresses are local (on `kube-ipvs0`), so filter-input
/// (before IPVS, which runs late in local input) also refuses other ports of a
/// ClusterIP: no node-local listener is reachable through a Service address.
pub(super) fn adapt_for_ipvs(table: &mut Table) {
    let addr = table.family.addr_type();
    let dispatch_key = vec![addr, KeyType::InetProto, KeyType::InetService];
    let at = 2; // after cluster-ips and nodeport-ips
    table.sets.splice(
        at..at,
        [
            set(
                SET_SERVICE_PORTS,
                dispatch_key.clone(),
                None,
                "Service IP . protocol . port that IPVS serves",
            ),
            set(
                SET_MASQUERADE_SERVICES,
                dispatch_key,
                None,
                "external IP or load balancer IP . protocol . port: masquerade (externalTrafficPolicy: Cluster)",
            ),
            set(
                SET_MASQUERADE_NODEPORTS,
                vec![KeyType::InetProto, KeyType::InetService],
                None,
                "protocol . NodePort: masquerade (externalTrafficPolicy: Cluster)",
            ),
        ],
    );
    if let Some(input) = table.chains.iter_mut().find(|c| c.name == "filter-input") {
        input.rules.push(Rule::new(vec![
            Stmt::CtStateNew,
            jump(CHAIN_SERVICE_PORTS_CHECK),
        ]));
    }
    table.chains.push(regular(
        CHAIN_SERVICE_PORTS_CHECK,
        vec![
            Rule::new(vec![
                Stmt::InSet {
                    fields: DISPATCH_KEY.to_vec(),
                    set: SET_SERVICE_PORTS.into(),
                },
                Stmt::Verdict(Verdict::Return),
            ]),
            Rule::new(vec![jump(CHAIN_CLUSTER_IPS_CHECK)]),
        ],
    ));
}

/// The IPVS backend's elements for a port's external addresses and NodePort:
/// served by IPVS, and masqueraded unless `externalTrafficPolicy: Local`.
pub(super) fn ipvs_external_elements(
    out: &mut ServiceRules,
    svc: &Service,
    port: &ServicePort,
    label: &str,
    external_keys: &[Vec<KeyValue>],
    chains: &PolicyChains,
) {
    if chains.external(svc).is_none() {
        return;
    }
    for key in external_keys {
        out.elements
            .push((SET_SERVICE_PORTS, element(key.clone(), None, label)));
        if !svc.external_policy_local {
            out.elements
                .push((SET_MASQUERADE_SERVICES, element(key.clone(), None, label)));
        }
    }
    if let (Some(node_port), false) = (port.node_port, svc.external_policy_local) {
        out.elements.push((
            SET_MASQUERADE_NODEPORTS,
            element(nodeport_key(port, node_port), None, label),
        ));
    }
}
