//! An endpoint's identity within a Service port: the address and the port that
//! traffic is DNATed to. Slots, merges and diffs all find endpoints by it.
//!
//! In test builds (feature `testing`) every comparison and hash of a key is
//! counted, per thread: that is the per-endpoint cost a change must not pay
//! for endpoints it does not touch (a search, a sort, a tree or hash map built
//! over a whole Service), and `integration/reconcile.rs` reads the count to
//! hold a change in a Service of 10,000 endpoints to the work of one of 1,000.
//! A sequential pass over a Service's endpoints that compares no key (copying
//! its slots, filtering its lists) is not counted; it stays linear, at a few
//! nanoseconds an endpoint. The shipped binary counts nothing.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

#[derive(Debug, Clone, Copy)]
pub struct EndpointKey {
    pub addr: IpAddr,
    pub port: u16,
}

impl EndpointKey {
    pub fn new(addr: IpAddr, port: u16) -> EndpointKey {
        EndpointKey { addr, port }
    }
}

#[cfg(feature = "testing")]
mod counting {
    use std::cell::Cell;

    thread_local! {
        static OPERATIONS: Cell<u64> = const { Cell::new(0) };
    }

    pub fn one() {
        OPERATIONS.with(|n| n.set(n.get() + 1));
    }

    pub fn so_far() -> u64 {
        OPERATIONS.with(|n| n.get())
    }
}

#[cfg(not(feature = "testing"))]
mod counting {
    #[inline(always)]
    pub fn one() {}
}

/// How many times this thread has compared or hashed endpoint keys.
#[cfg(feature = "testing")]
pub fn key_operations() -> u64 {
    counting::so_far()
}

impl PartialEq for EndpointKey {
    fn eq(&self, other: &Self) -> bool {
        counting::one();
        self.addr == other.addr && self.port == other.port
    }
}

impl Eq for EndpointKey {}

impl Ord for EndpointKey {
    fn cmp(&self, other: &Self) -> Ordering {
        counting::one();
        (self.addr, self.port).cmp(&(other.addr, other.port))
    }
}

impl PartialOrd for EndpointKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for EndpointKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        counting::one();
        self.addr.hash(state);
        self.port.hash(state);
    }
}
