//! The nftables backend: our own netlink encoder and decoder for nf_tables.
//!
//! `attr` frames attributes, `expr` is the kernel's expression vocabulary, `lower`
//! turns ruleset objects into kernel objects (bytecode identical to `nft`'s), and
//! `nftables` sends transactions and reads our tables back.

pub mod attr;
pub mod expr;
pub mod lower;
pub mod nftables;

pub use lower::{lower_table, KernelTable};
pub use nftables::{Batch, Committed, NftError, NftSocket};
