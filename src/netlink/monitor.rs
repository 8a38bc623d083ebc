//! nf_tables change notifications: tells when a transaction committed by another
//! process touched one of our tables, so drift is repaired within a sync period's
//! fraction rather than at the next periodic resync.

use super::attr::{Attrs, Payload};
use super::batch::NEWGEN;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The nf_tables multicast group.
const NFNLGRP_NFTABLES: u32 = 7;
// enum nft_gen_attributes
pub(crate) const NFTA_GEN_ID: u16 = 1;
const NFTA_GEN_PROC_PID: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
const ENOBUFS: i32 = 105;

pub struct Monitor {
    shared: Arc<Shared>,
}

/// What a monitor shares with this process's commits (`away_for`).
struct Shared {
    sock: Socket,
    /// The network namespace it listens in (`netns_id`).
    netns: u64,
    /// Set when another process may have committed while it was away.
    missed: AtomicBool,
}

/// The monitors that leave the nf_tables group while this process commits in
/// their namespace (`Monitor::away_during_own_commits`).
static AWAY_DURING_OWN_COMMITS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// How often a monitor that goes away checks whether it missed something.
const MISSED_CHECK: Duration = Duration::from_secs(1);

/// The network namespace of the calling thread, as its inode number.
pub(crate) fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino())
}

/// What the monitor saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Another process committed a transaction that touched our table: `pid` as
    /// the initial pid namespace numbers it.
    Foreign { pid: u32 },
    /// Notifications were lost (the socket overflowed), or another process
    /// committed while the monitor was away for one of our commits: what
    /// happened is unknown, so treat it as drift.
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
        Ok(Monitor {
            shared: Arc::new(Shared {
                sock,
                netns: netns_id(),
                missed: AtomicBool::new(false),
            }),
        })
    }

    /// Leaves the nf_tables group while this process commits in its namespace
    /// (`away_for`). With any subscriber in a namespace, the kernel builds a
    /// notification of every object a transaction adds, after the new rules
    /// are live and before it answers the commit: listening made the daemon's
    /// cold sync of 10k Services 60% longer, to hear only its own commit. A
    /// commit of another process at that moment is told by the generation
    /// count, and reported as `Change::Lost` within a second.
    pub fn away_during_own_commits(&self) -> io::Result<()> {
        rustix::net::sockopt::set_socket_timeout(
            &self.shared.sock,
            rustix::net::sockopt::Timeout::Recv,
            Some(MISSED_CHECK),
        )
        .map_err(io::Error::from)?;
        let mut away = AWAY_DURING_OWN_COMMITS.lock().unwrap();
        away.retain(|w| w.strong_count() > 0);
        away.push(Arc::downgrade(&self.shared));
        Ok(())
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
            if kind == NEWGEN {
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
            if kind != NEWGEN {
                return None;
            }
            let at = Instant::now();
            holds().then_some(Some(at))
        })?;
        let Some(mut at) = seen else { return Ok(None) };
        let sock = &self.shared.sock;
        sock.set_non_blocking(true)?;
        let later = loop {
            match sock.recv_from_full() {
                Ok((buf, _)) if messages(&buf).any(|(k, _, _)| k == NEWGEN) => break Ok(true),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(false),
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => break Ok(true),
                Err(e) => break Err(e),
            }
        };
        sock.set_non_blocking(false)?;
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
            let (buf, _) = match self.shared.sock.recv_from_full() {
                Ok(x) => x,
                Err(e) if e.raw_os_error() == Some(ENOBUFS) => return Ok(lost),
                // The receive timeout of a monitor that goes away.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.shared.missed.swap(false, Ordering::Relaxed) {
                        return Ok(lost);
                    }
                    continue;
                }
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

/// The monitors of one namespace, away from the nf_tables group for one of
/// this process's commits; back when dropped.
pub(crate) struct Away {
    monitors: Vec<Arc<Shared>>,
    back: bool,
}

/// Sends the monitors of namespace `netns` away (`Monitor::away_during_own_commits`).
pub(crate) fn away_for(netns: u64) -> Away {
    let monitors: Vec<Arc<Shared>> = AWAY_DURING_OWN_COMMITS
        .lock()
        .unwrap()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|m| m.netns == netns)
        .collect();
    for m in &monitors {
        if let Err(e) = m.sock.drop_membership(NFNLGRP_NFTABLES) {
            tracing::warn!("nf_tables monitor: leaving its group: {e}");
        }
    }
    Away {
        monitors,
        back: false,
    }
}

impl Away {
    pub fn any(&self) -> bool {
        !self.monitors.is_empty()
    }

    /// Tells the monitors that another process may have committed while they
    /// were away.
    pub fn missed(&self) {
        for m in &self.monitors {
            m.missed.store(true, Ordering::Relaxed);
        }
    }

    /// Brings the monitors back to the group; `missed` can still be told.
    pub fn rejoin(&mut self) {
        if std::mem::replace(&mut self.back, true) {
            return;
        }
        for m in &self.monitors {
            if let Err(e) = m.sock.add_membership(NFNLGRP_NFTABLES) {
                // Deaf from here on: said, and drift is repaired by the resync.
                tracing::error!("nf_tables monitor: joining its group again: {e}");
                m.missed.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Away {
    fn drop(&mut self) {
        self.rejoin();
    }
}

/// Whether no other process committed while the monitors were away: from the
/// generation read before our commit, after it, and once they were back (any
/// of them unknown: perhaps one did). `committed` is how many transactions
/// of ours committed (a split one, several; a failed one, none), each a
/// generation.
pub(crate) fn only_ours(
    before: Option<u32>,
    at_commit: Option<u32>,
    back: Option<u32>,
    committed: u32,
) -> bool {
    matches!((before, at_commit, back),
        (Some(b), Some(c), Some(a)) if c == b.wrapping_add(committed) && a == c)
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

#[cfg(test)]
mod tests {
    use super::only_ours;

    #[test]
    fn another_commit_while_the_monitors_were_away_is_told_by_the_generation() {
        assert!(only_ours(Some(5), Some(6), Some(6), 1));
        assert!(
            only_ours(Some(5), Some(5), Some(5), 0),
            "a refused commit counts none"
        );
        assert!(
            only_ours(Some(u32::MAX), Some(0), Some(0), 1),
            "the count wraps"
        );
        assert!(
            !only_ours(Some(5), Some(7), Some(7), 1),
            "one before or with ours"
        );
        assert!(
            !only_ours(Some(5), Some(6), Some(7), 1),
            "one before they were back"
        );
        assert!(
            !only_ours(Some(5), Some(6), Some(6), 0),
            "one while ours was refused"
        );
        assert!(
            only_ours(Some(5), Some(9), Some(9), 4),
            "ours, split in four"
        );
        assert!(!only_ours(None, Some(6), Some(6), 1), "unknown: perhaps");
        assert!(!only_ours(Some(5), Some(6), None, 1), "unknown: perhaps");
    }
}
