//! The IPVS dataplane: keeps the kernel's IPVS table and the Service addresses
//! on the `kube-ipvs0` dummy interface in step with what each Service asks for
//! (`servers`), Service by Service.
//!
//! Endpoint choice follows the core's policy, as for nftables; what IPVS does
//! not do (masquerade, source-range firewall, rejecting Services without
//! endpoints, other ports of a Service address) stays in the nftables table that
//! `nft` builds in its IPVS flavour. The engine runs both dataplanes.
//!
//! IPVS has no transactions and no owner marks. Ours are the virtual services on
//! addresses of `kube-ipvs0` or on NodePort addresses, outside `--ipvs-exclude-cidrs`.

mod draining;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod kernel;
pub mod servers;
#[cfg(test)]
mod tests;

use crate::core::model::{ClusterState, Service, ServiceKey};
use crate::core::net::Family;
use crate::core::node_config::{IpvsSettings, IpvsTimeouts, NodeConfig};
use crate::engine::dataplane::{Dataplane, SyncError, Written};
use crate::netlink::ipvs::{Command, IpvsError, IpvsSocket, VirtualKey};
use crate::netlink::route::{self, RouteError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use draining::Draining;
pub use kernel::{IpvsKernel, INTERFACE};
use servers::{diff, service_addresses, virtual_servers, VirtualServer};

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

/// What one IPVS sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpvsReport {
    /// IPVS commands sent, and their bytes.
    pub commands: usize,
    pub bytes: usize,
    /// Addresses added to or removed from `kube-ipvs0`.
    pub addresses: usize,
    /// Real servers kept at weight 0 until their connections end.
    pub draining: usize,
}

/// What was programmed for one Service.
#[derive(Debug, Default)]
struct Programmed {
    servers: Vec<VirtualServer>,
    addresses: Vec<IpAddr>,
}

impl Programmed {
    /// What `svc` asks for.
    fn desired(
        state: &ClusterState,
        svc: &Service,
        config: &NodeConfig,
        settings: &IpvsSettings,
    ) -> Programmed {
        Programmed {
            servers: virtual_servers(state, svc, config, settings),
            addresses: service_addresses(svc),
        }
    }
}

/// The servers of some Services, by key, for `diff`.
fn by_key<'a>(
    applied: impl Iterator<Item = &'a Programmed>,
) -> BTreeMap<VirtualKey, &'a VirtualServer> {
    applied
        .flat_map(|a| &a.servers)
        .map(|v| (v.service.key, v))
        .collect()
}

/// What the kernel has beside what the model wants.
struct Comparison {
    interface: u32,
    bound: BTreeSet<IpAddr>,
    have: BTreeMap<VirtualKey, VirtualServer>,
    programmed: HashMap<ServiceKey, Programmed>,
    address_refs: HashMap<IpAddr, usize>,
}

/// The kernel's IPVS table and `kube-ipvs0`, kept in step with the model.
pub struct IpvsDataplane<K = IpvsSocket> {
    kernel: K,
    programmed: HashMap<ServiceKey, Programmed>,
    /// How many Services use each address of `kube-ipvs0`.
    address_refs: HashMap<IpAddr, usize>,
    draining: Draining,
}

impl IpvsDataplane<IpvsSocket> {
    /// Opens IPVS in the current network namespace (loading the module if the
    /// kernel can), or says clearly that this kernel has none.
    pub fn open() -> Result<Self, BackendError> {
        let sock = IpvsSocket::open()?.ok_or(BackendError::Unavailable)?;
        Ok(IpvsDataplane::with_kernel(sock))
    }
}

impl<K: IpvsKernel> IpvsDataplane<K> {
    pub fn with_kernel(kernel: K) -> Self {
        IpvsDataplane {
            kernel,
            programmed: HashMap::new(),
            address_refs: HashMap::new(),
            draining: Draining::default(),
        }
    }

    /// Reads the kernel's virtual services (ours only) and `kube-ipvs0`'s
    /// addresses, beside what the model asks for.
    fn read_and_want(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        settings: &IpvsSettings,
    ) -> Result<Comparison, BackendError> {
        let interface = self.kernel.ensure_interface()?;
        let bound: BTreeSet<IpAddr> = self.kernel.addresses(interface)?.into_iter().collect();
        let programmed: HashMap<ServiceKey, Programmed> = state
            .services
            .iter()
            .map(|(key, svc)| {
                (
                    key.clone(),
                    Programmed::desired(state, svc, config, settings),
                )
            })
            .collect();
        let mut address_refs: HashMap<IpAddr, usize> = HashMap::new();
        for a in programmed.values().flat_map(|a| &a.addresses) {
            *address_refs.entry(*a).or_default() += 1;
        }
        let mut ours: BTreeSet<IpAddr> = bound.clone();
        for family in Family::ALL {
            ours.extend(config.nodeport_ips(state.node.as_ref(), family));
        }
        ours.extend(by_key(programmed.values()).keys().map(|k| k.addr));
        let mut have = BTreeMap::new();
        for service in self.kernel.services()? {
            let addr = service.key.addr;
            if !ours.contains(&addr) || settings.exclude_cidrs.iter().any(|c| c.contains(&addr)) {
                continue;
            }
            let reals = self.kernel.reals(&service.key)?;
            have.insert(service.key, VirtualServer { service, reals });
        }
        Ok(Comparison {
            interface,
            bound,
            have,
            programmed,
            address_refs,
        })
    }

    /// Reads the kernel's virtual services and `kube-ipvs0`, and makes them the
    /// desired ones: creates what is missing, repairs what differs, removes what
    /// is ours and no longer wanted. Adopts a correct table without a write.
    pub fn full(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<IpvsReport, BackendError> {
        let settings = config.ipvs_settings();
        self.set_sysctls(&settings);
        let c = self.read_and_want(state, config, &settings)?;
        let have = c.have.iter().map(|(k, v)| (*k, v)).collect();
        let want = by_key(c.programmed.values());
        let wanted_addresses: BTreeSet<IpAddr> = c.address_refs.keys().copied().collect();
        let mut report = IpvsReport::default();
        report.addresses +=
            self.set_addresses(c.interface, wanted_addresses.difference(&c.bound), true)?;
        // The draining list is rebuilt from the kernel's weights and counts.
        self.draining.clear();
        let kernel = &mut self.kernel;
        let commands = self
            .draining
            .rewrite(diff(&have, &want), &have, &mut |key| {
                kernel.connections(key).ok()
            });
        report.commands = commands.len();
        report.bytes = self.kernel.apply(&commands)?;
        report.draining = self.draining.count();
        report.addresses +=
            self.set_addresses(c.interface, c.bound.difference(&wanted_addresses), false)?;
        self.programmed = c.programmed;
        self.address_refs = c.address_refs;
        Ok(report)
    }

    /// Whether the kernel holds exactly the virtual servers and addresses wanted.
    pub fn matches(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<bool, BackendError> {
        let c = self.read_and_want(state, config, &config.ipvs_settings())?;
        let have = c.have.iter().map(|(k, v)| (*k, v)).collect();
        let wanted_addresses: BTreeSet<IpAddr> = c.address_refs.keys().copied().collect();
        // Real servers draining (at weight 0, no longer wanted) are as they
        // should be until a full sync finds them idle.
        let commands = Draining::default().rewrite(
            diff(&have, &by_key(c.programmed.values())),
            &have,
            &mut |_| None,
        );
        Ok(commands.is_empty() && wanted_addresses == c.bound)
    }

    /// Recomputes only the Services `keys` and sends only what changed for them.
    pub fn partial(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        keys: &[ServiceKey],
    ) -> Result<IpvsReport, BackendError> {
        let settings = config.ipvs_settings();
        let updates: Vec<(ServiceKey, Option<Programmed>)> = keys
            .iter()
            .map(|key| {
                let new = state
                    .services
                    .get(key)
                    .map(|svc| Programmed::desired(state, svc, config, &settings));
                (key.clone(), new)
            })
            .collect();
        let (mut to_bind, mut to_unbind) = (Vec::new(), Vec::new());
        for (key, new) in &updates {
            let old = self.programmed.get(key);
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
            Some(self.kernel.ensure_interface()?)
        };
        let mut report = IpvsReport::default();
        if let Some(i) = interface {
            report.addresses += self.set_addresses(i, to_bind.iter(), true)?;
        }
        let have = by_key(keys.iter().filter_map(|k| self.programmed.get(k)));
        let want = by_key(updates.iter().filter_map(|(_, new)| new.as_ref()));
        // Connections are not counted here: a real server that leaves drains
        // until a full sync finds it idle.
        let commands = self
            .draining
            .rewrite(diff(&have, &want), &have, &mut |_| None);
        report.commands = commands.len();
        report.bytes = self.kernel.apply(&commands)?;
        report.draining = self.draining.count();
        if let Some(i) = interface {
            report.addresses += self.set_addresses(i, to_unbind.iter(), false)?;
        }
        for (key, new) in updates {
            match new {
                Some(a) => self.programmed.insert(key, a),
                None => self.programmed.remove(&key),
            };
        }
        Ok(report)
    }
}

impl<K: IpvsKernel> IpvsDataplane<K> {
    /// Puts each address on `interface` (`present`) or takes it off; returns
    /// how many.
    fn set_addresses<'a>(
        &mut self,
        interface: u32,
        addrs: impl Iterator<Item = &'a IpAddr>,
        present: bool,
    ) -> Result<usize, RouteError> {
        let mut n = 0;
        for a in addrs {
            if present {
                self.kernel.add_address(interface, *a)?;
            } else {
                self.kernel.delete_address(interface, *a)?;
            }
            n += 1;
        }
        Ok(n)
    }

    /// What kube-proxy's IPVS mode sets, per network namespace: conntrack
    /// entries for IPVS connections (so that nftables can masquerade them), new
    /// connections on a reused port scheduled afresh, connections to removed
    /// real servers and stale persistence templates expired, forwarding on;
    /// strict ARP when asked.
    fn set_sysctls(&mut self, settings: &IpvsSettings) {
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
            if let Err(e) = self.kernel.set_sysctl(key, value) {
                tracing::warn!("could not set {} = {value}: {e}", key.replace('/', "."));
            }
        }
        self.set_timeouts(settings.timeouts);
    }

    /// The IPVS timeouts asked for (`--ipvs-tcp-timeout` …), set when the
    /// kernel holds others, at start and on each full sync after, as the
    /// sysctls are. As kube-proxy, a kernel that refuses them is said, and
    /// the Services are served all the same.
    fn set_timeouts(&mut self, want: IpvsTimeouts) {
        if !want.any() {
            return;
        }
        let held = self.kernel.timeouts().map(|have| want.held_by(&have));
        if matches!(held, Ok(true)) {
            return;
        }
        match self.kernel.set_timeouts(want) {
            Ok(()) => tracing::info!(
                "set IPVS timeouts (0: the kernel's kept): tcp {} s, tcpfin {} s, udp {} s",
                want.tcp,
                want.tcp_fin,
                want.udp
            ),
            Err(e) => tracing::error!("could not set the IPVS timeouts: {e}"),
        }
    }
}

impl<K: IpvsKernel> Dataplane for IpvsDataplane<K> {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn full_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<Written, SyncError> {
        self.full(state, config)
            .map(written)
            .map_err(|e| SyncError::new("ipvs", e))
    }

    fn partial_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        changed: &[ServiceKey],
    ) -> Result<Written, SyncError> {
        self.partial(state, config, changed)
            .map(written)
            .map_err(|e| SyncError::new("ipvs", e))
    }

    fn verify(&mut self, state: &ClusterState, config: &NodeConfig) -> Result<bool, SyncError> {
        self.matches(state, config)
            .map_err(|e| SyncError::new("ipvs", e))
    }
}

/// The sync log's IPVS counts (`ipvs_commands=…`).
fn written(r: IpvsReport) -> Written {
    Written {
        committed: Default::default(),
        counts: vec![
            ("commands", r.commands),
            ("bytes", r.bytes),
            ("addresses", r.addresses),
            ("draining", r.draining),
        ],
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
