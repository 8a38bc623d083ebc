//! The IPVS backend's own part: the virtual services and real servers each
//! Service asks for, the Service addresses on the `kube-ipvs0` dummy interface,
//! and keeping the kernel's IPVS table in step with both, Service by Service.
//!
//! Endpoint choice follows the same rules as the nftables backend (`translate::
//! categorize`: readiness, terminating fallback, topology hints, traffic
//! policies); what IPVS does not do (masquerade, source-range firewall, rejecting
//! Services without endpoints, other ports of a Service address) stays in the
//! nftables table that `translate` builds in IPVS mode. The Proxier runs both.
//!
//! IPVS has no transactions and no owner marks. Ours are the virtual services on
//! addresses of `kube-ipvs0` or on NodePort addresses, outside `--ipvs-exclude-cidrs`.

use crate::core::model::{ClusterState, Service, ServiceKey};
use crate::core::node_config::{IpvsSettings, NodeConfig, ProxyMode};
use crate::core::policy::{categorize, port_endpoints};
use crate::netlink::ipvs::{
    Command, IpvsError, IpvsSocket, RealServer, VirtualKey, VirtualService,
};
use crate::netlink::route::{self, RouteError};
use crate::ruleset::Family;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// The dummy interface holding every ClusterIP, external IP and load balancer
/// IP, so that the kernel delivers their traffic locally, where IPVS takes it.
pub const INTERFACE: &str = "kube-ipvs0";

/// Real servers' weight: every endpoint gets an equal share.
const WEIGHT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    pub service: VirtualService,
    pub reals: Vec<RealServer>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Ipvs(#[from] IpvsError),
    #[error("{INTERFACE}: {0}")]
    Interface(#[from] RouteError),
    #[error(
        "this kernel has no IPVS (the generic netlink family \"IPVS\" is missing and the ip_vs module could not be loaded); use --proxy-mode nftables, or a kernel with CONFIG_IP_VS"
    )]
    Unavailable,
}

/// What one Service asks of IPVS, in both families: a virtual service per
/// ClusterIP, external IP, load balancer IP and NodePort address, for each port
/// that has endpoints under the traffic policy that applies there.
pub fn virtual_servers(
    state: &ClusterState,
    svc: &Service,
    config: &NodeConfig,
    settings: &IpvsSettings,
) -> Vec<VirtualServer> {
    let node = state.node.as_ref();
    let scheduler = svc
        .ipvs_scheduler
        .clone()
        .unwrap_or_else(|| settings.scheduler.clone());
    let mut out = Vec::new();
    for family in Family::ALL {
        let Some(vip) = svc.cluster_ip_of(family) else {
            continue;
        };
        let externals: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .chain(&svc.load_balancer_ips)
            .copied()
            .filter(|ip| Family::of(ip) == family)
            .collect();
        let nodeport_ips = config.nodeport_ips(node, family);
        for port in &svc.ports {
            let eps = port_endpoints(state, svc, port, family);
            let chosen = categorize(svc, &eps, node);
            let reals = |local: bool| -> Vec<RealServer> {
                let list = if local {
                    &chosen.local
                } else {
                    &chosen.cluster
                };
                let mut reals: Vec<RealServer> = list
                    .iter()
                    .map(|e| RealServer {
                        addr: e.addr,
                        port: e.port,
                        weight: WEIGHT,
                    })
                    .collect();
                reals.sort();
                reals.dedup();
                reals
            };
            let mut add = |addr: IpAddr, port_number: u16, reals: Vec<RealServer>| {
                if reals.is_empty() {
                    return; // the nftables table refuses or drops its traffic
                }
                out.push(VirtualServer {
                    service: VirtualService {
                        key: VirtualKey {
                            addr,
                            protocol: port.protocol,
                            port: port_number,
                        },
                        scheduler: scheduler.clone(),
                        persistence: svc.affinity_timeout,
                    },
                    reals,
                });
            };
            add(vip, port.port, reals(svc.internal_policy_local));
            let external = reals(svc.external_policy_local);
            for ip in &externals {
                add(*ip, port.port, external.clone());
            }
            if let Some(np) = port.node_port {
                for ip in &nodeport_ips {
                    add(*ip, np, external.clone());
                }
            }
        }
    }
    out
}

/// The addresses a Service needs on `kube-ipvs0`, whether or not it has
/// endpoints (without, the nftables table refuses its traffic, which must
/// therefore arrive here rather than be routed away).
pub fn service_addresses(svc: &Service) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = svc
        .cluster_ips
        .iter()
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
        .copied()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The commands that turn `have` into `want`: new and changed virtual services
/// and real servers first (a changed service gains its new real servers before
/// it loses the old ones), deletions last.
pub fn diff(
    have: &BTreeMap<VirtualKey, &VirtualServer>,
    want: &BTreeMap<VirtualKey, &VirtualServer>,
) -> Vec<Command> {
    let mut out = Vec::new();
    let mut removals = Vec::new();
    for (key, w) in want {
        let Some(h) = have.get(key) else {
            out.push(Command::AddService(w.service.clone()));
            out.extend(w.reals.iter().map(|r| Command::AddReal(*key, r.clone())));
            continue;
        };
        if h.service != w.service {
            out.push(Command::UpdateService(w.service.clone()));
        }
        let old: HashMap<(IpAddr, u16), &RealServer> =
            h.reals.iter().map(|r| ((r.addr, r.port), r)).collect();
        let new: HashMap<(IpAddr, u16), &RealServer> =
            w.reals.iter().map(|r| ((r.addr, r.port), r)).collect();
        for r in &w.reals {
            match old.get(&(r.addr, r.port)) {
                None => out.push(Command::AddReal(*key, r.clone())),
                Some(o) if *o != r => out.push(Command::UpdateReal(*key, r.clone())),
                Some(_) => {}
            }
        }
        for r in &h.reals {
            if !new.contains_key(&(r.addr, r.port)) {
                removals.push(Command::DeleteReal(*key, r.clone()));
            }
        }
    }
    out.extend(removals);
    for key in have.keys().filter(|k| !want.contains_key(k)) {
        out.push(Command::DeleteService(*key));
    }
    out
}

/// What one IPVS sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpvsReport {
    /// IPVS commands sent, and their bytes.
    pub commands: usize,
    pub bytes: usize,
    /// Addresses added to or removed from `kube-ipvs0`.
    pub addresses: usize,
}

/// What was applied for one Service.
#[derive(Debug, Default)]
struct Applied {
    servers: Vec<VirtualServer>,
    addresses: Vec<IpAddr>,
}

impl Applied {
    /// What `svc` asks for.
    fn desired(
        state: &ClusterState,
        svc: &Service,
        config: &NodeConfig,
        settings: &IpvsSettings,
    ) -> Applied {
        Applied {
            servers: virtual_servers(state, svc, config, settings),
            addresses: service_addresses(svc),
        }
    }
}

/// The servers of some Services, by key, for `diff`.
fn by_key<'a>(
    applied: impl Iterator<Item = &'a Applied>,
) -> BTreeMap<VirtualKey, &'a VirtualServer> {
    applied
        .flat_map(|a| &a.servers)
        .map(|v| (v.service.key, v))
        .collect()
}

/// The kernel's IPVS table and `kube-ipvs0`, kept in step with the model.
pub struct IpvsTables {
    sock: IpvsSocket,
    applied: HashMap<ServiceKey, Applied>,
    /// How many Services use each address of `kube-ipvs0`.
    address_refs: HashMap<IpAddr, usize>,
}

fn settings(config: &NodeConfig) -> IpvsSettings {
    match &config.mode {
        ProxyMode::Ipvs(s) => s.clone(),
        ProxyMode::Nftables => IpvsSettings::default(),
    }
}

impl IpvsTables {
    /// Opens IPVS in the current network namespace (loading the module if the
    /// kernel can), or says clearly that this kernel has none.
    pub fn open() -> Result<IpvsTables, BackendError> {
        let sock = IpvsSocket::open()?.ok_or(BackendError::Unavailable)?;
        Ok(IpvsTables {
            sock,
            applied: HashMap::new(),
            address_refs: HashMap::new(),
        })
    }

    /// Reads the kernel's virtual services and `kube-ipvs0`, and makes them the
    /// desired ones: creates what is missing, repairs what differs, removes what
    /// is ours and no longer wanted. Adopts a correct table without a write.
    pub fn full_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<IpvsReport, BackendError> {
        let settings = settings(config);
        set_sysctls(&settings);
        let interface = ensure_interface()?;
        let bound: BTreeSet<IpAddr> = route::addresses(Some(interface))?.into_iter().collect();

        let applied: HashMap<ServiceKey, Applied> = state
            .services
            .iter()
            .map(|(key, svc)| (key.clone(), Applied::desired(state, svc, config, &settings)))
            .collect();
        let want = by_key(applied.values());
        let mut address_refs: HashMap<IpAddr, usize> = HashMap::new();
        for a in applied.values().flat_map(|a| &a.addresses) {
            *address_refs.entry(*a).or_default() += 1;
        }

        let mut ours: BTreeSet<IpAddr> = bound.clone();
        for family in Family::ALL {
            ours.extend(config.nodeport_ips(state.node.as_ref(), family));
        }
        ours.extend(want.keys().map(|k| k.addr));
        let mut have = BTreeMap::new();
        for service in self.sock.services()? {
            let addr = service.key.addr;
            if !ours.contains(&addr) || settings.exclude_cidrs.iter().any(|c| c.contains(&addr)) {
                continue;
            }
            let reals = self.sock.reals(&service.key)?;
            have.insert(service.key, VirtualServer { service, reals });
        }
        let have = have.iter().map(|(k, v)| (*k, v)).collect();

        let wanted_addresses: BTreeSet<IpAddr> = address_refs.keys().copied().collect();
        let mut report = IpvsReport::default();
        report.addresses += bind(interface, wanted_addresses.difference(&bound))?;
        let commands = diff(&have, &want);
        report.commands = commands.len();
        report.bytes = self.sock.apply(&commands)?;
        report.addresses += unbind(interface, bound.difference(&wanted_addresses))?;
        self.applied = applied;
        self.address_refs = address_refs;
        Ok(report)
    }

    /// Recomputes only the Services `keys` and sends only what changed for them.
    pub fn partial_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        keys: &[ServiceKey],
    ) -> Result<IpvsReport, BackendError> {
        let settings = settings(config);
        let updates: Vec<(ServiceKey, Option<Applied>)> = keys
            .iter()
            .map(|key| {
                let new = state
                    .services
                    .get(key)
                    .map(|svc| Applied::desired(state, svc, config, &settings));
                (key.clone(), new)
            })
            .collect();
        let (mut to_bind, mut to_unbind) = (Vec::new(), Vec::new());
        for (key, new) in &updates {
            let old = self.applied.get(key);
            let old_addresses = old.map(|o| o.addresses.as_slice()).unwrap_or_default();
            let new_addresses = new
                .as_ref()
                .map(|n| n.addresses.as_slice())
                .unwrap_or_default();
            for a in old_addresses.iter().filter(|a| !new_addresses.contains(a)) {
                let refs = self.address_refs.entry(*a).or_default();
                *refs = refs.saturating_sub(1);
                if *refs == 0 {
                    self.address_refs.remove(a);
                    to_unbind.push(*a);
                }
            }
            for a in new_addresses.iter().filter(|a| !old_addresses.contains(a)) {
                let refs = self.address_refs.entry(*a).or_default();
                *refs += 1;
                if *refs == 1 {
                    to_bind.push(*a);
                }
            }
        }
        // An address another Service took over in this same sync stays.
        to_unbind.retain(|a| !self.address_refs.contains_key(a));
        let interface = if to_bind.is_empty() && to_unbind.is_empty() {
            None
        } else {
            Some(ensure_interface()?)
        };
        let mut report = IpvsReport::default();
        if let Some(i) = interface {
            report.addresses += bind(i, to_bind.iter())?;
        }
        let have = by_key(keys.iter().filter_map(|k| self.applied.get(k)));
        let want = by_key(updates.iter().filter_map(|(_, new)| new.as_ref()));
        let commands = diff(&have, &want);
        report.commands = commands.len();
        report.bytes = self.sock.apply(&commands)?;
        if let Some(i) = interface {
            report.addresses += unbind(i, to_unbind.iter())?;
        }
        for (key, new) in updates {
            match new {
                Some(a) => self.applied.insert(key, a),
                None => self.applied.remove(&key),
            };
        }
        Ok(report)
    }
}

/// `kube-nft cleanup`: removes `kube-ipvs0` and every virtual service on this
/// node's own addresses (Service addresses and NodePort addresses alike: a
/// proxy's), as kube-proxy's cleanup flushes IPVS. Returns how many virtual
/// services it removed; a kernel without IPVS has none to remove.
pub fn cleanup() -> Result<usize, BackendError> {
    let interface = route::link_index(INTERFACE)?;
    let local: BTreeSet<IpAddr> = route::addresses(None)?.into_iter().collect();
    let mut removed = 0;
    if let Some(mut sock) = IpvsSocket::open()? {
        let commands: Vec<Command> = sock
            .services()?
            .into_iter()
            .filter(|s| local.contains(&s.key.addr))
            .map(|s| Command::DeleteService(s.key))
            .collect();
        sock.apply(&commands)?;
        removed = commands.len();
    }
    if let Some(i) = interface {
        route::delete_link(i)?;
    }
    Ok(removed)
}

/// The kernel's IPVS table, laid out like `ipvsadm -Ln` (for the lab and
/// operators without ipvsadm).
pub fn listing() -> Result<String, BackendError> {
    use std::fmt::Write;
    let mut sock = IpvsSocket::open()?.ok_or(BackendError::Unavailable)?;
    let mut services = sock.services()?;
    services.sort_by_key(|s| s.key);
    let mut out = String::from("Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight\n");
    for s in services {
        let addr = std::net::SocketAddr::new(s.key.addr, s.key.port);
        let persistent = s
            .persistence
            .map(|t| format!(" persistent {t}"))
            .unwrap_or_default();
        let proto = s.key.protocol.name().to_uppercase();
        let _ = writeln!(out, "{proto:<4} {addr} {}{persistent}", s.scheduler);
        for r in sock.reals(&s.key)? {
            let real = std::net::SocketAddr::new(r.addr, r.port).to_string();
            let _ = writeln!(out, "  -> {real:<28} Masq    {}", r.weight);
        }
    }
    Ok(out)
}

/// The index of `kube-ipvs0`, created (down, as kube-proxy leaves it) if missing.
fn ensure_interface() -> Result<u32, RouteError> {
    if let Some(i) = route::link_index(INTERFACE)? {
        return Ok(i);
    }
    route::add_dummy(INTERFACE)?;
    route::link_index(INTERFACE)?
        .ok_or_else(|| RouteError::Io(std::io::Error::other("created, then not found")))
}

fn bind<'a>(interface: u32, addrs: impl Iterator<Item = &'a IpAddr>) -> Result<usize, RouteError> {
    let mut n = 0;
    for a in addrs {
        route::add_address(interface, *a)?;
        n += 1;
    }
    Ok(n)
}

fn unbind<'a>(
    interface: u32,
    addrs: impl Iterator<Item = &'a IpAddr>,
) -> Result<usize, RouteError> {
    let mut n = 0;
    for a in addrs {
        route::delete_address(interface, *a)?;
        n += 1;
    }
    Ok(n)
}

/// What kube-proxy's IPVS mode sets, per network namespace: conntrack entries
/// for IPVS connections (so that nftables can masquerade them), new connections
/// on a reused port scheduled afresh, connections to removed real servers and
/// stale persistence templates expired, forwarding on; strict ARP when asked.
fn set_sysctls(settings: &IpvsSettings) {
    let mut values = vec![
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/conn_reuse_mode", "0"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/vs/expire_quiescent_template", "1"),
        ("net/ipv4/ip_forward", "1"),
    ];
    if settings.strict_arp {
        values.push(("net/ipv4/conf/all/arp_ignore", "1"));
        values.push(("net/ipv4/conf/all/arp_announce", "2"));
    }
    for (key, value) in values {
        let path = format!("/proc/sys/{key}");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
            continue;
        }
        if let Err(e) = std::fs::write(&path, value) {
            tracing::warn!("could not set {} = {value}: {e}", key.replace('/', "."));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::Protocol;

    fn vs(port: u16, reals: &[(&str, u32)]) -> (VirtualKey, VirtualServer) {
        let key = VirtualKey {
            addr: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port,
        };
        let server = VirtualServer {
            service: VirtualService {
                key,
                scheduler: "rr".into(),
                persistence: None,
            },
            reals: reals
                .iter()
                .map(|(a, w)| RealServer {
                    addr: a.parse().unwrap(),
                    port: 8080,
                    weight: *w,
                })
                .collect(),
        };
        (key, server)
    }

    /// The model the manifests describe, on node `node-a` (address 192.0.2.1).
    fn cluster(manifests: &str) -> (ClusterState, NodeConfig) {
        let loaded = crate::source::files::parse(manifests, "test").unwrap();
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        let validated = crate::core::convert::build_state(&loaded.objects, Some("node-a"));
        assert!(validated.rejected.is_empty(), "{:?}", validated.rejected);
        let config = NodeConfig {
            mode: ProxyMode::Ipvs(IpvsSettings {
                scheduler: "wlc".into(),
                ..IpvsSettings::default()
            }),
            ..NodeConfig::default()
        };
        (validated.state, config)
    }

    const NODE: &str = "---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.1}]}\n";
    const SLICE: &str = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 9376}]\nendpoints:\n- {addresses: [10.244.1.10], nodeName: node-a}\n- {addresses: [10.244.2.10], nodeName: node-b}\n";

    fn listed(servers: &[VirtualServer]) -> Vec<String> {
        servers
            .iter()
            .map(|v| {
                let reals: Vec<String> = v.reals.iter().map(|r| r.addr.to_string()).collect();
                format!(
                    "{} {} {:?} -> {}",
                    v.service.key,
                    v.service.scheduler,
                    v.service.persistence,
                    reals.join(",")
                )
            })
            .collect()
    }

    #[test]
    fn a_service_asks_for_a_virtual_service_per_address_with_its_policy_endpoints() {
        let web = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, annotations: {kube-nft.io/ipvs-scheduler: sh}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalTrafficPolicy: Local\n  sessionAffinity: ClientIP\n  ports: [{name: http, port: 80, targetPort: 9376, nodePort: 30080}]\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.8}]}}\n";
        let (state, config) = cluster(&(NODE.to_string() + web + SLICE));
        let svc = state.services.values().next().unwrap();
        let settings = settings(&config);
        assert_eq!(
            listed(&virtual_servers(&state, svc, &config, &settings)),
            [
                // Internal traffic: every endpoint; external: this node's only.
                "10.96.0.10:80/tcp sh Some(10800) -> 10.244.1.10,10.244.2.10",
                "198.51.100.8:80/tcp sh Some(10800) -> 10.244.1.10",
                "192.0.2.1:30080/tcp sh Some(10800) -> 10.244.1.10",
            ]
        );
        assert_eq!(
            service_addresses(svc),
            [
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "198.51.100.8".parse().unwrap()
            ]
        );
    }

    #[test]
    fn without_endpoints_under_its_policy_a_port_gets_no_virtual_service() {
        let web = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  internalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 9376}]\n";
        let remote_only = SLICE.replace("- {addresses: [10.244.1.10], nodeName: node-a}\n", "");
        let (state, config) = cluster(&(NODE.to_string() + web + &remote_only));
        let svc = state.services.values().next().unwrap();
        assert!(virtual_servers(&state, svc, &config, &settings(&config)).is_empty());
        let (state, config) = cluster(&(NODE.to_string() + web + SLICE));
        let svc = state.services.values().next().unwrap();
        assert_eq!(
            listed(&virtual_servers(&state, svc, &config, &settings(&config))),
            ["10.96.0.10:80/tcp wlc None -> 10.244.1.10"]
        );
    }

    fn refs(m: &BTreeMap<VirtualKey, VirtualServer>) -> BTreeMap<VirtualKey, &VirtualServer> {
        m.iter().map(|(k, v)| (*k, v)).collect()
    }

    #[test]
    fn diff_adds_before_it_removes_and_leaves_the_unchanged_alone() {
        let have = BTreeMap::from([
            vs(80, &[("10.244.0.1", 1), ("10.244.0.2", 1)]),
            vs(81, &[("10.244.0.1", 1)]),
            vs(82, &[("10.244.0.9", 1)]),
        ]);
        let want = BTreeMap::from([
            vs(80, &[("10.244.0.2", 1), ("10.244.0.3", 1)]),
            vs(81, &[("10.244.0.1", 1)]),
            vs(83, &[("10.244.0.4", 1)]),
        ]);
        let (have, want) = (refs(&have), refs(&want));
        let text: Vec<String> = diff(&have, &want).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            text,
            [
                "add real server 10.244.0.3:8080 to 10.96.0.10:80/tcp",
                "add virtual service 10.96.0.10:83/tcp (rr)",
                "add real server 10.244.0.4:8080 to 10.96.0.10:83/tcp",
                "delete real server 10.244.0.1:8080 from 10.96.0.10:80/tcp",
                "delete virtual service 10.96.0.10:82/tcp",
            ]
        );
        assert!(diff(&want, &want).is_empty());
    }

    #[test]
    fn a_changed_scheduler_or_weight_is_an_update_not_a_replacement() {
        let (key, old) = vs(80, &[("10.244.0.1", 1)]);
        let mut new = old.clone();
        new.service.scheduler = "sh".into();
        new.reals[0].weight = 0;
        let cmds = diff(
            &BTreeMap::from([(key, &old)]),
            &BTreeMap::from([(key, &new)]),
        );
        assert!(matches!(cmds[0], Command::UpdateService(ref s) if s.scheduler == "sh"));
        assert!(matches!(cmds[1], Command::UpdateReal(_, ref r) if r.weight == 0));
        assert_eq!(cmds.len(), 2);
    }
}
