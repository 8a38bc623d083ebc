//! Graceful termination, as kube-proxy's IPVS mode does it: a real server that
//! leaves a TCP virtual service is not deleted but set to weight 0, so that it
//! takes no new connection while IPVS keeps forwarding the ones it holds; it
//! goes once IPVS counts no connection on it (active or inactive). A rolling
//! update then cuts no established connection. UDP and SCTP real servers go at
//! once, as kube-proxy's do (`expire_nodest_conn` ends their flows).
//!
//! `Draining::rewrite` turns the commands `servers::diff` planned into these:
//! a deletion of a busy real server becomes weight 0, and a real server that
//! comes back while draining gets its weight again rather than being added
//! twice. A virtual service that goes (its Service or port deleted, or its
//! last endpoint gone) goes at once with its connections: kube-proxy deletes
//! the virtual servers of a Service that goes too, but keeps one whose
//! Service has no endpoints left, whose real servers then drain; kube-nft
//! makes no virtual service without endpoints (the nftables table refuses
//! their traffic), so scaling a Service to zero ends its connections. The connection counts
//! are read by full syncs, every sync period (kube-proxy looks once a minute);
//! a partial sync does not read them and keeps every draining real server
//! for the next full sync to judge.

use super::kernel::Connections;
use super::servers::VirtualServer;
use crate::core::net::Protocol;
use crate::netlink::ipvs::{Command, RealServer, VirtualKey};
use std::collections::BTreeMap;

/// The real servers kept at weight 0, with their virtual service.
#[derive(Debug, Default)]
pub struct Draining {
    servers: BTreeMap<VirtualKey, VirtualServer>,
}

/// Whether a real server of this protocol drains rather than going at once.
fn drains(protocol: Protocol) -> bool {
    protocol == Protocol::Tcp
}

impl Draining {
    /// How many real servers are draining.
    pub fn count(&self) -> usize {
        self.servers.values().map(|v| v.reals.len()).sum()
    }

    /// Rewrites `commands`, planned from `have` to what is wanted, so that
    /// real servers drain. `connections` gives a virtual service's counts, or
    /// `None` where they are not read (then a draining server is kept).
    pub fn rewrite(
        &mut self,
        commands: Vec<Command>,
        have: &BTreeMap<VirtualKey, &VirtualServer>,
        connections: &mut dyn FnMut(&VirtualKey) -> Option<Connections>,
    ) -> Vec<Command> {
        let mut out = Vec::with_capacity(commands.len());
        let mut counts: BTreeMap<VirtualKey, Option<Connections>> = BTreeMap::new();
        let mut busy = |key: &VirtualKey, real: &RealServer| -> Option<bool> {
            let c = counts.entry(*key).or_insert_with(|| connections(key));
            c.as_ref()
                .map(|c| c.get(&(real.addr, real.port)).copied().unwrap_or(0) > 0)
        };
        for command in commands {
            match command {
                Command::AddService(s) => match self.servers.get_mut(&s.key) {
                    // Still there for its draining real servers.
                    Some(kept) if kept.service != s => {
                        kept.service = s.clone();
                        out.push(Command::UpdateService(s));
                    }
                    Some(_) => {}
                    None => out.push(Command::AddService(s)),
                },
                Command::AddReal(key, real) if self.take(&key, &real) => {
                    out.push(Command::UpdateReal(key, real));
                }
                Command::DeleteReal(key, real) if drains(key.protocol) => {
                    let service = have.get(&key).map(|v| &v.service);
                    match (busy(&key, &real), service) {
                        (Some(false), _) | (_, None) => {
                            self.take(&key, &real);
                            out.push(Command::DeleteReal(key, real));
                        }
                        (_, Some(service)) => {
                            if let Some(c) = self.keep(service, &real) {
                                out.push(c);
                            }
                        }
                    }
                }
                Command::DeleteService(key) => {
                    self.servers.remove(&key);
                    out.push(Command::DeleteService(key));
                }
                other => out.push(other),
            }
        }
        out
    }

    /// Keeps `real` draining: the command that sets its weight to 0, if it
    /// had another.
    fn keep(
        &mut self,
        service: &crate::netlink::ipvs::VirtualService,
        real: &RealServer,
    ) -> Option<Command> {
        let kept = self
            .servers
            .entry(service.key)
            .or_insert_with(|| VirtualServer {
                service: service.clone(),
                reals: Vec::new(),
            });
        let zero = RealServer {
            weight: 0,
            ..real.clone()
        };
        if !kept.reals.contains(&zero) {
            kept.reals.push(zero.clone());
        }
        (real.weight != 0).then_some(Command::UpdateReal(service.key, zero))
    }

    /// Takes `real` off the draining list; whether it was on it.
    fn take(&mut self, key: &VirtualKey, real: &RealServer) -> bool {
        let Some(kept) = self.servers.get_mut(key) else {
            return false;
        };
        let before = kept.reals.len();
        kept.reals
            .retain(|r| (r.addr, r.port) != (real.addr, real.port));
        let taken = kept.reals.len() != before;
        if kept.reals.is_empty() {
            // The virtual service stays only if it is wanted; the caller's
            // commands say which.
            self.servers.remove(key);
        }
        taken
    }

    /// Forgets everything: a full sync rebuilds the list from the kernel.
    pub fn clear(&mut self) {
        self.servers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::ipvs::VirtualService;

    /// UDP (and SCTP) real servers go at once, busy or not, as kube-proxy's.
    #[test]
    fn only_tcp_real_servers_drain() {
        for (protocol, drained) in [
            (Protocol::Tcp, true),
            (Protocol::Udp, false),
            (Protocol::Sctp, false),
        ] {
            let key = VirtualKey {
                addr: "10.96.0.10".parse().unwrap(),
                protocol,
                port: 53,
            };
            let real = RealServer {
                addr: "10.244.1.2".parse().unwrap(),
                port: 53,
                weight: 1,
            };
            let server = VirtualServer {
                service: VirtualService {
                    key,
                    scheduler: "rr".into(),
                    persistence: None,
                },
                reals: vec![real.clone()],
            };
            let have = BTreeMap::from([(key, &server)]);
            let busy = Connections::from([((real.addr, real.port), 1)]);
            let mut d = Draining::default();
            let out = d.rewrite(
                vec![Command::DeleteReal(key, real.clone())],
                &have,
                &mut |_| Some(busy.clone()),
            );
            let zero = RealServer {
                weight: 0,
                ..real.clone()
            };
            let want = if drained {
                Command::UpdateReal(key, zero)
            } else {
                Command::DeleteReal(key, real)
            };
            assert_eq!(out, [want], "{protocol:?}");
            assert_eq!(d.count(), usize::from(drained));
        }
    }
}
