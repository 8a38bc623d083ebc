//! What runs on the node around the dataplane: the daemon (`kube-nft run`), and
//! what it serves and sets beside the rules, as kube-proxy does.
//!
//! - served: `metrics` (kept) and `metrics_server` (the metrics port),
//!   `proxy_health` (the healthz port), `healthcheck` (a port per Service with
//!   `externalTrafficPolicy: Local`), all over `http`;
//! - held: `nat_hold`, owned tables that keep the kernel's NAT of established
//!   connections through a foreign `nft flush ruleset`;
//! - set: `conntrack_sysctls` at start, `stale_flows` (UDP conntrack entries of
//!   gone endpoints) after each sync, `fast_path` (the flowtable of long-lived
//!   flows and its devices), one `malloc_arena` for the process;
//! - removed: `kube_proxy_leftovers`, what kube-proxy leaves behind.

pub mod conntrack_sysctls;
pub mod daemon;
pub mod fast_path;
pub mod healthcheck;
pub mod http;
pub mod kernel_probe;
pub mod kube_proxy_leftovers;
pub mod malloc_arena;
pub mod metrics;
pub mod metrics_server;
pub mod nat_hold;
pub mod process_metrics;
pub mod proxy_health;
pub mod stale_flows;
