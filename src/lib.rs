//! kube-nft: a kube-proxy replacement whose dataplane is nftables, programmed
//! directly over netlink.
//!
//! The pipeline, one module per stage (docs/DESIGN.md has the map):
//! `source` (manifests, or the API server's watches) → `core` (the validated
//! model, endpoint policy, node settings) → a dataplane: `nft` (translate to the
//! desired `ruleset`, plan against the kernel's view) or `ipvs`, both written
//! through `netlink` (wire only). `text` renders a ruleset as `nft -f` input.
//! `proxy` runs one sync; `daemon` runs `kube-nft run` (configured by `config`,
//! observed through `metrics` and `proxy_health`); `lab` demonstrates it in
//! network namespaces.

pub mod assemble;
pub mod bench;
pub mod config;
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
pub mod lab;
pub mod metrics;
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
