//! rtnetlink, for the one thing kube-nft needs from it: this node's addresses
//! (which `--nodeport-addresses` CIDRs select from).

use super::attr::{ip_from_bytes, Attrs, ParseError};
use super::message::{exchange, finish_msg, put_nlmsghdr, Refusal, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use std::io;
use std::net::IpAddr;

const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// sizeof(struct ifaddrmsg)
const IFADDRMSG_LEN: usize = 8;

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

/// Every address on every interface of the current network namespace.
pub fn local_addresses() -> Result<Vec<IpAddr>, RouteError> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    let mut req = Vec::new();
    let at = put_nlmsghdr(&mut req, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1);
    req.extend_from_slice(&[0u8; IFADDRMSG_LEN]); // AF_UNSPEC: both families
    finish_msg(&mut req, at);
    let mut rx = Vec::with_capacity(64 << 10);
    let mut out = Vec::new();
    exchange(&sock, &mut rx, &req, |msg| {
        if msg.kind != RTM_NEWADDR || msg.payload.len() < IFADDRMSG_LEN {
            return Ok::<(), RouteError>(());
        }
        let (mut address, mut local) = (None, None);
        for a in Attrs::new(&msg.payload[IFADDRMSG_LEN..]) {
            let (k, p) = a?;
            let ip = ip_from_bytes(p);
            match k {
                IFA_ADDRESS => address = ip,
                IFA_LOCAL => local = ip,
                _ => {}
            }
        }
        // On point-to-point links IFA_ADDRESS is the peer; IFA_LOCAL is ours.
        out.extend(local.or(address));
        Ok(())
    })?;
    out.sort();
    out.dedup();
    Ok(out)
}
