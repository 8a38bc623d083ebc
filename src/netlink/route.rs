//! rtnetlink, for what kube-nft needs from it: this node's addresses (which
//! `--nodeport-addresses` CIDRs select from), and for the IPVS backend a dummy
//! interface holding the Service addresses.

use super::attr::{ip_from_bytes, AttrWriter, Attrs, ParseError};
use super::message::{
    exchange, finish_msg, put_nlmsghdr, Refusal, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use std::io;
use std::net::IpAddr;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// No duplicate address detection: a Service address is ours at once.
const IFA_F_NODAD: u8 = 0x02;
/// sizeof(struct ifaddrmsg)
const IFADDRMSG_LEN: usize = 8;
/// sizeof(struct ifinfomsg)
const IFINFOMSG_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("rtnetlink: {0}")]
    Io(#[from] io::Error),
    #[error("rtnetlink answer: {0}")]
    Parse(#[from] ParseError),
}

impl From<Refusal> for RouteError {
    fn from(r: Refusal) -> Self {
        RouteError::Io(r.source)
    }
}

fn socket() -> Result<Socket, RouteError> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    Ok(sock)
}

/// Every address on every interface of the current network namespace.
pub fn local_addresses() -> Result<Vec<IpAddr>, RouteError> {
    addresses(None)
}

/// The addresses of one interface (`Some(index)`), or of all of them.
pub fn addresses(interface: Option<u32>) -> Result<Vec<IpAddr>, RouteError> {
    let sock = socket()?;
    let mut req = Vec::new();
    let at = put_nlmsghdr(&mut req, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1);
    req.extend_from_slice(&[0u8; IFADDRMSG_LEN]); // AF_UNSPEC: both families
    finish_msg(&mut req, at);
    let mut rx = Vec::with_capacity(64 << 10);
    let mut out = Vec::new();
    exchange(&sock, &mut rx, &req, |msg| {
        if msg.kind != RTM_NEWADDR {
            return Ok::<(), RouteError>(());
        }
        if let Some((index, addr)) = decode_address(msg.payload)? {
            if interface.is_none_or(|i| i == index) {
                out.push(addr);
            }
        }
        Ok(())
    })?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// An RTM_NEWADDR body: the interface's index and the address, if it has one.
pub fn decode_address(payload: &[u8]) -> Result<Option<(u32, IpAddr)>, ParseError> {
    let Some(index) = payload.get(4..8) else {
        return Ok(None);
    };
    let index = u32::from_ne_bytes(index.try_into().expect("four bytes"));
    let (mut address, mut local) = (None, None);
    for a in Attrs::new(payload.get(IFADDRMSG_LEN..).unwrap_or_default()) {
        let (k, p) = a?;
        let ip = ip_from_bytes(p);
        match k {
            IFA_ADDRESS => address = ip,
            IFA_LOCAL => local = ip,
            _ => {}
        }
    }
    // On point-to-point links IFA_ADDRESS is the peer; IFA_LOCAL is ours.
    Ok(local.or(address).map(|a| (index, a)))
}

/// Sends one request and waits for its acknowledgement.
fn request(kind: u16, flags: u16, header: &[u8], attrs: AttrWriter) -> Result<(), RouteError> {
    let sock = socket()?;
    let mut req = Vec::new();
    let at = put_nlmsghdr(&mut req, kind, NLM_F_REQUEST | NLM_F_ACK | flags, 1);
    req.extend_from_slice(header);
    req.extend_from_slice(&attrs.into_bytes());
    finish_msg(&mut req, at);
    let mut rx = Vec::with_capacity(8192);
    exchange(&sock, &mut rx, &req, |_| Ok::<(), RouteError>(()))
}

/// The index of the interface `name`, if there is one.
pub fn link_index(name: &str) -> Result<Option<u32>, RouteError> {
    let sock = socket()?;
    let mut req = Vec::new();
    // With an ack after the answer, `exchange` knows when it is over.
    let at = put_nlmsghdr(&mut req, RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK, 1);
    req.extend_from_slice(&[0u8; IFINFOMSG_LEN]);
    let mut attrs = AttrWriter::over(req);
    attrs.put_str(IFLA_IFNAME, name);
    let mut req = attrs.into_bytes();
    finish_msg(&mut req, at);
    let mut rx = Vec::with_capacity(8192);
    let mut index = None;
    let result = exchange(&sock, &mut rx, &req, |msg| {
        if msg.kind == RTM_NEWLINK && msg.payload.len() >= IFINFOMSG_LEN {
            index = Some(i32::from_ne_bytes(msg.payload[4..8].try_into().unwrap()) as u32);
        }
        Ok::<(), RouteError>(())
    });
    match result {
        Ok(()) => Ok(index),
        Err(RouteError::Io(e))
            if e.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The interfaces of the current namespace: name and whether it is loopback.
pub fn links() -> Result<Vec<(String, bool)>, RouteError> {
    const IFF_LOOPBACK: u32 = 0x8;
    let sock = socket()?;
    let mut req = Vec::new();
    let at = put_nlmsghdr(&mut req, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1);
    req.extend_from_slice(&[0u8; IFINFOMSG_LEN]);
    finish_msg(&mut req, at);
    let mut rx = Vec::with_capacity(64 << 10);
    let mut out = Vec::new();
    exchange(&sock, &mut rx, &req, |msg| {
        if msg.kind != RTM_NEWLINK || msg.payload.len() < IFINFOMSG_LEN {
            return Ok::<(), RouteError>(());
        }
        let flags = u32::from_ne_bytes(msg.payload[8..12].try_into().expect("four bytes"));
        for a in Attrs::new(&msg.payload[IFINFOMSG_LEN..]) {
            let (k, p) = a?;
            if k == IFLA_IFNAME {
                let name = super::attr::Payload::new("link", k, p).string()?;
                out.push((name, flags & IFF_LOOPBACK != 0));
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// Calls `changed` whenever an interface of the current namespace is added,
/// removed or changed, from a thread of its own, until it returns false.
pub fn watch_links(mut changed: impl FnMut() -> bool + Send + 'static) -> Result<(), RouteError> {
    const RTMGRP_LINK: u32 = 0x1;
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind(&netlink_sys::SocketAddr::new(0, RTMGRP_LINK))?;
    std::thread::Builder::new()
        .name("links".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                // An overrun (ENOBUFS) still means something changed.
                let _ = sock.recv(&mut &mut buf[..], 0);
                if !changed() {
                    return;
                }
            }
        })?;
    Ok(())
}

/// Creates a dummy interface, left down: its addresses are local all the same.
pub fn add_dummy(name: &str) -> Result<(), RouteError> {
    let mut attrs = AttrWriter::new();
    attrs.put_str(IFLA_IFNAME, name);
    attrs.nest(IFLA_LINKINFO, |w| w.put_str(IFLA_INFO_KIND, "dummy"));
    request(
        RTM_NEWLINK,
        NLM_F_CREATE | NLM_F_EXCL,
        &[0u8; IFINFOMSG_LEN],
        attrs,
    )
}

pub fn delete_link(index: u32) -> Result<(), RouteError> {
    let mut header = [0u8; IFINFOMSG_LEN];
    header[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    request(RTM_DELLINK, 0, &header, AttrWriter::new())
}

fn address_request(kind: u16, flags: u16, interface: u32, addr: IpAddr) -> Result<(), RouteError> {
    let (family, prefix, bytes): (u8, u8, Vec<u8>) = match addr {
        IpAddr::V4(a) => (2, 32, a.octets().to_vec()),
        IpAddr::V6(a) => (10, 128, a.octets().to_vec()),
    };
    let mut header = vec![family, prefix, IFA_F_NODAD, 0];
    header.extend_from_slice(&interface.to_ne_bytes());
    let mut attrs = AttrWriter::new();
    attrs.put(IFA_LOCAL, &bytes);
    attrs.put(IFA_ADDRESS, &bytes);
    request(kind, flags, &header, attrs)
}

/// Adds `addr` (a /32 or /128) to the interface; an address it has is no error.
pub fn add_address(interface: u32, addr: IpAddr) -> Result<(), RouteError> {
    address_request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, interface, addr).or_else(|e| match e {
        RouteError::Io(e) if e.raw_os_error() == Some(rustix::io::Errno::EXIST.raw_os_error()) => {
            Ok(())
        }
        e => Err(e),
    })
}

pub fn delete_address(interface: u32, addr: IpAddr) -> Result<(), RouteError> {
    address_request(RTM_DELADDR, 0, interface, addr)
}
