//! nf_tables change notifications: tells when a transaction committed by another
//! process touched one of our tables, so drift is repaired within a sync period's
//! fraction rather than at the next periodic resync.

use super::attr::{Attrs, Payload};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use std::io;
use std::time::Instant;

/// The nf_tables multicast group.
const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWGEN: u16 = 15;
const NFTA_GEN_PROC_PID: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
const ENOBUFS: i32 = 105;

pub struct Monitor {
    sock: Socket,
}

/// What the monitor saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Another process committed a transaction that touched our table: `pid` as
    /// the initial pid namespace numbers it.
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

    /// Blocks until a transaction that `own` does not claim touches a table whose
    /// name `watched` accepts (in any family). `own` is asked the netlink port id
    /// of the socket that committed it (`nftables::committed_by_this_process`).
    pub fn next_foreign_change(
        &mut self,
        watched: impl Fn(&str) -> bool,
        own: impl Fn(u32) -> bool,
    ) -> io::Result<Change> {
        let mut touched = false;
        self.next_commit(Change::Lost, |kind, port, attrs| {
            if kind == NFT_MSG_NEWGEN {
                if touched && !own(port) {
                    let pid = Attrs::new(attrs)
                        .flatten()
                        .find(|(k, _)| *k == NFTA_GEN_PROC_PID)
                        .and_then(|(k, p)| Payload::new("gen", k, p).u32().ok())
                        .unwrap_or(0);
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

    /// Blocks until `holds` is true after a committed transaction of any
    /// process, and answers when that commit was notified. `holds` reads the
    /// kernel's state (lists the ruleset, say); if another commit was notified
    /// while it read, the answer is the moment that was found, so it is never
    /// early. None if notifications were lost.
    pub fn next_commit_after_which(
        &mut self,
        mut holds: impl FnMut() -> bool,
    ) -> io::Result<Option<Instant>> {
        let seen = self.next_commit(None, |kind, _, _| {
            if kind != NFT_MSG_NEWGEN {
                return None;
            }
            let at = Instant::now();
            holds().then_some(Some(at))
        })?;
        let Some(mut at) = seen else { return Ok(None) };
        self.sock.set_non_blocking(true)?;
        let later = loop {
            match self.sock.recv_from_full() {
                Ok((buf, _)) if messages(&buf).any(|(k, _, _)| k == NFT_MSG_NEWGEN) => {
                    break Ok(true)
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(false),
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => break Ok(true),
                Err(e) => break Err(e),
            }
        };
        self.sock.set_non_blocking(false)?;
        if later? {
            at = Instant::now();
        }
        Ok(Some(at))
    }

    /// Feeds every nf_tables notification (its type, the committer's port id and
    /// its attributes after the nfgenmsg) to `seen` until it returns an answer. A
    /// socket that overflowed answers `lost`: what happened is unknown.
    fn next_commit<T>(
        &mut self,
        lost: T,
        mut seen: impl FnMut(u16, u32, &[u8]) -> Option<T>,
    ) -> io::Result<T> {
        loop {
            let (buf, _) = match self.sock.recv_from_full() {
                Ok(x) => x,
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => return Ok(lost),
                Err(e) => return Err(e),
            };
            for (kind, port, attrs) in messages(&buf) {
                if let Some(change) = seen(kind, port, attrs) {
                    return Ok(change);
                }
            }
        }
    }
}

/// The notifications of a datagram: each one's type, the port id of the socket
/// that committed it (the header's pid field), and its attributes after the
/// nfgenmsg (every object message names its table in attribute 1).
fn messages(mut rest: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32::from_ne_bytes(rest.get(0..4)?.try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let kind = u16::from_ne_bytes([rest[4], rest[5]]) & 0xff;
        let port = u32::from_ne_bytes(rest[12..16].try_into().unwrap());
        let attrs = rest.get(NLMSG_HDRLEN + 4..len).unwrap_or_default();
        rest = &rest[super::attr::align4(len).min(rest.len())..];
        Some((kind, port, attrs))
    })
}
