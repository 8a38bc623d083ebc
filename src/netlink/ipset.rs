//! nfnetlink's ipset subsystem, as far as kube-nft needs it: whether the kernel
//! has ipset, and destroying a set by name. kube-nft writes no ipset; it removes
//! those kube-proxy's IPVS mode left (`kube-nft cleanup --kube-proxy`).

use super::attr::{AttrWriter, ParseError};
use super::batch::put_header;
use super::message::{exchange, finish_msg, Refusal, NLM_F_ACK, NLM_F_REQUEST};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use std::io;

const NFNL_SUBSYS_IPSET: u16 = 6;
const IPSET_CMD_PROTOCOL: u16 = 1;
const IPSET_CMD_DESTROY: u16 = 3;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
/// Every command carries the protocol version; the kernel takes any from its
/// minimum (6, which every kernel with ipset accepts) for these two.
const IPSET_PROTOCOL_MIN: u8 = 6;
/// ipset's own errno for a set that a rule still references.
const IPSET_ERR_BUSY: i32 = 4100;
/// ipset's longest set name (IPSET_MAXNAMELEN less its NUL).
pub const MAX_NAME_LEN: usize = 31;
const AF_INET: u8 = 2;
const ENOENT: i32 = 2;
/// nfnetlink's answer for a subsystem the kernel does not have.
const EINVAL: i32 = 22;
/// Without it ipset treats a missing set as already destroyed (`ipset -exist`).
const NLM_F_EXCL: u16 = 0x200;

#[derive(Debug, thiserror::Error)]
pub enum IpsetError {
    #[error("ipset netlink: {0}")]
    Io(#[from] io::Error),
    #[error("ipset netlink answer: {0}")]
    Parse(#[from] ParseError),
    #[error("the kernel refused: {}", .0.source)]
    Refused(Refusal),
}

impl From<Refusal> for IpsetError {
    fn from(r: Refusal) -> Self {
        IpsetError::Refused(r)
    }
}

/// What became of one set asked to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroyed {
    Gone,
    NotThere,
    /// A rule (iptables, legacy or nft) still matches on it.
    InUse,
}

pub struct IpsetSocket {
    sock: Socket,
    rx: Vec<u8>,
}

fn request(cmd: u16, name: Option<&str>) -> Vec<u8> {
    let mut req = Vec::new();
    let at = put_header(
        &mut req,
        (NFNL_SUBSYS_IPSET << 8) | cmd,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL,
        1,
        AF_INET,
        0,
    );
    let mut w = AttrWriter::over(req);
    w.put(IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL_MIN]);
    if let Some(name) = name {
        w.put_str(IPSET_ATTR_SETNAME, name);
    }
    let mut req = w.into_bytes();
    finish_msg(&mut req, at);
    req
}

fn errno(e: &IpsetError) -> Option<i32> {
    match e {
        IpsetError::Refused(r) => r.source.raw_os_error(),
        _ => None,
    }
}

impl IpsetSocket {
    /// A socket to the ipset subsystem, or `None` if this kernel has no ipset
    /// (then it holds no set to remove either).
    pub fn open() -> Result<Option<IpsetSocket>, IpsetError> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        let mut s = IpsetSocket {
            sock,
            rx: Vec::with_capacity(16 << 10),
        };
        let asked = request(IPSET_CMD_PROTOCOL, None);
        match exchange(&s.sock, &mut s.rx, &asked, |_| Ok::<(), IpsetError>(())) {
            Ok(()) => Ok(Some(s)),
            Err(e) if errno(&e) == Some(EINVAL) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Destroys one set by name. Never sent without a name: a destroy without
    /// one destroys every set no rule references.
    pub fn destroy(&mut self, name: &str) -> Result<Destroyed, IpsetError> {
        assert!(!name.is_empty() && name.len() <= MAX_NAME_LEN, "{name:?}");
        let asked = request(IPSET_CMD_DESTROY, Some(name));
        match exchange(&self.sock, &mut self.rx, &asked, |_| {
            Ok::<(), IpsetError>(())
        }) {
            Ok(()) => Ok(Destroyed::Gone),
            Err(e) => match errno(&e) {
                Some(ENOENT) => Ok(Destroyed::NotThere),
                Some(IPSET_ERR_BUSY) => Ok(Destroyed::InUse),
                _ => Err(e),
            },
        }
    }
}
