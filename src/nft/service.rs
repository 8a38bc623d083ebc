//! What one Service contributes to one family's tables: its dispatch and
//! no-endpoint elements, its entries' endpoints in the shared endpoint maps
//! (`pick`) and the shared chains it uses, the chains of its own where a policy
//! needs them (`external-`/`nodeport-` for `externalTrafficPolicy: Local`;
//! `svc-`, `local-` and affinity sets for session affinity; `firewall-`),
//! counters and hairpin addresses.
//!
//! `nftables_rules` is the nftables flavour, read straight through. What the
//! IPVS flavour (`ipvs_table::ipvs_rules`) shares with it is here too:
//! `ServiceIn` (the `cluster-ips` element, the firewall, each port's chosen
//! endpoints and keys), the refusals, the counters and the external elements.

use crate::core::model::{ClusterState, NodeInfo, PortEndpoint, Service, ServicePort};
use crate::core::net::{Family, Protocol};
use crate::core::node_config::NodeConfig;
use crate::core::policy::{categorize, port_endpoints, Categorized};
use crate::nft::build::{dispatch_key, element, nodeport_key};
use crate::nft::names::*;
use crate::nft::pick::{EntryKind, EntrySlots, PickGroup, Shared};
use crate::nft::service_tables;
use crate::nft::slots::{assign_slots, Fill, Placement};
use crate::ruleset::{
    clamp_comment, Chain, CtTimeoutPolicy, Element, Field, KeyValue, Mapped, NamedObject,
    ObjectDef, Rule, Set, Stmt, TableId, Verdict, DYNAMIC_SET_SIZE,
};
use ipnet::IpNet;
use std::net::IpAddr;

/// Session affinity of one Service port: the clients each endpoint has seen.
struct Affinity<'a> {
    /// `ns/name/proto/port`, which with the endpoint names its set.
    port_id: &'a str,
    timeout: u32,
}

impl Affinity<'_> {
    fn set_name(&self, ep: &PortEndpoint) -> String {
        chain_name(
            "affinity",
            // nft set names take no ':' (IPv6). The timeout is in the name: a
            // new timeout is a new set.
            &format!(
                "{}/{}/{}/{}s",
                self.port_id,
                ep.addr.to_string().replace(':', "-"),
                ep.port,
                self.timeout
            ),
        )
    }

    fn set(&self, family: Family, ep: &PortEndpoint) -> Set {
        Set {
            name: self.set_name(ep),
            key: vec![family.addr_type()],
            data: None,
            comment: None,
            timeout: Some(self.timeout),
            size: Some(DYNAMIC_SET_SIZE),
            elements: Vec::new(),
        }
    }
}

/// The endpoint-selection chain of one Service port with session affinity: a
/// `numgen` cascade, one rule per slot from the highest down. The rule of slot k
/// matches with probability 1/(k+1) (slot 0 always), so each of n endpoints gets
/// exactly 1/n. Each endpoint also has a timeout set of the clients it served: a
/// client found in one goes back to that endpoint, and the cascade records the
/// client in the set of the endpoint it picks. An endpoint that leaves takes its
/// set with it, so no client is ever sent back to it.
fn affinity_chain(
    name: String,
    label: &str,
    port: &ServicePort,
    slots: &[&PortEndpoint],
    affinity: &Affinity,
) -> Chain {
    let dnat = |ep: &PortEndpoint| Stmt::Dnat {
        addr: ep.addr,
        port: ep.port,
    };
    let mut rules = Vec::new();
    for ep in slots.iter().rev() {
        rules.push(Rule::new(vec![
            Stmt::L4Proto(port.protocol),
            Stmt::InSet {
                fields: vec![Field::Saddr],
                set: affinity.set_name(ep),
            },
            dnat(ep),
        ]));
    }
    for (k, ep) in slots.iter().enumerate().rev() {
        let mut stmts = vec![Stmt::L4Proto(port.protocol)];
        if k > 0 {
            stmts.push(Stmt::NumgenEq {
                modulus: k as u32 + 1,
                value: 0,
            });
        }
        stmts.push(Stmt::SetUpdate {
            field: Field::Saddr,
            set: affinity.set_name(ep),
        });
        stmts.push(dnat(ep));
        rules.push(Rule::new(stmts));
    }
    Chain {
        name,
        base: None,
        comment: Some(clamp_comment(label)),
        rules,
    }
}

/// What one Service contributes to one family's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRules {
    /// The Service table that holds this Service's port chains, its dispatch
    /// elements and its sets (the main table with the IPVS backend).
    pub table: TableId,
    /// Chains in `table`.
    pub chains: Vec<Chain>,
    /// Chains in the main table: the source-range firewall, which the filter
    /// hooks reach.
    pub main_chains: Vec<Chain>,
    /// Sets of this Service alone (session affinity sets), in `table`,
    /// created and deleted with it.
    pub sets: Vec<Set>,
    /// Its entries' endpoints, each entry in the endpoint map of its count.
    pub slots: Vec<EntrySlots>,
    /// The shared chains (and maps) of `table` it uses, sorted, each once.
    pub shared: Vec<Shared>,
    /// Elements, with the name of the set or map they belong to (in the table
    /// `home` says).
    pub elements: Vec<(&'static str, Element)>,
    /// Endpoints that need a hairpin element (shared between Services).
    pub hairpin: Vec<IpAddr>,
    /// Named objects, with their table: a counter per Service port with
    /// `--counters` (in the main table), its conntrack timeout policies (in
    /// `table`).
    pub objects: Vec<(TableId, NamedObject)>,
}

impl ServiceRules {
    pub(super) fn new(table: TableId) -> ServiceRules {
        ServiceRules {
            table,
            chains: Vec::new(),
            main_chains: Vec::new(),
            sets: Vec::new(),
            slots: Vec::new(),
            shared: Vec::new(),
            elements: Vec::new(),
            hairpin: Vec::new(),
            objects: Vec::new(),
        }
    }

    /// The hairpin addresses and shared objects sorted and without repeats.
    pub(super) fn finish(mut self) -> ServiceRules {
        self.hairpin.sort();
        self.hairpin.dedup();
        self.shared.sort();
        self.shared.dedup();
        self
    }

    /// The table whose set or map `set` this Service's element belongs to: the
    /// dispatch maps are in its Service table, every other set in the main one.
    pub fn home(&self, set: &str) -> TableId {
        if set == MAP_SERVICE_IPS || set == MAP_SERVICE_NODEPORTS {
            self.table
        } else {
            TableId::main(self.table.family)
        }
    }
}

/// The source-range firewall of a load balancer: listed sources return to the
/// caller (`firewall-check`), every other source is dropped.
fn firewall_chain(name: String, svc: &Service, ranges: &[IpNet]) -> Chain {
    let mut rules: Vec<Rule> = ranges
        .iter()
        .map(|r| {
            Rule::new(vec![
                Stmt::AddrMatch {
                    field: Field::Saddr,
                    net: *r,
                    negate: false,
                },
                Stmt::Verdict(Verdict::Return),
            ])
        })
        .collect();
    rules.push(
        Rule::new(vec![Stmt::Verdict(Verdict::Drop)])
            .with_comment("source outside loadBalancerSourceRanges"),
    );
    Chain {
        name,
        base: None,
        comment: Some(clamp_comment(&svc.key.to_string())),
        rules,
    }
}

/// The endpoint-picking chains of one Service port, by traffic policy.
pub(super) struct PolicyChains {
    pub cluster: Option<String>,
    pub local: Option<String>,
}

impl PolicyChains {
    pub(super) fn internal(&self, svc: &Service) -> Option<&str> {
        if svc.internal_policy_local {
            self.local.as_deref()
        } else {
            self.cluster.as_deref()
        }
    }

    pub(super) fn external(&self, svc: &Service) -> Option<&str> {
        if svc.external_policy_local {
            self.local.as_deref()
        } else {
            self.cluster.as_deref()
        }
    }
}

/// The chain external traffic (NodePorts, external IPs, load balancer IPs) enters.
/// With `externalTrafficPolicy: Cluster` it is masqueraded and may go anywhere.
/// With `Local`, clients outside the node keep their source address and reach only
/// this node's endpoints, while pods and the node itself reach any endpoint
/// (kube-proxy's short-circuit): their traffic is subject to neither policy, as
/// if it had gone out to the load balancer and come back to a node that has
/// one. So the Service works from every pod, whatever node it is on
/// (kubernetes#131765).
fn external_chain(
    name: String,
    label: &str,
    svc: &Service,
    config: &NodeConfig,
    family: Family,
    cluster: Option<&str>,
    local: Option<&str>,
) -> Option<Chain> {
    let mark = config.masquerade_mark();
    let goto = |c: &str| Stmt::Verdict(Verdict::Goto(c.to_string()));
    let mut rules = Vec::new();
    if !svc.external_policy_local {
        let cluster = cluster?;
        rules.push(Rule::new(vec![Stmt::MarkOr(mark)]));
        rules.push(Rule::new(vec![goto(cluster)]));
    } else {
        if let Some(cluster) = cluster {
            if let Some(cidr) = NodeConfig::cidr(&config.cluster_cidrs, family) {
                rules.push(
                    Rule::new(vec![
                        Stmt::AddrMatch {
                            field: Field::Saddr,
                            net: cidr,
                            negate: false,
                        },
                        goto(cluster),
                    ])
                    .with_comment("pods reach any endpoint"),
                );
            }
            rules.push(Rule::new(vec![Stmt::FibSaddrLocal, Stmt::MarkOr(mark)]));
            rules.push(Rule::new(vec![Stmt::FibSaddrLocal, goto(cluster)]));
        }
        if let Some(local) = local {
            rules.push(Rule::new(vec![goto(local)]));
        }
    }
    if rules.is_empty() {
        return None;
    }
    Some(Chain {
        name,
        base: None,
        comment: Some(clamp_comment(label)),
        rules,
    })
}

/// One Service in one family, as both flavours (nftables, IPVS) start it: its
/// `cluster-ips` element and source-range firewall are already in `out`.
pub(super) struct ServiceIn<'a> {
    pub svc: &'a Service,
    pub vip: IpAddr,
    pub node: Option<&'a NodeInfo>,
    /// External IPs, then load balancer IPs, of this family.
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    /// The `firewall-` chain, when load balancer IPs have source ranges.
    firewall: Option<String>,
}

/// One port of a `ServiceIn`, as both flavours see it.
pub(super) struct PortIn<'a> {
    pub port: &'a ServicePort,
    /// `ns/name:port`, the comment on everything of the port.
    pub label: String,
    /// `ns/name/proto/port`, from which its chains are named.
    pub port_id: String,
    /// Its index among the Service's ports.
    pub index: usize,
    pub eps: Categorized<'a>,
    /// The `service-ips` key of the ClusterIP, and of each external address.
    pub vip_key: Vec<KeyValue>,
    pub external_keys: Vec<Vec<KeyValue>>,
}

impl<'a> ServiceIn<'a> {
    /// `None` (and `out` untouched) if the Service has no ClusterIP in `family`.
    pub(super) fn start(
        out: &mut ServiceRules,
        state: &'a ClusterState,
        svc: &'a Service,
        family: Family,
    ) -> Option<Self> {
        let vip = svc.cluster_ip_of(family)?;
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .copied()
                .filter(|ip| Family::of(ip) == family)
                .collect()
        };
        let lb_ips = of_family(&svc.load_balancer_ips);
        let ranges: Vec<IpNet> = svc
            .source_ranges
            .iter()
            .copied()
            .filter(|r| Family::of_net(r) == family)
            .collect();
        out.elements.push((
            SET_CLUSTER_IPS,
            element(vec![KeyValue::Addr(vip)], None, &svc.key.to_string()),
        ));
        let firewall = (!lb_ips.is_empty() && !ranges.is_empty()).then(|| {
            let name = chain_name(
                "firewall",
                &format!("{}/{}", svc.key.namespace, svc.key.name),
            );
            out.main_chains
                .push(firewall_chain(name.clone(), svc, &ranges));
            name
        });
        Some(ServiceIn {
            svc,
            vip,
            node: state.node.as_ref(),
            external_ips: of_family(&svc.external_ips),
            lb_ips,
            firewall,
        })
    }

    /// Port `index` of the Service, over its endpoints in this family as the
    /// core's policy chose them (`categorize`).
    pub(super) fn port<'p>(&self, index: usize, eps: Categorized<'p>) -> PortIn<'p>
    where
        'a: 'p,
    {
        let port = &self.svc.ports[index];
        PortIn {
            port,
            label: self.svc.port_label(port),
            port_id: port_id(self.svc, port),
            index,
            eps,
            vip_key: dispatch_key(self.vip, port),
            external_keys: self
                .external_ips
                .iter()
                .chain(&self.lb_ips)
                .map(|ip| dispatch_key(*ip, port))
                .collect(),
        }
    }

    /// Names the port's own chain of kind `kind` that picks among `chosen`
    /// (`None` if there is none to pick), and records the endpoints that may
    /// hairpin.
    pub(super) fn policy_chain_name(
        &self,
        out: &mut ServiceRules,
        kind: &str,
        p: &PortIn,
        chosen: &[&PortEndpoint],
    ) -> Option<String> {
        self.record_hairpin(out, chosen);
        (!chosen.is_empty()).then(|| chain_name(kind, &p.port_id))
    }

    /// Records the endpoints of `chosen` that may hairpin. Only a pod on this
    /// node reaches itself through this node's rules (other nodes' pods go
    /// through their own node's), so only endpoints that may be here need a
    /// hairpin element: this node's, and any whose node is unknown.
    pub(super) fn record_hairpin(&self, out: &mut ServiceRules, chosen: &[&PortEndpoint]) {
        let here = chosen.iter().filter(|e| e.may_be_on(self.node));
        out.hairpin.extend(here.map(|e| e.addr));
    }

    /// The elements of the port's external addresses and NodePort that both
    /// flavours have: to the nftables flavour's chain for each kind of entry
    /// (`address`, `nodeport`) if there is one, to a refusal if the external
    /// policy has no endpoint to pick, and to the source-range firewall.
    pub(super) fn external_elements(
        &self,
        out: &mut ServiceRules,
        p: &PortIn,
        address: Option<&str>,
        nodeport: Option<&str>,
    ) {
        let served = |key: Vec<KeyValue>, to: Option<&str>| {
            to.map(|c| element(key, Some(Verdict::Goto(c.to_string())), &p.label))
        };
        let policy = if self.svc.external_policy_local {
            &p.eps.local
        } else {
            &p.eps.cluster
        };
        let unserved = p.unserved(!policy.is_empty());
        let refused = |key: Vec<KeyValue>| {
            unserved
                .as_ref()
                .map(|v| element(key, Some(v.clone()), &p.label))
        };
        for key in &p.external_keys {
            out.elements
                .extend(served(key.clone(), address).map(|e| (MAP_SERVICE_IPS, e)));
            out.elements
                .extend(refused(key.clone()).map(|e| (MAP_NO_ENDPOINT_SERVICES, e)));
        }
        if let Some(key) = p.nodeport_key() {
            out.elements
                .extend(served(key.clone(), nodeport).map(|e| (MAP_SERVICE_NODEPORTS, e)));
            out.elements
                .extend(refused(key).map(|e| (MAP_NO_ENDPOINT_NODEPORTS, e)));
        }
        if let Some(fw) = &self.firewall {
            for ip in &self.lb_ips {
                out.elements.push((
                    MAP_FIREWALL_IPS,
                    element(
                        dispatch_key(*ip, p.port),
                        Some(Verdict::Jump(fw.clone())),
                        &p.label,
                    ),
                ));
            }
        }
    }
}

impl PortIn<'_> {
    /// What happens to traffic whose policy has no endpoint to pick (`served`
    /// false): no endpoints at all is refused at once; endpoints only elsewhere
    /// (a Local policy) is dropped.
    pub(super) fn unserved(&self, served: bool) -> Option<Verdict> {
        match (self.eps.has_any, served) {
            (false, _) => Some(Verdict::Goto(CHAIN_REJECT.into())),
            (true, false) => Some(Verdict::Drop),
            (true, true) => None,
        }
    }

    /// The ClusterIP's `no-endpoint-services` element, for when no chain
    /// serves internal traffic.
    pub(super) fn vip_unserved(&self) -> (&'static str, Element) {
        let verdict = self.unserved(false);
        (
            MAP_NO_ENDPOINT_SERVICES,
            element(self.vip_key.clone(), verdict, &self.label),
        )
    }

    /// The `service-nodeports` key of the NodePort, if the port has one.
    pub(super) fn nodeport_key(&self) -> Option<Vec<KeyValue>> {
        self.port.node_port.map(|np| nodeport_key(self.port, np))
    }

    /// The entries of one kind: the ClusterIP is not among them.
    fn external_entries(&self, kind: EntryKind) -> Vec<Vec<KeyValue>> {
        match kind {
            EntryKind::Address => self.external_keys.clone(),
            EntryKind::NodePort => self.nodeport_key().into_iter().collect(),
        }
    }

    /// Whether the port has external addresses or a NodePort.
    pub(super) fn is_external(&self) -> bool {
        !self.external_keys.is_empty() || self.port.node_port.is_some()
    }

    /// `--counters`: every address and NodePort of the port counts into one
    /// named counter.
    pub(super) fn count(&self, out: &mut ServiceRules, svc: &Service, config: &NodeConfig) {
        if !config.counters {
            return;
        }
        let name = port_chain_name("svc", svc, self.port);
        let counted = |key: Vec<KeyValue>| Element {
            key,
            value: Some(Mapped::Counter(name.clone())),
            comment: None,
        };
        for key in std::iter::once(&self.vip_key).chain(&self.external_keys) {
            out.elements
                .push((MAP_SERVICE_COUNTERS, counted(key.clone())));
        }
        if let Some(np) = self.port.node_port {
            out.elements
                .push((MAP_NODEPORT_COUNTERS, counted(nodeport_key(self.port, np))));
        }
        let counter = NamedObject {
            name,
            comment: Some(clamp_comment(&self.label)),
            kind: ObjectDef::Counter,
        };
        out.objects.push((TableId::main(out.table.family), counter));
    }
}

/// The nftables flavour: each entry of the Service picks its endpoint in the
/// shared chain of its kind and endpoint count, in its Service table, and the
/// dispatch maps go there; with session affinity, its own cascade chains pick.
pub(super) fn nftables_rules(
    state: &ClusterState,
    svc: &Service,
    family: Family,
    config: &NodeConfig,
    placement: &dyn Placement,
) -> ServiceRules {
    let count = service_tables::count(config, state);
    let mut out = ServiceRules::new(service_tables::table_of(&svc.key, family, count));
    let Some(s) = ServiceIn::start(&mut out, state, svc, family) else {
        return out;
    };
    for (index, port) in svc.ports.iter().enumerate() {
        let endpoints;
        let eps = match placement.chosen(index) {
            Some(eps) => eps,
            None => {
                endpoints = port_endpoints(state, svc, port, family);
                categorize(svc, &endpoints, s.node)
            }
        };
        let p = s.port(index, eps);
        let elements_before = out.elements.len();
        match svc.affinity_timeout {
            Some(timeout) => cascade_port(&mut out, &s, &p, config, family, placement, timeout),
            None => shared_port(&mut out, &s, &p, config, family, placement),
        }
        if let Some(policy) = conntrack_policy(svc, p.port.protocol) {
            with_conntrack_timeouts(&mut out, svc, &p, policy, elements_before);
        }
        if config.fast_path.offloads(svc) {
            // Labelled on its first packet; the fast path's forward chain
            // offloads labelled flows once they are under way.
            let label = Stmt::CtLabelSet(crate::nft::names::FAST_PATH_LABEL);
            wrap_dispatch(&mut out, &p, elements_before, "fast", label);
        }
        p.count(&mut out, svc, config);
    }
    out.finish()
}

/// The Service's own conntrack timeouts for a protocol, as a policy.
fn conntrack_policy(svc: &Service, protocol: Protocol) -> Option<CtTimeoutPolicy> {
    let t = &svc.conntrack_timeouts;
    let set = match protocol {
        Protocol::Tcp => vec![("established", t.tcp_established?)],
        Protocol::Udp => {
            let udp = t.udp?;
            vec![("unreplied", udp), ("replied", udp)]
        }
        Protocol::Sctp => return None,
    };
    Some(CtTimeoutPolicy { protocol, set })
}

/// Gives the flows of a port the Service's conntrack timeouts: each of the
/// port's dispatch elements (since `from` in `out.elements`) goes to a chain
/// that sets them and then goes where the element went. The flow is new and
/// not yet confirmed when it meets the dispatch maps at dstnat, which is when
/// `ct timeout set` takes. The policy's object is named after its values, so
/// that new values are a new object (the kernel cannot change one in use).
fn with_conntrack_timeouts(
    out: &mut ServiceRules,
    svc: &Service,
    p: &PortIn,
    policy: CtTimeoutPolicy,
    from: usize,
) {
    let values: Vec<String> = policy
        .set
        .iter()
        .map(|(s, t)| format!("{s}-{t}s"))
        .collect();
    let object = chain_name(
        "timeout",
        &format!(
            "{}/{}/{}/{}",
            svc.key.namespace,
            svc.key.name,
            policy.protocol,
            values.join("/")
        ),
    );
    let wrapped = wrap_dispatch(out, p, from, "timeout", Stmt::CtTimeoutSet(object.clone()));
    // Only while some chain sets it: a port without endpoints sets nothing.
    if wrapped && !out.objects.iter().any(|(_, o)| o.name == object) {
        out.objects.push((
            out.table,
            // Named after its Service: nft takes no comment on a timeout.
            NamedObject {
                name: object,
                comment: None,
                kind: ObjectDef::CtTimeout(policy),
            },
        ));
    }
}

/// Sends each of the port's dispatch elements (since `from` in
/// `out.elements`) through a chain of its own (`kind-…`, one per target) that
/// runs `first` and then goes where the element went. Returns whether any
/// element was sent.
fn wrap_dispatch(out: &mut ServiceRules, p: &PortIn, from: usize, kind: &str, first: Stmt) -> bool {
    let mut chains: Vec<Chain> = Vec::new();
    for (set, e) in &mut out.elements[from..] {
        if *set != MAP_SERVICE_IPS && *set != MAP_SERVICE_NODEPORTS {
            continue;
        }
        let Some(Mapped::Verdict(Verdict::Goto(target))) = &mut e.value else {
            continue;
        };
        let name = chain_name(kind, &format!("{}/{target}", p.port_id));
        if !chains.iter().any(|c| c.name == name) {
            chains.push(Chain {
                name: name.clone(),
                base: None,
                comment: Some(clamp_comment(&p.label)),
                rules: vec![Rule::new(vec![
                    first.clone(),
                    Stmt::Verdict(Verdict::Goto(target.clone())),
                ])],
            });
        }
        *target = name;
    }
    let any = !chains.is_empty();
    out.chains.extend(chains);
    any
}

/// A port whose entries pick in the shared chains: each entry's endpoints go
/// into the endpoint map of its kind, policy and count, in slots kept from the
/// kernel's (`placement`), and its dispatch element goes to the chain of that
/// map; external traffic goes first through a chain that masquerades
/// (`externalTrafficPolicy: Cluster`, shared) or applies the Local policy (the
/// port's own).
fn shared_port(
    out: &mut ServiceRules,
    s: &ServiceIn,
    p: &PortIn,
    config: &NodeConfig,
    family: Family,
    placement: &dyn Placement,
) {
    let svc = s.svc;
    match &p.eps.here {
        Some(here) => out.hairpin.extend_from_slice(here),
        None => {
            s.record_hairpin(out, &p.eps.cluster);
            s.record_hairpin(out, &p.eps.local);
        }
    }
    let group = |kind: EntryKind, local: bool| {
        let chosen = if local { &p.eps.local } else { &p.eps.cluster };
        (!chosen.is_empty()).then_some(PickGroup {
            kind,
            local,
            count: chosen.len() as u32,
        })
    };
    let table = out.table;
    let place = |out: &mut ServiceRules, group: PickGroup, entry: &[KeyValue]| {
        let chosen = if group.local {
            &p.eps.local
        } else {
            &p.eps.cluster
        };
        let endpoints = placement
            .placed(table, group.kind, group.local, entry, p.index)
            .unwrap_or_else(|| {
                let previous = placement.entry(table, group.kind, group.local, entry);
                assign_slots(previous, chosen, Fill::Map)
                    .iter()
                    .map(|e| e.key())
                    .collect()
            });
        out.slots.push(EntrySlots {
            kind: group.kind,
            local: group.local,
            entry: entry.to_vec(),
            endpoints,
        });
        let maps = group.layout().map(|b| Shared::Map(b.map));
        out.shared.extend(maps);
        out.shared.push(Shared::Pick(group));
        group.chain_name()
    };
    let internal = match group(EntryKind::Address, svc.internal_policy_local) {
        Some(g) => {
            let chain = place(out, g, &p.vip_key);
            (
                MAP_SERVICE_IPS,
                element(p.vip_key.clone(), Some(Verdict::Goto(chain)), &p.label),
            )
        }
        None => p.vip_unserved(),
    };
    out.elements.push(internal);
    if !p.is_external() {
        return;
    }
    let mut targets = [None, None];
    for (kind, target) in [EntryKind::Address, EntryKind::NodePort]
        .into_iter()
        .zip(&mut targets)
    {
        let entries = p.external_entries(kind);
        if entries.is_empty() {
            continue;
        }
        let cluster = group(kind, false);
        if !svc.external_policy_local {
            let Some(g) = cluster else { continue };
            for entry in &entries {
                place(out, g, entry);
            }
            out.shared.push(Shared::Masquerade {
                kind,
                count: g.count,
            });
            *target = Some(Shared::masquerade_chain_name(kind, g.count));
            continue;
        }
        let local = group(kind, true);
        for entry in &entries {
            for g in cluster.iter().chain(&local) {
                place(out, *g, entry);
            }
        }
        let to_cluster = cluster.map(|g| g.chain_name());
        let to_local = local.map(|g| g.chain_name());
        let own = match kind {
            EntryKind::Address => "external",
            EntryKind::NodePort => "nodeport",
        };
        let chain = external_chain(
            port_chain_name(own, svc, p.port),
            &p.label,
            svc,
            config,
            family,
            to_cluster.as_deref(),
            to_local.as_deref(),
        );
        *target = chain.as_ref().map(|c| c.name.clone());
        out.chains.extend(chain);
    }
    let [address, nodeport] = targets;
    s.external_elements(out, p, address.as_deref(), nodeport.as_deref());
}

/// A port with session affinity: its own cascade chains (`svc-`, `local-`)
/// pick for every entry, and record each client's endpoint.
fn cascade_port(
    out: &mut ServiceRules,
    s: &ServiceIn,
    p: &PortIn,
    config: &NodeConfig,
    family: Family,
    placement: &dyn Placement,
    timeout: u32,
) {
    let svc = s.svc;
    let affinity = Affinity {
        port_id: &p.port_id,
        timeout,
    };
    let cascade = |out: &mut ServiceRules, kind: &str, chosen: &[&PortEndpoint]| {
        let name = s.policy_chain_name(out, kind, p, chosen)?;
        let slots = assign_slots(placement.cascade(out.table, &name), chosen, Fill::Cascade);
        for ep in chosen {
            let set = affinity.set(family, ep);
            if !out.sets.iter().any(|s| s.name == set.name) {
                out.sets.push(set);
            }
        }
        out.chains.push(affinity_chain(
            name.clone(),
            &p.label,
            p.port,
            &slots,
            &affinity,
        ));
        Some(name)
    };
    let chains = PolicyChains {
        cluster: cascade(out, "svc", &p.eps.cluster),
        local: cascade(out, "local", &p.eps.local),
    };
    out.elements.push(match chains.internal(svc) {
        Some(chain) => (
            MAP_SERVICE_IPS,
            element(
                p.vip_key.clone(),
                Some(Verdict::Goto(chain.to_string())),
                &p.label,
            ),
        ),
        None => p.vip_unserved(),
    });
    if !p.is_external() {
        return;
    }
    let external = if p.eps.has_any {
        external_chain(
            port_chain_name("external", svc, p.port),
            &p.label,
            svc,
            config,
            family,
            chains.cluster.as_deref(),
            chains.local.as_deref(),
        )
    } else {
        None
    };
    let target = external.as_ref().map(|c| c.name.as_str());
    s.external_elements(out, p, target, target);
    out.chains.extend(external);
}
