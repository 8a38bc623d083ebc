//! Forgetting UDP flows whose endpoint went away, as kube-proxy does.
//!
//! A UDP "connection" is only a conntrack entry; it never closes, so a client
//! that keeps sending to a VIP keeps reaching the endpoint its entry was DNATed
//! to, even after that endpoint left the Service, until the entry expires
//! (minutes, refreshed by every packet). Likewise an entry created while the
//! Service had no endpoints keeps the flow un-NATed. After each sync we compare
//! the UDP flows to Service destinations with the endpoints each destination may
//! now reach, and delete the others so their next packet is load-balanced again.

use crate::model::ClusterState;
use crate::netlink::conntrack::{ConntrackError, ConntrackSocket, Flow};
use crate::ruleset::{Family, Protocol};
use crate::translate::{categorize, NodeConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

type Addr = (IpAddr, u16);

/// Every UDP Service destination (ClusterIP, external IP, load balancer IP and
/// NodePort on this node's addresses) with the endpoints it may be DNATed to.
pub fn udp_destinations(
    state: &ClusterState,
    config: &NodeConfig,
) -> BTreeMap<Addr, BTreeSet<Addr>> {
    let node = state.node.as_ref();
    let mut out: BTreeMap<Addr, BTreeSet<Addr>> = BTreeMap::new();
    for svc in state.services.values() {
        for port in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
            let all = state.endpoints_for(svc, port);
            for family in Family::ALL {
                let in_family: Vec<_> = all
                    .iter()
                    .filter(|e| Family::of(&e.addr) == family)
                    .cloned()
                    .collect();
                let eps = categorize(svc, &in_family, node);
                let allowed: BTreeSet<Addr> = eps
                    .cluster
                    .iter()
                    .chain(&eps.local)
                    .map(|e| (e.addr, e.port))
                    .collect();
                let of_family = |ip: &&IpAddr| Family::of(ip) == family;
                let mut dests: Vec<Addr> = svc
                    .cluster_ips
                    .iter()
                    .chain(&svc.external_ips)
                    .chain(&svc.load_balancer_ips)
                    .filter(of_family)
                    .map(|ip| (*ip, port.port))
                    .collect();
                if let Some(np) = port.node_port {
                    if svc.cluster_ips.iter().any(|ip| of_family(&ip)) {
                        dests.extend(
                            config
                                .nodeport_ips(node, family)
                                .into_iter()
                                .map(|ip| (ip, np)),
                        );
                    }
                }
                for d in dests {
                    out.entry(d).or_default().extend(allowed.iter().copied());
                }
            }
        }
    }
    out
}

/// The flows to a Service destination whose reply does not come from one of the
/// endpoints that destination may reach now.
pub fn stale<'a>(flows: &'a [Flow], dests: &BTreeMap<Addr, BTreeSet<Addr>>) -> Vec<&'a Flow> {
    flows
        .iter()
        .filter(|f| {
            dests
                .get(&(f.original.dst, f.original.dport))
                .is_some_and(|allowed| !allowed.contains(&(f.reply.src, f.reply.sport)))
        })
        .collect()
}

/// Runs the cleanup after syncs, only when the UDP destinations changed.
#[derive(Default)]
pub struct StaleFlowCleaner {
    last: Option<BTreeMap<Addr, BTreeSet<Addr>>>,
}

impl StaleFlowCleaner {
    /// Returns how many flows were deleted.
    pub fn after_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<usize, ConntrackError> {
        let dests = udp_destinations(state, config);
        if self.last.as_ref() == Some(&dests) {
            return Ok(0);
        }
        let mut sock = ConntrackSocket::open()?;
        let flows = sock.flows(Protocol::Udp.number())?;
        let stale = stale(&flows, &dests);
        for f in &stale {
            sock.delete(f)?;
        }
        self.last = Some(dests);
        Ok(stale.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::conntrack::Tuple;

    fn flow(dst: &str, dport: u16, reply_src: &str, sport: u16) -> Flow {
        let client: IpAddr = "10.244.9.9".parse().unwrap();
        Flow {
            original: Tuple {
                src: client,
                dst: dst.parse().unwrap(),
                proto: 17,
                sport: 40000,
                dport,
            },
            reply: Tuple {
                src: reply_src.parse().unwrap(),
                dst: client,
                proto: 17,
                sport,
                dport: 40000,
            },
        }
    }

    #[test]
    fn flows_to_gone_or_never_natted_endpoints_are_stale() {
        let mut dests = BTreeMap::new();
        dests.insert(
            ("10.96.0.10".parse().unwrap(), 53),
            BTreeSet::from([("10.244.0.2".parse().unwrap(), 5353)]),
        );
        let flows = [
            flow("10.96.0.10", 53, "10.244.0.2", 5353), // current endpoint
            flow("10.96.0.10", 53, "10.244.0.1", 5353), // endpoint that left
            flow("10.96.0.10", 53, "10.96.0.10", 53),   // from when it had none
            flow("8.8.8.8", 53, "8.8.8.8", 53),         // not a Service
        ];
        let s = stale(&flows, &dests);
        assert_eq!(s, vec![&flows[1], &flows[2]]);
    }
}
