//! IPVS and `kube-ipvs0` in memory, for unit tests of the IPVS dataplane without
//! root or an IPVS kernel. It refuses what `ip_vs_ctl.c` and rtnetlink refuse,
//! with their errors:
//! - a virtual service added twice, or with a scheduler the kernel lacks;
//! - a real server added twice, or changed or deleted when it is not there;
//! - anything done to a virtual service that is not there;
//! - an address added twice, or deleted when it is not there.
//!
//! IPVS has no transactions, and neither has the fake: each command of a call
//! is tried in order, the first refusal is returned, and what went before it
//! stays applied. Clones share one kernel, as `nft::fake::FakeKernel`'s do.

use crate::core::node_config::IpvsTimeouts;
use crate::ipvs::kernel::{Connections, IpvsKernel};
use crate::netlink::genl::GenlError;
use crate::netlink::ipvs::{
    encoded_len, Command, IpvsError, RealServer, VirtualKey, VirtualService,
};
use crate::netlink::route::RouteError;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::rc::Rc;

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// The schedulers a stock kernel builds (`ip_vs_*.c`).
const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// The interface index the fake gives `kube-ipvs0`.
const INTERFACE_INDEX: u32 = 7;

/// A virtual service's real servers, by address and port.
type Reals = BTreeMap<(IpAddr, u16), RealServer>;

#[derive(Debug, Default)]
struct State {
    services: BTreeMap<VirtualKey, (VirtualService, Reals)>,
    interface: bool,
    addresses: BTreeSet<IpAddr>,
    sysctls: BTreeMap<String, String>,
    timeouts: IpvsTimeouts,
    /// Connections on real servers, as a test sets them.
    connections: BTreeMap<(VirtualKey, IpAddr, u16), u32>,
    /// How many times the timeouts were set.
    timeouts_set: usize,
    commands: usize,
}

#[derive(Debug, Clone, Default)]
pub struct FakeIpvs(Rc<RefCell<State>>);

impl FakeIpvs {
    pub fn new() -> Self {
        Self::default()
    }

    /// The commands applied so far (refused ones not counted).
    pub fn commands(&self) -> usize {
        self.0.borrow().commands
    }

    /// The addresses on `kube-ipvs0`.
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.0.borrow().addresses.clone()
    }

    /// Every virtual service with its real servers, as `ipvsadm -Ln` lists them.
    pub fn table(&self) -> BTreeMap<VirtualKey, (VirtualService, Vec<RealServer>)> {
        self.0
            .borrow()
            .services
            .iter()
            .map(|(k, (s, reals))| (*k, (s.clone(), reals.values().cloned().collect())))
            .collect()
    }

    pub fn sysctl(&self, key: &str) -> Option<String> {
        self.0.borrow().sysctls.get(key).cloned()
    }

    /// Says that a real server holds `n` connections (until said otherwise).
    pub fn set_connections(&self, key: VirtualKey, addr: IpAddr, port: u16, n: u32) {
        self.0.borrow_mut().connections.insert((key, addr, port), n);
    }

    /// The IPVS timeouts, and how many times they were set.
    pub fn timeouts(&self) -> (IpvsTimeouts, usize) {
        let state = self.0.borrow();
        (state.timeouts, state.timeouts_set)
    }

    /// Sets the timeouts behind the dataplane's back (`ipvsadm --set`).
    pub fn tamper_timeouts(&self, t: IpvsTimeouts) {
        self.0.borrow_mut().timeouts = t;
    }

    /// Applies `commands` behind the dataplane's back (someone else's tool, or drift).
    pub fn tamper(&self, commands: &[Command]) {
        self.clone().apply(commands).expect("the tamper applies");
    }

    /// Adds an address behind the dataplane's back.
    pub fn tamper_address(&self, addr: IpAddr) {
        let mut s = self.0.borrow_mut();
        s.interface = true;
        s.addresses.insert(addr);
    }
}

fn refused(command: &Command, errno: i32) -> IpvsError {
    IpvsError::Refused {
        command: command.to_string(),
        source: GenlError::Refused {
            source: io::Error::from_raw_os_error(errno),
            detail: None,
        },
    }
}

impl State {
    /// One command, as `ip_vs_ctl.c` would take it: `Err(errno)` if refused.
    fn apply(&mut self, command: &Command) -> Result<(), i32> {
        match command {
            Command::AddService(s) => {
                if self.services.contains_key(&s.key) {
                    return Err(EEXIST);
                }
                if !SCHEDULERS.contains(&s.scheduler.as_str()) {
                    return Err(ENOENT);
                }
                self.services.insert(s.key, (s.clone(), BTreeMap::new()));
            }
            Command::UpdateService(s) => {
                if !SCHEDULERS.contains(&s.scheduler.as_str()) {
                    return Err(ENOENT);
                }
                self.services.get_mut(&s.key).ok_or(ESRCH)?.0 = s.clone();
            }
            Command::DeleteService(k) => {
                self.services.remove(k).ok_or(ESRCH)?;
            }
            Command::AddReal(k, r) => {
                let reals = &mut self.services.get_mut(k).ok_or(ESRCH)?.1;
                if reals.contains_key(&(r.addr, r.port)) {
                    return Err(EEXIST);
                }
                reals.insert((r.addr, r.port), r.clone());
            }
            Command::UpdateReal(k, r) => {
                let reals = &mut self.services.get_mut(k).ok_or(ESRCH)?.1;
                *reals.get_mut(&(r.addr, r.port)).ok_or(ENOENT)? = r.clone();
            }
            Command::DeleteReal(k, r) => {
                let reals = &mut self.services.get_mut(k).ok_or(ESRCH)?.1;
                reals.remove(&(r.addr, r.port)).ok_or(ENOENT)?;
            }
        }
        self.commands += 1;
        Ok(())
    }

    fn interface(&self, index: u32) -> Result<(), RouteError> {
        if self.interface && index == INTERFACE_INDEX {
            Ok(())
        } else {
            Err(RouteError::Io(io::Error::from_raw_os_error(ENODEV)))
        }
    }
}

impl IpvsKernel for FakeIpvs {
    fn services(&mut self) -> Result<Vec<VirtualService>, IpvsError> {
        Ok(self
            .0
            .borrow()
            .services
            .values()
            .map(|(s, _)| s.clone())
            .collect())
    }

    fn reals(&mut self, key: &VirtualKey) -> Result<Vec<RealServer>, IpvsError> {
        // The kernel's dump of a missing service is empty, not an error.
        let state = self.0.borrow();
        let reals = state.services.get(key).map(|(_, reals)| reals.values());
        Ok(reals.into_iter().flatten().cloned().collect())
    }

    fn connections(&mut self, key: &VirtualKey) -> Result<Connections, IpvsError> {
        let state = self.0.borrow();
        let reals = state.services.get(key).map(|(_, reals)| reals.keys());
        Ok(reals
            .into_iter()
            .flatten()
            .map(|&(addr, port)| {
                let n = state.connections.get(&(*key, addr, port));
                ((addr, port), n.copied().unwrap_or(0))
            })
            .collect())
    }

    fn apply(&mut self, commands: &[Command]) -> Result<usize, IpvsError> {
        let mut state = self.0.borrow_mut();
        let mut first_refusal = None;
        for c in commands {
            if let Err(errno) = state.apply(c) {
                first_refusal.get_or_insert(refused(c, errno));
            }
        }
        match first_refusal {
            Some(e) => Err(e),
            None => Ok(encoded_len(commands)),
        }
    }

    fn ensure_interface(&mut self) -> Result<u32, RouteError> {
        self.0.borrow_mut().interface = true;
        Ok(INTERFACE_INDEX)
    }

    fn addresses(&mut self, interface: u32) -> Result<Vec<IpAddr>, RouteError> {
        let state = self.0.borrow();
        state.interface(interface)?;
        Ok(state.addresses.iter().copied().collect())
    }

    fn add_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError> {
        let mut state = self.0.borrow_mut();
        state.interface(interface)?;
        if !state.addresses.insert(addr) {
            return Err(RouteError::Io(io::Error::from_raw_os_error(EEXIST)));
        }
        Ok(())
    }

    fn delete_address(&mut self, interface: u32, addr: IpAddr) -> Result<(), RouteError> {
        let mut state = self.0.borrow_mut();
        state.interface(interface)?;
        if !state.addresses.remove(&addr) {
            return Err(RouteError::Io(io::Error::from_raw_os_error(EADDRNOTAVAIL)));
        }
        Ok(())
    }

    fn set_sysctl(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.0.borrow_mut().sysctls.insert(key.into(), value.into());
        Ok(())
    }

    fn timeouts(&mut self) -> Result<IpvsTimeouts, IpvsError> {
        Ok(self.0.borrow().timeouts)
    }

    /// As the kernel: a timeout at 0 keeps the value it had.
    fn set_timeouts(&mut self, t: IpvsTimeouts) -> Result<(), IpvsError> {
        let mut state = self.0.borrow_mut();
        let have = &mut state.timeouts;
        for (have, want) in [
            (&mut have.tcp, t.tcp),
            (&mut have.tcp_fin, t.tcp_fin),
            (&mut have.udp, t.udp),
        ] {
            if want != 0 {
                *have = want;
            }
        }
        state.timeouts_set += 1;
        Ok(())
    }
}
