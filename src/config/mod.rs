//! kube-proxy's configuration: its flags and its `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`) file, resolved into what `run` needs.
//!
//! A flag given on the command line wins over the file, and the file over the
//! defaults (kube-proxy's nftables defaults). Every field of the v1alpha1 schema
//! (kube-proxy 1.37's) is known here: a field we implement is used; one we have
//! no use for is accepted, with a warning unless it is at its zero value (kubeadm
//! writes them all); one asking for what kube-nft does not do stops the start
//! with a message naming it. A field the schema does not have (a newer
//! kube-proxy's, or a typo) is warned about by name and ignored, as kube-proxy's
//! lenient decoding does. A setting both the file and a flag carry is treated
//! alike in both (`IGNORED`, and the checks both call).

pub use crate::core::duration::{go_duration, parse_duration};
use crate::core::node_config::check_scheduler;
use crate::core::node_config::{
    FastPath, IpvsSettings, IpvsTimeouts, ModeName, NodeConfig, NodePortAddresses, ProxyMode,
    DEFAULT_MASQUERADE_BIT,
};
use crate::source::kubernetes::Connection;
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod file;
pub mod kube_proxy_flags;
use file::FileConfig;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const DEFAULT_HEALTHZ_BIND_ADDRESS: &str = "0.0.0.0:10256";
pub const DEFAULT_METRICS_BIND_ADDRESS: &str = "127.0.0.1:10249";
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);

/// `run`'s own flags, with kube-proxy's names and meanings; `None` means not
/// given (the config file's value or the default then holds). The rest of
/// kube-proxy's flags are `kube_proxy_flags::KubeProxyFlags`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Flags {
    /// A KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Read Services and EndpointSlices from manifests instead of an API server.
    #[arg(long, num_args = 1..)]
    pub manifests: Vec<PathBuf>,
    /// The kubeconfig to reach the API server with (default: the in-cluster config;
    /// as kube-proxy, neither $KUBECONFIG nor ~/.kube/config is read).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL (overrides the kubeconfig's).
    #[arg(long)]
    pub master: Option<String>,
    /// This node's name, if not its hostname.
    #[arg(long, visible_alias = "node-name")]
    pub hostname_override: Option<String>,
    /// `nftables` (the default) or `ipvs` (IPVS balances; nftables does the rest).
    #[arg(long, visible_alias = "backend")]
    pub proxy_mode: Option<ModeName>,
    /// The IPVS scheduler for Services without the `kube-nft.io/ipvs-scheduler`
    /// annotation (default rr).
    #[arg(long)]
    pub ipvs_scheduler: Option<String>,
    /// Answer ARP only for addresses on the interface asked (arp_ignore=1, arp_announce=2).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub ipvs_strict_arp: Option<bool>,
    /// Virtual services in these CIDRs belong to someone else: never touched.
    #[arg(long, value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Option<Vec<IpNet>>,
    /// IPVS's idle timeout for established TCP connections, for the whole
    /// node (0: the kernel's, 900s unless changed).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub ipvs_tcp_timeout: Option<Duration>,
    /// IPVS's timeout for TCP connections after a FIN (0: the kernel's, 120s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub ipvs_tcpfin_timeout: Option<Duration>,
    /// IPVS's timeout for UDP flows (0: the kernel's, 300s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub ipvs_udp_timeout: Option<Duration>,
    /// Pod CIDRs (comma-separated, one per family): traffic from outside them to a
    /// ClusterIP is masqueraded.
    #[arg(long, value_delimiter = ',')]
    pub cluster_cidr: Option<Vec<IpNet>>,
    /// Service CIDRs (any number per family): unallocated addresses in them are
    /// dropped. Default: every ServiceCIDR object of the cluster, kept current.
    #[arg(long, value_delimiter = ',')]
    pub service_cidr: Option<Vec<IpNet>>,
    /// Where NodePorts are served: `primary` (default), `all`, or CIDRs selecting
    /// this node's addresses.
    #[arg(long)]
    pub nodeport_addresses: Option<String>,
    /// Masquerade every connection to a ClusterIP.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub masquerade_all: Option<bool>,
    /// The bit of the packet mark that requests masquerade (default 14: 0x4000).
    #[arg(long)]
    pub masquerade_bit: Option<u8>,
    /// What is traffic from a pod: ClusterCIDR (default) or NodeCIDR.
    #[arg(long)]
    pub detect_local_mode: Option<String>,
    /// HOST:PORT of /healthz and /livez (default 0.0.0.0:10256; empty: off).
    #[arg(long)]
    pub healthz_bind_address: Option<String>,
    /// HOST:PORT of /metrics (default 127.0.0.1:10249; empty: off).
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
    /// How often the whole table is read back and repaired (default 30s).
    #[arg(long, value_parser = parse_duration)]
    pub sync_period: Option<Duration>,
    /// The least time between syncs; changes within it go out together (default 1s).
    #[arg(long, value_parser = parse_duration)]
    pub min_sync_period: Option<Duration>,
    /// How often the kernel is verified against the whole state while drift
    /// is watched (default 1h, as kube-proxy's full sync; the tests shorten it).
    #[arg(long, value_parser = parse_duration, hide = true)]
    pub verification_period: Option<Duration>,
    /// kube-proxy's `--oom-score-adj` (set through `KubeProxyFlags`).
    #[arg(skip)]
    pub oom_score_adj: Option<i32>,
    /// kube-proxy's `--logging-format` (set through `KubeProxyFlags`).
    #[arg(skip)]
    pub log_format: Option<String>,
    /// kube-proxy's `--v` (set through `KubeProxyFlags`).
    #[arg(skip)]
    pub verbosity: Option<u8>,
    #[command(flatten)]
    pub conntrack: ConntrackFlags,
    /// Count every Service port's packets and bytes (see `kube-nft top`).
    #[arg(long)]
    pub counters: bool,
    /// Whose established flows a flowtable offloads: Services annotated
    /// kube-nft.io/traffic-hint=LongLived, all, or none (off). Needs a kernel
    /// with flowtables; without one, long-lived is off and all refuses to start.
    #[arg(long, value_enum, default_value = "long-lived", value_name = "WHOSE")]
    pub fast_path: FastPath,
}

/// kube-proxy's `--conntrack-*` flags (`conntrack_sysctls`); `None` where not
/// given.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ConntrackFlags {
    /// Entries per CPU for nf_conntrack_max (default 32768; 0 leaves it and
    /// ignores --conntrack-min).
    #[arg(long = "conntrack-max-per-core", value_name = "N")]
    pub max_per_core: Option<u32>,
    /// The least nf_conntrack_max, whatever the CPU count (default 131072).
    #[arg(long = "conntrack-min", value_name = "N")]
    pub min: Option<u32>,
    /// Idle timeout of established TCP connections (default 24h; 0 leaves it).
    #[arg(long = "conntrack-tcp-timeout-established", value_parser = parse_duration, value_name = "DURATION")]
    pub tcp_established_timeout: Option<Duration>,
    /// Idle timeout of TCP connections in CLOSE_WAIT (default 1h; 0 leaves it).
    #[arg(long = "conntrack-tcp-timeout-close-wait", value_parser = parse_duration, value_name = "DURATION")]
    pub tcp_close_wait_timeout: Option<Duration>,
    /// Sets nf_conntrack_tcp_be_liberal to 1.
    #[arg(long = "conntrack-tcp-be-liberal", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub tcp_be_liberal: Option<bool>,
    /// Idle timeout of UDP flows not yet answered (default 0: leave it).
    #[arg(long = "conntrack-udp-timeout", value_parser = parse_duration, value_name = "DURATION")]
    pub udp_timeout: Option<Duration>,
    /// Idle timeout of answered UDP flows (default 0: leave it).
    #[arg(long = "conntrack-udp-timeout-stream", value_parser = parse_duration, value_name = "DURATION")]
    pub udp_stream_timeout: Option<Duration>,
}

/// kube-proxy caps the scaled maximum here, whatever `min` says.
const MAX_LIMIT: u32 = 1 << 20;

/// The conntrack sysctls to set at start (`node::conntrack_sysctls` sets them),
/// from the `--conntrack-*` flags over the file's `conntrack` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Entries per CPU; 0 leaves `nf_conntrack_max` (and `min`) alone.
    pub max_per_core: u32,
    /// The least `nf_conntrack_max`, whatever the CPU count.
    pub min: u32,
    /// Each timeout: zero leaves the kernel's value.
    pub tcp_established_timeout: Duration,
    pub tcp_close_wait_timeout: Duration,
    /// Set to 1 when true; never written back to 0.
    pub tcp_be_liberal: bool,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

/// kube-proxy's defaults (`pkg/proxy/apis/config/v1alpha1/defaults.go`).
impl Default for ConntrackSettings {
    fn default() -> Self {
        ConntrackSettings {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

impl ConntrackSettings {
    /// `nf_conntrack_max` for this many CPUs, or `None` to leave it.
    pub fn max(&self, cpus: u32) -> Option<u32> {
        if self.max_per_core == 0 {
            return None;
        }
        let scaled = u64::from(self.max_per_core) * u64::from(cpus);
        Some(if scaled > u64::from(MAX_LIMIT) {
            MAX_LIMIT
        } else {
            (scaled as u32).max(self.min)
        })
    }
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

/// How `run` logs: kube-proxy's `--logging-format`/`logging.format` and
/// `--v`/`logging.verbosity`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogSettings {
    pub json: bool,
    pub verbosity: u8,
}

/// Everything `run` needs, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub logging: LogSettings,
    /// What was accepted and ignored, each said once when logging starts.
    pub warnings: Vec<String>,
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
    /// `--verification-period`, where given.
    pub verification_period: Option<Duration>,
    pub oom_score_adj: Option<i32>,
    /// The conntrack sysctls to set at start.
    pub conntrack: ConntrackSettings,
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

/// The config file's `mode` (`--proxy-mode` is checked by clap). Empty is
/// kube-proxy's default, iptables.
fn file_mode(mode: &str) -> Result<ModeName, String> {
    if mode.is_empty() {
        return Ok(ModeName::Iptables);
    }
    <ModeName as clap::ValueEnum>::from_str(mode, false).map_err(|_| {
        format!(
            "mode: {mode:?} is not supported by kube-nft ({})",
            ModeName::names().join(", ")
        )
    })
}

/// The settings kube-proxy reads from the section of its mode (its v1alpha1
/// conversion): masqueradeAll and the sync periods from the mode's own section,
/// the masquerade bit from nftables' in nftables mode and from iptables'
/// otherwise (IPVS marks with it too).
struct ModeSection<'a> {
    name: &'static str,
    masquerade_all: Option<bool>,
    masquerade_bit: (&'static str, Option<i32>),
    sync_period: &'a Option<String>,
    min_sync_period: &'a Option<String>,
}

impl<'a> ModeSection<'a> {
    fn of(
        mode: ModeName,
        nft: &'a file::NftablesSection,
        ipt: &'a file::IptablesSection,
        ipvs: &'a file::IpvsSection,
    ) -> ModeSection<'a> {
        let ipt_bit = ("iptables.masqueradeBit", ipt.masquerade_bit);
        match mode {
            ModeName::Nftables => ModeSection {
                name: "nftables",
                masquerade_all: nft.masquerade_all,
                masquerade_bit: ("nftables.masqueradeBit", nft.masquerade_bit),
                sync_period: &nft.sync_period,
                min_sync_period: &nft.min_sync_period,
            },
            ModeName::Iptables => ModeSection {
                name: "iptables",
                masquerade_all: ipt.masquerade_all,
                masquerade_bit: ipt_bit,
                sync_period: &ipt.sync_period,
                min_sync_period: &ipt.min_sync_period,
            },
            ModeName::Ipvs => ModeSection {
                name: "ipvs",
                masquerade_all: ipt.masquerade_all,
                masquerade_bit: ipt_bit,
                sync_period: &ipvs.sync_period,
                min_sync_period: &ipvs.min_sync_period,
            },
        }
    }

    /// The fields of the other sections that are set, and so ignored.
    fn unread(
        &self,
        nft: &file::NftablesSection,
        ipt: &file::IptablesSection,
    ) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        let sections = [
            (
                "nftables",
                nft.masquerade_all,
                nft.masquerade_bit,
                &nft.sync_period,
                &nft.min_sync_period,
            ),
            (
                "iptables",
                ipt.masquerade_all,
                ipt.masquerade_bit,
                &ipt.sync_period,
                &ipt.min_sync_period,
            ),
        ];
        for (section, all, bit, sync, min_sync) in sections {
            let field = |f: &str| format!("{section}.{f}");
            let read_all = self.name == section || (section == "iptables" && self.name == "ipvs");
            let read_bit = self.masquerade_bit.0 == field("masqueradeBit");
            let set = [
                ("masqueradeAll", all == Some(true) && !read_all),
                ("masqueradeBit", bit.is_some() && !read_bit),
                (
                    "syncPeriod",
                    self.name != section && duration_field(&field("syncPeriod"), sync)?.is_some(),
                ),
                (
                    "minSyncPeriod",
                    self.name != section
                        && duration_field(&field("minSyncPeriod"), min_sync)?.is_some(),
                ),
            ];
            out.extend(set.into_iter().filter(|(_, set)| *set).map(|(f, _)| {
                format!(
                    "{} is accepted and ignored: kube-proxy reads it only in {section} mode, and the mode is {}",
                    field(f),
                    self.name
                )
            }));
        }
        Ok(out)
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

/// kube-proxy's settings that kube-nft accepts and ignores: the file's field,
/// the flag, and one reason for both, so that both warn alike.
const IGNORED: &[(&str, &str, &str)] = &[
    (
        "featureGates",
        "--feature-gates",
        "kube-nft has no feature gates: what kube-proxy's gate is either always on or not built (docs/OPERATIONS.md)",
    ),
    (
        "clientConnection.contentType",
        "--kube-api-content-type",
        "kube-nft lists Services and EndpointSlices in protobuf (JSON where the server cannot) and reads everything else in JSON",
    ),
    (
        "clientConnection.acceptContentTypes",
        "",
        "kube-nft lists Services and EndpointSlices in protobuf (JSON where the server cannot) and reads everything else in JSON",
    ),
    (
        "clientConnection.qps",
        "--kube-api-qps",
        "kube-nft's watches ask the API server little and are not throttled",
    ),
    (
        "clientConnection.burst",
        "--kube-api-burst",
        "kube-nft's watches ask the API server little and are not throttled",
    ),
    (
        "logging.vmodule",
        "--vmodule",
        "kube-nft has no per-file verbosity",
    ),
    (
        "bindAddressHardFail",
        "--bind-address-hard-fail",
        "a port that cannot be bound is logged and tried again every 5 s",
    ),
    (
        "enableProfiling",
        "--profiling",
        "kube-nft serves no profiling endpoint",
    ),
    (
        "showHiddenMetricsForVersion",
        "--show-hidden-metrics-for-version",
        "kube-nft hides no metrics",
    ),
    (
        "iptables.localhostNodePorts",
        "--iptables-localhost-nodeports",
        "NodePorts are never served on loopback (as in kube-proxy's nftables mode)",
    ),
    (
        "nodePortAddresses: localhost",
        "--nodeport-addresses localhost",
        "NodePorts are never served on loopback (kube-proxy's nftables mode serves TCP there only behind its alpha gate KubeProxyNFTablesLocalhostNodePorts)",
    ),
    (
        "configSyncPeriod",
        "--config-sync-period",
        "the watches keep the model current without a periodic relist",
    ),
    (
        "portRange",
        "",
        "it was the userspace proxy's, which is gone",
    ),
    ("winkernel", "", "it is a Windows option"),
    ("windowsRunAsService", "", "it is a Windows option"),
    (
        "detectLocal",
        "",
        "it is read only in the detect-local modes BridgeInterface and InterfaceNamePrefix, which kube-nft does not build",
    ),
    ("", "--boot-id-file", "kube-nft does not read boot ids"),
    ("", "--machine-id-file", "kube-nft does not read machine ids"),
];

/// The warning for an ignored setting, by its field or its flag (`IGNORED`).
fn ignored(name: &str) -> String {
    let why = IGNORED
        .iter()
        .find(|(field, flag, _)| *field == name || *flag == name)
        .map_or("kube-nft has no use for it", |(_, _, why)| why);
    format!("{name} is kube-proxy's, accepted and ignored: {why}")
}

/// `logging.format` / `--logging-format`: whether it asks for JSON.
fn log_format(format: Option<&str>, field: &str) -> Result<bool, String> {
    match format.unwrap_or_default() {
        "" | "text" => Ok(false),
        "json" => Ok(true),
        other => Err(format!("{field}: {other:?} is not text or json")),
    }
}

/// kube-proxy's alpha split-stream options (`--log-*-split-stream`,
/// `--log-*-info-buffer-size`, and the file's `logging.options`): refused
/// unless they ask for nothing, since kube-nft writes each line to stderr at once.
fn split_stream(field: &str, value: Option<&str>) -> Result<(), String> {
    match value {
        Some(v) if !is_noop(v) => Err(format!(
            "{field}: not supported by kube-nft (logs go to stderr, unbuffered), given {v}"
        )),
        _ => Ok(()),
    }
}

/// A value that asks for nothing: zero, a zero duration, or false.
fn is_noop(value: &str) -> bool {
    matches!(value.trim(), "" | "0" | "false") || parse_duration(value).is_ok_and(|d| d.is_zero())
}

/// `bindAddress` / `--bind-address`: only the unspecified addresses, which
/// leave the node's IPs to its Node object, as kube-nft always does.
fn check_bind_address(field: &str, value: Option<&str>) -> Result<(), String> {
    match value.unwrap_or_default() {
        "" | "0.0.0.0" | "::" => Ok(()),
        other => Err(format!(
            "{field}: {other:?}: overriding the node's primary IP is not supported (the node's addresses come from its Node object); leave it unset"
        )),
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

fn whole_secs(flag: Option<Duration>, file: Option<Duration>) -> u32 {
    flag.or(file)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
}

fn masquerade_bit(field: &str, bit: Option<i32>) -> Result<Option<u8>, String> {
    match bit {
        None => Ok(None),
        Some(b) if (0..=31).contains(&b) => Ok(Some(b as u8)),
        Some(b) => Err(format!("{field}: {b} is not in 0..=31")),
    }
}

/// An OOM score adjustment, as the kernel takes it (the flag's and the file's).
fn check_oom_score_adj(field: &str, adj: Option<i32>) -> Result<(), String> {
    match adj {
        Some(a) if !(-1000..=1000).contains(&a) => {
            Err(format!("{field}: {a} is not in -1000..=1000"))
        }
        _ => Ok(()),
    }
}

/// Reads the file (if any) and merges it with the flags. An error about a value
/// from the file names the file; one about a flag names the flag.
pub fn resolve(flags: &Flags) -> Result<Settings, String> {
    resolve_flags_and_file(flags).map_err(|e| match &flags.config {
        Some(path) if !e.starts_with("--") && !e.starts_with(&path.display().to_string()) => {
            format!("{}: {e}", path.display())
        }
        _ => e,
    })
}

fn resolve_flags_and_file(flags: &Flags) -> Result<Settings, String> {
    let file = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--config {}: {e}", path.display()))?;
            FileConfig::parse(&text, path)?
        }
        // No file: kube-nft's own default mode (a file without one means
        // kube-proxy's, iptables).
        None => FileConfig {
            mode: Some("nftables".into()),
            ..FileConfig::default()
        },
    };
    resolve_with_file(flags, file)
}

/// The settings `flags` and a config file's `text` give, as `run --config`
/// reads them (the file's path only names it in errors).
pub fn resolve_text(flags: &Flags, text: &str, origin: &Path) -> Result<Settings, String> {
    resolve_with_file(flags, FileConfig::parse(text, origin)?)
}

fn resolve_with_file(flags: &Flags, file: FileConfig) -> Result<Settings, String> {
    let mut warnings = file.check()?;
    let mode = match flags.proxy_mode {
        Some(mode) => mode,
        None => file_mode(file.mode.as_deref().unwrap_or_default())?,
    };
    let ipvs_mode = mode == ModeName::Ipvs;
    let nft = file.nftables.unwrap_or_default();
    let ipt = file.iptables.unwrap_or_default();
    let ipvs = file.ipvs.unwrap_or_default();
    let section = ModeSection::of(mode, &nft, &ipt, &ipvs);
    warnings.extend(section.unread(&nft, &ipt)?);
    if mode == ModeName::Iptables {
        warnings.push(format!(
            "mode iptables{}: kube-nft runs nftables in its place, with the iptables section's settings, as kube-proxy's nftables mode would{}",
            if file.mode.as_deref().unwrap_or_default().is_empty() && flags.proxy_mode.is_none() {
                " (kube-proxy's default, as the mode is empty)"
            } else {
                ""
            },
            if flags.nodeport_addresses.is_none() && file.node_port_addresses.is_none() {
                "; NodePorts are served on the node's primary IPs, where kube-proxy's iptables mode served every address (set nodePortAddresses: [all] to keep that; docs/OPERATIONS.md)"
            } else {
                ""
            }
        ));
    }
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
    let (nodeport_addresses, loopback) =
        match (&flags.nodeport_addresses, &file.node_port_addresses) {
            (Some(text), _) => (
                nodeport_addresses(text, "--nodeport-addresses")?,
                "--nodeport-addresses localhost",
            ),
            (None, Some(list)) => (
                nodeport_addresses(&list.join(","), "nodePortAddresses")?,
                "nodePortAddresses: localhost",
            ),
            (None, None) => (NodePortAddresses::default(), ""),
        };
    if nodeport_addresses.localhost {
        warnings.push(ignored(loopback));
    }
    let logging = LogSettings {
        json: match &flags.log_format {
            Some(f) => log_format(Some(f), "--logging-format")?,
            None => log_format(
                file.logging.as_ref().and_then(|l| l.format.as_deref()),
                "logging.format",
            )?,
        },
        verbosity: flags
            .verbosity
            .or(file.logging.as_ref().and_then(|l| l.verbosity))
            .unwrap_or(0),
    };
    let masquerade_bit = match flags.masquerade_bit {
        Some(b) => b,
        None => masquerade_bit(section.masquerade_bit.0, section.masquerade_bit.1)?
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
        fast_path: flags.fast_path,
        masquerade_all: flags
            .masquerade_all
            .or(section.masquerade_all)
            .unwrap_or(false),
        mode: if ipvs_mode {
            ProxyMode::Ipvs(IpvsSettings {
                scheduler: flags
                    .ipvs_scheduler
                    .clone()
                    .or_else(|| non_empty(&ipvs.scheduler))
                    .unwrap_or_else(|| IpvsSettings::default().scheduler),
                strict_arp: flags.ipvs_strict_arp.or(ipvs.strict_arp).unwrap_or(false),
                // A flag over the file; whole seconds, as kube-proxy (which
                // truncates), 0 leaving the kernel's value.
                timeouts: IpvsTimeouts {
                    tcp: whole_secs(
                        flags.ipvs_tcp_timeout,
                        duration_field("ipvs.tcpTimeout", &ipvs.tcp_timeout)?,
                    ),
                    tcp_fin: whole_secs(
                        flags.ipvs_tcpfin_timeout,
                        duration_field("ipvs.tcpFinTimeout", &ipvs.tcp_fin_timeout)?,
                    ),
                    udp: whole_secs(
                        flags.ipvs_udp_timeout,
                        duration_field("ipvs.udpTimeout", &ipvs.udp_timeout)?,
                    ),
                },
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
        service_tables: None,
    };
    node.validate().map_err(|e| e.to_string())?;
    if detect_local == DetectLocal::ClusterCidr && node.cluster_cidrs.is_empty() {
        warnings.push(
            "no cluster CIDR (--cluster-cidr or clusterCIDR): traffic from pods to ClusterIPs is not told from other traffic".into(),
        );
    }
    Ok(Settings {
        logging,
        warnings,
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
            None => duration_field(&format!("{}.syncPeriod", section.name), section.sync_period)?
                .unwrap_or(DEFAULT_SYNC_PERIOD),
        },
        min_sync_period: match flags.min_sync_period {
            Some(d) => d,
            None => duration_field(
                &format!("{}.minSyncPeriod", section.name),
                section.min_sync_period,
            )?
            .unwrap_or(DEFAULT_MIN_SYNC_PERIOD),
        },
        verification_period: flags.verification_period,
        oom_score_adj: flags.oom_score_adj.or(file.oom_score_adj),
        conntrack: file
            .conntrack
            .unwrap_or_default()
            .settings(&flags.conntrack)?,
    })
}

#[cfg(test)]
mod tests;
