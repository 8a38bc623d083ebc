//! kube-nft: a kube-proxy replacement whose dataplane is nftables, programmed
//! directly over netlink.
//!
//! The pipeline, one module per stage:
//! `source` (manifests, or the API server's watches) → `model` (validated
//! objects) → `translate` (desired `ruleset`) → a backend: `netlink` (the kernel)
//! or `text` (`nft -f` syntax). `proxy` runs one sync through it; `daemon` runs
//! `kube-nft run` (configured by `config`, observed through `metrics` and
//! `proxy_health`); `lab` demonstrates it in network namespaces.

pub mod bench;
pub mod config;
pub mod daemon;
pub mod explain;
pub mod healthcheck;
pub mod http;
pub mod ipvs;
pub mod lab;
pub mod metrics;
pub mod model;
pub mod netlink;
pub mod netns;
pub mod proxy;
pub mod proxy_health;
pub mod ruleset;
pub mod source;
pub mod stale_flows;
pub mod text;
pub mod top;
pub mod translate;
