//! The nftables table that runs beside IPVS (`--proxy-mode ipvs`): no dispatch
//! maps (IPVS picks endpoints), but the sets that say which Service ports IPVS
//! serves and which external traffic is masqueraded. It is the nftables
//! translator's other flavour, so it lives here; `ipvs/` programs IPVS itself.

use crate::core::model::{ClusterState, Service};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::core::policy::{categorize, port_endpoints};
use crate::nft::build::{element, jump, nodeport_key, regular, set, DISPATCH_KEY};
use crate::nft::names::*;
use crate::nft::service::{PolicyChains, ServiceIn, ServiceRules};
use crate::ruleset::{KeyType, Rule, Stmt, Table, TableId, Verdict};

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

/// The IPVS flavour of one Service in one family, in the main table: IPVS
/// picks endpoints, so there are no picking chains, only the sets that say
/// which Service ports IPVS serves and which external traffic is masqueraded,
/// beside the refusals and the firewall both flavours have.
pub(super) fn ipvs_rules(
    state: &ClusterState,
    svc: &Service,
    family: Family,
    config: &NodeConfig,
) -> ServiceRules {
    let mut out = ServiceRules::new(TableId::main(family));
    let Some(s) = ServiceIn::start(&mut out, state, svc, family) else {
        return out;
    };
    for (index, port) in svc.ports.iter().enumerate() {
        let endpoints = port_endpoints(state, svc, port, family);
        let p = s.port(index, categorize(svc, &endpoints, s.node));
        // Only names: whether IPVS serves the port under each policy.
        let chains = PolicyChains {
            cluster: s.policy_chain_name(&mut out, "svc", &p, &p.eps.cluster),
            local: s.policy_chain_name(&mut out, "local", &p, &p.eps.local),
        };
        let internal = chains.internal(svc);
        out.elements.push(match internal {
            Some(_) => (
                SET_SERVICE_PORTS,
                element(p.vip_key.clone(), None, &p.label),
            ),
            None => p.vip_unserved(),
        });
        p.count(&mut out, svc, config);
        if !p.is_external() {
            continue;
        }
        if chains.external(svc).is_some() {
            let masquerade = !svc.external_policy_local;
            for key in &p.external_keys {
                out.elements
                    .push((SET_SERVICE_PORTS, element(key.clone(), None, &p.label)));
                if masquerade {
                    out.elements.push((
                        SET_MASQUERADE_SERVICES,
                        element(key.clone(), None, &p.label),
                    ));
                }
            }
            if let (Some(node_port), true) = (port.node_port, masquerade) {
                out.elements.push((
                    SET_MASQUERADE_NODEPORTS,
                    element(nodeport_key(port, node_port), None, &p.label),
                ));
            }
        }
        s.external_elements(&mut out, &p, None, None);
    }
    out.finish()
}
