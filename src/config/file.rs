//! The `KubeProxyConfiguration` file, field for field as kube-proxy's v1alpha1
//! schema has it, and the check that refuses what kube-nft does not implement.

use super::*;

// The file, field for field. `Option` everywhere: absent and null are the same.

type Unknown = BTreeMap<String, serde_json::Value>;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ClientConnection {
    pub(super) kubeconfig: Option<String>,
    pub(super) accept_content_types: Option<String>,
    pub(super) content_type: Option<String>,
    pub(super) qps: Option<f64>,
    pub(super) burst: Option<i64>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Logging {
    pub(super) format: Option<String>,
    /// Accepted and ignored: kube-nft writes each line at once, unbuffered.
    #[serde(rename = "flushFrequency")]
    pub(super) _flush_frequency: Option<serde_json::Value>,
    pub(super) verbosity: Option<u8>,
    pub(super) vmodule: Option<serde_json::Value>,
    pub(super) options: Option<LoggingOptions>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LoggingOptions {
    pub(super) text: Option<StreamOptions>,
    pub(super) json: Option<StreamOptions>,
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

/// kube-proxy's alpha split-stream options, per format.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StreamOptions {
    pub(super) split_stream: Option<bool>,
    /// A quantity: `"0"`, `0` or `"64Ki"`.
    pub(super) info_buffer_size: Option<serde_json::Value>,
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NftablesSection {
    pub(super) masquerade_bit: Option<i32>,
    pub(super) masquerade_all: Option<bool>,
    pub(super) sync_period: Option<String>,
    pub(super) min_sync_period: Option<String>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct IptablesSection {
    pub(super) masquerade_bit: Option<i32>,
    pub(super) masquerade_all: Option<bool>,
    pub(super) localhost_node_ports: Option<bool>,
    #[serde(rename = "snatNodeInternalIP")]
    pub(super) snat_node_internal_ip: Option<bool>,
    pub(super) sync_period: Option<String>,
    pub(super) min_sync_period: Option<String>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WinkernelSection {
    pub(super) network_name: Option<String>,
    pub(super) source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub(super) enable_dsr: Option<bool>,
    pub(super) root_hns_endpoint_name: Option<String>,
    pub(super) forward_health_check_vip: Option<bool>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DetectLocalSection {
    pub(super) bridge_interface: Option<String>,
    pub(super) interface_name_prefix: Option<String>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConntrackSection {
    pub(super) max_per_core: Option<i32>,
    pub(super) min: Option<i32>,
    pub(super) tcp_established_timeout: Option<String>,
    pub(super) tcp_close_wait_timeout: Option<String>,
    pub(super) tcp_be_liberal: Option<bool>,
    pub(super) udp_timeout: Option<String>,
    pub(super) udp_stream_timeout: Option<String>,
    /// Fields this schema does not have (a newer kube-proxy's, or a typo).
    #[serde(flatten)]
    pub(super) unknown: Unknown,
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
        Ok(file)
    }

    /// Checks what the resolver does not read: a value kube-nft cannot honour
    /// is an error naming its field; one it has no use for, and a field the
    /// schema does not have (kube-proxy decodes v1alpha1 leniently too), is a
    /// warning. kubeadm writes every field at its zero value, which says nothing.
    pub(super) fn check(&self) -> Result<Vec<String>, String> {
        let mut ignored_here: Vec<&str> = Vec::new();
        let mut warn_if = |set: bool, name: &'static str| {
            if set {
                ignored_here.push(name);
            }
        };
        let mut warnings = Vec::new();
        let text_set = |v: &Option<String>| v.as_deref().is_some_and(|t| !t.is_empty());
        let duration_set = |field: &str, v: &Option<String>| -> Result<bool, String> {
            Ok(duration_field(field, v)?.is_some())
        };
        if let Some(gates) = self.feature_gates.as_ref().filter(|g| !g.is_empty()) {
            let named: Vec<String> = gates.iter().map(|(g, on)| format!("{g}={on}")).collect();
            warnings.push(format!("{} ({})", ignored("featureGates"), named.join(",")));
        }
        if let Some(c) = &self.client_connection {
            warn_if(
                text_set(&c.accept_content_types),
                "clientConnection.acceptContentTypes",
            );
            warn_if(text_set(&c.content_type), "clientConnection.contentType");
            warn_if(c.qps.is_some_and(|q| q != 0.0), "clientConnection.qps");
            warn_if(c.burst.is_some_and(|b| b != 0), "clientConnection.burst");
        }
        if let Some(l) = &self.logging {
            log_format(l.format.as_deref(), "logging.format")?;
            let vmodule_set = l.vmodule.as_ref().is_some_and(|v| match v {
                serde_json::Value::Null => false,
                serde_json::Value::String(s) => !s.is_empty(),
                serde_json::Value::Array(a) => !a.is_empty(),
                serde_json::Value::Object(o) => !o.is_empty(),
                _ => true,
            });
            warn_if(vmodule_set, "logging.vmodule");
            let options = l.options.as_ref();
            for (format, o) in [
                ("text", options.and_then(|o| o.text.as_ref())),
                ("json", options.and_then(|o| o.json.as_ref())),
            ] {
                let Some(o) = o else { continue };
                let size = match &o.info_buffer_size {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(other) => Some(other.to_string()),
                };
                split_stream(
                    &format!("logging.options.{format}.splitStream"),
                    o.split_stream.map(|b| b.to_string()).as_deref(),
                )?;
                split_stream(
                    &format!("logging.options.{format}.infoBufferSize"),
                    size.as_deref(),
                )?;
            }
        }
        check_bind_address("bindAddress", self.bind_address.as_deref())?;
        warn_if(
            self.bind_address_hard_fail == Some(true),
            "bindAddressHardFail",
        );
        warn_if(self.enable_profiling == Some(true), "enableProfiling");
        warn_if(
            text_set(&self.show_hidden_metrics_for_version),
            "showHiddenMetricsForVersion",
        );
        if let Some(i) = &self.iptables {
            masquerade_bit("iptables.masqueradeBit", i.masquerade_bit)?;
            warn_if(
                i.snat_node_internal_ip == Some(true),
                "iptables.snatNodeInternalIP",
            );
            warn_if(
                i.localhost_node_ports == Some(true),
                "iptables.localhostNodePorts",
            );
        }
        if let Some(v) = &self.ipvs {
            // Checked now so that a file written for the IPVS backend is right
            // before that backend exists; only used in mode ipvs.
            duration_field("ipvs.syncPeriod", &v.sync_period)?;
            duration_field("ipvs.minSyncPeriod", &v.min_sync_period)?;
            duration_field("ipvs.tcpTimeout", &v.tcp_timeout)?;
            duration_field("ipvs.tcpFinTimeout", &v.tcp_fin_timeout)?;
            duration_field("ipvs.udpTimeout", &v.udp_timeout)?;
            if let Some(s) = v.scheduler.as_deref().filter(|s| !s.is_empty()) {
                check_scheduler(s).map_err(|e| format!("ipvs.scheduler: {e}"))?;
            }
            for (i, c) in v.exclude_cidrs.iter().flatten().enumerate() {
                cidr_list(c, &format!("ipvs.excludeCIDRs[{i}]"))?;
            }
        }
        if let Some(w) = &self.winkernel {
            let set = text_set(&w.network_name)
                || text_set(&w.source_vip)
                || text_set(&w.root_hns_endpoint_name)
                || w.enable_dsr == Some(true)
                || w.forward_health_check_vip == Some(true);
            warn_if(set, "winkernel");
        }
        warn_if(
            self.windows_run_as_service == Some(true),
            "windowsRunAsService",
        );
        if let Some(d) = &self.detect_local {
            // Read only in the detect-local modes kube-nft refuses (detectLocalMode).
            warn_if(
                text_set(&d.bridge_interface) || text_set(&d.interface_name_prefix),
                "detectLocal",
            );
        }
        warn_if(
            duration_set("configSyncPeriod", &self.config_sync_period)?,
            "configSyncPeriod",
        );
        warn_if(text_set(&self.port_range), "portRange");
        check_oom_score_adj("oomScoreAdj", self.oom_score_adj)?;
        warnings.extend(ignored_here.into_iter().map(ignored));
        warnings.extend(self.unknown_fields().into_iter().map(|field| {
            format!("{field}: not a field of {API_VERSION} as kube-nft knows it (kube-proxy 1.37); ignored")
        }));
        Ok(warnings)
    }

    /// Every field the schema does not have, by its path.
    fn unknown_fields(&self) -> Vec<String> {
        fn under<'a>(prefix: &str, unknown: &'a Unknown) -> impl Iterator<Item = String> + 'a {
            let prefix = prefix.to_string();
            unknown.keys().map(move |k| format!("{prefix}{k}"))
        }
        let mut out: Vec<String> = under("", &self.unknown).collect();
        let sections: [(&str, Option<&Unknown>); 9] = [
            (
                "clientConnection.",
                self.client_connection.as_ref().map(|s| &s.unknown),
            ),
            ("logging.", self.logging.as_ref().map(|s| &s.unknown)),
            ("iptables.", self.iptables.as_ref().map(|s| &s.unknown)),
            ("ipvs.", self.ipvs.as_ref().map(|s| &s.unknown)),
            ("nftables.", self.nftables.as_ref().map(|s| &s.unknown)),
            ("winkernel.", self.winkernel.as_ref().map(|s| &s.unknown)),
            (
                "detectLocal.",
                self.detect_local.as_ref().map(|s| &s.unknown),
            ),
            ("conntrack.", self.conntrack.as_ref().map(|s| &s.unknown)),
            (
                "logging.options.",
                self.logging
                    .as_ref()
                    .and_then(|l| l.options.as_ref())
                    .map(|o| &o.unknown),
            ),
        ];
        for (prefix, unknown) in sections {
            out.extend(unknown.into_iter().flat_map(|u| under(prefix, u)));
        }
        let options = self.logging.as_ref().and_then(|l| l.options.as_ref());
        for (prefix, o) in [
            (
                "logging.options.text.",
                options.and_then(|o| o.text.as_ref()),
            ),
            (
                "logging.options.json.",
                options.and_then(|o| o.json.as_ref()),
            ),
        ] {
            out.extend(o.into_iter().flat_map(|o| under(prefix, &o.unknown)));
        }
        out
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
