//! What kube-proxy serves on its metrics port (`--metrics-bind-address`,
//! 127.0.0.1:10249), path for path and in its formats, so that the probes,
//! scrapers and scripts pointed at kube-proxy keep working: `/metrics`,
//! `/healthz` and `/healthz/ping` (plain `ok`: this port's health is the
//! server's own, not the proxy's), `/proxyMode`, `/configz` (the configuration
//! in effect, as a v1alpha1 `KubeProxyConfiguration`), `/flagz` and `/statusz`
//! (text for people, as kube-proxy 1.36's zpages).

use crate::config::{go_duration, DetectLocal, Settings, Source, API_VERSION};
use crate::core::node_config::ProxyMode;
use crate::node::http::Response;
use crate::node::metrics::Metrics;
use std::sync::Arc;
use std::time::SystemTime;

/// The paths `/statusz` lists, as kube-proxy lists its own.
const PATHS: [&str; 5] = ["/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"];

/// kube-proxy's zpages warn that they are for people; so do ours.
const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";

pub struct MetricsServer {
    metrics: Arc<Metrics>,
    mode: String,
    configz: String,
    flagz: String,
    started: SystemTime,
}

impl MetricsServer {
    /// `flags`: every flag of `run`, by name, with its value as given or its
    /// default (empty for none).
    pub fn new(settings: &Settings, flags: &[(String, String)], metrics: Arc<Metrics>) -> Self {
        MetricsServer {
            metrics,
            mode: settings.node.mode.name(),
            configz: configz(settings),
            flagz: flagz(flags),
            started: SystemTime::now(),
        }
    }

    pub fn respond(&self, path: &str) -> Response {
        let text = |body: String| Response {
            status: 200,
            content_type: "text/plain; charset=utf-8",
            body,
        };
        match path {
            "/metrics" => Response {
                status: 200,
                content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body: self.metrics.render(),
            },
            "/healthz" | "/healthz/ping" => text("ok".into()),
            "/proxyMode" => text(self.mode.clone()),
            "/configz" => Response {
                status: 200,
                content_type: "application/json",
                body: self.configz.clone(),
            },
            "/flagz" => text(self.flagz.clone()),
            "/statusz" => text(self.statusz()),
            _ => Response::not_found(),
        }
    }

    fn statusz(&self) -> String {
        let up = self.started.elapsed().unwrap_or_default().as_secs();
        let started = k8s_openapi::jiff::Timestamp::try_from(self.started)
            .map(|t| t.strftime("%a %b %e %H:%M:%S UTC %Y").to_string())
            .unwrap_or_default();
        format!(
            "\nkube-nft statusz\n{WARNING}\n\nStarted: {started}\nUp: {} hr {:02} min {:02} sec\nBinary version: {}\nPaths: {}\n",
            up / 3600,
            (up / 60) % 60,
            up % 60,
            env!("CARGO_PKG_VERSION"),
            PATHS.join(" ")
        )
    }
}

/// `/flagz`: kube-proxy's text form, one `name=value` line per flag, by name.
fn flagz(flags: &[(String, String)]) -> String {
    let mut flags = flags.to_vec();
    flags.sort();
    let mut out = format!("\nkube-nft flagz\n{WARNING}\n");
    for (name, value) in flags {
        out.push_str(&format!("{name}={value}\n"));
    }
    out
}

/// `/configz`: the configuration in effect, as kube-proxy shows its own (a
/// v1alpha1 `KubeProxyConfiguration` under `kubeproxy.config.k8s.io`), with
/// the fields kube-nft has; the sync periods under the mode in effect.
fn configz(s: &Settings) -> String {
    let node = &s.node;
    let kubeconfig = match &s.source {
        Source::Api(c) => c
            .kubeconfig
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        Source::Manifests(_) => String::new(),
    };
    let bind = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    let periods = serde_json::json!({
        "syncPeriod": go_duration(s.sync_period),
        "minSyncPeriod": go_duration(s.min_sync_period),
    });
    let mut nftables = serde_json::json!({
        "masqueradeBit": node.masquerade_bit,
        "masqueradeAll": node.masquerade_all,
    });
    let mut config = serde_json::json!({
        "kind": "KubeProxyConfiguration",
        "apiVersion": API_VERSION,
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": s.node_name,
        "healthzBindAddress": bind(s.healthz_bind_address),
        "metricsBindAddress": bind(s.metrics_bind_address),
        "mode": node.mode.name(),
        "detectLocalMode": match s.detect_local {
            DetectLocal::ClusterCidr => "ClusterCIDR",
            DetectLocal::NodeCidr => "NodeCIDR",
        },
        "clusterCIDR": node.cluster_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        "nodePortAddresses": node.nodeport_addresses.items(),
        "oomScoreAdj": s.oom_score_adj,
    });
    match &node.mode {
        ProxyMode::Nftables => {
            for (k, v) in periods.as_object().unwrap() {
                nftables[k] = v.clone();
            }
        }
        ProxyMode::Ipvs(ipvs) => {
            let mut block = serde_json::json!({
                "scheduler": ipvs.scheduler,
                "strictARP": ipvs.strict_arp,
                "excludeCIDRs": ipvs.exclude_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
                "tcpTimeout": go_duration(std::time::Duration::from_secs(ipvs.timeouts.tcp.into())),
                "tcpFinTimeout": go_duration(std::time::Duration::from_secs(ipvs.timeouts.tcp_fin.into())),
                "udpTimeout": go_duration(std::time::Duration::from_secs(ipvs.timeouts.udp.into())),
            });
            for (k, v) in periods.as_object().unwrap() {
                block[k] = v.clone();
            }
            config["ipvs"] = block;
        }
    }
    config["nftables"] = nftables;
    serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string()
}
