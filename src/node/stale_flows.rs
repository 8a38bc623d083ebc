//! Forgetting UDP flows whose endpoint went away, as kube-proxy does.
//!
//! A UDP "connection" is only a conntrack entry; it never closes, so a client
//! that keeps sending to a VIP keeps reaching the endpoint its entry was DNATed
//! to, even after that endpoint left the Service, until the entry expires
//! (minutes, refreshed by every packet). Likewise an entry created while the
//! Service had no endpoints keeps the flow un-NATed. After a sync we compare the
//! UDP flows to the destinations of the Services it recomputed with the
//! endpoints that still serve, and delete the others so their next packet is
//! load-balanced again. A deleted Service's destinations may reach nothing.
//!
//! A gap in the rules does the same to every protocol: a connection whose first
//! packet came while our tables were missing (flushed by someone, or not yet
//! written at start) is tracked without DNAT, and its later packets, after the
//! repair, skip the NAT hook and meet the rules that reject a Service address's
//! unknown ports. After the first sync and after each repair of drift, the
//! flows to a Service destination that were never DNATed are deleted, so that
//! the client's retransmission is load-balanced (`unnated`). Both go in one
//! read of conntrack (`StaleFlowCleaner::after_sync`).
//!
//! "Still serve" is kube-proxy's rule (`pkg/proxy/conntrack/cleanup.go`): every
//! endpoint whose `serving` condition holds, whatever the traffic policy,
//! topology hints or terminating state choose for new flows. A flow lives as
//! long as its endpoint serves, as a TCP connection does: a pod that starts
//! terminating keeps the flows it has while it drains, and a policy or hint
//! change moves only new flows.

use crate::core::model::{ClusterState, Service, ServiceKey, ServicePort};
use crate::core::net::{Family, Protocol};
use crate::core::node_config::NodeConfig;
use crate::core::policy::port_endpoints;
use crate::engine::dataplane::SyncKind;
use crate::engine::SyncReport;
use crate::netlink::conntrack::{ConntrackError, ConntrackSocket, Flow};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

type Addr = (IpAddr, u16);
type Destinations = BTreeMap<Addr, BTreeSet<Addr>>;

/// Where one Service port is reached in one family: its ClusterIP, external
/// IPs and load balancer IPs at its port, and this node's NodePort addresses at
/// its NodePort.
fn port_destinations(
    state: &ClusterState,
    svc: &Service,
    port: &ServicePort,
    family: Family,
    config: &NodeConfig,
) -> Vec<Addr> {
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
                    .nodeport_ips(state.node.as_ref(), family)
                    .into_iter()
                    .map(|ip| (ip, np)),
            );
        }
    }
    dests
}

/// One Service's UDP destinations with the endpoints that still serve them.
pub fn udp_destinations(state: &ClusterState, svc: &Service, config: &NodeConfig) -> Destinations {
    let mut out = Destinations::new();
    for port in svc.ports.iter().filter(|p| p.protocol == Protocol::Udp) {
        for family in Family::ALL {
            let allowed: BTreeSet<Addr> = port_endpoints(state, svc, port, family)
                .iter()
                .filter(|e| e.conditions.serving)
                .map(|e| (e.addr, e.port))
                .collect();
            for d in port_destinations(state, svc, port, family, config) {
                out.entry(d).or_default().extend(allowed.iter().copied());
            }
        }
    }
    out
}

/// Every Service destination, with its transport protocol's number.
fn all_destinations(state: &ClusterState, config: &NodeConfig) -> BTreeSet<(u8, Addr)> {
    let mut out = BTreeSet::new();
    for svc in state.services.values() {
        for port in &svc.ports {
            for family in Family::ALL {
                let proto = port.protocol.number();
                out.extend(
                    port_destinations(state, svc, port, family, config)
                        .into_iter()
                        .map(|d| (proto, d)),
                );
            }
        }
    }
    out
}

/// The flows to a Service destination that were never DNATed, and that
/// nothing has answered: their reply would come from the destination itself.
/// Every flow our rules let through to a Service is DNATed to an endpoint, and
/// the rules drop or reject the others before conntrack keeps them, so only a
/// gap in the rules leaves these. One that was answered is left alone: someone
/// serves it, and only what has no other way out is ours to forget.
pub fn unnated<'a>(flows: &'a [Flow], dests: &BTreeSet<(u8, Addr)>) -> Vec<&'a Flow> {
    flows.iter().filter(|f| is_unnated(f, dests)).collect()
}

fn is_unnated(f: &Flow, dests: &BTreeSet<(u8, Addr)>) -> bool {
    !f.replied
        && (f.reply.src, f.reply.sport) == (f.original.dst, f.original.dport)
        && dests.contains(&(f.original.proto, (f.original.dst, f.original.dport)))
}

/// The flows to a checked destination whose reply does not come from one of the
/// endpoints that destination may reach now.
pub fn stale<'a>(flows: &'a [Flow], dests: &Destinations) -> Vec<&'a Flow> {
    flows.iter().filter(|f| is_stale(f, dests)).collect()
}

fn is_stale(f: &Flow, dests: &Destinations) -> bool {
    dests
        .get(&(f.original.dst, f.original.dport))
        .is_some_and(|allowed| !allowed.contains(&(f.reply.src, f.reply.sport)))
}

/// Runs the cleanup after syncs, over the Services each sync recomputed, and
/// only reads conntrack when one of their UDP destinations changed.
#[derive(Default)]
pub struct StaleFlowCleaner {
    /// What each Service with UDP ports had at the last cleanup.
    last: HashMap<ServiceKey, Destinations>,
}

/// What one run of the cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleaned {
    pub took: Duration,
    /// Flows deleted, per family.
    pub deleted: Vec<(Family, usize)>,
    /// Of those, the flows that met none of our rules (`unnated`); the others
    /// were UDP flows whose endpoint went away.
    pub unnated: usize,
    /// The flows read: the entries of the namespace that either rule looks at.
    pub read: usize,
}

impl Cleaned {
    fn empty(start: Instant) -> Cleaned {
        Cleaned {
            took: start.elapsed(),
            deleted: Family::ALL.iter().map(|f| (*f, 0)).collect(),
            unnated: 0,
            read: 0,
        }
    }

    fn count(&mut self, f: &Flow) {
        let family = Family::of(&f.original.dst);
        if let Some((_, n)) = self.deleted.iter_mut().find(|(of, _)| *of == family) {
            *n += 1;
        }
    }

    pub fn total(&self) -> usize {
        self.deleted.iter().map(|(_, n)| n).sum()
    }
}

impl StaleFlowCleaner {
    /// What the cleanup did; `None` if there was nothing to look for, so
    /// conntrack was not read. `after_gap`: our rules may have been missing
    /// before this sync (the first sync, a repair of drift), so the flows that
    /// met none of them go too, of every protocol (`unnated`). One read of
    /// conntrack serves both.
    pub fn after_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        sync: &SyncReport,
        after_gap: bool,
    ) -> Result<Option<Cleaned>, ConntrackError> {
        let start = Instant::now();
        let (check, updates) = self.changes(state, config, sync);
        let gap_dests = after_gap.then(|| all_destinations(state, config));
        if check.is_empty() && gap_dests.is_none() {
            return Ok(None);
        }
        let mut sock = ConntrackSocket::open()?;
        let udp = Protocol::Udp.number();
        // Only flows to a destination either rule looks at are kept: on a node
        // with a full conntrack table, they are a few of many.
        let flows = sock.flows(|f| {
            let dest = (f.original.dst, f.original.dport);
            (f.original.proto == udp && check.contains_key(&dest))
                || gap_dests
                    .as_ref()
                    .is_some_and(|d| d.contains(&(f.original.proto, dest)))
        })?;
        let mut cleaned = Cleaned::empty(start);
        cleaned.read = flows.len();
        for f in &flows {
            let unnated = gap_dests.as_ref().is_some_and(|d| is_unnated(f, d));
            if unnated || (f.original.proto == udp && is_stale(f, &check)) {
                sock.delete(f)?;
                cleaned.count(f);
                cleaned.unnated += usize::from(unnated);
            }
        }
        for (key, now) in updates {
            if now.is_empty() {
                self.last.remove(&key);
            } else {
                self.last.insert(key, now);
            }
        }
        cleaned.took = start.elapsed();
        Ok(Some(cleaned))
    }

    /// The destinations to check (with what each may reach now) and each changed
    /// Service's new destinations; only Services the sync recomputed are looked at.
    fn changes(
        &self,
        state: &ClusterState,
        config: &NodeConfig,
        sync: &SyncReport,
    ) -> (Destinations, Vec<(ServiceKey, Destinations)>) {
        let keys: BTreeSet<&ServiceKey> = match sync.kind {
            SyncKind::Full => state.services.keys().chain(self.last.keys()).collect(),
            SyncKind::Partial => sync.recomputed.iter().collect(),
        };
        let mut check = Destinations::new();
        let mut updates = Vec::new();
        for key in keys {
            let now = state
                .services
                .get(key)
                .map(|svc| udp_destinations(state, svc, config))
                .unwrap_or_default();
            let before = self.last.get(key);
            if before.unwrap_or(&Destinations::new()) == &now {
                continue;
            }
            // Destinations that went away may reach nothing now.
            for gone in before.into_iter().flat_map(|b| b.keys()) {
                check.entry(*gone).or_default();
            }
            for (d, allowed) in &now {
                check.insert(*d, allowed.clone());
            }
            updates.push((key.clone(), now));
        }
        (check, updates)
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
            replied: false,
        }
    }

    fn udp_state(endpoints: &[(usize, &[&str])]) -> ClusterState {
        use crate::testbed::synthetic::{service, service_key, slice};
        let mut state = ClusterState::default();
        for (i, addrs) in endpoints {
            let mut svc = service(*i);
            svc.ports[0].protocol = Protocol::Udp;
            let mut slice = slice(
                *i,
                &addrs.iter().map(|a| a.parse().unwrap()).collect::<Vec<_>>(),
            );
            slice.ports[0].protocol = Protocol::Udp;
            state.put_service(svc);
            state
                .slices
                .entry(service_key(*i))
                .or_default()
                .insert(slice);
        }
        state
    }

    fn report(kind: SyncKind, recomputed: &[usize]) -> SyncReport {
        SyncReport {
            kind,
            services: recomputed.len(),
            recomputed: recomputed
                .iter()
                .map(|i| crate::testbed::synthetic::service_key(*i))
                .collect(),
            committed: crate::netlink::Committed::default(),
            written: Vec::new(),
            duration: std::time::Duration::ZERO,
        }
    }

    /// Applies `changes` as a successful cleanup would, returning the checked
    /// destinations as (VIP, allowed endpoint count).
    fn cleanup(
        c: &mut StaleFlowCleaner,
        state: &ClusterState,
        sync: &SyncReport,
    ) -> Vec<(String, usize)> {
        let (check, updates) = c.changes(state, &NodeConfig::default(), sync);
        for (k, now) in updates {
            c.last.insert(k, now);
        }
        check
            .iter()
            .map(|((ip, _), allowed)| (ip.to_string(), allowed.len()))
            .collect()
    }

    #[test]
    fn only_recomputed_services_whose_destinations_changed_are_checked() {
        let mut c = StaleFlowCleaner::default();
        let one: &[&str] = &["10.128.0.1"];
        let two: &[&str] = &["10.128.0.1", "10.128.0.2"];
        let state = udp_state(&[(1, one), (2, one)]);
        let vip = |i: usize| crate::testbed::synthetic::vip(i).to_string();
        // The first (full) sync checks every UDP Service.
        assert_eq!(
            cleanup(&mut c, &state, &report(SyncKind::Full, &[])),
            vec![(vip(1), 1), (vip(2), 1)]
        );
        // Recomputed but unchanged: nothing to read.
        assert!(cleanup(&mut c, &state, &report(SyncKind::Partial, &[1])).is_empty());
        // Service 2 gains an endpoint; a partial sync of 2 checks 2 only.
        let state = udp_state(&[(1, one), (2, two)]);
        assert_eq!(
            cleanup(&mut c, &state, &report(SyncKind::Partial, &[2])),
            vec![(vip(2), 2)]
        );
        // Service 1 deleted: its VIP may reach nothing, so all its flows go.
        let state = udp_state(&[(2, two)]);
        assert_eq!(
            cleanup(&mut c, &state, &report(SyncKind::Partial, &[1])),
            vec![(vip(1), 0)]
        );
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

    #[test]
    fn only_flows_to_a_service_destination_that_were_never_natted_are_unnated() {
        let vip: IpAddr = "10.96.0.10".parse().unwrap();
        let dests = BTreeSet::from([(6, (vip, 80)), (17, (vip, 53))]);
        let tcp = |dst, dport, reply_src, sport| {
            let mut f = flow(dst, dport, reply_src, sport);
            f.original.proto = 6;
            f.reply.proto = 6;
            f
        };
        let flows = [
            tcp("10.96.0.10", 80, "10.244.0.2", 9376), // DNATed
            tcp("10.96.0.10", 80, "10.96.0.10", 80),   // met no rule
            flow("10.96.0.10", 53, "10.96.0.10", 53),  // the same, UDP
            flow("10.96.0.10", 80, "10.96.0.10", 80),  // UDP to a TCP port
            tcp("10.96.0.10", 22, "10.96.0.10", 22),   // not a Service port
            tcp("192.0.2.1", 80, "192.0.2.1", 80),     // not a Service address
            Flow {
                replied: true, // answered by whoever holds the address
                ..tcp("10.96.0.10", 80, "10.96.0.10", 80)
            },
        ];
        assert_eq!(unnated(&flows, &dests), vec![&flows[1], &flows[2]]);
    }

    #[test]
    fn every_service_destination_is_checked_with_its_protocol() {
        let mut state = udp_state(&[(1, &["10.128.0.1"])]);
        let tcp = crate::testbed::synthetic::service(2);
        state.put_service(tcp.clone());
        let dests = all_destinations(&state, &NodeConfig::default());
        let vip = crate::testbed::synthetic::vip;
        let port = tcp.ports[0].port;
        assert!(dests.contains(&(17, (vip(1), port))), "{dests:?}");
        assert!(dests.contains(&(6, (vip(2), port))), "{dests:?}");
        assert!(!dests.contains(&(6, (vip(1), port))), "{dests:?}");
    }
}
