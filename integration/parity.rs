//! Parity with `nft`: for every rule shape the translator emits, the same objects
//! loaded as text with `nft -f` into one namespace and through our netlink encoder
//! into another must list identically, and the bytecode `nft` wrote must be exactly
//! the bytecode our lowering produces.

mod common;

use common::*;
use kube_nft::core::node_config::{IpvsSettings, NodeConfig, ProxyMode};
use kube_nft::netlink::NftSocket;
use kube_nft::nft::kernel;
use kube_nft::nft::pick::EndpointMap;
use kube_nft::ruleset::text;
use kube_nft::ruleset::{Ruleset, Stmt};
use kube_nft::source::files::parse;
use kube_nft::testbed::netns::{in_netns, Netns};
use std::io::Write;
use std::process::{Command, Stdio};

/// Services that together use every rule shape: 1, 2 and 3 endpoints (a plain
/// DNAT, and endpoint maps in both families), more than 16 (blocks), TCP/UDP/SCTP, several ports, no endpoints, IPv6,
/// dual-stack, an unnamed port, terminating-only endpoints, and names long enough
/// to clamp comments.
fn manifests() -> String {
    let long_ns = "n".repeat(63);
    let long_name = "s".repeat(63);
    let mut m = String::new();
    m += &service("one", &["10.96.0.1"], &[tcp(80, 8080)]);
    m += &slice("one", "a", &[tcp(80, 8080)], &["10.244.1.1"]);
    m += &service("two", &["10.96.0.2"], &[tcp(80, 8080), udp(53, 5353)]);
    m += &slice(
        "two",
        "a",
        &[tcp(80, 8080), udp(53, 5353)],
        &["10.244.1.2", "10.244.1.3"],
    );
    m += &service("three", &["10.96.0.3", "fd00:10:96::3"], &[tcp(443, 8443)]);
    m += &slice(
        "three",
        "a",
        &[tcp(443, 8443)],
        &["10.244.2.1", "10.244.2.2", "10.244.2.3"],
    );
    m += &slice(
        "three",
        "b",
        &[tcp(443, 8443)],
        &["fd00:10:244::1", "fd00:10:244::2", "fd00:10:244::3"],
    );
    m += &service(
        "sctp",
        &["10.96.0.4"],
        &[Port {
            name: "sig",
            protocol: "SCTP",
            port: 3868,
            target: 3868,
        }],
    );
    m += &slice(
        "sctp",
        "a",
        &[Port {
            name: "sig",
            protocol: "SCTP",
            port: 3868,
            target: 3868,
        }],
        &["10.244.3.1", "10.244.3.2"],
    );
    m += &service("empty", &["10.96.0.5", "fd00:10:96::5"], &[tcp(80, 80)]);
    m += "---\napiVersion: v1\nkind: Service\nmetadata: {name: unnamed}\nspec: {clusterIP: 10.96.0.6, ports: [{port: 8080}]}\n";
    m += "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: unnamed-a, labels: {kubernetes.io/service-name: unnamed}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints:\n- addresses: [10.244.4.1]\n  conditions: {ready: false, serving: true, terminating: true}\n";
    m += &format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {long_name}, namespace: {long_ns}}}\nspec: {{clusterIP: 10.96.0.7, ports: [{{name: a-very-long-nam, port: 80}}]}}\n"
    );
    m += &format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: l, namespace: {long_ns}, labels: {{kubernetes.io/service-name: {long_name}}}}}\naddressType: IPv4\nports: [{{name: a-very-long-nam, port: 80}}]\nendpoints: [{{addresses: [10.244.5.1]}}]\n"
    );
    m += &service("v6only", &["fd00:10:96::8"], &[udp(53, 53)]);
    m += &slice(
        "v6only",
        "a",
        &[udp(53, 53)],
        &["fd00:10:244::8", "fd00:10:244::9"],
    );
    // Above 16 endpoints an entry's slots are in blocks: 21 is 16 + 4 + 1, and
    // 1029 a whole block of 1024, then 4 and 1 (over two slices, as the API's
    // limit of 1000 an EndpointSlice asks). On four ports, the whole blocks
    // fill their map to 4096 elements, and it is made with a size.
    let addrs = |n: usize| -> Vec<String> {
        (0..n)
            .map(|i| format!("10.245.{}.{}", i / 250, i % 250 + 1))
            .collect()
    };
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    m += &service("blocks", &["10.96.0.9"], &[tcp(80, 8080), udp(53, 53)]);
    m += &slice(
        "blocks",
        "a",
        &[tcp(80, 8080), udp(53, 53)],
        &refs(&addrs(21)),
    );
    let many = addrs(1029);
    let ports: Vec<Port> = ["a", "b", "c", "d"]
        .into_iter()
        .zip(0..)
        .map(|(name, i)| Port {
            name,
            ..tcp(80 + i, 8080 + i)
        })
        .collect();
    m += &service("a-whole-block", &["10.96.0.10"], &ports);
    m += &slice("a-whole-block", "a", &ports, &refs(&many[..600]));
    m += &slice("a-whole-block", "b", &ports, &refs(&many[600..]));
    m += EXTERNAL;
    m
}

/// This node, and Services reachable from outside it: NodePorts, external IPs, a
/// load balancer with source ranges, both traffic policies with and without
/// local endpoints (the `external-`, `local-` and `firewall-` chain shapes), and
/// a Service's own conntrack timeouts (`ct timeout` objects and `timeout-`
/// chains, before shared pick chains and before affinity cascades).
const EXTERNAL: &str = r#"
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status: {addresses: [{type: InternalIP, address: 192.0.2.1}, {type: InternalIP, address: "2001:db8::1"}]}
---
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.1.1
  clusterIPs: [10.96.1.1, "fd00:10:96::1:1"]
  externalIPs: [198.51.100.7]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}, {name: dns, protocol: UDP, port: 53, nodePort: 30053}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: np-a, namespace: default, labels: {kubernetes.io/service-name: np}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, protocol: UDP, port: 53}]
endpoints: [{addresses: [10.244.6.1], nodeName: node-a}, {addresses: [10.244.6.2], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata:
  name: timed
  namespace: default
  annotations: {kube-nft.io/conntrack-udp-timeout: 5s, kube-nft.io/conntrack-tcp-established-timeout: 24h}
spec:
  type: NodePort
  clusterIP: 10.96.1.5
  clusterIPs: [10.96.1.5, "fd00:10:96::1:5"]
  externalIPs: [198.51.100.10]
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30085}, {name: dns, protocol: UDP, port: 53, nodePort: 30055}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: timed-a, namespace: default, labels: {kubernetes.io/service-name: timed}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, protocol: UDP, port: 53}]
endpoints: [{addresses: [10.244.6.5], nodeName: node-a}, {addresses: [10.244.6.6], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata:
  name: timed-sticky
  namespace: default
  annotations: {kube-nft.io/conntrack-udp-timeout: 1m30s}
spec:
  type: NodePort
  clusterIP: 10.96.1.6
  sessionAffinity: ClientIP
  ports: [{name: dns, protocol: UDP, port: 53, nodePort: 30056}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: timed-sticky-a, namespace: default, labels: {kubernetes.io/service-name: timed-sticky}}
addressType: IPv4
ports: [{name: dns, protocol: UDP, port: 53}]
endpoints: [{addresses: [10.244.6.7], nodeName: node-a}, {addresses: [10.244.6.8], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: lb-local, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.2
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [203.0.113.0/24, 192.0.2.0/25]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.8}, {ip: 198.51.100.9, ipMode: Proxy}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-local-a, namespace: default, labels: {kubernetes.io/service-name: lb-local}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.6.3], nodeName: node-a}, {addresses: [10.244.6.4], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: lb-elsewhere, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.3
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30082}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.10}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-elsewhere-a, namespace: default, labels: {kubernetes.io/service-name: lb-elsewhere}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.6.5], nodeName: node-b}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.1.5
  clusterIPs: [10.96.1.5, "fd00:10:96::1:5"]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 5430}}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-a, namespace: default, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.6.7]}, {addresses: [10.244.6.8]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sticky-b, namespace: default, labels: {kubernetes.io/service-name: sticky}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ["fd00:10:244::6:7"]}]
---
apiVersion: v1
kind: Service
metadata: {name: np-empty, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.1.4
  ports: [{name: http, port: 80, nodePort: 30083}]
"#;

fn ruleset(config: &NodeConfig) -> Ruleset {
    let loaded = parse(&manifests(), "parity.yaml").unwrap();
    assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
    let (rs, validated) =
        kube_nft::nft::translate::desired(&loaded.objects, Some("node-a"), config);
    assert!(validated.rejected.is_empty(), "{:?}", validated.rejected);
    rs
}

fn nft_load(ns: &str, script: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running nft (is nftables installed?)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -f refused our text:\n{}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Element lists wrap and sort differently in `nft list` (which orders
/// concatenated keys as little-endian integers) and in our text (natural key
/// order); join and sort them. Our test comments contain no ", ".
fn normalize_elements(s: &str) -> String {
    s.replace(",\n\t\t\t     ", ", ")
        .lines()
        .map(|line| {
            match line
                .strip_prefix("\t\telements = { ")
                .and_then(|l| l.strip_suffix(" }"))
            {
                Some(list) => {
                    let mut items: Vec<&str> = list.split(", ").collect();
                    items.sort();
                    format!("\t\telements = {{ {} }}\n", items.join(", "))
                }
                None => format!("{line}\n"),
            }
        })
        .collect()
}

/// The first set or chain where the kernel differs from our lowering, to say
/// what broke parity.
fn first_difference(sock: &mut NftSocket, want: &kube_nft::ruleset::Ruleset) -> String {
    for want in kernel::lowered(want) {
        let Some(got) = sock.read_table(want.family, &want.name).unwrap() else {
            return format!("table {} missing", want.name);
        };
        for s in &want.sets {
            let Some(g) = got.sets.iter().find(|g| g.name == s.name) else {
                return format!("set {} missing", s.name);
            };
            let (mut a, mut b) = (s.clone(), g.clone());
            a.elements.sort_by(|x, y| x.key.cmp(&y.key));
            b.elements.sort_by(|x, y| x.key.cmp(&y.key));
            if a.timeout_ms.is_some() {
                (a.elements, b.elements) = (Vec::new(), Vec::new());
            }
            if a != b {
                return format!("set {}:\n ours {a:?}\n nft's {b:?}", s.name);
            }
        }
        for c in &want.chains {
            let Some(g) = got.chains.iter().find(|g| g.name == c.name) else {
                return format!("chain {} missing", c.name);
            };
            let same = c.rules.len() == g.rules.len()
                && c.rules.iter().zip(&g.rules).all(|(r, s)| r.same_as(s));
            if !same || c.userdata != g.userdata || c.base != g.base {
                return format!("chain {}:\n ours {c:?}\n nft's {g:?}", c.name);
            }
        }
    }
    "tables, counters or chain counts".into()
}

fn check_parity(tag: &str, config: NodeConfig) {
    require_root();
    let rs = ruleset(&config);
    let by_text = Netns::create(&unique(&format!("{tag}-t"))).unwrap();
    let by_netlink = Netns::create(&unique(&format!("{tag}-n"))).unwrap();

    nft_load(&by_text.name, &text::replace_script(&rs.tables));
    let to_apply = rs.clone();
    in_netns(&by_netlink.name, move || {
        let mut sock = NftSocket::open().unwrap();
        kernel::apply(&mut sock, &to_apply).unwrap();
    })
    .unwrap();

    let listed_text = nft_list(&by_text.name);
    let listed_netlink = nft_list(&by_netlink.name);
    assert_eq!(
        listed_text, listed_netlink,
        "nft lists the two namespaces differently"
    );

    // Our text is what nft prints, up to element wrapping.
    let rendered: String = rs.tables.iter().map(text::table).collect();
    if matches!(config.mode, ProxyMode::Nftables) {
        assert_eq!(
            rendered.matches("\t\tsize 8192\n").count(),
            1,
            "the whole blocks' map, made with a size (`endpoint_map_size`)"
        );
    }
    assert_eq!(
        normalize_elements(&listed_text),
        normalize_elements(&rendered)
    );

    // The bytecode nft wrote decodes to exactly what our lowering emits.
    let expected = rs.clone();
    let first_difference = in_netns(&by_text.name, move || {
        let mut sock = NftSocket::open().unwrap();
        if kernel::kernel_matches(&mut sock, &expected).unwrap() {
            return None;
        }
        Some(first_difference(&mut sock, &expected))
    })
    .unwrap();
    assert!(
        first_difference.is_none(),
        "the kernel objects nft -f created differ from our lowering: {}",
        first_difference.unwrap_or_default()
    );

    // What either wrote lifts back to exactly the desired ruleset (what
    // `explain` walks on a live node).
    for ns in [&by_text.name, &by_netlink.name] {
        let lifted = in_netns(ns, || {
            kernel::read_ruleset(&mut NftSocket::open().unwrap()).map_err(|e| e.to_string())
        })
        .unwrap()
        .unwrap_or_else(|e| panic!("lifting {ns}: {e}"));
        assert_eq!(sorted(lifted), sorted(rs.clone()), "lifted from {ns}");
    }
}

/// Tables by id and set elements by key: the kernel keeps its own order.
fn sorted(mut rs: Ruleset) -> Ruleset {
    rs.tables.sort_by_key(|t| t.id());
    for t in &mut rs.tables {
        for s in &mut t.sets {
            s.elements.sort_by_key(|e| format!("{:?}", e.key));
        }
        t.sets.sort_by(|a, b| a.name.cmp(&b.name));
        t.chains.sort_by(|a, b| a.name.cmp(&b.name));
    }
    rs
}

#[test]
fn parity_with_aligned_pod_cidrs_and_the_default_service_cidr() {
    check_parity(
        "pa",
        NodeConfig {
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:10:244::/56".parse().unwrap(),
            ],
            service_cidrs: vec![
                "10.96.0.0/12".parse().unwrap(),
                "fd00:10:96::/112".parse().unwrap(),
            ],
            masquerade_bit: 14,
            ..NodeConfig::default()
        },
    );
}

/// Also a cluster with a second ServiceCIDR per family, added at run time:
/// one drop rule each.
#[test]
fn parity_with_unaligned_cidrs_two_service_cidrs_and_another_masquerade_bit() {
    check_parity(
        "pb",
        NodeConfig {
            cluster_cidrs: vec![
                "10.244.0.0/14".parse().unwrap(),
                "fd00:10:244::/52".parse().unwrap(),
            ],
            service_cidrs: vec![
                "10.96.0.0/16".parse().unwrap(),
                "fd00:10:96::/108".parse().unwrap(),
                "10.97.0.0/24".parse().unwrap(),
                "fd00:10:97::/120".parse().unwrap(),
            ],
            masquerade_bit: 0,
            ..NodeConfig::default()
        },
    );
}

#[test]
fn parity_without_cidrs() {
    check_parity("pc", NodeConfig::default());
}

#[test]
fn parity_with_counters() {
    check_parity(
        "pd",
        NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            counters: true,
            ..NodeConfig::default()
        },
    );
}

/// Every Service on the fast path: each dispatch element goes through a chain
/// that labels the flow (`ct label set 127`) on its way to the pick.
#[test]
fn parity_with_the_fast_path_for_every_service() {
    check_parity(
        "pf",
        NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            fast_path: kube_nft::core::node_config::FastPath::All,
            ..NodeConfig::default()
        },
    );
}

#[test]
fn parity_with_masquerade_all() {
    check_parity(
        "pe",
        NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            masquerade_all: true,
            ..NodeConfig::default()
        },
    );
}

/// The table the IPVS backend keeps beside IPVS: no dispatch maps or Service
/// chains, but sets of served and masqueraded Service ports (nftables alone, so
/// this runs on any kernel).
#[test]
fn parity_with_the_ipvs_backend_table() {
    check_parity(
        "pg",
        NodeConfig {
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:10:244::/56".parse().unwrap(),
            ],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            mode: ProxyMode::Ipvs(IpvsSettings::default()),
            ..NodeConfig::default()
        },
    );
}

/// The nft of Debian 13 (1.1.x), from the chroot that
/// `integration/nft-versions/chroots.sh` builds (install-deps runs it), beside
/// the host's (Debian 12's 1.0.6). Not Debian 11's 0.9.8: see `NFT_0_9_8`.
const OTHER_NFTS: [&str; 1] = ["trixie"];

/// Why the nft of Debian 11 cannot list our tables (it still writes its own
/// beside them in `other_nft_versions_tables_beside_ours…`).
const NFT_0_9_8: &str = "nft 0.9.8 aborts (`concat_expr_msort_value: Assertion ilen > 0`) \
     on a map whose concatenated key has a `numgen` field, as the endpoint maps' keys do; \
     kube-proxy's nftables mode requires nft 1.0.1 and kernel 5.13 for the same kind of \
     reason (its own tables make nft 0.9.8 unusable), and Debian 11 ships neither";

#[test]
fn older_and_newer_nft_read_what_we_program() {
    require_root();
    let rs = ruleset(&NodeConfig {
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ],
        ..NodeConfig::default()
    });
    let ns = Netns::create(&unique("pv")).unwrap();
    let to_apply = rs.clone();
    in_netns(&ns.name, move || {
        kernel::apply(&mut NftSocket::open().unwrap(), &to_apply).unwrap();
    })
    .unwrap();
    let names: Vec<&str> = rs
        .tables
        .iter()
        .flat_map(|t| {
            let sets = t.sets.iter().map(|s| s.name.as_str());
            sets.chain(t.chains.iter().map(|c| c.name.as_str()))
        })
        .collect();
    let endpoint_maps: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| EndpointMap::of_name(n).is_some())
        .collect();
    assert!(
        endpoint_maps.len() >= 4,
        "the parity Services have endpoint maps"
    );
    let host = exec_in(&ns.name, &["nft", "list", "ruleset"]);
    for suite in OTHER_NFTS {
        let root = format!("/var/cache/kube-nft/chroots/{suite}");
        let out = Command::new("ip")
            .args([
                "netns", "exec", &ns.name, "chroot", &root, "nft", "list", "ruleset",
            ])
            .output()
            .unwrap_or_else(|e| panic!("running {suite}'s nft: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{suite}'s nft could not list our ruleset (run integration/nft-versions/chroots.sh): {stderr}"
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        for name in &names {
            assert!(listing.contains(name), "{suite}'s nft does not list {name}");
        }
        // Each endpoint map is listed with its type, and used by every rule
        // (a protocol each, in each pick chain of its counts) that picks from it.
        assert_eq!(
            listing.matches(" . numgen random mod 1 : ").count(),
            endpoint_maps.len(),
            "{suite}:\n{listing}"
        );
        for map in &endpoint_maps {
            let picks = rs
                .tables
                .iter()
                .flat_map(|t| &t.chains)
                .flat_map(|c| &c.rules)
                .filter(|r| {
                    r.stmts
                        .iter()
                        .any(|s| matches!(s, Stmt::DnatPick { map: m, .. } if m == map))
                })
                .count();
            assert!(picks >= 3, "{map} has a pick chain");
            assert_eq!(
                listing.matches(&format!(" map @{map}\n")).count(),
                picks,
                "{suite}: {map}:\n{listing}"
            );
        }
        // Apart from how each version prints the same thing, the listings are
        // identical, word for word.
        let (ours, theirs) = (printed_alike(&host), printed_alike(&listing));
        if let Some(at) = (0..ours.len().max(theirs.len())).find(|&i| ours.get(i) != theirs.get(i))
        {
            let around = |w: &[String]| w[at.saturating_sub(12)..(at + 12).min(w.len())].join(" ");
            panic!(
                "{suite} lists our ruleset differently from the host's nft:\n  host: {}\n  {suite}: {}",
                around(&ours),
                around(&theirs)
            );
        }
    }
}

/// A listing's words with the differences in how nft versions print the same
/// ruleset undone: 1.1 names output hooks' priorities (`dstnat + 1` for -99),
/// wraps long element lists over lines and prints a timeout policy's seconds
/// as durations (`established : 1d`); 0.9.8 prints a mapped DNAT as
/// `dnat ip addr . port to`.
fn printed_alike(listing: &str) -> Vec<String> {
    let words: Vec<&str> = listing.split_whitespace().collect();
    let named = |w: &str| match w {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "dstnat" => Some(-100),
        "filter" => Some(0),
        "security" => Some(50),
        "srcnat" => Some(100),
        _ => None,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if w == "priority" && i + 1 < words.len() {
            let name = words[i + 1].trim_end_matches(';');
            if let Some(base) = named(name) {
                let (value, used, last) = match (words.get(i + 2), words.get(i + 3)) {
                    (Some(&op @ ("+" | "-")), Some(&offset)) if !words[i + 1].ends_with(';') => {
                        let n: i32 = offset.trim_end_matches(';').parse().unwrap();
                        let v = if op == "+" { base + n } else { base - n };
                        (v, 4, offset)
                    }
                    _ => (base, 2, words[i + 1]),
                };
                let semicolon = if last.ends_with(';') { ";" } else { "" };
                out.push("priority".to_string());
                out.push(format!("{value}{semicolon}"));
                i += used;
                continue;
            }
        }
        if i > 0 && words[i - 1] == ":" {
            if let Some(seconds) = duration_seconds(w.trim_end_matches(',')) {
                let comma = if w.ends_with(',') { "," } else { "" };
                out.push(format!("{seconds}{comma}"));
                i += 1;
                continue;
            }
        }
        if w == "dnat" && words.get(i + 2..i + 5) == Some(&["addr", ".", "port"][..]) {
            out.push(w.to_string());
            out.push(words[i + 1].to_string());
            i += 5;
            continue;
        }
        out.push(w.to_string());
        i += 1;
    }
    out
}

/// `1d`, `1m30s` or `5s` in seconds; `None` for any other word.
fn duration_seconds(w: &str) -> Option<u64> {
    let (mut total, mut number) = (0, None::<u64>);
    for c in w.chars() {
        if let Some(d) = c.to_digit(10) {
            number = Some(number.unwrap_or(0) * 10 + u64::from(d));
            continue;
        }
        let unit = match c {
            'd' => 86400,
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total += number.take()? * unit;
    }
    (number.is_none() && total > 0).then_some(total)
}

/// Tables that the nft of Debian 11, 12 (the host's) and 13 write beside ours
/// (named counters and quotas, sets and elements with comments, verdict maps,
/// rule comments) break neither our readback nor our sync, and are left as
/// they were. Flowtables: the host's kernel has none, so `dataplane`'s
/// flowtable test covers them in the 6.1 guest.
#[test]
fn other_nft_versions_tables_beside_ours_break_neither_readback_nor_sync() {
    use common::foreign_tables::{beside_ours, Writer};
    // Oldest first.
    let writers = [
        Writer::chroot("bullseye").not_reading_ours(NFT_0_9_8),
        Writer::host(),
        Writer::chroot("trixie").breaking_older(
            "nft 0.9.8 and Debian's 1.0.6 crash (SIGSEGV) on the user data nft 1.1.3 writes \
             with a set declared by `type` (kubernetes#136786, fixed in nft 1.0.6.1); \
             kube-nft reads the kernel itself and is unaffected",
        ),
    ];
    beside_ours("pfx", &writers, false);
}

/// The NAT hold's tables (`node::nat_hold`), owned by the socket that wrote
/// them, list as `nft -f` writes the same text, but for the owner flag (a table
/// `nft -f` owns goes when nft exits, and `list` within its own session shows
/// no rules), read with the other nft versions too, pass a foreign
/// `nft flush ruleset` by, keep conntrack tracking new flows when nothing else
/// uses it, go with their socket, and pass to a second holder that
/// waited.
#[test]
fn parity_of_the_nat_hold_tables_which_a_flush_passes_by_and_their_socket_takes_away() {
    use kube_nft::core::net::Family;
    use kube_nft::node::nat_hold::{hold_table, NatHold, HOLD_TABLE};
    require_root();
    let text: String = Family::ALL
        .iter()
        .map(|f| text::table(&hold_table(*f)))
        .collect();
    // Ours without its owner: the flag's line, the owning process's name, and
    // the blank line nft prints after a table's comment when it has flags.
    let owned = |listing: &str| -> String {
        listing
            .lines()
            .filter(|l| l.trim() != "flags owner" && !l.is_empty())
            .map(|l| l.split(" # progname").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let theirs = Netns::create(&unique("holdnft")).unwrap();
    nft_load(&theirs.name, &text);
    let by_nft = owned(&exec_in(&theirs.name, &["nft", "list", "ruleset"]));
    assert_eq!(by_nft.matches("ct state new").count(), 2, "{by_nft}");

    let ours = Netns::create(&unique("holdours")).unwrap();
    let ns = ours.name.clone();
    in_netns(&ours.name, move || {
        let hold = NatHold::take().unwrap();
        assert_eq!(hold.families.len(), 2);
        let listed = exec_in(&ns, &["nft", "list", "ruleset"]);
        assert_eq!(owned(&listed), by_nft, "our encoder against nft -f");
        assert_eq!(listed.matches("\n\tflags owner\n").count(), 2, "{listed}");
        assert!(listed.contains("# progname "), "{listed}");
        for suite in OTHER_NFTS {
            let root = format!("/var/cache/kube-nft/chroots/{suite}");
            let other = exec_in(&ns, &["chroot", &root, "nft", "list", "ruleset"]);
            assert_eq!(
                printed_alike(&owned(&other)),
                printed_alike(&by_nft),
                "{suite}'s nft"
            );
        }
        // Another kube-nft here (one replacing another) waits for the tables,
        // and takes them once the first lets go.
        let mut second = NatHold::take().unwrap();
        assert!(second.families.is_empty());
        second.refresh();
        assert!(second.families.is_empty());
        exec_in(&ns, &["nft", "flush", "ruleset"]);
        assert_eq!(
            exec_in(&ns, &["nft", "list", "tables"]),
            format!("table ip {HOLD_TABLE}\ntable ip6 {HOLD_TABLE}\n"),
            "a flush of the ruleset passes the owned tables by"
        );
        let delete = Command::new("nft")
            .args(["delete", "table", "ip", HOLD_TABLE])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&delete.stderr).contains("Operation not permitted"),
            "another process deleted an owned table: {delete:?}"
        );
        // With nothing else here, conntrack still tracks: a new flow is kept.
        let count = || exec_in(&ns, &["cat", "/proc/sys/net/netfilter/nf_conntrack_count"]);
        assert_eq!(count().trim(), "0");
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        probe.send_to(b"?", "127.0.0.1:9").unwrap();
        assert_eq!(count().trim(), "1", "conntrack stopped tracking");
        drop(hold);
        assert_eq!(exec_in(&ns, &["nft", "list", "tables"]), "");
        second.refresh();
        assert_eq!(second.families, Family::ALL.to_vec());
        assert_eq!(
            exec_in(&ns, &["nft", "list", "tables"]),
            format!("table ip {HOLD_TABLE}\ntable ip6 {HOLD_TABLE}\n")
        );
        drop(second);
    })
    .unwrap();
}
