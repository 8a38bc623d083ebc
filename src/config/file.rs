//! The `KubeProxyConfiguration` file, field for field as kube-proxy's v1alpha1
//! schema has it, and the check that refuses what kube-nft does not implement.

use super::*;

// The file, field for field. `Option` everywhere: absent and null are the same.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct FileConfig {
    pub(super) api_version: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) feature_gates: Option<BTreeMap<String, bool>>,
    pub(super) client_connection: Option<ClientConnection>,
    pub(super) logging: Option<Logging>,
    pub(super) hostname_override: Option<String>,
    pub(super) bind_address: Option<String>,
    pub(super) healthz_bind_address: Option<String>,
    pub(super) metrics_bind_address: Option<String>,
    pub(super) bind_address_hard_fail: Option<bool>,
    pub(super) enable_profiling: Option<bool>,
    pub(super) show_hidden_metrics_for_version: Option<String>,
    pub(super) mode: Option<String>,
    pub(super) iptables: Option<IptablesSection>,
    pub(super) ipvs: Option<IpvsSection>,
    pub(super) nftables: Option<NftablesSection>,
    pub(super) winkernel: Option<WinkernelSection>,
    pub(super) detect_local_mode: Option<String>,
    pub(super) detect_local: Option<DetectLocalSection>,
    #[serde(rename = "clusterCIDR")]
    pub(super) cluster_cidr: Option<String>,
    pub(super) node_port_addresses: Option<Vec<String>>,
    pub(super) oom_score_adj: Option<i32>,
    pub(super) conntrack: Option<ConntrackSection>,
    pub(super) config_sync_period: Option<String>,
    pub(super) port_range: Option<String>,
    pub(super) windows_run_as_service: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ClientConnection {
    pub(super) kubeconfig: Option<String>,
    pub(super) accept_content_types: Option<String>,
    pub(super) content_type: Option<String>,
    pub(super) qps: Option<f64>,
    pub(super) burst: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Logging {
    pub(super) format: Option<String>,
    pub(super) flush_frequency: Option<serde_json::Value>,
    pub(super) verbosity: Option<u32>,
    pub(super) vmodule: Option<serde_json::Value>,
    pub(super) options: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct NftablesSection {
    pub(super) masquerade_bit: Option<i32>,
    pub(super) masquerade_all: Option<bool>,
    pub(super) sync_period: Option<String>,
    pub(super) min_sync_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct IptablesSection {
    pub(super) masquerade_bit: Option<i32>,
    pub(super) masquerade_all: Option<bool>,
    pub(super) localhost_node_ports: Option<bool>,
    #[serde(rename = "snatNodeInternalIP")]
    pub(super) snat_node_internal_ip: Option<bool>,
    pub(super) sync_period: Option<String>,
    pub(super) min_sync_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct IpvsSection {
    pub(super) sync_period: Option<String>,
    pub(super) min_sync_period: Option<String>,
    pub(super) scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub(super) exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub(super) strict_arp: Option<bool>,
    pub(super) tcp_timeout: Option<String>,
    pub(super) tcp_fin_timeout: Option<String>,
    pub(super) udp_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WinkernelSection {
    pub(super) network_name: Option<String>,
    pub(super) source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub(super) enable_dsr: Option<bool>,
    pub(super) root_hns_endpoint_name: Option<String>,
    pub(super) forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct DetectLocalSection {
    pub(super) bridge_interface: Option<String>,
    pub(super) interface_name_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ConntrackSection {
    pub(super) max_per_core: Option<i32>,
    pub(super) min: Option<i32>,
    pub(super) tcp_established_timeout: Option<String>,
    pub(super) tcp_close_wait_timeout: Option<String>,
    pub(super) tcp_be_liberal: Option<bool>,
    pub(super) udp_timeout: Option<String>,
    pub(super) udp_stream_timeout: Option<String>,
}

impl FileConfig {
    pub(super) fn parse(text: &str, origin: &Path) -> Result<FileConfig, String> {
        let file: FileConfig = serde_saphyr::from_str(text).map_err(|e| {
            // The line at fault, so that the message names the field.
            let line = e
                .location()
                .and_then(|l| text.lines().nth((l.line() as usize).checked_sub(1)?))
                .map(|l| format!(" (`{}`)", l.trim()))
                .unwrap_or_default();
            format!(
                "{}: {}{line}",
                origin.display(),
                crate::source::files::yaml_error(&e)
            )
        })?;
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
            "kube-nft logs a port it cannot bind and tries it again every 5 s (kube-proxy's default)",
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
        // configSyncPeriod is the informers' resync; watches need none.
        duration_field("configSyncPeriod", &self.config_sync_period)?;
        must_be_unset(
            "portRange",
            &self.port_range,
            "it was the userspace proxy's, which is gone",
        )?;
        check_oom_score_adj("oomScoreAdj", self.oom_score_adj)
    }
}

impl ConntrackSection {
    /// The flags over the file over kube-proxy's defaults. In the file, absent
    /// or null is the default and `0`/`0s` leaves the kernel's value.
    pub(super) fn settings(&self, flags: &ConntrackFlags) -> Result<ConntrackSettings, String> {
        let d = ConntrackSettings::default();
        let count =
            |field: &str, flag: Option<u32>, file: Option<i32>, default: u32| match (flag, file) {
                (Some(n), _) => Ok(n),
                (None, Some(n)) => {
                    u32::try_from(n).map_err(|_| format!("{field}: {n} must be 0 or more"))
                }
                (None, None) => Ok(default),
            };
        let duration =
            |field: &str, flag: Option<Duration>, file: &Option<String>, default: Duration| match (
                flag,
                file.as_deref().filter(|t| !t.is_empty()),
            ) {
                (Some(d), _) => Ok(d),
                (None, Some(text)) => parse_duration(text).map_err(|e| format!("{field}: {e}")),
                (None, None) => Ok(default),
            };
        Ok(ConntrackSettings {
            max_per_core: count(
                "conntrack.maxPerCore",
                flags.max_per_core,
                self.max_per_core,
                d.max_per_core,
            )?,
            min: count("conntrack.min", flags.min, self.min, d.min)?,
            tcp_established_timeout: duration(
                "conntrack.tcpEstablishedTimeout",
                flags.tcp_established_timeout,
                &self.tcp_established_timeout,
                d.tcp_established_timeout,
            )?,
            tcp_close_wait_timeout: duration(
                "conntrack.tcpCloseWaitTimeout",
                flags.tcp_close_wait_timeout,
                &self.tcp_close_wait_timeout,
                d.tcp_close_wait_timeout,
            )?,
            tcp_be_liberal: flags
                .tcp_be_liberal
                .or(self.tcp_be_liberal)
                .unwrap_or(d.tcp_be_liberal),
            udp_timeout: duration(
                "conntrack.udpTimeout",
                flags.udp_timeout,
                &self.udp_timeout,
                d.udp_timeout,
            )?,
            udp_stream_timeout: duration(
                "conntrack.udpStreamTimeout",
                flags.udp_stream_timeout,
                &self.udp_stream_timeout,
                d.udp_stream_timeout,
            )?,
        })
    }
}
