//! Our own netlink code, wire only: nf_tables, IPVS over generic netlink,
//! conntrack, ipset (only to remove kube-proxy's) and rtnetlink. Nothing here
//! knows what a Service is.
//!
//! `attr` frames attributes, `message` frames messages, `expr` is the kernel's
//! expression vocabulary and `objects` its tables, chains, rules, sets and
//! elements; `nftables` sends transactions and dumps our tables back.

pub mod attr;
pub mod batch;
pub mod conntrack;
pub mod expr;
pub mod flowtable;
pub mod genl;
pub mod ipset;
pub mod ipvs;
pub mod listeners;
pub mod message;
pub mod monitor;
pub mod nftables;
pub mod objects;
pub mod route;

pub use batch::Batch;
pub use nftables::{Committed, NftError, NftSocket};
pub use objects::KernelTable;
