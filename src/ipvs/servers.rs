//! What each Service asks of IPVS (pure, no I/O): its virtual services with their
//! real servers, chosen by the core's endpoint policy, the addresses it needs on
//! `kube-ipvs0`, and the commands that turn one set of virtual servers into
//! another.

use crate::core::model::{ClusterState, Service};
use crate::core::net::Family;
use crate::core::node_config::{IpvsSettings, NodeConfig};
use crate::core::policy::{categorize, port_endpoints};
use crate::netlink::ipvs::{Command, RealServer, VirtualKey, VirtualService};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// Real servers' weight: every endpoint gets an equal share.
const WEIGHT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    pub service: VirtualService,
    pub reals: Vec<RealServer>,
}

/// What one Service asks of IPVS, in both families: a virtual service per
/// ClusterIP, external IP, load balancer IP and NodePort address, for each port
/// that has endpoints under the traffic policy that applies there.
pub fn virtual_servers(
    state: &ClusterState,
    svc: &Service,
    config: &NodeConfig,
    settings: &IpvsSettings,
) -> Vec<VirtualServer> {
    let node = state.node.as_ref();
    let scheduler = svc
        .ipvs_scheduler
        .clone()
        .unwrap_or_else(|| settings.scheduler.clone());
    let mut out = Vec::new();
    for family in Family::ALL {
        let Some(vip) = svc.cluster_ip_of(family) else {
            continue;
        };
        let externals: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .chain(&svc.load_balancer_ips)
            .copied()
            .filter(|ip| Family::of(ip) == family)
            .collect();
        let nodeport_ips = config.nodeport_ips(node, family);
        for port in &svc.ports {
            let eps = port_endpoints(state, svc, port, family);
            let chosen = categorize(svc, &eps, node);
            let reals = |local: bool| -> Vec<RealServer> {
                let list = if local {
                    &chosen.local
                } else {
                    &chosen.cluster
                };
                let mut reals: Vec<RealServer> = list
                    .iter()
                    .map(|e| RealServer {
                        addr: e.addr,
                        port: e.port,
                        weight: WEIGHT,
                    })
                    .collect();
                reals.sort();
                reals.dedup();
                reals
            };
            let mut add = |addr: IpAddr, port_number: u16, reals: Vec<RealServer>| {
                if reals.is_empty() {
                    return; // the nftables table refuses or drops its traffic
                }
                out.push(VirtualServer {
                    service: VirtualService {
                        key: VirtualKey {
                            addr,
                            protocol: port.protocol,
                            port: port_number,
                        },
                        scheduler: scheduler.clone(),
                        persistence: svc.affinity_timeout,
                    },
                    reals,
                });
            };
            add(vip, port.port, reals(svc.internal_policy_local));
            let external = reals(svc.external_policy_local);
            for ip in &externals {
                add(*ip, port.port, external.clone());
            }
            if let Some(np) = port.node_port {
                for ip in &nodeport_ips {
                    add(*ip, np, external.clone());
                }
            }
        }
    }
    out
}

/// The addresses a Service needs on `kube-ipvs0`, whether or not it has
/// endpoints (without, the nftables table refuses its traffic, which must
/// therefore arrive here rather than be routed away).
pub fn service_addresses(svc: &Service) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = svc
        .cluster_ips
        .iter()
        .chain(&svc.external_ips)
        .chain(&svc.load_balancer_ips)
        .copied()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The commands that turn `have` into `want`: new and changed virtual services
/// and real servers first (a changed service gains its new real servers before
/// it loses the old ones), deletions last.
pub fn diff(
    have: &BTreeMap<VirtualKey, &VirtualServer>,
    want: &BTreeMap<VirtualKey, &VirtualServer>,
) -> Vec<Command> {
    let mut out = Vec::new();
    let mut removals = Vec::new();
    for (key, w) in want {
        let Some(h) = have.get(key) else {
            out.push(Command::AddService(w.service.clone()));
            out.extend(w.reals.iter().map(|r| Command::AddReal(*key, r.clone())));
            continue;
        };
        if h.service != w.service {
            out.push(Command::UpdateService(w.service.clone()));
        }
        let old: HashMap<(IpAddr, u16), &RealServer> =
            h.reals.iter().map(|r| ((r.addr, r.port), r)).collect();
        let new: HashMap<(IpAddr, u16), &RealServer> =
            w.reals.iter().map(|r| ((r.addr, r.port), r)).collect();
        for r in &w.reals {
            match old.get(&(r.addr, r.port)) {
                None => out.push(Command::AddReal(*key, r.clone())),
                Some(o) if *o != r => out.push(Command::UpdateReal(*key, r.clone())),
                Some(_) => {}
            }
        }
        for r in &h.reals {
            if !new.contains_key(&(r.addr, r.port)) {
                removals.push(Command::DeleteReal(*key, r.clone()));
            }
        }
    }
    out.extend(removals);
    for key in have.keys().filter(|k| !want.contains_key(k)) {
        out.push(Command::DeleteService(*key));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::net::Protocol;
    use crate::core::node_config::ProxyMode;

    fn vs(port: u16, reals: &[(&str, u32)]) -> (VirtualKey, VirtualServer) {
        let key = VirtualKey {
            addr: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port,
        };
        let server = VirtualServer {
            service: VirtualService {
                key,
                scheduler: "rr".into(),
                persistence: None,
            },
            reals: reals
                .iter()
                .map(|(a, w)| RealServer {
                    addr: a.parse().unwrap(),
                    port: 8080,
                    weight: *w,
                })
                .collect(),
        };
        (key, server)
    }

    /// The model the manifests describe, on node `node-a` (address 192.0.2.1).
    fn cluster(manifests: &str) -> (ClusterState, NodeConfig) {
        let loaded = crate::source::files::parse(manifests, "test").unwrap();
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        let validated = crate::core::convert::build_state(&loaded.objects, Some("node-a"));
        assert!(validated.rejected.is_empty(), "{:?}", validated.rejected);
        let config = NodeConfig {
            mode: ProxyMode::Ipvs(IpvsSettings {
                scheduler: "wlc".into(),
                ..IpvsSettings::default()
            }),
            ..NodeConfig::default()
        };
        (validated.state, config)
    }

    const NODE: &str = "---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.1}]}\n";
    const SLICE: &str = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 9376}]\nendpoints:\n- {addresses: [10.244.1.10], nodeName: node-a}\n- {addresses: [10.244.2.10], nodeName: node-b}\n";

    fn listed(servers: &[VirtualServer]) -> Vec<String> {
        servers
            .iter()
            .map(|v| {
                let reals: Vec<String> = v.reals.iter().map(|r| r.addr.to_string()).collect();
                format!(
                    "{} {} {:?} -> {}",
                    v.service.key,
                    v.service.scheduler,
                    v.service.persistence,
                    reals.join(",")
                )
            })
            .collect()
    }

    #[test]
    fn a_service_asks_for_a_virtual_service_per_address_with_its_policy_endpoints() {
        let web = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, annotations: {kube-nft.io/ipvs-scheduler: sh}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalTrafficPolicy: Local\n  sessionAffinity: ClientIP\n  ports: [{name: http, port: 80, targetPort: 9376, nodePort: 30080}]\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.8}]}}\n";
        let (state, config) = cluster(&(NODE.to_string() + web + SLICE));
        let svc = state.services.values().next().unwrap();
        let settings = config.ipvs_settings();
        assert_eq!(
            listed(&virtual_servers(&state, svc, &config, &settings)),
            [
                // Internal traffic: every endpoint; external: this node's only.
                "10.96.0.10:80/tcp sh Some(10800) -> 10.244.1.10,10.244.2.10",
                "198.51.100.8:80/tcp sh Some(10800) -> 10.244.1.10",
                "192.0.2.1:30080/tcp sh Some(10800) -> 10.244.1.10",
            ]
        );
        assert_eq!(
            service_addresses(svc),
            [
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "198.51.100.8".parse().unwrap()
            ]
        );
    }

    #[test]
    fn without_endpoints_under_its_policy_a_port_gets_no_virtual_service() {
        let web = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  internalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 9376}]\n";
        let remote_only = SLICE.replace("- {addresses: [10.244.1.10], nodeName: node-a}\n", "");
        let (state, config) = cluster(&(NODE.to_string() + web + &remote_only));
        let svc = state.services.values().next().unwrap();
        assert!(virtual_servers(&state, svc, &config, &config.ipvs_settings()).is_empty());
        let (state, config) = cluster(&(NODE.to_string() + web + SLICE));
        let svc = state.services.values().next().unwrap();
        assert_eq!(
            listed(&virtual_servers(
                &state,
                svc,
                &config,
                &config.ipvs_settings()
            )),
            ["10.96.0.10:80/tcp wlc None -> 10.244.1.10"]
        );
    }

    fn refs(m: &BTreeMap<VirtualKey, VirtualServer>) -> BTreeMap<VirtualKey, &VirtualServer> {
        m.iter().map(|(k, v)| (*k, v)).collect()
    }

    #[test]
    fn diff_adds_before_it_removes_and_leaves_the_unchanged_alone() {
        let have = BTreeMap::from([
            vs(80, &[("10.244.0.1", 1), ("10.244.0.2", 1)]),
            vs(81, &[("10.244.0.1", 1)]),
            vs(82, &[("10.244.0.9", 1)]),
        ]);
        let want = BTreeMap::from([
            vs(80, &[("10.244.0.2", 1), ("10.244.0.3", 1)]),
            vs(81, &[("10.244.0.1", 1)]),
            vs(83, &[("10.244.0.4", 1)]),
        ]);
        let (have, want) = (refs(&have), refs(&want));
        let text: Vec<String> = diff(&have, &want).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            text,
            [
                "add real server 10.244.0.3:8080 to 10.96.0.10:80/tcp",
                "add virtual service 10.96.0.10:83/tcp (rr)",
                "add real server 10.244.0.4:8080 to 10.96.0.10:83/tcp",
                "delete real server 10.244.0.1:8080 from 10.96.0.10:80/tcp",
                "delete virtual service 10.96.0.10:82/tcp",
            ]
        );
        assert!(diff(&want, &want).is_empty());
    }

    #[test]
    fn a_changed_scheduler_or_weight_is_an_update_not_a_replacement() {
        let (key, old) = vs(80, &[("10.244.0.1", 1)]);
        let mut new = old.clone();
        new.service.scheduler = "sh".into();
        new.reals[0].weight = 0;
        let cmds = diff(
            &BTreeMap::from([(key, &old)]),
            &BTreeMap::from([(key, &new)]),
        );
        assert!(matches!(cmds[0], Command::UpdateService(ref s) if s.scheduler == "sh"));
        assert!(matches!(cmds[1], Command::UpdateReal(_, ref r) if r.weight == 0));
        assert_eq!(cmds.len(), 2);
    }
}
