//! Generic netlink: the family header, and resolving a family's name to the
//! message type the kernel gave it. Asking for a family the kernel does not have
//! makes it try to load the module that provides it (`net-pf-16-proto-16-family-*`).

use super::attr::{AttrWriter, Attrs, ParseError, Payload};
use super::message::{exchange, finish_msg, put_nlmsghdr, Refusal, NLM_F_ACK, NLM_F_REQUEST};
use netlink_sys::{protocols::NETLINK_GENERIC, Socket};
use std::io;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// sizeof(struct genlmsghdr)
pub const GENL_HDRLEN: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum GenlError {
    #[error("netlink: {0}")]
    Io(#[from] io::Error),
    #[error("reading the kernel's answer: {0}")]
    Parse(#[from] ParseError),
    #[error("{source}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        source: io::Error,
        detail: Option<String>,
    },
}

impl From<Refusal> for GenlError {
    fn from(r: Refusal) -> Self {
        GenlError::Refused {
            source: r.source,
            detail: r.detail,
        }
    }
}

impl GenlError {
    /// The errno the kernel answered with, if it refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            GenlError::Refused { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Starts a generic netlink message: the netlink header and `genlmsghdr`.
/// Attributes follow; `finish_msg` closes it.
pub fn put_genl_header(
    buf: &mut Vec<u8>,
    family: u16,
    flags: u16,
    seq: u32,
    cmd: u8,
    version: u8,
) -> usize {
    let at = put_nlmsghdr(buf, family, flags, seq);
    buf.extend_from_slice(&[cmd, version, 0, 0]);
    at
}

/// A generic netlink socket talking to one family.
pub struct GenlSocket {
    pub sock: Socket,
    pub family: u16,
}

impl GenlSocket {
    /// Opens a socket for the family `name`; `None` when this kernel has no such
    /// family (and could not load it).
    pub fn open(name: &str) -> Result<Option<GenlSocket>, GenlError> {
        let mut sock = Socket::new(NETLINK_GENERIC)?;
        sock.bind_auto()?;
        // Errors carry the kernel's explanation; acks echo only the header.
        sock.set_ext_ack(true)?;
        sock.set_cap_ack(true)?;
        let mut req = Vec::new();
        let at = put_genl_header(
            &mut req,
            GENL_ID_CTRL,
            NLM_F_REQUEST | NLM_F_ACK,
            1,
            CTRL_CMD_GETFAMILY,
            1,
        );
        let mut attrs = AttrWriter::over(req);
        attrs.put_str(CTRL_ATTR_FAMILY_NAME, name);
        let mut req = attrs.into_bytes();
        finish_msg(&mut req, at);
        let mut family = None;
        let mut rx = Vec::with_capacity(8192);
        let result = exchange::<GenlError>(&sock, &mut rx, &req, |msg| {
            for a in Attrs::new(msg.payload.get(GENL_HDRLEN..).unwrap_or_default()) {
                let (kind, p) = a?;
                if kind == CTRL_ATTR_FAMILY_ID {
                    family = Some(Payload::new("genl family", kind, p).u16_host()?);
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => Ok(family.map(|family| GenlSocket { sock, family })),
            Err(e) if e.errno() == Some(rustix::io::Errno::NOENT.raw_os_error()) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
