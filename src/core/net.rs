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

/// An IP address as Kubernetes reads one from a stored object
/// (`netutils.ParseIPSloppy`): IPv4 octets may carry leading zeros, read as
/// decimal (`010.001.002.003` is 10.1.2.3), which objects stored before the API
/// server's strict validation still hold; an IPv4-mapped IPv6 address is the
/// IPv4 address, as Go's `net.IP` treats it.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part
            .trim_start_matches('0')
            .parse::<u8>()
            .or_else(|e| {
                // All zeros trim to nothing: the octet is 0.
                if part.bytes().all(|b| b == b'0') {
                    Ok(0)
                } else {
                    Err(e)
                }
            })
            .ok()?;
    }
    parts.next().is_none().then(|| IpAddr::from(octets))
}

/// A CIDR as Kubernetes reads one (`netutils.ParseCIDRSloppy`), host bits
/// cleared: the address as `parse_ip_sloppy` reads it.
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    let addr = match s.parse::<IpNet>() {
        // An IPv4-mapped network stays IPv6 here, as Go keeps its 128-bit mask.
        Ok(net) => return Some(net.trunc()),
        Err(_) => parse_ip_sloppy(addr)?,
    };
    IpNet::new(addr, len).ok().map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_kubernetes_reads_stored_objects() {
        let ip = |s: &str| parse_ip_sloppy(s).map(|a| a.to_string());
        for (text, want) in [
            ("10.1.2.3", Some("10.1.2.3")),
            ("010.001.002.003", Some("10.1.2.3")),
            ("0.0.0.0", Some("0.0.0.0")),
            ("000.00.0.255", Some("0.0.0.255")),
            ("::ffff:10.1.2.3", Some("10.1.2.3")),
            ("fd00::1", Some("fd00::1")),
            ("10.1.2.256", None),
            ("10.1.2", None),
            ("10.1.2.3.4", None),
            ("10.1.2.-3", None),
            ("10.1..3", None),
            ("", None),
            ("1.2.3.4 ", None),
        ] {
            assert_eq!(ip(text).as_deref(), want, "{text:?}");
        }
        let net = |s: &str| parse_cidr_sloppy(s).map(|n| n.to_string());
        for (text, want) in [
            ("10.0.0.0/8", Some("10.0.0.0/8")),
            ("010.000.000.000/8", Some("10.0.0.0/8")),
            ("10.1.2.3/16", Some("10.1.0.0/16")),
            ("fd00::/64", Some("fd00::/64")),
            ("10.0.0.0/33", None),
            ("10.0.0.0", None),
            ("10.0.0.0/", None),
            ("10.0.0.0/+8", None),
        ] {
            assert_eq!(net(text).as_deref(), want, "{text:?}");
        }
    }
}
