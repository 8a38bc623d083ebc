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
    assert!(matches!(s.node.nodeport_addresses, NodePortAddresses::Cidrs(ref c) if c.len() == 2));
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
}
