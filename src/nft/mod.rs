//! The nftables dataplane: `translate` (with `names`, `skeleton`, `service`,
//! `slots` and the IPVS flavour in `ipvs_helper`) computes the desired tables
//! from the model; `lower` turns them into kernel objects; `view` is the compact
//! picture of what the kernel holds; `plan` is the transaction between the two.

pub mod ipvs_helper;
pub mod lower;
pub mod names;
pub mod plan;
pub mod service;
pub mod skeleton;
pub mod slots;
pub mod translate;
pub mod view;
