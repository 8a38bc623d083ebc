//! The flags and the file, resolved: kubeadm's file, precedence, and every kind of
//! bad value refused naming its field.

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
    // A file of each call's own: tests run side by side, often on one text.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{call}.yaml"));
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
    assert_eq!(s.node.nodeport_addresses, NodePortAddresses::default());
    assert_eq!(s.logging, LogSettings::default());
    assert_eq!(
        s.warnings,
        Vec::<String>::new(),
        "kubeadm's zero values say nothing"
    );
    assert_eq!(s.oom_score_adj, Some(-999));
    assert!(s.service_cidrs_from_api);
    // null is kube-proxy's default, 0s leaves the kernel's value.
    assert_eq!(s.conntrack, ConntrackSettings::default());
}

#[test]
fn conntrack_settings_take_the_flag_then_the_file_then_kube_proxy_s_default() {
    let text = KUBEADM
        .replace("  maxPerCore: null", "  maxPerCore: 0")
        .replace("  tcpBeLiberal: false", "  tcpBeLiberal: true")
        .replace(
            "  tcpEstablishedTimeout: null",
            "  tcpEstablishedTimeout: 0s",
        )
        .replacen("  udpTimeout: 0s", "  udpTimeout: 30s", 1);
    let s = resolve_text(
        &text,
        Flags {
            conntrack: ConntrackFlags {
                udp_timeout: Some(Duration::from_secs(45)),
                min: Some(4096),
                ..ConntrackFlags::default()
            },
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(
        s.conntrack,
        ConntrackSettings {
            max_per_core: 0,
            min: 4096,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(45),
            udp_stream_timeout: Duration::ZERO,
        }
    );
    // Without a file: kube-proxy's defaults, the 1 h CLOSE_WAIT among them.
    let s = resolve(&Flags {
        hostname_override: Some("node1".into()),
        ..Flags::default()
    })
    .unwrap();
    assert_eq!(
        s.conntrack.tcp_close_wait_timeout,
        Duration::from_secs(3600)
    );
    assert_eq!(s.conntrack.max_per_core, 32768);
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
    assert_eq!(s.node.nodeport_addresses.cidrs.len(), 2);
    assert!(!s.node.nodeport_addresses.primary);
}

#[test]
fn invalid_files_fail_naming_the_field() {
    for (from, to, field) in [
        ("mode: nftables", "mode: userspace", "mode"),
        (
            "  tcpTimeout: 0s",
            "  tcpTimeout: a while",
            "ipvs.tcpTimeout",
        ),
        (
            "  maxPerCore: null",
            "  maxPerCore: -1",
            "conntrack.maxPerCore",
        ),
        (
            "  tcpCloseWaitTimeout: null",
            "  tcpCloseWaitTimeout: an hour",
            "conntrack.tcpCloseWaitTimeout",
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
            "  masqueradeBit: 40",
            "iptables.masqueradeBit",
        ),
        (
            "  scheduler: \"\"",
            "  scheduler: fastest",
            "ipvs.scheduler",
        ),
        (
            "nodePortAddresses: null",
            "nodePortAddresses: [primary, 10.0.0.0/8, primary]",
            "nodePortAddresses",
        ),
        (
            "nodePortAddresses: null",
            "nodePortAddresses: [nodes]",
            "nodePortAddresses",
        ),
        (
            "clusterCIDR: 10.244.0.0/16",
            "clusterCIDR: 10.244.0.0/33",
            "clusterCIDR",
        ),
        (
            "bindAddress: 0.0.0.0",
            "bindAddress: 10.0.0.1",
            "bindAddress",
        ),
        ("  verbosity: 0", "  verbosity: -1", "verbosity"),
        (
            "  flushFrequency: 0",
            "  flushFrequency: 0\n  format: logfmt",
            "logging.format",
        ),
        (
            "    text:\n      infoBufferSize: \"0\"",
            "    text:\n      infoBufferSize: 64Ki",
            "logging.options.text.infoBufferSize",
        ),
        (
            "    json:\n      infoBufferSize: \"0\"",
            "    json:\n      splitStream: true",
            "logging.options.json.splitStream",
        ),
        ("v1alpha1", "v1alpha2", "apiVersion"),
        ("oomScoreAdj: -999", "oomScoreAdj: -1001", "oomScoreAdj"),
    ] {
        assert!(KUBEADM.contains(from), "{from}");
        let text = KUBEADM.replacen(from, to, 1);
        let err = resolve_text(&text, Flags::default()).unwrap_err();
        assert!(err.contains(field), "{to:?}: {err}");
        assert!(
            err.contains(".yaml: "),
            "{to:?}: the file is not named: {err}"
        );
    }
    let err = resolve_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables: {masqueradeAll: yes please}\n", Flags::default()).unwrap_err();
    assert!(
        err.contains("masqueradeAll") || err.contains("nftables"),
        "{err}"
    );
}

/// What kube-nft has no use for, and fields the schema does not have (a newer
/// kube-proxy's, or a typo), start kube-nft with one warning each, naming them.
#[test]
fn what_kube_nft_has_no_use_for_warns_once_naming_it() {
    for (from, to, named) in [
        (
            "kind: KubeProxyConfiguration\n",
            "kind: KubeProxyConfiguration\nfeatureGates: {KubeProxyNFTablesLocalhostNodePorts: true, AllAlpha: false}\n",
            "featureGates is kube-proxy's, accepted and ignored: kube-nft has no feature gates",
        ),
        (
            "  masqueradeBit: 15\n",
            "  masqueradeBit: 15\n  masqueradeBitt: 15\n",
            "nftables.masqueradeBitt: not a field",
        ),
        (
            "kind: KubeProxyConfiguration\n",
            "kind: KubeProxyConfiguration\nipFamilyPolicy: PreferDualStack\n",
            "ipFamilyPolicy: not a field",
        ),
        (
            "    text:\n      infoBufferSize: \"0\"",
            "    text:\n      infoBufferSize: \"0\"\n      colors: true",
            "logging.options.text.colors: not a field",
        ),
        (
            "  masqueradeBit: null",
            "  masqueradeBit: 12",
            "iptables.masqueradeBit is accepted and ignored: kube-proxy reads it only in iptables mode, and the mode is nftables",
        ),
        (
            "  syncPeriod: 0s\nipvs",
            "  syncPeriod: 30s\nipvs",
            "iptables.syncPeriod is accepted and ignored: kube-proxy reads it only in iptables mode",
        ),
        (
            "  localhostNodePorts: null",
            "  localhostNodePorts: true",
            "iptables.localhostNodePorts is kube-proxy's",
        ),
        (
            "nodePortAddresses: null",
            "nodePortAddresses: [primary, localhost]",
            "nodePortAddresses: localhost is kube-proxy's",
        ),
        (
            "enableProfiling: false",
            "enableProfiling: true",
            "enableProfiling is kube-proxy's",
        ),
        (
            "  contentType: \"\"",
            "  contentType: application/vnd.kubernetes.protobuf",
            "clientConnection.contentType is kube-proxy's",
        ),
        ("  qps: 0", "  qps: 50", "clientConnection.qps is kube-proxy's"),
        (
            "  networkName: \"\"",
            "  networkName: flannel.4096",
            "winkernel is kube-proxy's",
        ),
        (
            "configSyncPeriod: 0s",
            "configSyncPeriod: 15m0s",
            "configSyncPeriod is kube-proxy's",
        ),
    ] {
        assert!(KUBEADM.contains(from), "{from}");
        let text = KUBEADM.replacen(from, to, 1);
        let s = resolve_text(&text, Flags::default()).unwrap_or_else(|e| panic!("{to:?}: {e}"));
        assert_eq!(s.warnings.len(), 1, "{to:?}: {:?}", s.warnings);
        assert!(s.warnings[0].contains(named), "{to:?}: {:?}", s.warnings);
    }
}

/// The file and the flags that mean the same warn alike, refuse alike, and
/// set the same thing.
#[test]
fn a_setting_in_the_file_and_its_flag_behave_alike() {
    // The flags' warnings and settings (or error), without a file.
    let by_flags = |args: &[&str]| -> Result<(Vec<String>, Settings), String> {
        let cli = super::kube_proxy_flags::tests::try_parse_both(args)?;
        let mut flags = cli.flags;
        flags.hostname_override = Some("node1".into());
        flags.cluster_cidr = Some(vec!["10.244.0.0/16".parse().unwrap()]);
        let mut warnings = cli.kp.apply(&mut flags)?;
        let s = resolve(&flags)?;
        warnings.extend(s.warnings.clone());
        Ok((warnings, s))
    };
    let by_file = |from: &str, to: &str| {
        assert!(KUBEADM.contains(from), "{from}");
        resolve_text(&KUBEADM.replacen(from, to, 1), Flags::default())
    };
    let warned = [
        (
            &["--feature-gates=AllAlpha=false"][..],
            (
                "kind: KubeProxyConfiguration\n",
                "kind: KubeProxyConfiguration\nfeatureGates: {AllAlpha: false}\n",
            ),
        ),
        (
            &["--kube-api-content-type=application/vnd.kubernetes.protobuf"],
            (
                "  contentType: \"\"",
                "  contentType: application/vnd.kubernetes.protobuf",
            ),
        ),
        (&["--kube-api-qps=50"], ("  qps: 0", "  qps: 50")),
        (&["--kube-api-burst=100"], ("  burst: 0", "  burst: 100")),
        (
            &["--profiling"],
            ("enableProfiling: false", "enableProfiling: true"),
        ),
        (
            &["--bind-address-hard-fail"],
            ("bindAddressHardFail: false", "bindAddressHardFail: true"),
        ),
        (
            &["--show-hidden-metrics-for-version=1.36"],
            (
                "showHiddenMetricsForVersion: \"\"",
                "showHiddenMetricsForVersion: \"1.36\"",
            ),
        ),
        (
            &["--iptables-localhost-nodeports=true"],
            ("  localhostNodePorts: null", "  localhostNodePorts: true"),
        ),
        (
            &["--config-sync-period=15m"],
            ("configSyncPeriod: 0s", "configSyncPeriod: 15m0s"),
        ),
        (
            &["--vmodule=proxier=4"],
            (
                "  verbosity: 0",
                "  verbosity: 0\n  vmodule: [{filePattern: proxier, verbosity: 4}]",
            ),
        ),
        (
            &["--nodeport-addresses=primary,localhost"],
            (
                "nodePortAddresses: null",
                "nodePortAddresses: [primary, localhost]",
            ),
        ),
    ];
    for (args, (from, to)) in warned {
        let (flag_warnings, _) = by_flags(args).unwrap();
        let file_warnings = by_file(from, to).unwrap().warnings;
        assert_eq!(flag_warnings.len(), 1, "{args:?}: {flag_warnings:?}");
        assert_eq!(file_warnings.len(), 1, "{to:?}: {file_warnings:?}");
        // One reason for both: the same text after the name.
        let reason = |w: &str| w.split_once(" is kube-proxy's").map(|(_, r)| r.to_string());
        assert_eq!(
            reason(&flag_warnings[0]),
            reason(&file_warnings[0]),
            "{args:?} and {to:?} warn differently: {flag_warnings:?} {file_warnings:?}"
        );
        assert!(reason(&flag_warnings[0]).is_some(), "{flag_warnings:?}");
    }
    // The value that asks for nothing says nothing, in both.
    for args in [
        &["--profiling=false"][..],
        &["--kube-api-qps=0"],
        &[
            "--log-json-split-stream=false",
            "--log-text-info-buffer-size=0",
        ],
    ] {
        let (warnings, _) = by_flags(args).unwrap();
        assert!(warnings.is_empty(), "{args:?}: {warnings:?}");
    }
    let refused = [
        (
            &["--bind-address=10.0.0.1"][..],
            ("bindAddress: 0.0.0.0", "bindAddress: 10.0.0.1"),
        ),
        (
            &["--log-text-split-stream"],
            (
                "    text:\n      infoBufferSize: \"0\"",
                "    text:\n      splitStream: true",
            ),
        ),
        (
            &["--log-json-info-buffer-size=64Ki"],
            (
                "    json:\n      infoBufferSize: \"0\"",
                "    json:\n      infoBufferSize: 64Ki",
            ),
        ),
        (
            &["--nodeport-addresses=all,10.0.0.0/8,all"],
            (
                "nodePortAddresses: null",
                "nodePortAddresses: [all, 10.0.0.0/8, all]",
            ),
        ),
    ];
    for (args, (from, to)) in refused {
        let flag_err = by_flags(args).unwrap_err();
        let file_err = by_file(from, to).unwrap_err();
        assert!(
            flag_err.starts_with(args[0].split('=').next().unwrap()),
            "{flag_err}"
        );
        let tail = |e: &str| e.rsplit_once(": ").map(|(_, t)| t.to_string());
        assert_eq!(tail(&flag_err), tail(&file_err), "{flag_err} / {file_err}");
    }
    // Both bind addresses that mean "the node's" are taken, in both.
    by_flags(&["--bind-address=::"]).unwrap();
    by_file("bindAddress: 0.0.0.0", "bindAddress: \"::\"").unwrap();

    // What both set, they set alike.
    let (_, from_flags) = by_flags(&["--logging-format=json", "--v=4"]).unwrap();
    let from_file = by_file("  verbosity: 0", "  verbosity: 4\n  format: json").unwrap();
    let want = LogSettings {
        json: true,
        verbosity: 4,
    };
    assert_eq!((from_flags.logging, from_file.logging), (want, want));
    let (_, from_flags) = by_flags(&["--nodeport-addresses=primary,10.0.0.0/8,all"]).unwrap();
    let from_file = by_file(
        "nodePortAddresses: null",
        "nodePortAddresses: [primary, 10.0.0.0/8, all]",
    )
    .unwrap();
    let npa = &from_flags.node.nodeport_addresses;
    assert_eq!(npa, &from_file.node.nodeport_addresses);
    assert!(npa.primary && npa.cidrs.len() == 3, "{npa:?}");
    // A flag wins over the file.
    let s = resolve_text(
        &KUBEADM.replacen("  verbosity: 0", "  verbosity: 4\n  format: json", 1),
        Flags {
            log_format: Some("text".into()),
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(
        s.logging,
        LogSettings {
            json: false,
            verbosity: 4
        }
    );
}

/// The file kubeadm of each minor version from 1.33 to 1.37 writes
/// (integration/fixtures/kubeadm, recorded by integration/k8s/kubeadm-configs.sh)
/// starts kube-nft, with nothing to warn about.
#[test]
fn the_files_kubeadm_1_33_to_1_37_write_start_kube_nft() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/fixtures/kubeadm");
    let mut minors = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(version) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("kube-proxy-v")?.strip_suffix(".yaml"))
        else {
            continue;
        };
        minors.push(version.split('.').nth(1).unwrap().parse::<u32>().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let s = resolve_text(&text, Flags::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.node.mode, ProxyMode::Nftables, "{version}");
        assert_eq!(s.node.nodeport_addresses, NodePortAddresses::default());
        assert_eq!(s.sync_period, DEFAULT_SYNC_PERIOD);
        // kubeadm's mode is kube-proxy's default, iptables (empty up to 1.36,
        // named from 1.37), which kube-nft runs nftables in place of; and
        // kubeadm's file names no cluster CIDR (a cluster's has networking.podSubnet's).
        let said = |s: &Settings, starts: &[&str]| {
            s.warnings.len() == starts.len()
                && s.warnings
                    .iter()
                    .zip(starts)
                    .all(|(w, start)| w.starts_with(start))
        };
        assert!(
            said(&s, &["mode iptables", "no cluster CIDR"]),
            "kubeadm v{version}: {:?}",
            s.warnings
        );
        // With the mode set to nftables, as docs/OPERATIONS.md asks.
        let mode_line = text.lines().find(|l| l.starts_with("mode: ")).unwrap();
        let nft = text.replace(mode_line, "mode: nftables");
        let s = resolve_text(&nft, Flags::default()).unwrap();
        assert!(
            said(&s, &["no cluster CIDR"]),
            "v{version}: {:?}",
            s.warnings
        );
    }
    minors.sort();
    assert_eq!(minors, [33, 34, 35, 36, 37], "a version's file is missing");
}

/// `mode: iptables`, or empty (kube-proxy's default, which kubeadm writes):
/// kube-nft runs nftables in its place with what kube-proxy reads in that mode,
/// the iptables section, and says so once.
#[test]
fn mode_iptables_runs_nftables_with_the_iptables_section() {
    let text = KUBEADM
        .replace("mode: nftables", "mode: iptables")
        .replace(
            "  masqueradeAll: false\n  masqueradeBit: null",
            "  masqueradeAll: true\n  masqueradeBit: 13",
        )
        .replace(
            "  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs",
            "  minSyncPeriod: 5s\n  syncPeriod: 1m\nipvs",
        )
        .replace(
            "  masqueradeAll: true\n  masqueradeBit: 15",
            "  masqueradeAll: false\n  masqueradeBit: 15",
        );
    let s = resolve_text(&text, Flags::default()).unwrap();
    assert_eq!(s.node.mode, ProxyMode::Nftables);
    assert!(s.node.masquerade_all, "iptables.masqueradeAll");
    assert_eq!(s.node.masquerade_bit, 13, "iptables.masqueradeBit");
    assert_eq!(s.sync_period, Duration::from_secs(60));
    assert_eq!(s.min_sync_period, Duration::from_secs(5));
    let unread: Vec<&String> = s
        .warnings
        .iter()
        .filter(|w| w.starts_with("nftables."))
        .collect();
    assert_eq!(
        unread.len(),
        3,
        "nftables.masqueradeBit, syncPeriod, minSyncPeriod: {:?}",
        s.warnings
    );
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("mode iptables: kube-nft runs nftables")),
        "{:?}",
        s.warnings
    );
    // The flag says the same.
    let s = resolve_text(
        KUBEADM,
        Flags {
            proxy_mode: Some(ModeName::Iptables),
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(s.node.mode, ProxyMode::Nftables);
    assert!(!s.node.masquerade_all, "the nftables section is not read");
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("mode iptables: kube-nft runs nftables")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn mode_ipvs_takes_the_ipvs_section_and_its_flags() {
    let text = KUBEADM
        .replace("mode: nftables", "mode: ipvs")
        .replace("  scheduler: \"\"", "  scheduler: sh")
        .replace("  strictARP: false", "  strictARP: true")
        .replace("  tcpTimeout: 0s", "  tcpTimeout: 15m30.9s")
        .replace("  udpTimeout: 0s\nkind:", "  udpTimeout: 30s\nkind:");
    let s = resolve_text(&text, Flags::default()).unwrap();
    assert_eq!(
        s.node.mode,
        ProxyMode::Ipvs(IpvsSettings {
            scheduler: "sh".into(),
            strict_arp: true,
            exclude_cidrs: Vec::new(),
            // Whole seconds, as kube-proxy truncates them; 0 is the kernel's.
            timeouts: IpvsTimeouts {
                tcp: 930,
                tcp_fin: 0,
                udp: 30,
            },
        })
    );
    // A flag over the file, the others from it.
    let s = resolve_text(
        &text,
        Flags {
            ipvs_tcp_timeout: Some(Duration::from_secs(3600)),
            ipvs_tcpfin_timeout: Some(Duration::from_secs(5)),
            ..Flags::default()
        },
    )
    .unwrap();
    assert!(
        matches!(&s.node.mode, ProxyMode::Ipvs(i) if i.timeouts == IpvsTimeouts { tcp: 3600, tcp_fin: 5, udp: 30 }),
        "{:?}",
        s.node.mode
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
            proxy_mode: Some(ModeName::Nftables),
            ..Flags::default()
        },
    )
    .unwrap();
    assert_eq!(s.node.mode, ProxyMode::Nftables);
}

#[test]
fn durations_print_as_go_prints_them_and_parse_back() {
    let d = Duration::from_secs;
    for (duration, text) in [
        (d(30), "30s"),
        (d(90), "1m30s"),
        (d(3600), "1h0m0s"),
        (d(86400), "24h0m0s"),
        (d(900), "15m0s"),
        (Duration::from_millis(500), "500ms"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::ZERO, "0s"),
    ] {
        assert_eq!(go_duration(duration), text);
        assert_eq!(parse_duration(text).unwrap(), duration, "{text}");
    }
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
    // Refused, not a panic (found by the config_file fuzz target).
    for long in [
        "34444444444444444444444440s",
        "inf",
        "1e300",
        "2562048h",
        "NaN",
    ] {
        assert!(parse_duration(long).is_err(), "{long}");
    }
    assert!(parse_duration("2562047h").is_ok());
}
