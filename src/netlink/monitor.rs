//! nf_tables change notifications: tells when a transaction committed by another
//! process touched one of our tables, so drift is repaired within a sync period's
//! fraction rather than at the next periodic resync.

use super::attr::{Attrs, Payload};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use std::io;
use std::net::IpAddr;

/// The nf_tables multicast group.
const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWGEN: u16 = 15;
/// DELTABLE, DELCHAIN, DELRULE, DELSET, DELSETELEM, DELOBJ, DELFLOWTABLE: the
/// kernel notifies a flush or a destroy as these too.
const DELETIONS: [u16; 7] = [2, 5, 8, 11, 14, 20, 24];
const NFTA_GEN_PROC_PID: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
const ENOBUFS: i32 = 105;

pub struct Monitor {
    sock: Socket,
}

/// What the monitor saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Another process committed a transaction that touched our table.
    Foreign { pid: u32 },
    /// Notifications were lost (the socket overflowed, e.g. during our own large
    /// sync): what happened is unknown, so treat it as drift.
    Lost,
}

impl Monitor {
    /// Subscribes in the current network namespace.
    pub fn open() -> io::Result<Monitor> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind(&SocketAddr::new(0, 0))?;
        sock.add_membership(NFNLGRP_NFTABLES)?;
        rustix::net::sockopt::set_socket_recv_buffer_size_force(&sock, 8 << 20)
            .map_err(io::Error::from)?;
        Ok(Monitor { sock })
    }

    /// Blocks until a transaction of a process other than `own_pid` touches a table
    /// whose name `watched` accepts (in any family).
    pub fn next_foreign_change(
        &mut self,
        watched: impl Fn(&str) -> bool,
        own_pid: u32,
    ) -> io::Result<Change> {
        let mut touched = false;
        self.next_commit(Change::Lost, |kind, attrs| {
            if kind == NFT_MSG_NEWGEN {
                let pid = Attrs::new(attrs)
                    .flatten()
                    .find(|(k, _)| *k == NFTA_GEN_PROC_PID)
                    .and_then(|(k, p)| Payload::new("gen", k, p).u32().ok())
                    .unwrap_or(0);
                if touched && pid != own_pid {
                    return Some(Change::Foreign { pid });
                }
                touched = false;
            } else if Attrs::new(attrs).flatten().any(|(k, p)| {
                k == 1
                    && Payload::new("object", k, p)
                        .string()
                        .is_ok_and(|n| watched(&n))
            }) {
                touched = true;
            }
            None
        })
    }

    /// Blocks until a committed transaction, of any process, deleted an object
    /// whose notification holds `addr`: as its bytes (a set element's key or
    /// data), or as text in a name (kube-proxy flushes a removed endpoint's chain,
    /// `endpoint-…__10.0.0.7/80`; a deleted rule's notification names its chain
    /// but holds no expressions). That is when a removal reached the kernel,
    /// whatever else the writer committed before it. False if notifications
    /// were lost.
    pub fn next_commit_deleting(&mut self, addr: IpAddr) -> io::Result<bool> {
        let bytes = match addr {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let text = addr.to_string();
        let mut deleted = false;
        self.next_commit(false, |kind, attrs| {
            if kind == NFT_MSG_NEWGEN {
                if deleted {
                    return Some(true);
                }
            } else if DELETIONS.contains(&kind)
                && (attrs.windows(bytes.len()).any(|w| w == bytes)
                    || holds_address_text(attrs, text.as_bytes()))
            {
                deleted = true;
            }
            None
        })
    }

    /// Feeds every nf_tables notification (its type, and its attributes after the
    /// nfgenmsg) to `seen` until it returns an answer. A socket that overflowed
    /// answers `lost`: what happened is unknown.
    fn next_commit<T>(
        &mut self,
        lost: T,
        mut seen: impl FnMut(u16, &[u8]) -> Option<T>,
    ) -> io::Result<T> {
        loop {
            let (buf, _) = match self.sock.recv_from_full() {
                Ok(x) => x,
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => return Ok(lost),
                Err(e) => return Err(e),
            };
            let mut rest = buf.as_slice();
            while rest.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                if len < NLMSG_HDRLEN || len > rest.len() {
                    break;
                }
                let kind = u16::from_ne_bytes([rest[4], rest[5]]) & 0xff;
                // Skip the nfgenmsg; every object message names its table in attribute 1.
                let attrs = rest.get(NLMSG_HDRLEN + 4..len).unwrap_or_default();
                if let Some(change) = seen(kind, attrs) {
                    return Ok(change);
                }
                rest = &rest[super::attr::align4(len).min(rest.len())..];
            }
        }
    }
}

/// Whether `attrs` holds `text` (an address written out) as a whole: not as the
/// start or the end of a longer address (10.0.0.1 in 10.0.0.10 or 110.0.0.1).
fn holds_address_text(attrs: &[u8], text: &[u8]) -> bool {
    let part =
        |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_hexdigit() || *b == b'.' || *b == b':');
    attrs.windows(text.len()).enumerate().any(|(i, w)| {
        w == text
            && !part(i.checked_sub(1).and_then(|j| attrs.get(j)))
            && !part(attrs.get(i + text.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::holds_address_text;

    #[test]
    fn an_address_in_a_name_is_found_whole_only() {
        let name = b"endpoint-ABCD1234-ns/web/tcp/http__10.0.0.10/80";
        assert!(holds_address_text(name, b"10.0.0.10"));
        assert!(!holds_address_text(name, b"10.0.0.1"));
        assert!(!holds_address_text(name, b"0.0.0.10"));
    }
}
