//! kube-nft: a kube-proxy replacement whose dataplane is nftables, programmed
//! directly over netlink.
//!
//! The pipeline, one module per stage (docs/DESIGN.md has the map):
//! `source` (manifests, or the API server's watches) → `core` (the validated
//! model, endpoint policy, node settings) → `engine` (which Services changed,
//! full or partial sync) → the dataplanes behind the `dataplane` trait: `nft`
//! (translate to the desired `ruleset`, plan against the kernel's view) and
//! `ipvs`, both written through `netlink` (wire only). `assemble` is where a
//! proxy mode's dataplanes are opened and handed to an engine; `daemon` runs
//! `kube-nft run` (configured by `config`, observed through `metrics` and
//! `proxy_health`); `text` renders a ruleset as `nft -f` input; `lab`
//! demonstrates it in network namespaces; `bench` measures it, over the
//! `synthetic` cluster the tests use too.
//!
//! Features: `testing` (the fake kernels, `nft::fake` and `ipvs::fake`) and
//! `fuzzing` (the fuzz targets' bodies) are for tests only; the binary that
//! ships has neither.

pub mod assemble;
pub mod bench;
pub mod config;
pub mod conntrack_sysctls;
pub mod core;
pub mod daemon;
pub mod dataplane;
pub mod engine;
pub mod explain;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod healthcheck;
pub mod http;
pub mod ipvs;
pub mod kube_proxy_leftovers;
pub mod lab;
pub mod malloc_arena;
pub mod metrics;
pub mod metrics_server;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod proxy_health;
pub mod ruleset;
pub mod source;
pub mod stale_flows;
pub mod synthetic;
pub mod text;
pub mod top;
