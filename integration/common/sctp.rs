//! SCTP probes without an SCTP stack. The test kernels track and NAT SCTP
//! (`NF_CT_PROTO_SCTP`) but have no SCTP sockets, so clients send INIT chunks on
//! raw sockets and pods capture what reaches them on raw sockets. An INIT is what
//! opens an association, so it is the packet a Service's DNAT must rewrite.

use rustix::net::{ipproto, AddressFamily, RecvFlags, SendFlags, SocketType};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// CRC-32C (Castagnoli), SCTP's checksum (RFC 9260, appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// An SCTP packet holding one INIT chunk; `tag` is its initiate tag, which NAT
/// leaves alone, so it names the probe at the receiver.
pub fn init_packet(src_port: u16, dst_port: u16, tag: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes()); // verification tag: 0 in an INIT
    p.extend_from_slice(&0u32.to_be_bytes()); // checksum, filled below
    p.extend_from_slice(&[1, 0]); // chunk type INIT, flags
    p.extend_from_slice(&20u16.to_be_bytes()); // chunk length
    p.extend_from_slice(&tag.to_be_bytes());
    p.extend_from_slice(&65_536u32.to_be_bytes()); // advertised receiver window
    p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
    p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
    p.extend_from_slice(&tag.to_be_bytes()); // initial TSN
                                             // SCTP stores the CRC little-endian, unlike every other field.
    let sum = crc32c(&p);
    p[8..12].copy_from_slice(&sum.to_le_bytes());
    p
}

/// One SCTP packet as a pod received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub dst_port: u16,
    pub tag: u32,
    pub checksum_ok: bool,
}

fn parse(packet: &[u8]) -> Option<Arrival> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let ip = packet.get(..ihl)?;
    let sctp = packet.get(ihl..)?;
    if sctp.len() < 20 || sctp[12] != 1 {
        return None;
    }
    let mut zeroed = sctp.to_vec();
    zeroed[8..12].fill(0);
    let sum = u32::from_le_bytes(sctp[8..12].try_into().ok()?);
    Some(Arrival {
        src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        dst_port: u16::from_be_bytes([sctp[2], sctp[3]]),
        tag: u32::from_be_bytes(sctp[16..20].try_into().ok()?),
        checksum_ok: crc32c(&zeroed) == sum,
    })
}

fn raw_socket() -> std::io::Result<OwnedFd> {
    Ok(rustix::net::socket(
        AddressFamily::INET,
        SocketType::RAW,
        Some(ipproto::SCTP),
    )?)
}

/// A raw SCTP socket opened inside a namespace; it stays there for its lifetime.
pub struct Capture(OwnedFd);

impl Capture {
    pub fn open(ns: &str) -> Capture {
        let fd = kube_nft::testbed::netns::in_netns(ns, raw_socket)
            .unwrap()
            .expect("a raw SCTP socket");
        Capture(fd)
    }

    /// Every INIT that arrives until `quiet` passes without one.
    pub fn drain(&self, quiet: Duration) -> Vec<Arrival> {
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        rustix::net::sockopt::set_socket_timeout(
            &self.0,
            rustix::net::sockopt::Timeout::Recv,
            Some(quiet),
        )
        .unwrap();
        let start = Instant::now();
        while let Ok((n, _)) = rustix::net::recv(&self.0, &mut buf[..], RecvFlags::empty()) {
            got.extend(parse(&buf[..n]));
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "capture never quiet"
            );
        }
        got
    }
}

/// Sends one INIT from `ns` to `target` per tag, each from its own source port
/// (so each opens its own conntrack entry and meets the Service's choice anew).
pub fn send_inits(ns: &str, target: SocketAddrV4, tags: Vec<u32>) {
    kube_nft::testbed::netns::in_netns(ns, move || {
        let fd = raw_socket()?;
        for tag in tags {
            let src_port = 20_000 + (tag % 40_000) as u16;
            let packet = init_packet(src_port, target.port(), tag);
            // A raw socket of a protocol takes no port; the port is in the packet.
            let to = SocketAddrV4::new(*target.ip(), 0);
            rustix::net::sendto(&fd, &packet, SendFlags::empty(), &to)?;
        }
        std::io::Result::Ok(())
    })
    .unwrap()
    .expect("sending SCTP INITs");
}
