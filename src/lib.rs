//! kube-nft: a kube-proxy replacement whose dataplane is nftables, programmed
//! directly over netlink.
//!
//! The pipeline, one folder per stage (docs/DESIGN.md has the map):
//! `source` (manifests, or the API server's watches) → `core` (the validated
//! model, endpoint policy, node settings) → `engine` (which Services changed,
//! full or partial sync) → the dataplanes behind its `engine::dataplane` seam:
//! `nft` (translate to the desired `ruleset`, plan against the kernel's view)
//! and `ipvs`, both written through `netlink` (wire only).
//!
//! Around it: `assemble`, where a proxy mode's dataplanes are opened and handed
//! to an engine; `node`, what runs on the node beside the dataplane (the
//! `daemon` of `kube-nft run`, configured by `config`; its metrics, health
//! ports and conntrack settings); `tools`, the operator's commands against a
//! node; `lab`, the demo in network namespaces; `bench`, the measurements; and
//! `testbed`, what tests, lab and benches share.
//!
//! Features: `testing` (the fake kernels, `nft::fake` and `ipvs::fake`) and
//! `fuzzing` (the fuzz targets' bodies) are for tests only; the binary that
//! ships has neither.

pub mod assemble;
pub mod bench;
pub mod config;
pub mod core;
pub mod engine;
pub mod ipvs;
pub mod lab;
pub mod netlink;
pub mod nft;
pub mod node;
pub mod ruleset;
pub mod source;
pub mod testbed;
pub mod tools;
