//! The address families and transport protocols Services use: plain values
//! that every dataplane names in its own way (nftables' keywords and numbers are
//! given to them in `ruleset`).

use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Ip, Family::Ip6];

    pub fn of(addr: &IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }

    pub fn of_net(net: &IpNet) -> Family {
        Family::of(&net.addr())
    }
}

/// Transport protocols a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// The protocol of an IP protocol number, if a Service port can use it.
    pub fn from_number(n: u8) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.number() == n)
    }

    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
