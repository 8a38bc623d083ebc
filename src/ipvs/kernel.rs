//! The kernel as the IPVS dataplane sees it (`IpvsKernel`): the IPVS table,
//! the addresses of `kube-ipvs0`, and the sysctls IPVS mode needs. Implemented
//! by the IPVS socket in the current network namespace and, for unit tests, by
//! `fake::FakeIpvs`, as `nft::kernel::NftKernel` is for nftables.

use crate::core::node_config::IpvsTimeouts;
use crate::netlink::ipvs::{
    Command, IpvsError, IpvsSocket, RealServer, VirtualKey, VirtualService,
};
use crate::netlink::route::{self, RouteError};
use std::net::IpAddr;

/// The dummy interface holding every ClusterIP, external IP and load balancer
/// IP, so that the kernel delivers their traffic locally, where IPVS takes it.
pub const INTERFACE: &str = "kube-ipvs0";

/// Connections held on each real server of a virtual service, by its address
/// and port.
pub type Connections = std::collections::HashMap<(IpAddr, u16), u32>;

pub trait IpvsKernel {
    /// Every virtual service (firewall-mark ones left out).
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError>;
    /// The real servers of one virtual service, sorted.
    fn reals(&mut self, key: &VirtualKey) -> Result<Vec<RealServer>, IpvsError>;
    /// The connections IPVS holds on each real server of one virtual service,
    /// by address and port.
    fn connections(&mut self, key: &VirtualKey) -> Result<Connections, IpvsError>;
    /// Applies the commands in order and returns the bytes sent. IPVS has no
    /// transactions: after an error, some commands may have been applied.
    fn apply(&mut self, commands: &[Command]) -> Result<usize, IpvsError>;
    /// The index of `kube-ipvs0`, created (down, as kube-proxy leaves it) if missing.
    fn ensure_interface(&mut self) -> Result<u32, RouteError>;
    /// The addresses on one interface.
    fn addresses(&mut self, interface: u32) -> Result<Vec<IpAddr>, RouteError>;
    fn add_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError>;
    fn delete_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError>;
    /// Sets the sysctl at /proc/sys/`key` unless it already holds `value`.
    fn set_sysctl(&mut self, key: &str, value: &str) -> std::io::Result<()>;
    /// The namespace's IPVS timeouts.
    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsError>;
    /// Sets those of `t` that are not 0.
    fn set_timeouts(&mut self, t: IpvsTimeouts) -> Result<(), IpvsError>;
}

impl IpvsKernel for IpvsSocket {
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        IpvsSocket::services(self)
    }

    fn reals(&mut self, key: &VirtualKey) -> Result<Vec<RealServer>, IpvsError> {
        IpvsSocket::reals(self, key)
    }

    fn connections(&mut self, key: &VirtualKey) -> Result<Connections, IpvsError> {
        let dests = IpvsSocket::dests(self, key)?;
        Ok(dests
            .into_iter()
            .map(|(r, n)| ((r.addr, r.port), n))
            .collect())
    }

    fn apply(&mut self, commands: &[Command]) -> Result<usize, IpvsError> {
        IpvsSocket::apply(self, commands)
    }

    fn ensure_interface(&mut self) -> Result<u32, RouteError> {
        if let Some(i) = route::link_index(INTERFACE)? {
            return Ok(i);
        }
        route::add_dummy(INTERFACE)?;
        route::link_index(INTERFACE)?
            .ok_or_else(|| RouteError::Io(std::io::Error::other("created, then not found")))
    }

    fn addresses(&mut self, interface: u32) -> Result<Vec<IpAddr>, RouteError> {
        route::addresses(Some(interface))
    }

    fn add_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError> {
        route::add_address(interface, addr)
    }

    fn delete_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError> {
        route::delete_address(interface, addr)
    }

    fn set_sysctl(&mut self, key: &str, value: &str) -> std::io::Result<()> {
        let path = format!("/proc/sys/{key}");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
            return Ok(());
        }
        std::fs::write(&path, value)
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsError> {
        IpvsSocket::timeouts(self)
    }

    fn set_timeouts(&mut self, t: IpvsTimeouts) -> Result<(), IpvsError> {
        IpvsSocket::set_timeouts(self, t)
    }
}
