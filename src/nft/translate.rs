//! Translate: from the validated model and this node's settings to the desired
//! nftables objects. A pure function, no I/O: every Service semantic lives here and
//! is unit-tested without a kernel.
//!
//! The layout follows kube-proxy's nftables mode (its users know the names) with
//! the kernel's scaling traps avoided (see docs/DESIGN.md): no chain or set per
//! Service, no set shared by a rule per Service, and a number of sets per table
//! that follows the endpoint counts in use, not the Services.
//! - `service-ips` dispatches `daddr . l4proto . dport` (and `service-nodeports`
//!   `l4proto . dport`) to the chain that picks the entry's endpoint. The dispatch
//!   maps and what they lead to are spread over Service tables by a hash of the
//!   Service's name, as many as the cluster's size calls for
//!   (`nft::service_tables`); the main table keeps everything else.
//! - A Service port with n endpoints goes to the table's `pick-n`, which DNATs to
//!   the endpoint in slot `numgen random mod n` of the packet's entry in a shared
//!   endpoint map (`pick`), so every endpoint gets exactly 1/n. Session affinity
//!   keeps a chain of the port's own, a `numgen` cascade (rule k of n matches with
//!   probability 1/(n-k)).
//! - Masquerade is a mark (kube-proxy's 0x4000 by default) set in the dispatch
//!   chain and acted on in postrouting; hairpin traffic is found by one set lookup.
//! - Filter chains reject Services with no endpoints and wrong ports on live
//!   ClusterIPs, and drop traffic to unallocated addresses in the service CIDRs.

use crate::core::convert::{validate, Objects, Validated};
use crate::core::model::{ClusterState, Service};
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::nft::ipvs_table::ipvs_rules;
use crate::nft::names::*;
use crate::nft::pick::{endpoint_map_size, EndpointMap, EntryKind, Shared};
use crate::nft::service::{nftables_rules, ServiceRules};
use crate::nft::service_tables;
use crate::nft::skeleton::skeleton_of;
use crate::nft::slots::{FromScratch, Placement};
use crate::ruleset::{Element, KeyValue, Mapped, Ruleset, Table, TableId, Verdict};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

/// The chains and elements of one Service in one family, for the mode's flavour.
pub fn service_rules(
    state: &ClusterState,
    svc: &Service,
    family: Family,
    config: &NodeConfig,
    placement: &dyn Placement,
) -> ServiceRules {
    if config.mode.is_ipvs() {
        ipvs_rules(state, svc, family, config)
    } else {
        nftables_rules(state, svc, family, config, placement)
    }
}

/// The elements that depend on no Service: the addresses NodePorts are
/// served on, and the verdict of `cluster-ips-check` (`skeleton`).
pub fn node_elements(
    state: &ClusterState,
    config: &NodeConfig,
    family: Family,
) -> Vec<(&'static str, Element)> {
    let reject = Element {
        key: vec![KeyValue::CtStateNew],
        value: Some(Mapped::Verdict(Verdict::Goto(CHAIN_REJECT.into()))),
        comment: None,
    };
    config
        .nodeport_ips(state.node.as_ref(), family)
        .into_iter()
        .map(|ip| {
            (
                SET_NODEPORT_IPS,
                Element {
                    key: vec![KeyValue::Addr(ip)],
                    value: None,
                    comment: None,
                },
            )
        })
        .chain([(MAP_CLUSTER_IPS_REJECT, reject)])
        .collect()
}

pub fn hairpin_element(addr: IpAddr) -> Element {
    Element {
        key: vec![KeyValue::Addr(addr), KeyValue::Addr(addr)],
        value: None,
        comment: None,
    }
}

/// The tables of one family.
fn tables_for(
    state: &ClusterState,
    config: &NodeConfig,
    family: Family,
    placement: &dyn Placement,
) -> Vec<Table> {
    let count = service_tables::count(config, state);
    let ids = service_tables::table_ids(family, config, count);
    let mut tables: Vec<Table> = ids
        .iter()
        .map(|id| skeleton_of(*id, config, count))
        .collect();
    let index = |id: TableId| {
        ids.iter()
            .position(|t| *t == id)
            .expect("one of our tables")
    };
    let mut elements: BTreeMap<(usize, &str), Vec<Element>> = BTreeMap::new();
    let mut endpoint_maps: BTreeMap<(usize, EndpointMap), Vec<Element>> = BTreeMap::new();
    let mut shared: BTreeSet<(usize, Shared)> = BTreeSet::new();
    let mut claimed: HashSet<(usize, EntryKind, bool, Vec<KeyValue>)> = HashSet::new();
    let mut hairpin = BTreeSet::new();
    for (set, e) in node_elements(state, config, family) {
        // Every table that dispatches NodePorts has its own copy of the addresses.
        for i in 0..ids.len() {
            elements.entry((i, set)).or_default().push(e.clone());
        }
    }
    for svc in state.services.values() {
        let mut rules = service_rules(state, svc, family, config, placement);
        let (main, own) = (index(TableId::main(family)), index(rules.table));
        for (set, e) in std::mem::take(&mut rules.elements) {
            elements
                .entry((index(rules.home(set)), set))
                .or_default()
                .push(e);
        }
        for entry in &rules.slots {
            // Two Services with one entry (the same external IP and port): the
            // first keeps it, whole, as in the dispatch maps.
            let at = (own, entry.kind, entry.local, entry.entry.clone());
            if claimed.insert(at) {
                for (map, element) in entry.elements() {
                    endpoint_maps.entry((own, map)).or_default().push(element);
                }
            }
        }
        shared.extend(rules.shared.iter().map(|s| (own, *s)));
        hairpin.extend(rules.hairpin);
        tables[own].chains.extend(rules.chains);
        tables[own].sets.extend(rules.sets);
        tables[main].chains.extend(rules.main_chains);
        for (table, object) in rules.objects {
            tables[index(table)].objects.push(object);
        }
    }
    for (i, s) in shared {
        tables[i].chains.extend(s.chains(config.masquerade_mark()));
        if let Shared::Map(map) = s {
            let mut set = map.set(family);
            set.elements = endpoint_maps.remove(&(i, map)).unwrap_or_default();
            set.elements.sort_by(|a, b| a.key.cmp(&b.key));
            set.size = endpoint_map_size(set.elements.len());
            tables[i].sets.push(set);
        }
    }
    elements.insert(
        (index(TableId::main(family)), SET_HAIRPIN),
        hairpin.into_iter().map(hairpin_element).collect(),
    );
    for ((i, name), mut els) in elements {
        els.sort_by(|a, b| a.key.cmp(&b.key));
        els.dedup_by(|a, b| a.key == b.key);
        if let Some(s) = tables[i].sets.iter_mut().find(|s| s.name == name) {
            s.elements = els;
        }
    }
    tables
}

/// The whole desired ruleset: the tables for IPv4, then those for IPv6.
pub fn translate(state: &ClusterState, config: &NodeConfig) -> Ruleset {
    translate_placed(state, config, &FromScratch)
}

/// The same, keeping endpoints in the cascade slots the kernel has them in.
pub fn translate_placed(
    state: &ClusterState,
    config: &NodeConfig,
    placement: &dyn Placement,
) -> Ruleset {
    Ruleset {
        tables: Family::ALL
            .iter()
            .flat_map(|f| tables_for(state, config, *f, placement))
            .collect(),
    }
}

/// Validates the objects and computes the desired ruleset, logging each rejected
/// object; the others still go through.
pub fn desired(
    objects: &Objects,
    node_name: Option<&str>,
    config: &NodeConfig,
) -> (Ruleset, Validated) {
    let validated = validate(objects, node_name);
    (translate(&validated.state, config), validated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::{
        Conditions, Endpoint, EndpointPort, EndpointSlice, NodeInfo, PortEndpoint, Service,
        ServiceKey, ServicePort, TargetPort,
    };
    use crate::nft::skeleton::skeleton;
    use crate::nft::slots::SlotKey;

    use crate::core::net::Protocol;
    use crate::nft::build::DISPATCH_KEY;
    use crate::nft::service_tables::shard_of;
    use crate::nft::slots::{assign_slots, Fill};
    use crate::ruleset::{Field, KeyValue, MapData, Mapped, Stmt, Verdict, SERVICE_SHARDS};
    use std::net::IpAddr;

    fn key(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "default".into(),
            name: name.into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state_with(name: &str, vips: &[&str], eps: &[(&str, Conditions)]) -> ClusterState {
        let mut state = ClusterState::default();
        let svc = Service {
            key: key(name),
            cluster_ips: vips.iter().map(|v| ip(v)).collect(),
            ports: vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                target_port: TargetPort::Number(9376),
                node_port: None,
            }],
            ..Service::default()
        };
        state.put_service(svc);
        for family in Family::ALL {
            let endpoints: Vec<Endpoint> = eps
                .iter()
                .filter(|(a, _)| Family::of(&ip(a)) == family)
                .map(|(a, c)| Endpoint {
                    addr: ip(a),
                    conditions: *c,
                    node_name: None,
                    zone: None,
                    hints: Default::default(),
                })
                .collect();
            state
                .slices
                .entry(key(name))
                .or_default()
                .insert(EndpointSlice {
                    name: format!("{name}-{}", family.keyword()),
                    service: key(name),
                    family,
                    ports: vec![EndpointPort {
                        name: "http".into(),
                        protocol: Protocol::Tcp,
                        port: 9376,
                    }],
                    endpoints,
                });
        }
        state
    }

    const READY: Conditions = Conditions {
        ready: true,
        serving: true,
        terminating: false,
    };
    const TERMINATING: Conditions = Conditions {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// The endpoints, by slot, that a packet to `vip`:80/TCP is sent to: its
    /// dispatch element's pick chain, and that chain's map's elements for the
    /// entry. Checks the chain picks `numgen random mod n` over exactly n slots.
    fn endpoints_of(rs: &Ruleset, family: Family, vip: &str) -> Vec<String> {
        let entry = vec![
            KeyValue::Addr(ip(vip)),
            KeyValue::Proto(Protocol::Tcp),
            KeyValue::Port(80),
        ];
        let (table, chain) = rs
            .of_family(family)
            .find_map(|t| {
                let e = t
                    .set(MAP_SERVICE_IPS)?
                    .elements
                    .iter()
                    .find(|e| e.key == entry)?;
                match &e.value {
                    Some(Mapped::Verdict(Verdict::Goto(c))) => Some((t, t.chain(c)?)),
                    _ => None,
                }
            })
            .expect("a dispatch element to a chain");
        let tcp = chain
            .rules
            .iter()
            .find(|r| r.stmts[0] == Stmt::L4Proto(Protocol::Tcp))
            .expect("a rule for TCP");
        let [_, Stmt::DnatPick {
            fields,
            modulus,
            map,
        }] = tcp.stmts.as_slice()
        else {
            panic!("meta l4proto tcp dnat … map: {:?}", tcp.stmts);
        };
        assert_eq!(fields, &DISPATCH_KEY.to_vec());
        let map = table.set(map).expect("the pick chain's map");
        assert_eq!(map.data, Some(MapData::Endpoint(family)));
        let slots: Vec<String> = (0..*modulus)
            .map(|slot| {
                let key = [entry.clone(), vec![KeyValue::Slot(slot)]].concat();
                let e = map.elements.iter().find(|e| e.key == key);
                let e = e.unwrap_or_else(|| panic!("slot {slot} of {modulus} in {}", map.name));
                e.value.as_ref().unwrap().to_string()
            })
            .collect();
        let of_entry = map.elements.iter().filter(|e| e.key[..3] == entry[..]);
        assert_eq!(of_entry.count(), slots.len(), "no slot beyond the modulus");
        slots
    }

    /// Every chain and set of a family's Service tables.
    fn names(rs: &Ruleset, family: Family) -> Vec<String> {
        rs.of_family(family)
            .filter(|t| t.id().shard.is_some())
            .flat_map(|t| {
                let chains = t.chains.iter().map(|c| c.name.clone());
                chains.chain(t.sets.iter().map(|s| s.name.clone()))
            })
            .collect()
    }

    #[test]
    fn one_pick_chain_gives_every_endpoint_an_equal_share() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[
                ("10.244.0.1", READY),
                ("10.244.0.2", READY),
                ("10.244.0.3", READY),
            ],
        );
        let rs = translate(&state, &NodeConfig::default());
        // `numgen random mod 3` yields 0, 1 and 2 alike, and each names one endpoint.
        assert_eq!(
            endpoints_of(&rs, Family::Ip, "10.0.0.10"),
            [
                "10.244.0.1 . 9376",
                "10.244.0.2 . 9376",
                "10.244.0.3 . 9376"
            ]
        );
        // The chain and map are the count's, not the Service's.
        let home = rs
            .get(TableId::shard(Family::Ip, shard_of(&key("web"), 1)))
            .unwrap();
        let pick = home.chain("pick-3").expect("pick-3");
        assert_eq!(pick.rules.len(), 3, "one rule per protocol");
        assert!(home.set("endpoints-3-4").is_some());
        assert!(
            !names(&rs, Family::Ip).iter().any(|n| n.contains("web")),
            "no chain or set of its own: {:?}",
            names(&rs, Family::Ip)
        );
    }

    #[test]
    fn services_with_the_same_count_share_one_chain_and_map() {
        let mut state = ClusterState::default();
        for (name, vip) in [("a", "10.0.0.10"), ("b", "10.0.0.11"), ("c", "10.0.0.12")] {
            let mut s = state_with(
                name,
                &[vip],
                &[("10.244.0.1", READY), ("10.244.0.2", READY)],
            );
            // All in one Service table: the tables differ by name hash only.
            state.services.append(&mut s.services);
            state.slices.append(&mut s.slices);
        }
        let rs = translate(&state, &NodeConfig::default());
        let maps: Vec<(TableId, usize)> = rs
            .tables
            .iter()
            .filter_map(|t| Some((t.id(), t.set("endpoints-2")?.elements.len())))
            .collect();
        let total: usize = maps.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 6, "two slots for each of three Services: {maps:?}");
        for t in maps.iter().map(|(t, _)| rs.get(*t).unwrap()) {
            assert_eq!(t.chains.iter().filter(|c| c.name == "pick-2").count(), 1);
        }
        for vip in ["10.0.0.10", "10.0.0.11", "10.0.0.12"] {
            assert_eq!(endpoints_of(&rs, Family::Ip, vip).len(), 2);
        }
    }

    #[test]
    fn two_services_with_one_external_entry_the_first_keeps_it_whole() {
        // Two names of one Service table.
        let names: Vec<String> = (0..200).map(|i| format!("s{i}")).collect();
        let (a, b) = names
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                let b = names[i + 1..]
                    .iter()
                    .find(|b| shard_of(&key(b), 16) == shard_of(&key(a), 16))?;
                Some((a.clone(), b.clone()))
            })
            .unwrap();
        // The first in the model's order (by name) is `a`.
        let (a, b) = if a < b { (a, b) } else { (b, a) };
        let mut state = ClusterState::default();
        for (name, vip, eps) in [
            (
                &a,
                "10.0.0.10",
                &["10.244.0.1", "10.244.0.2", "10.244.0.3"][..],
            ),
            (
                &b,
                "10.0.0.11",
                &["10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4"][..],
            ),
        ] {
            let ready: Vec<(&str, Conditions)> = eps.iter().map(|e| (*e, READY)).collect();
            let mut s = state_with(name, &[vip], &ready);
            for svc in s.services.values_mut().map(std::sync::Arc::make_mut) {
                svc.external_ips = vec![ip("192.0.2.1")];
            }
            state.services.append(&mut s.services);
            state.slices.append(&mut s.slices);
        }
        let sixteen = NodeConfig {
            service_tables: Some(SERVICE_SHARDS),
            ..NodeConfig::default()
        };
        let rs = translate(&state, &sixteen);
        let table = rs
            .get(TableId::shard(Family::Ip, shard_of(&key(&a), 16)))
            .unwrap();
        // Both counts, 3 and 4, share the map of 3 to 4 endpoints.
        let external: Vec<String> = table
            .set("endpoints-3-4")
            .unwrap()
            .elements
            .iter()
            .filter(|e| e.key[0] == KeyValue::Addr(ip("192.0.2.1")))
            .map(|e| e.value.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(
            external,
            [
                "10.244.0.1 . 9376",
                "10.244.0.2 . 9376",
                "10.244.0.3 . 9376"
            ]
        );
        let dispatch = table.set(MAP_SERVICE_IPS).unwrap();
        let to_external = dispatch
            .elements
            .iter()
            .filter(|e| e.key[0] == KeyValue::Addr(ip("192.0.2.1")))
            .map(|e| e.value.as_ref().unwrap().to_string())
            .collect::<Vec<_>>();
        assert_eq!(to_external, ["goto masquerade-pick-3"]);
    }

    #[test]
    fn one_endpoint_is_slot_zero_of_the_map_of_one() {
        let state = state_with("web", &["10.0.0.10"], &[("10.244.0.1", READY)]);
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(
            endpoints_of(&rs, Family::Ip, "10.0.0.10"),
            ["10.244.0.1 . 9376"]
        );
    }

    #[test]
    fn service_without_endpoints_goes_to_the_reject_map_and_has_no_chain() {
        let state = state_with("empty", &["10.0.0.11"], &[]);
        let rs = translate(&state, &NodeConfig::default());
        let t = rs.table(Family::Ip).unwrap();
        assert!(rs
            .of_family(Family::Ip)
            .filter_map(|t| t.set(MAP_SERVICE_IPS))
            .all(|m| m.elements.is_empty()));
        let ne = &t.set(MAP_NO_ENDPOINT_SERVICES).unwrap().elements;
        assert_eq!(ne.len(), 1);
        assert_eq!(
            ne[0].value,
            Some(Mapped::Verdict(Verdict::Goto(CHAIN_REJECT.into())))
        );
        let skeleton = names(
            &translate(&ClusterState::default(), &NodeConfig::default()),
            Family::Ip,
        );
        assert_eq!(names(&rs, Family::Ip), skeleton, "no pick chain or map");
        assert_eq!(t.set(SET_CLUSTER_IPS).unwrap().elements.len(), 1);
    }

    #[test]
    fn terminating_endpoints_serve_only_when_none_is_ready() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[("10.244.0.1", READY), ("10.244.0.2", TERMINATING)],
        );
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(
            endpoints_of(&rs, Family::Ip, "10.0.0.10"),
            ["10.244.0.1 . 9376"]
        );

        let state = state_with("web", &["10.0.0.10"], &[("10.244.0.2", TERMINATING)]);
        let rs = translate(&state, &NodeConfig::default());
        assert_eq!(
            endpoints_of(&rs, Family::Ip, "10.0.0.10"),
            ["10.244.0.2 . 9376"]
        );
    }

    #[test]
    fn dual_stack_service_picks_in_each_family_among_its_own_endpoints() {
        let state = state_with(
            "web",
            &["10.0.0.10", "fd00:10:96::10"],
            &[("10.244.0.1", READY), ("fd00:10:244::1", READY)],
        );
        let rs = translate(&state, &NodeConfig::default());
        for (family, vip, ep) in [
            (Family::Ip, "10.0.0.10", "10.244.0.1 . 9376"),
            (Family::Ip6, "fd00:10:96::10", "fd00:10:244::1 . 9376"),
        ] {
            assert_eq!(endpoints_of(&rs, family, vip), [ep]);
        }
    }

    #[test]
    fn a_small_cluster_has_one_service_table_per_family() {
        let state = state_with("web", &["10.0.0.10"], &[("10.244.0.1", READY)]);
        let rs = translate(&state, &NodeConfig::default());
        let ids: Vec<TableId> = rs.tables.iter().map(|t| t.id()).collect();
        assert_eq!(
            ids,
            [
                TableId::main(Family::Ip),
                TableId::shard(Family::Ip, 0),
                TableId::main(Family::Ip6),
                TableId::shard(Family::Ip6, 0),
            ]
        );
        let comment = rs
            .get(TableId::shard(Family::Ip, 0))
            .unwrap()
            .comment
            .clone();
        assert!(comment
            .unwrap()
            .starts_with("kube-nft: 1/1 of the Services"));
    }

    #[test]
    fn a_services_dispatch_elements_and_endpoints_share_its_service_table() {
        let mut state = state_with("web", &["10.0.0.10"], &[("10.244.0.1", READY)]);
        let other = state_with("api", &["10.0.0.11"], &[("10.244.0.2", READY)]);
        state.services.extend(other.services);
        state.slices.extend(other.slices);
        assert_ne!(shard_of(&key("web"), 16), shard_of(&key("api"), 16));
        let sixteen = NodeConfig {
            service_tables: Some(SERVICE_SHARDS),
            ..NodeConfig::default()
        };
        let rs = translate(&state, &sixteen);
        assert_eq!(rs.tables.len(), 2 * (1 + SERVICE_SHARDS as usize));
        for name in ["web", "api"] {
            let home = rs
                .get(TableId::shard(Family::Ip, shard_of(&key(name), 16)))
                .unwrap();
            let dispatch = &home.set(MAP_SERVICE_IPS).unwrap().elements;
            assert_eq!(dispatch.len(), 1);
            assert_eq!(
                dispatch[0].value,
                Some(Mapped::Verdict(Verdict::Goto("pick-1".into())))
            );
            assert_eq!(home.set("endpoints-1").unwrap().elements.len(), 1);
        }
        // Nothing anywhere else, and the main table has no dispatch map.
        let picks = rs.tables.iter().filter(|t| t.chain("pick-1").is_some());
        assert_eq!(picks.count(), 2);
        assert!(rs.table(Family::Ip).unwrap().set(MAP_SERVICE_IPS).is_none());
    }

    #[test]
    fn only_endpoints_that_may_be_on_this_node_get_a_hairpin_element() {
        let mut state = state_with(
            "web",
            &["10.0.0.10"],
            &[
                ("10.244.0.1", READY),
                ("10.244.0.2", READY),
                ("10.244.0.3", READY),
            ],
        );
        let hairpin = |state: &ClusterState| {
            let rs = translate(state, &NodeConfig::default());
            let set = rs.table(Family::Ip).unwrap().set(SET_HAIRPIN).unwrap();
            set.elements
                .iter()
                .map(|e| e.key[0].to_string())
                .collect::<Vec<_>>()
        };
        let nodes = [Some("node-a"), Some("node-b"), None];
        for slice in state.slices.values_mut().flat_map(|s| s.values_mut()) {
            for (e, node) in slice.endpoints.iter_mut().zip(nodes) {
                e.node_name = node.map(crate::core::model::name);
            }
        }
        // This node unknown: any endpoint may be here.
        assert_eq!(hairpin(&state).len(), 3);
        state.node = Some(NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        });
        assert_eq!(hairpin(&state), vec!["10.244.0.1", "10.244.0.3"]);
    }

    #[test]
    fn masquerade_rule_and_unallocated_drop_follow_the_cidrs() {
        let config = NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            // Every ServiceCIDR of a family is guarded, each once, host bits
            // cleared.
            service_cidrs: ["10.0.0.0/16", "10.97.0.0/24", "10.97.0.9/24"]
                .map(|c| c.parse().unwrap())
                .to_vec(),
            masquerade_bit: 14,
            ..NodeConfig::default()
        };
        let v4 = skeleton(Family::Ip, &config);
        let services = v4.chain(CHAIN_SERVICES).unwrap();
        assert_eq!(services.rules.len(), 1);
        assert!(services.rules[0].stmts.contains(&Stmt::MarkOr(0x4000)));
        let drops: Vec<_> = v4.chain(CHAIN_CLUSTER_IPS_CHECK).unwrap().rules[1..]
            .iter()
            .map(|r| r.stmts.clone())
            .collect();
        let drop = |net: &str| {
            vec![
                Stmt::AddrMatch {
                    field: Field::Daddr,
                    net: net.parse().unwrap(),
                    negate: false,
                },
                Stmt::Verdict(Verdict::Drop),
            ]
        };
        assert_eq!(drops, vec![drop("10.0.0.0/16"), drop("10.97.0.0/24")]);
        // No IPv6 CIDRs were given: no masquerade rule and no drop rule there.
        let v6 = skeleton(Family::Ip6, &config);
        assert!(v6.chain(CHAIN_SERVICES).unwrap().rules.is_empty());
        assert_eq!(v6.chain(CHAIN_CLUSTER_IPS_CHECK).unwrap().rules.len(), 1);
    }

    #[test]
    fn hairpin_set_holds_each_endpoint_once() {
        let state = state_with(
            "web",
            &["10.0.0.10"],
            &[("10.244.0.1", READY), ("10.244.0.2", READY)],
        );
        let t = translate(&state, &NodeConfig::default()).tables.remove(0);
        let hp = &t.set(SET_HAIRPIN).unwrap().elements;
        assert_eq!(hp.len(), 2);
        assert_eq!(
            hp[0].key,
            vec![
                KeyValue::Addr(ip("10.244.0.1")),
                KeyValue::Addr(ip("10.244.0.1"))
            ]
        );
    }

    #[test]
    fn two_pod_cidrs_of_one_family_are_a_clear_error_two_service_cidrs_are_not() {
        let two = vec![
            "10.244.0.0/16".parse().unwrap(),
            "10.245.0.0/16".parse().unwrap(),
        ];
        let config = NodeConfig {
            cluster_cidrs: two.clone(),
            ..NodeConfig::default()
        };
        let err = config.validate().unwrap_err();
        assert!(err.0.starts_with("--cluster-cidr: 2 ip CIDRs"), "{err}");
        let config = NodeConfig {
            service_cidrs: two,
            ..NodeConfig::default()
        };
        config.validate().unwrap();
    }

    fn ep(last: u8) -> PortEndpoint {
        PortEndpoint {
            addr: IpAddr::from([10, 244, 0, last]),
            port: 80,
            conditions: READY,
            node_name: None,
            zone: None,
            hints: Default::default(),
        }
    }

    fn keys(slots: &[&PortEndpoint]) -> Vec<u8> {
        slots
            .iter()
            .map(|e| match e.addr {
                IpAddr::V4(a) => a.octets()[3],
                IpAddr::V6(_) => 0,
            })
            .collect()
    }

    #[test]
    fn slots_from_scratch_list_endpoints_in_ascending_order() {
        let eps = [ep(1), ep(2), ep(3)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        // A cascade's slot 0 is its last rule, so its highest slot holds the
        // lowest address; a map lists slot 0 first.
        assert_eq!(
            keys(&assign_slots(None, &refs, Fill::Cascade)),
            vec![3, 2, 1]
        );
        assert_eq!(keys(&assign_slots(None, &refs, Fill::Map)), vec![1, 2, 3]);
    }

    #[test]
    fn a_leaving_endpoint_is_replaced_by_the_last_slot_and_others_stay() {
        let eps = [ep(1), ep(2), ep(4), ep(5)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        let previous: Vec<SlotKey> = [5, 4, 3, 2, 1]
            .iter()
            .map(|l| SlotKey::new(IpAddr::from([10, 244, 0, *l]), 80))
            .collect();
        // 3 (slot 2) leaves: 1 (slot 4, the last) moves into slot 2.
        assert_eq!(
            keys(&assign_slots(Some(previous.clone()), &refs, Fill::Map)),
            vec![5, 4, 1, 2]
        );
        // A newcomer takes a new slot at the end; nobody moves.
        let eps = [ep(1), ep(2), ep(3), ep(4), ep(5), ep(6)];
        let refs: Vec<&PortEndpoint> = eps.iter().collect();
        assert_eq!(
            keys(&assign_slots(Some(previous), &refs, Fill::Map)),
            vec![5, 4, 3, 2, 1, 6]
        );
    }

    #[test]
    fn chain_names_are_stable_and_bounded() {
        let mut svc = Service {
            key: key("web"),
            ..Service::default()
        };
        let port = ServicePort {
            name: String::new(),
            protocol: Protocol::Udp,
            port: 53,
            target_port: TargetPort::Number(53),
            node_port: None,
        };
        let a = service_chain_name(&svc, &port);
        assert_eq!(a, service_chain_name(&svc, &port));
        assert!(a.ends_with("-default/web/udp/53"), "{a}");
        svc.key.name = "x".repeat(300);
        assert!(service_chain_name(&svc, &port).len() <= 255);
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;
    use crate::core::node_config::DEFAULT_MASQUERADE_BIT;
    use crate::nft::skeleton::{service_table_skeleton, skeleton};

    /// `nft-templates/skeleton.nft` is the readable form of `skeleton()` and
    /// `service_table_skeleton()`; this keeps
    /// the two from drifting apart.
    #[test]
    fn skeleton_matches_its_template() {
        let template = include_str!("../../nft-templates/skeleton.nft");
        let config = NodeConfig {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            ..NodeConfig::default()
        };
        let body: String = template
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let tables = [
            skeleton(Family::Ip, &config),
            service_table_skeleton(TableId::shard(Family::Ip, 0), 16),
        ];
        let text: String = tables.iter().map(crate::ruleset::text::table).collect();
        assert_eq!(text, body.trim_start());
    }
}
