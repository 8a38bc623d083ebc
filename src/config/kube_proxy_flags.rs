//! The rest of kube-proxy 1.36's flags, so that a DaemonSet's args carry over
//! when kube-nft replaces kube-proxy. Each flag is taken (it means the same
//! here), accepted and ignored with a warning (it has no meaning for kube-nft),
//! or refused by name (it asks for something kube-nft does not do), for the
//! same reason as the config file's field that means the same (`super::IGNORED`
//! and the checks both call). The flags both share (`--config`, `--kubeconfig`,
//! `--cluster-cidr`, …) are `run`'s own. docs/OPERATIONS.md lists every flag.

use super::{check_bind_address, ignored, is_noop, parse_duration, split_stream, Flags};
use std::time::Duration;

/// kube-proxy's logging flags.
#[derive(clap::Args, Debug, Default)]
pub struct LoggingFlags {
    /// Log verbosity, as kube-proxy's: 0 and 1 log info, 2 to 4 debug, 5 and up
    /// trace (`RUST_LOG`, when set, wins). The file's `logging.verbosity`.
    #[arg(long = "v", short = 'v', value_name = "LEVEL")]
    pub verbosity: Option<u8>,
    /// Accepted and ignored: kube-nft has no per-file verbosity.
    #[arg(long, value_name = "PATTERN=N,...")]
    pub vmodule: Option<String>,
    /// `text` (the default) or `json`, one object per line. The file's `logging.format`.
    #[arg(long, value_parser = ["text", "json"])]
    pub logging_format: Option<String>,
    /// Accepted and ignored: kube-nft writes each log line at once, unbuffered.
    #[arg(long, value_parser = parse_duration)]
    pub log_flush_frequency: Option<Duration>,
    /// Refused unless false: kube-proxy's alpha split-stream option is not supported.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub log_text_split_stream: Option<String>,
    /// Refused unless 0: kube-proxy's alpha split-stream option is not supported.
    #[arg(long, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
    /// Refused unless false: kube-proxy's alpha split-stream option is not supported.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub log_json_split_stream: Option<String>,
    /// Refused unless 0: kube-proxy's alpha split-stream option is not supported.
    #[arg(long, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,
}

#[derive(clap::Args, Debug, Default)]
pub struct KubeProxyFlags {
    #[command(flatten)]
    pub logging: LoggingFlags,
    /// kube-proxy's name for `--masquerade-bit`.
    #[arg(long, value_name = "BIT")]
    pub iptables_masquerade_bit: Option<u8>,
    /// kube-proxy's name for `--sync-period` (nftables and iptables modes).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub iptables_sync_period: Option<Duration>,
    /// kube-proxy's name for `--min-sync-period` (nftables and iptables modes).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub iptables_min_sync_period: Option<Duration>,
    /// kube-proxy's name for `--sync-period` in IPVS mode.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub ipvs_sync_period: Option<Duration>,
    /// kube-proxy's name for `--min-sync-period` in IPVS mode.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub ipvs_min_sync_period: Option<Duration>,
    /// The OOM score of this process (-1000..=1000), as the file's `oomScoreAdj`.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,
    /// Prints kube-nft's version and exits.
    #[arg(long)]
    pub version: bool,

    // Accepted and ignored.
    /// Ignored: the watches keep the model current without a periodic relist.
    #[arg(long, value_name = "DURATION")]
    pub config_sync_period: Option<String>,
    /// Ignored: kube-nft asks the API server little and does not throttle.
    #[arg(long, value_name = "QPS")]
    pub kube_api_qps: Option<String>,
    /// Ignored: kube-nft asks the API server little and does not throttle.
    #[arg(long, value_name = "N")]
    pub kube_api_burst: Option<String>,
    /// Ignored: kube-nft lists Services and EndpointSlices in protobuf, the rest in JSON.
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// Ignored: kube-nft serves no profiling endpoint.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub profiling: Option<String>,
    /// Ignored: kube-nft has no hidden metrics.
    #[arg(long, value_name = "VERSION")]
    pub show_hidden_metrics_for_version: Option<String>,
    /// Ignored: a port that cannot be bound is logged and skipped.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub bind_address_hard_fail: Option<String>,
    /// Ignored: kube-nft does not read boot ids.
    #[arg(long, value_name = "FILES")]
    pub boot_id_file: Option<String>,
    /// Ignored: kube-nft does not read machine ids.
    #[arg(long, value_name = "FILES")]
    pub machine_id_file: Option<String>,
    /// Ignored: NodePorts are never served on loopback (nftables mode's rule).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub iptables_localhost_nodeports: Option<String>,
    /// Ignored: kube-nft has no feature gates; what it does is always on.
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,

    // Refused.
    /// Refused unless 0.0.0.0 or ::: the node's addresses come from its Node object.
    #[arg(long, value_name = "IP")]
    pub bind_address: Option<String>,
    /// Refused: detect-local mode BridgeInterface is not built.
    #[arg(long, value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,
    /// Refused: detect-local mode InterfaceNamePrefix is not built.
    #[arg(long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,
    /// Refused: kube-nft does not write its configuration out.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<String>,
}

impl KubeProxyFlags {
    /// Folds the flags that mean the same into `flags` (without overriding
    /// kube-nft's own), and returns a warning for each one accepted and ignored.
    /// A flag kube-nft refuses is an error naming it.
    pub fn apply(&self, flags: &mut Flags) -> Result<Vec<String>, String> {
        check_bind_address("--bind-address", self.bind_address.as_deref())?;
        let l = &self.logging;
        for (flag, value) in [
            ("--log-text-split-stream", &l.log_text_split_stream),
            ("--log-text-info-buffer-size", &l.log_text_info_buffer_size),
            ("--log-json-split-stream", &l.log_json_split_stream),
            ("--log-json-info-buffer-size", &l.log_json_info_buffer_size),
        ] {
            split_stream(flag, value.as_deref())?;
        }
        let refused = [
            (
                "--pod-bridge-interface",
                &self.pod_bridge_interface,
                "detect-local mode BridgeInterface is not built",
            ),
            (
                "--pod-interface-name-prefix",
                &self.pod_interface_name_prefix,
                "detect-local mode InterfaceNamePrefix is not built",
            ),
            (
                "--write-config-to",
                &self.write_config_to,
                "kube-nft does not write its configuration out",
            ),
        ];
        for (flag, value, why) in refused {
            if value.is_some() {
                return Err(format!("{flag}: not supported by kube-nft ({why})"));
            }
        }
        super::check_oom_score_adj("--oom-score-adj", self.oom_score_adj)?;
        flags.masquerade_bit = flags.masquerade_bit.or(self.iptables_masquerade_bit);
        flags.sync_period = flags
            .sync_period
            .or(self.ipvs_sync_period)
            .or(self.iptables_sync_period);
        flags.min_sync_period = flags
            .min_sync_period
            .or(self.ipvs_min_sync_period)
            .or(self.iptables_min_sync_period);
        flags.oom_score_adj = flags.oom_score_adj.or(self.oom_score_adj);
        flags.log_format = l.logging_format.clone();
        flags.verbosity = l.verbosity;
        let accepted = [
            ("--config-sync-period", &self.config_sync_period),
            ("--kube-api-qps", &self.kube_api_qps),
            ("--kube-api-burst", &self.kube_api_burst),
            ("--kube-api-content-type", &self.kube_api_content_type),
            ("--profiling", &self.profiling),
            (
                "--show-hidden-metrics-for-version",
                &self.show_hidden_metrics_for_version,
            ),
            ("--bind-address-hard-fail", &self.bind_address_hard_fail),
            ("--boot-id-file", &self.boot_id_file),
            ("--machine-id-file", &self.machine_id_file),
            (
                "--iptables-localhost-nodeports",
                &self.iptables_localhost_nodeports,
            ),
            ("--vmodule", &l.vmodule),
        ];
        let mut warnings: Vec<String> = accepted
            .into_iter()
            .filter(|(_, v)| v.as_deref().is_some_and(|v| !is_noop(v)))
            .map(|(flag, _)| ignored(flag))
            .collect();
        if let Some(gates) = &self.feature_gates {
            warnings.push(format!("{} ({gates})", ignored("--feature-gates")));
        }
        Ok(warnings)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use clap::Parser;

    /// As `run` has them: its own flags beside kube-proxy's others.
    #[derive(Parser)]
    pub(in crate::config) struct Cli {
        #[command(flatten)]
        pub(in crate::config) flags: Flags,
        #[command(flatten)]
        pub(in crate::config) kp: KubeProxyFlags,
    }

    /// `args` as `run` parses them, or clap's error.
    pub(in crate::config) fn try_parse_both(args: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once("kube-nft").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    fn parse_both(args: &[&str]) -> Cli {
        try_parse_both(args).unwrap()
    }

    fn parse(args: &[&str]) -> KubeProxyFlags {
        parse_both(args).kp
    }

    #[test]
    fn kube_proxy_flags_are_taken_ignored_or_refused_by_name() {
        let Cli { mut flags, kp } = parse_both(&[
            "--iptables-masquerade-bit=15",
            "--iptables-sync-period=1m",
            "--iptables-min-sync-period=2s",
            "--oom-score-adj=-999",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=2h",
            "--conntrack-tcp-be-liberal",
            "--kube-api-qps=5",
            "--feature-gates=AllAlpha=false",
        ]);
        let warnings = kp.apply(&mut flags).unwrap();
        assert_eq!(flags.masquerade_bit, Some(15));
        assert_eq!(flags.sync_period, Some(Duration::from_secs(60)));
        assert_eq!(flags.min_sync_period, Some(Duration::from_secs(2)));
        assert_eq!(flags.oom_score_adj, Some(-999));
        assert_eq!(
            flags.conntrack,
            super::super::ConntrackFlags {
                max_per_core: Some(0),
                tcp_established_timeout: Some(Duration::ZERO),
                tcp_close_wait_timeout: Some(Duration::from_secs(7200)),
                tcp_be_liberal: Some(true),
                ..Default::default()
            }
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("--kube-api-qps"), "{warnings:?}");

        // kube-nft's own flag wins over kube-proxy's name for it.
        let mut flags = Flags {
            masquerade_bit: Some(14),
            ..Flags::default()
        };
        parse(&["--iptables-masquerade-bit=15"])
            .apply(&mut flags)
            .unwrap();
        assert_eq!(flags.masquerade_bit, Some(14));

        for (args, named) in [
            (&["--bind-address=10.0.0.1"][..], "--bind-address"),
            (&["--write-config-to", "/tmp/x"], "--write-config-to"),
            (&["--oom-score-adj=-1001"], "--oom-score-adj"),
        ] {
            let err = parse(args).apply(&mut Flags::default()).unwrap_err();
            assert!(err.starts_with(named), "{args:?}: {err}");
        }
    }
}
