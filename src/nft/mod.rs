//! The nftables dataplane: `translate` (with `names`, `skeleton`, `service`,
//! `slots`, and `ipvs_table` for the table beside IPVS, all made with the
//! builders of `build`) computes the desired tables from the model; `lower`
//! turns them into kernel objects (and `lift` back); `view` is the compact
//! picture of what the kernel holds; `planner` decides, without I/O, the `plan`
//! (the transaction) between the two; `dataplane` reads, plans and commits
//! through a `kernel::NftKernel`.

pub mod build;
pub mod dataplane;
pub mod endpoint_memo;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod ipvs_table;
pub mod kernel;
pub mod lift;
pub mod lower;
pub mod names;
pub mod pick;
pub mod plan;
pub mod planner;
pub mod service;
pub mod service_tables;
pub mod skeleton;
pub mod slots;
pub mod translate;
pub mod verifier;
pub mod view;
