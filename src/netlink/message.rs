//! Netlink message framing shared by every protocol kube-nft speaks (nf_tables,
//! conntrack, rtnetlink): headers, splitting a datagram into messages, error
//! and extended-ack decoding, and the request/dump exchange.

use super::attr::{Attrs, ParseError, Payload};
use netlink_sys::Socket;
use std::io;

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
/// Set on an error message that carries extended-ack TLVs after the request header.
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;

pub struct NlMsg<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// Starts a message: its header, with the length filled in by `finish_msg`.
pub fn put_nlmsghdr(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    at
}

pub fn finish_msg(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
}

pub fn split_messages(buf: &[u8]) -> Result<Vec<NlMsg<'_>>, ParseError> {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(ParseError::Truncated);
        }
        out.push(NlMsg {
            kind: u16::from_ne_bytes([rest[4], rest[5]]),
            flags: u16::from_ne_bytes([rest[6], rest[7]]),
            seq: u32::from_ne_bytes(rest[8..12].try_into().unwrap()),
            payload: &rest[NLMSG_HDRLEN..len],
        });
        rest = &rest[super::attr::align4(len).min(rest.len())..];
    }
    Ok(out)
}

/// An NLMSG_ERROR payload: the errno (0 for an ack) and the extended-ack message.
pub fn parse_error(msg: &NlMsg) -> (i32, Option<String>) {
    const EPROTO: i32 = 71;
    let p = msg.payload;
    if p.len() < 4 {
        return (-EPROTO, None);
    }
    let errno = i32::from_ne_bytes(p[0..4].try_into().unwrap());
    let mut detail = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 && p.len() >= 4 + NLMSG_HDRLEN {
        // With NETLINK_CAP_ACK only the request's header is echoed; TLVs follow it.
        for (k, v) in Attrs::new(&p[4 + NLMSG_HDRLEN..]).flatten() {
            if k == NLMSGERR_ATTR_MSG {
                detail = Payload::new("extack", k, v).string().ok();
            }
        }
    }
    (errno, detail)
}

/// A refused request: the errno and the kernel's extended-ack text.
#[derive(Debug)]
pub struct Refusal {
    pub source: io::Error,
    pub detail: Option<String>,
}

/// Sends one request (a dump, or a single message asking for an ack) and hands
/// each answer's payload to `each` until the dump ends or the ack arrives.
pub fn exchange<E: From<io::Error> + From<ParseError> + From<Refusal>>(
    sock: &Socket,
    rx: &mut Vec<u8>,
    request: &[u8],
    mut each: impl FnMut(&NlMsg) -> Result<(), E>,
) -> Result<(), E> {
    sock.send(request, 0)?;
    loop {
        rx.clear();
        sock.recv(rx, 0)?;
        for msg in split_messages(rx)? {
            match msg.kind {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let (errno, detail) = parse_error(&msg);
                    if errno == 0 {
                        return Ok(());
                    }
                    return Err(Refusal {
                        source: io::Error::from_raw_os_error(-errno),
                        detail,
                    }
                    .into());
                }
                _ => each(&msg)?,
            }
        }
    }
}
