//! Our own netlink code: nf_tables (the nftables backend), IPVS over generic
//! netlink (the IPVS backend), conntrack and rtnetlink.
//!
//! `attr` frames attributes, `expr` is the kernel's expression vocabulary, `lower`
//! turns ruleset objects into kernel objects (bytecode identical to `nft`'s),
//! `nftables` sends transactions and reads our tables back, `view` keeps a compact
//! picture of what the kernel holds, and `diff` plans the transaction between the two.

pub mod attr;
pub mod conntrack;
pub mod diff;
pub mod expr;
pub mod genl;
pub mod ipvs;
pub mod lower;
pub mod message;
pub mod monitor;
pub mod nftables;
pub mod route;
pub mod view;

pub use lower::{lower_table, KernelTable};
pub use nftables::{Batch, Committed, NftError, NftSocket};
