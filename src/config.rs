//! kube-proxy's configuration: its flags and its `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`) file, resolved into what `run` needs.
//!
//! A flag given on the command line wins over the file, and the file over the
//! defaults (kube-proxy's nftables defaults). Every field of the v1alpha1 schema
//! is known here: a field we implement is used, a field we do not is accepted only
//! at its zero value (kubeadm writes them all), and anything else, including a
//! misspelt field, stops the start with a message naming the field.

use crate::core::node_config::check_scheduler;
use crate::core::node_config::{
    IpvsSettings, NodeConfig, NodePortAddresses, ProxyMode, DEFAULT_MASQUERADE_BIT,
};
use crate::source::kubernetes::Connection;
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const DEFAULT_HEALTHZ_BIND_ADDRESS: &str = "0.0.0.0:10256";
pub const DEFAULT_METRICS_BIND_ADDRESS: &str = "127.0.0.1:10249";
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);

/// The settings that come as flags; `None` means not given.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub manifests: Vec<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub hostname_override: Option<String>,
    pub proxy_mode: Option<String>,
    pub ipvs_scheduler: Option<String>,
    pub ipvs_strict_arp: Option<bool>,
    pub ipvs_exclude_cidrs: Option<Vec<IpNet>>,
    pub cluster_cidr: Option<Vec<IpNet>>,
    pub service_cidr: Option<Vec<IpNet>>,
    pub nodeport_addresses: Option<String>,
    pub masquerade_all: Option<bool>,
    pub masquerade_bit: Option<u8>,
    pub detect_local_mode: Option<String>,
    /// `Some("")` turns the server off.
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub sync_period: Option<Duration>,
    pub min_sync_period: Option<Duration>,
    pub counters: bool,
}

/// `detectLocalMode`: what makes traffic "from a pod" (not masqueraded, and
/// short-circuited to local endpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DetectLocal {
    /// The source is inside `clusterCIDR`.
    #[default]
    ClusterCidr,
    /// The source is inside this node's `spec.podCIDRs`.
    NodeCidr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Manifests(Vec<PathBuf>),
    Api(ConnectionSettings),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
}

impl ConnectionSettings {
    pub fn connection(&self) -> Connection {
        Connection {
            kubeconfig: self.kubeconfig.clone(),
            master: self.master.clone(),
        }
    }
}

/// Everything `run` needs, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub source: Source,
    pub node_name: String,
    pub node: NodeConfig,
    pub detect_local: DetectLocal,
    /// The Service CIDRs were not given: take them from ServiceCIDR objects.
    pub service_cidrs_from_api: bool,
    pub healthz_bind_address: Option<SocketAddr>,
    pub metrics_bind_address: Option<SocketAddr>,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub oom_score_adj: Option<i32>,
}

// The file, field for field. `Option` everywhere: absent and null are the same.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileConfig {
    api_version: Option<String>,
    kind: Option<String>,
    feature_gates: Option<BTreeMap<String, bool>>,
    client_connection: Option<ClientConnection>,
    logging: Option<Logging>,
    hostname_override: Option<String>,
    bind_address: Option<String>,
    healthz_bind_address: Option<String>,
    metrics_bind_address: Option<String>,
    bind_address_hard_fail: Option<bool>,
    enable_profiling: Option<bool>,
    show_hidden_metrics_for_version: Option<String>,
    mode: Option<String>,
    iptables: Option<IptablesSection>,
    ipvs: Option<IpvsSection>,
    nftables: Option<NftablesSection>,
    winkernel: Option<WinkernelSection>,
    detect_local_mode: Option<String>,
    detect_local: Option<DetectLocalSection>,
    #[serde(rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    node_port_addresses: Option<Vec<String>>,
    oom_score_adj: Option<i32>,
    conntrack: Option<ConntrackSection>,
    config_sync_period: Option<String>,
    port_range: Option<String>,
    windows_run_as_service: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClientConnection {
    kubeconfig: Option<String>,
    accept_content_types: Option<String>,
    content_type: Option<String>,
    qps: Option<f64>,
    burst: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Logging {
    format: Option<String>,
    flush_frequency: Option<serde_yaml::Value>,
    verbosity: Option<u32>,
    vmodule: Option<serde_yaml::Value>,
    options: Option<serde_yaml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NftablesSection {
    masquerade_bit: Option<i32>,
    masquerade_all: Option<bool>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IptablesSection {
    masquerade_bit: Option<i32>,
    masquerade_all: Option<bool>,
    localhost_node_ports: Option<bool>,
    #[serde(rename = "snatNodeInternalIP")]
    snat_node_internal_ip: Option<bool>,
    sync_period: Option<String>,
    min_sync_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IpvsSection {
    sync_period: Option<String>,
    min_sync_period: Option<String>,
    scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    strict_arp: Option<bool>,
    tcp_timeout: Option<String>,
    tcp_fin_timeout: Option<String>,
    udp_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WinkernelSection {
    network_name: Option<String>,
    source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    enable_dsr: Option<bool>,
    root_hns_endpoint_name: Option<String>,
    forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DetectLocalSection {
    bridge_interface: Option<String>,
    interface_name_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConntrackSection {
    max_per_core: Option<i32>,
    min: Option<i32>,
    tcp_established_timeout: Option<String>,
    tcp_close_wait_timeout: Option<String>,
    tcp_be_liberal: Option<bool>,
    udp_timeout: Option<String>,
    udp_stream_timeout: Option<String>,
}

/// Parses a Go duration as Kubernetes writes them (`30s`, `1m30s`, `500ms`, `2h`),
/// or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (like 30s, 500ms, 1m30s)");
    let text = s.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return (secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs))
            .ok_or_else(bad);
    }
    let mut rest = text;
    let mut total = 0.0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(format!(
                    "{s:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// `nodePortAddresses` / `--nodeport-addresses` (comma-separated): `primary`, or
/// CIDRs and `all`.
fn nodeport_addresses(list: &str, field: &str) -> Result<NodePortAddresses, String> {
    list.parse().map_err(|e| format!("{field}: {e}"))
}

fn cidr_list(text: &str, field: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| format!("{field}: {c:?} is not a CIDR"))
        })
        .collect()
}

fn detect_local(mode: &str, field: &str) -> Result<DetectLocal, String> {
    match mode {
        "" | "ClusterCIDR" => Ok(DetectLocal::ClusterCidr),
        "NodeCIDR" => Ok(DetectLocal::NodeCidr),
        "BridgeInterface" | "InterfaceNamePrefix" => Err(format!(
            "{field}: {mode} is not supported by kube-nft (ClusterCIDR and NodeCIDR are)"
        )),
        other => Err(format!(
            "{field}: {other:?} is not a mode (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)"
        )),
    }
}

/// `mode` / `--proxy-mode`: whether the mode is IPVS.
fn check_mode(mode: &str, field: &str) -> Result<bool, String> {
    match mode {
        "" | "nftables" => Ok(false),
        "ipvs" => Ok(true),
        other => Err(format!(
            "{field}: {other:?} is not supported by kube-nft (nftables or ipvs)"
        )),
    }
}

/// `HOST:PORT`; empty means off.
fn bind_address(text: &str, field: &str) -> Result<Option<SocketAddr>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| format!("{field}: {text:?} is not an address and port (like 0.0.0.0:10256)"))
}

/// Fails naming `field` unless `value` is its zero value (unset, false, 0, "").
fn must_be_unset<T: PartialEq + Default + std::fmt::Debug>(
    field: &str,
    value: &Option<T>,
    why: &str,
) -> Result<(), String> {
    match value {
        Some(v) if *v != T::default() => Err(format!("{field}: set to {v:?}, but {why}")),
        _ => Ok(()),
    }
}

/// A duration field: unset or "0s" is `None`.
fn duration_field(field: &str, value: &Option<String>) -> Result<Option<Duration>, String> {
    match value.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => {
            let d = parse_duration(text).map_err(|e| format!("{field}: {e}"))?;
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

fn masquerade_bit(field: &str, bit: Option<i32>) -> Result<Option<u8>, String> {
    match bit {
        None => Ok(None),
        Some(b) if (0..=31).contains(&b) => Ok(Some(b as u8)),
        Some(b) => Err(format!("{field}: {b} is not in 0..=31")),
    }
}

impl FileConfig {
    fn parse(text: &str, origin: &Path) -> Result<FileConfig, String> {
        let file: FileConfig =
            serde_yaml::from_str(text).map_err(|e| format!("{}: {e}", origin.display()))?;
        let at = |e: String| format!("{}: {e}", origin.display());
        match file.api_version.as_deref() {
            Some(API_VERSION) => {}
            Some(other) => {
                return Err(at(format!(
                    "apiVersion: {other:?} is not supported (only {API_VERSION})"
                )))
            }
            None => return Err(at(format!("apiVersion: missing (want {API_VERSION})"))),
        }
        if file.kind.as_deref() != Some("KubeProxyConfiguration") {
            return Err(at(format!(
                "kind: {:?}, want \"KubeProxyConfiguration\"",
                file.kind.as_deref().unwrap_or_default()
            )));
        }
        file.check_unsupported().map_err(at)?;
        Ok(file)
    }

    /// Fields of the schema that kube-nft does not implement must be at zero.
    fn check_unsupported(&self) -> Result<(), String> {
        if let Some(gates) = &self.feature_gates {
            if let Some((gate, _)) = gates.iter().next() {
                return Err(format!(
                    "featureGates.{gate}: kube-nft has no feature gates; remove it"
                ));
            }
        }
        check_mode(self.mode.as_deref().unwrap_or_default(), "mode")?;
        if let Some(c) = &self.client_connection {
            must_be_unset(
                "clientConnection.acceptContentTypes",
                &c.accept_content_types,
                "kube-nft always speaks JSON",
            )?;
            must_be_unset(
                "clientConnection.contentType",
                &c.content_type,
                "kube-nft always speaks JSON",
            )?;
            // qps and burst limit kube-proxy's requests; a watch-only client has no use for them.
            let _ = (c.qps, c.burst);
        }
        if let Some(l) = &self.logging {
            must_be_unset(
                "logging.format",
                &l.format.clone().filter(|f| f != "text"),
                "kube-nft logs text (set RUST_LOG for the level)",
            )?;
            let _ = (&l.flush_frequency, l.verbosity, &l.vmodule, &l.options);
        }
        match self.bind_address.as_deref().unwrap_or_default() {
            "" | "0.0.0.0" | "::" => {}
            other => return Err(format!("bindAddress: {other:?}: overriding the node's primary IP is not supported; leave it unset")),
        }
        must_be_unset(
            "bindAddressHardFail",
            &self.bind_address_hard_fail,
            "kube-nft logs a port it cannot bind and goes on (kube-proxy's default)",
        )?;
        must_be_unset(
            "enableProfiling",
            &self.enable_profiling,
            "kube-nft has no profiling endpoint",
        )?;
        must_be_unset(
            "showHiddenMetricsForVersion",
            &self.show_hidden_metrics_for_version,
            "kube-nft hides no metrics",
        )?;
        if let Some(i) = &self.iptables {
            let why = "kube-nft runs nftables: set it in the nftables section";
            must_be_unset("iptables.masqueradeBit", &i.masquerade_bit, why)?;
            must_be_unset("iptables.masqueradeAll", &i.masquerade_all, why)?;
            must_be_unset(
                "iptables.localhostNodePorts",
                &i.localhost_node_ports,
                "kube-nft never serves NodePorts on loopback",
            )?;
            must_be_unset(
                "iptables.snatNodeInternalIP",
                &i.snat_node_internal_ip,
                "it is an iptables-mode option",
            )?;
            duration_field("iptables.syncPeriod", &i.sync_period)?
                .map_or(Ok(()), |_| Err(format!("iptables.syncPeriod: {why}")))?;
            duration_field("iptables.minSyncPeriod", &i.min_sync_period)?
                .map_or(Ok(()), |_| Err(format!("iptables.minSyncPeriod: {why}")))?;
        }
        if let Some(v) = &self.ipvs {
            // Checked now so that a file written for the IPVS backend is right
            // before that backend exists; only used in mode ipvs.
            duration_field("ipvs.syncPeriod", &v.sync_period)?;
            duration_field("ipvs.minSyncPeriod", &v.min_sync_period)?;
            for (field, value) in [
                ("ipvs.tcpTimeout", &v.tcp_timeout),
                ("ipvs.tcpFinTimeout", &v.tcp_fin_timeout),
                ("ipvs.udpTimeout", &v.udp_timeout),
            ] {
                if duration_field(field, value)?.is_some_and(|d| !d.is_zero()) {
                    return Err(format!(
                        "{field}: kube-nft leaves IPVS's connection timeouts at the kernel's defaults; remove it"
                    ));
                }
            }
            if let Some(s) = v.scheduler.as_deref().filter(|s| !s.is_empty()) {
                check_scheduler(s).map_err(|e| format!("ipvs.scheduler: {e}"))?;
            }
            for (i, c) in v.exclude_cidrs.iter().flatten().enumerate() {
                cidr_list(c, &format!("ipvs.excludeCIDRs[{i}]"))?;
            }
        }
        if let Some(w) = &self.winkernel {
            let why = "it is a Windows option";
            must_be_unset("winkernel.networkName", &w.network_name, why)?;
            must_be_unset("winkernel.sourceVip", &w.source_vip, why)?;
            must_be_unset("winkernel.enableDSR", &w.enable_dsr, why)?;
            must_be_unset(
                "winkernel.rootHnsEndpointName",
                &w.root_hns_endpoint_name,
                why,
            )?;
            must_be_unset(
                "winkernel.forwardHealthCheckVip",
                &w.forward_health_check_vip,
                why,
            )?;
        }
        must_be_unset(
            "windowsRunAsService",
            &self.windows_run_as_service,
            "it is a Windows option",
        )?;
        if let Some(d) = &self.detect_local {
            let why = "detectLocalMode BridgeInterface and InterfaceNamePrefix are not supported";
            must_be_unset("detectLocal.bridgeInterface", &d.bridge_interface, why)?;
            must_be_unset(
                "detectLocal.interfaceNamePrefix",
                &d.interface_name_prefix,
                why,
            )?;
        }
        if let Some(c) = &self.conntrack {
            let why = "kube-nft does not set conntrack sysctls; set them on the node";
            must_be_unset("conntrack.maxPerCore", &c.max_per_core, why)?;
            must_be_unset("conntrack.min", &c.min, why)?;
            must_be_unset("conntrack.tcpBeLiberal", &c.tcp_be_liberal, why)?;
            for (field, value) in [
                (
                    "conntrack.tcpEstablishedTimeout",
                    &c.tcp_established_timeout,
                ),
                ("conntrack.tcpCloseWaitTimeout", &c.tcp_close_wait_timeout),
                ("conntrack.udpTimeout", &c.udp_timeout),
                ("conntrack.udpStreamTimeout", &c.udp_stream_timeout),
            ] {
                if duration_field(field, value)?.is_some() {
                    return Err(format!("{field}: {why}"));
                }
            }
        }
        // configSyncPeriod is the informers' resync; watches need none.
        duration_field("configSyncPeriod", &self.config_sync_period)?;
        must_be_unset(
            "portRange",
            &self.port_range,
            "it was the userspace proxy's, which is gone",
        )?;
        if let Some(adj) = self.oom_score_adj {
            if !(-1000..=1000).contains(&adj) {
                return Err(format!("oomScoreAdj: {adj} is not in -1000..=1000"));
            }
        }
        Ok(())
    }
}

/// Reads the file (if any) and merges it with the flags.
pub fn resolve(flags: &Flags) -> Result<Settings, String> {
    let file = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--config {}: {e}", path.display()))?;
            FileConfig::parse(&text, path)?
        }
        None => FileConfig::default(),
    };
    let ipvs_mode = match &flags.proxy_mode {
        Some(mode) => check_mode(mode, "--proxy-mode")?,
        None => check_mode(file.mode.as_deref().unwrap_or_default(), "mode")?,
    };
    let nft = file.nftables.unwrap_or_default();
    let ipvs = file.ipvs.unwrap_or_default();
    let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());

    let source = if !flags.manifests.is_empty() {
        if flags.kubeconfig.is_some() || flags.master.is_some() {
            return Err("--manifests and --kubeconfig/--master are two sources; give one".into());
        }
        Source::Manifests(flags.manifests.clone())
    } else {
        let kubeconfig = flags.kubeconfig.clone().or_else(|| {
            non_empty(&file.client_connection.and_then(|c| c.kubeconfig)).map(PathBuf::from)
        });
        Source::Api(ConnectionSettings {
            kubeconfig,
            master: flags.master.clone(),
        })
    };

    let node_name = match flags
        .hostname_override
        .clone()
        .or_else(|| non_empty(&file.hostname_override))
    {
        Some(name) => name,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| format!("reading this host's name (give --hostname-override): {e}"))?,
    }
    .trim()
    .to_lowercase();

    let cluster_cidrs = match (&flags.cluster_cidr, non_empty(&file.cluster_cidr)) {
        (Some(c), _) => c.clone(),
        (None, Some(text)) => cidr_list(&text, "clusterCIDR")?,
        (None, None) => Vec::new(),
    };
    let nodeport_addresses = match (&flags.nodeport_addresses, &file.node_port_addresses) {
        (Some(text), _) => nodeport_addresses(text, "--nodeport-addresses")?,
        (None, Some(list)) => nodeport_addresses(&list.join(","), "nodePortAddresses")?,
        (None, None) => NodePortAddresses::Primary,
    };
    let masquerade_bit = match flags.masquerade_bit {
        Some(b) => b,
        None => masquerade_bit("nftables.masqueradeBit", nft.masquerade_bit)?
            .unwrap_or(DEFAULT_MASQUERADE_BIT),
    };
    let detect_local = match &flags.detect_local_mode {
        Some(m) => detect_local(m, "--detect-local-mode")?,
        None => detect_local(
            file.detect_local_mode.as_deref().unwrap_or_default(),
            "detectLocalMode",
        )?,
    };
    let bind = |flag: &Option<String>, field: &str, from_file: &Option<String>, default: &str| {
        match flag {
            Some(text) => bind_address(text, &format!("--{field}")),
            None => bind_address(non_empty(from_file).as_deref().unwrap_or(default), field),
        }
    };
    let node = NodeConfig {
        cluster_cidrs,
        service_cidrs: flags.service_cidr.clone().unwrap_or_default(),
        masquerade_bit,
        nodeport_addresses,
        local_addresses: Vec::new(),
        counters: flags.counters,
        masquerade_all: flags.masquerade_all.or(nft.masquerade_all).unwrap_or(false),
        mode: if ipvs_mode {
            ProxyMode::Ipvs(IpvsSettings {
                scheduler: flags
                    .ipvs_scheduler
                    .clone()
                    .or_else(|| non_empty(&ipvs.scheduler))
                    .unwrap_or_else(|| IpvsSettings::default().scheduler),
                strict_arp: flags.ipvs_strict_arp.or(ipvs.strict_arp).unwrap_or(false),
                exclude_cidrs: match &flags.ipvs_exclude_cidrs {
                    Some(c) => c.clone(),
                    None => {
                        let mut out = Vec::new();
                        for (i, c) in ipvs.exclude_cidrs.iter().flatten().enumerate() {
                            out.extend(cidr_list(c, &format!("ipvs.excludeCIDRs[{i}]"))?);
                        }
                        out
                    }
                },
            })
        } else {
            ProxyMode::Nftables
        },
    };
    node.validate().map_err(|e| e.to_string())?;
    if detect_local == DetectLocal::ClusterCidr && node.cluster_cidrs.is_empty() {
        tracing::warn!(
            "no cluster CIDR (--cluster-cidr or clusterCIDR): traffic from pods to ClusterIPs is not told from other traffic"
        );
    }
    Ok(Settings {
        source,
        node_name,
        service_cidrs_from_api: flags.service_cidr.is_none(),
        node,
        detect_local,
        healthz_bind_address: bind(
            &flags.healthz_bind_address,
            "healthz-bind-address",
            &file.healthz_bind_address,
            DEFAULT_HEALTHZ_BIND_ADDRESS,
        )?,
        metrics_bind_address: bind(
            &flags.metrics_bind_address,
            "metrics-bind-address",
            &file.metrics_bind_address,
            DEFAULT_METRICS_BIND_ADDRESS,
        )?,
        sync_period: match flags.sync_period {
            Some(d) => d,
            None if ipvs_mode => {
                duration_field("ipvs.syncPeriod", &ipvs.sync_period)?.unwrap_or(DEFAULT_SYNC_PERIOD)
            }
            None => duration_field("nftables.syncPeriod", &nft.sync_period)?
                .unwrap_or(DEFAULT_SYNC_PERIOD),
        },
        min_sync_period: match flags.min_sync_period {
            Some(d) => d,
            None if ipvs_mode => duration_field("ipvs.minSyncPeriod", &ipvs.min_sync_period)?
                .unwrap_or(DEFAULT_MIN_SYNC_PERIOD),
            None => duration_field("nftables.minSyncPeriod", &nft.min_sync_period)?
                .unwrap_or(DEFAULT_MIN_SYNC_PERIOD),
        },
        oom_score_adj: file.oom_score_adj,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `kubeadm init` writes into the kube-proxy ConfigMap (every field, at
    /// zero), with the nftables mode and a few settings of ours.
    pub const KUBEADM: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: nftables
nftables:
  masqueradeAll: true
  masqueradeBit: 15
  minSyncPeriod: 2s
  syncPeriod: 1m30s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

    fn resolve_text(text: &str, flags: Flags) -> Result<Settings, String> {
        let dir = std::env::temp_dir().join(format!("kn-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{:x}.yaml", text.len() ^ (text.as_ptr() as usize)));
        std::fs::write(&path, text).unwrap();
        let r = resolve(&Flags {
            config: Some(path.clone()),
            hostname_override: Some("node1".into()),
            ..flags
        });
        std::fs::remove_file(path).unwrap();
        r
    }

    #[test]
    fn the_file_kubeadm_writes_loads_with_its_values() {
        let s = resolve_text(KUBEADM, Flags::default()).unwrap();
        assert_eq!(
            s.source,
            Source::Api(ConnectionSettings {
                kubeconfig: Some("/var/lib/kube-proxy/kubeconfig.conf".into()),
                master: None,
            })
        );
        assert_eq!(s.node_name, "node1");
        assert_eq!(s.node.cluster_cidrs.len(), 2);
        assert!(s.node.masquerade_all);
        assert_eq!(s.node.masquerade_bit, 15);
        assert_eq!(s.sync_period, Duration::from_secs(90));
        assert_eq!(s.min_sync_period, Duration::from_secs(2));
        assert_eq!(
            s.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(
            s.metrics_bind_address,
            Some("127.0.0.1:10249".parse().unwrap())
        );
        assert_eq!(s.node.nodeport_addresses, NodePortAddresses::Primary);
        assert_eq!(s.oom_score_adj, Some(-999));
        assert!(s.service_cidrs_from_api);
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let s = resolve_text(
            KUBEADM,
            Flags {
                masquerade_all: Some(false),
                min_sync_period: Some(Duration::from_millis(250)),
                metrics_bind_address: Some(String::new()),
                nodeport_addresses: Some("all".into()),
                detect_local_mode: Some("NodeCIDR".into()),
                ..Flags::default()
            },
        )
        .unwrap();
        assert!(!s.node.masquerade_all);
        assert_eq!(s.min_sync_period, Duration::from_millis(250));
        assert_eq!(s.sync_period, Duration::from_secs(90));
        assert_eq!(s.metrics_bind_address, None, "an empty flag turns it off");
        assert_eq!(s.detect_local, DetectLocal::NodeCidr);
        assert!(
            matches!(s.node.nodeport_addresses, NodePortAddresses::Cidrs(ref c) if c.len() == 2)
        );
    }

    #[test]
    fn invalid_files_fail_naming_the_field() {
        for (from, to, field) in [
            (
                "  masqueradeBit: 15\n",
                "  masqueradeBitt: 15\n",
                "masqueradeBitt",
            ),
            ("mode: nftables", "mode: iptables", "mode"),
            ("  tcpTimeout: 0s", "  tcpTimeout: 900s", "ipvs.tcpTimeout"),
            (
                "  maxPerCore: null",
                "  maxPerCore: 32768",
                "conntrack.maxPerCore",
            ),
            (
                "detectLocalMode: \"\"",
                "detectLocalMode: BridgeInterface",
                "detectLocalMode",
            ),
            (
                "  syncPeriod: 1m30s",
                "  syncPeriod: 5 parsecs",
                "nftables.syncPeriod",
            ),
            (
                "  masqueradeBit: 15",
                "  masqueradeBit: 32",
                "nftables.masqueradeBit",
            ),
            (
                "  masqueradeBit: null",
                "  masqueradeBit: 12",
                "iptables.masqueradeBit",
            ),
            (
                "  localhostNodePorts: null",
                "  localhostNodePorts: true",
                "iptables.localhostNodePorts",
            ),
            (
                "  scheduler: \"\"",
                "  scheduler: fastest",
                "ipvs.scheduler",
            ),
            (
                "nodePortAddresses: null",
                "nodePortAddresses: [localhost]",
                "nodePortAddresses",
            ),
            (
                "clusterCIDR: 10.244.0.0/16",
                "clusterCIDR: 10.244.0.0/33",
                "clusterCIDR",
            ),
            (
                "enableProfiling: false",
                "enableProfiling: true",
                "enableProfiling",
            ),
            ("v1alpha1", "v1alpha2", "apiVersion"),
            ("oomScoreAdj: -999", "oomScoreAdj: -1001", "oomScoreAdj"),
        ] {
            assert!(KUBEADM.contains(from), "{from}");
            let text = KUBEADM.replacen(from, to, 1);
            let err = resolve_text(&text, Flags::default()).unwrap_err();
            assert!(err.contains(field), "{to:?}: {err}");
        }
        let err = resolve_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables: {masqueradeAll: yes please}\n", Flags::default()).unwrap_err();
        assert!(
            err.contains("masqueradeAll") || err.contains("nftables"),
            "{err}"
        );
    }

    #[test]
    fn mode_ipvs_takes_the_ipvs_section_and_its_flags() {
        let text = KUBEADM
            .replace("mode: nftables", "mode: ipvs")
            .replace("  scheduler: \"\"", "  scheduler: sh")
            .replace("  strictARP: false", "  strictARP: true");
        let s = resolve_text(&text, Flags::default()).unwrap();
        assert_eq!(
            s.node.mode,
            ProxyMode::Ipvs(IpvsSettings {
                scheduler: "sh".into(),
                strict_arp: true,
                exclude_cidrs: Vec::new(),
            })
        );
        let s = resolve_text(
            &text,
            Flags {
                ipvs_scheduler: Some("mh".into()),
                ..Flags::default()
            },
        )
        .unwrap();
        assert!(matches!(&s.node.mode, ProxyMode::Ipvs(i) if i.scheduler == "mh"));
        let err = resolve_text(
            &text,
            Flags {
                ipvs_scheduler: Some("fastest".into()),
                ..Flags::default()
            },
        )
        .unwrap_err();
        assert!(err.contains("--ipvs-scheduler"), "{err}");
        let s = resolve_text(
            KUBEADM,
            Flags {
                proxy_mode: Some("nftables".into()),
                ..Flags::default()
            },
        )
        .unwrap();
        assert_eq!(s.node.mode, ProxyMode::Nftables);
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1").is_err());
    }
}
