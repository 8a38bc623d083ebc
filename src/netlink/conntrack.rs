//! ctnetlink: listing connection-tracking entries and deleting them. kube-nft
//! uses it to forget UDP flows to endpoints that went away (UDP has no close, so
//! without this a client keeps sending to a dead endpoint until the entry expires).

use super::attr::{ip_from_bytes, AttrWriter, Attrs, ParseError};
use super::batch::put_header;
use super::message::{exchange, finish_msg, Refusal, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};
use std::io;
use std::net::IpAddr;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const IPS_SEEN_REPLY: u32 = 1 << 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const AF_UNSPEC: u8 = 0;

/// One direction of a tracked connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// A tracked connection: as the client sent it, and as the reply comes back (after
/// DNAT the reply's source is the endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub original: Tuple,
    pub reply: Tuple,
    /// A packet has come back in the reply direction (IPS_SEEN_REPLY).
    pub replied: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("ctnetlink: {0}")]
    Io(#[from] io::Error),
    #[error("ctnetlink answer: {0}")]
    Parse(#[from] ParseError),
    #[error("the kernel refused: {}", .0.source)]
    Refused(Refusal),
}

impl From<Refusal> for ConntrackError {
    fn from(r: Refusal) -> Self {
        ConntrackError::Refused(r)
    }
}

pub struct ConntrackSocket {
    sock: Socket,
    rx: Vec<u8>,
}

fn msg_type(kind: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | kind
}

fn parse_tuple(buf: &[u8]) -> Result<Option<Tuple>, ParseError> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        match k {
            CTA_TUPLE_IP => {
                for a in Attrs::new(p) {
                    let (k, p) = a?;
                    let Some(ip) = ip_from_bytes(p) else {
                        continue;
                    };
                    match k {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(ip),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(ip),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for a in Attrs::new(p) {
                    let (k, p) = a?;
                    match (k, p.len()) {
                        (CTA_PROTO_NUM, 1) => proto = Some(p[0]),
                        (CTA_PROTO_SRC_PORT, 2) => sport = u16::from_be_bytes([p[0], p[1]]),
                        (CTA_PROTO_DST_PORT, 2) => dport = u16::from_be_bytes([p[0], p[1]]),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(match (src, dst, proto) {
        (Some(src), Some(dst), Some(proto)) => Some(Tuple {
            src,
            dst,
            proto,
            sport,
            dport,
        }),
        _ => None,
    })
}

/// A conntrack message's body (nfgenmsg, then attributes): the flow, if both
/// its tuples are complete.
pub fn decode_flow(payload: &[u8]) -> Result<Option<Flow>, ParseError> {
    let Some(attrs) = payload.get(4..) else {
        return Ok(None);
    };
    let (mut original, mut reply, mut status) = (None, None, 0);
    for a in Attrs::new(attrs) {
        let (k, p) = a?;
        match k {
            CTA_TUPLE_ORIG => original = parse_tuple(p)?,
            CTA_TUPLE_REPLY => reply = parse_tuple(p)?,
            CTA_STATUS if p.len() == 4 => status = u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
            _ => {}
        }
    }
    Ok(match (original, reply) {
        (Some(original), Some(reply)) => Some(Flow {
            original,
            reply,
            replied: status & IPS_SEEN_REPLY != 0,
        }),
        _ => None,
    })
}

fn write_tuple(w: &mut AttrWriter, kind: u16, t: &Tuple) {
    w.nest(kind, |w| {
        w.nest(CTA_TUPLE_IP, |w| match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                w.put(CTA_IP_V4_SRC, &s.octets());
                w.put(CTA_IP_V4_DST, &d.octets());
            }
            (s, d) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                    IpAddr::V6(a) => a.octets(),
                };
                w.put(CTA_IP_V6_SRC, &v6(s));
                w.put(CTA_IP_V6_DST, &v6(d));
            }
        });
        w.nest(CTA_TUPLE_PROTO, |w| {
            w.put(CTA_PROTO_NUM, &[t.proto]);
            w.put(CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            w.put(CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
        });
    });
}

impl ConntrackSocket {
    pub fn open() -> io::Result<ConntrackSocket> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        Ok(ConntrackSocket {
            sock,
            rx: Vec::with_capacity(256 << 10),
        })
    }

    /// The tracked flows, of both families, that `keep` keeps.
    pub fn flows(&mut self, keep: impl Fn(&Flow) -> bool) -> Result<Vec<Flow>, ConntrackError> {
        let mut req = Vec::new();
        let at = put_header(
            &mut req,
            msg_type(IPCTNL_MSG_CT_GET),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            AF_UNSPEC,
            0,
        );
        finish_msg(&mut req, at);
        let mut out = Vec::new();
        exchange(&self.sock, &mut self.rx, &req, |msg| {
            if let Some(flow) = decode_flow(msg.payload)? {
                if keep(&flow) {
                    out.push(flow);
                }
            }
            Ok::<(), ConntrackError>(())
        })?;
        Ok(out)
    }

    /// Deletes one flow; a flow that is already gone is not an error.
    pub fn delete(&mut self, flow: &Flow) -> Result<(), ConntrackError> {
        let family = match flow.original.src {
            IpAddr::V4(_) => 2,
            IpAddr::V6(_) => 10,
        };
        let mut req = Vec::new();
        let at = put_header(
            &mut req,
            msg_type(IPCTNL_MSG_CT_DELETE),
            NLM_F_REQUEST | NLM_F_ACK,
            2,
            family,
            0,
        );
        let mut w = AttrWriter::over(req);
        write_tuple(&mut w, CTA_TUPLE_ORIG, &flow.original);
        let mut req = w.into_bytes();
        finish_msg(&mut req, at);
        match exchange(&self.sock, &mut self.rx, &req, |_| {
            Ok::<(), ConntrackError>(())
        }) {
            Err(ConntrackError::Refused(r)) if r.source.raw_os_error() == Some(2) => Ok(()),
            other => other,
        }
    }
}
