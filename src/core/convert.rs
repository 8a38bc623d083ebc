//! Conversion from the Kubernetes API types to the model, and nowhere else. Each
//! object is checked on its own: a malformed one becomes a `Rejected` naming the
//! object and the field, and never stops the others. Services that a proxy must
//! leave alone (ExternalName, headless, another proxy's) are skipped, not rejected.

use crate::core::model::{self, *};
use crate::core::net::{parse_cidr_sloppy, parse_ip_sloppy, Family, Protocol};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::net::IpAddr;

/// What to do with an object that is valid but not ours to proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    ExternalName,
    Headless,
    OtherProxy(String),
    /// An EndpointSlice of addressType FQDN, which no proxy uses.
    Fqdn,
}

pub enum Converted<T> {
    Valid(T),
    Skipped(Skip),
}

pub fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace
        .clone()
        .unwrap_or_else(|| "default".to_string())
}

fn reject(object: &str, field: impl Into<String>, reason: impl Into<String>) -> Rejected {
    Rejected {
        object: object.to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}

fn parse_protocol(object: &str, field: &str, p: Option<&String>) -> Result<Protocol, Rejected> {
    match p.map(String::as_str) {
        None | Some("TCP") => Ok(Protocol::Tcp),
        Some("UDP") => Ok(Protocol::Udp),
        Some("SCTP") => Ok(Protocol::Sctp),
        Some(other) => Err(reject(
            object,
            field,
            format!("{other:?} is not a supported protocol (TCP, UDP or SCTP)"),
        )),
    }
}

fn parse_port(object: &str, field: &str, port: i32) -> Result<u16, Rejected> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| reject(object, field, format!("{port} is not a valid port")))
}

/// IANA_SVC_NAME: 1-15 lowercase alphanumerics or '-', with a letter, no '--'.
fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// The labels kube-proxy's informers select away, on Services and
/// EndpointSlices alike: another proxy's, and headless.
fn not_for_a_proxy(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Skip> {
    let labels = meta.labels.as_ref()?;
    if let Some(proxy) = labels.get(SERVICE_PROXY_NAME_LABEL) {
        return Some(Skip::OtherProxy(proxy.clone()));
    }
    labels
        .contains_key(HEADLESS_LABEL)
        .then_some(Skip::Headless)
}

/// One Service. A value kube-proxy reads one by one (an external IP, a load
/// balancer's ingress IP, a source range) that does not parse is skipped, as
/// kube-proxy skips it, and pushed to `skipped` for the log and the metric; the
/// rest of the Service is proxied. Anything else malformed rejects the Service.
pub fn convert_service(
    svc: &core::Service,
    skipped: &mut Vec<Rejected>,
) -> Result<Converted<Service>, Rejected> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let key = ServiceKey {
        namespace: namespace_of(&svc.metadata).into(),
        name: name.clone(),
    };
    let object = format!("Service {key}");
    if name.is_empty() {
        return Err(reject(&object, "metadata.name", "must be set"));
    }
    if let Some(skip) = not_for_a_proxy(&svc.metadata) {
        return Ok(Converted::Skipped(skip));
    }
    let spec = svc
        .spec
        .as_ref()
        .ok_or_else(|| reject(&object, "spec", "must be set"))?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(Converted::Skipped(Skip::ExternalName));
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return Ok(Converted::Skipped(Skip::Headless));
    }
    let ip_strings: Vec<(String, &String)> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip))
            .collect(),
        (_, Some(ip)) if !ip.is_empty() => vec![("spec.clusterIP".to_string(), ip)],
        _ => {
            return Err(reject(
                &object,
                "spec.clusterIP",
                "not set (a ClusterIP is allocated by the API server; manifests must carry it)",
            ))
        }
    };
    let mut cluster_ips = Vec::new();
    for (field, s) in ip_strings {
        let ip = parse_ip_sloppy(s)
            .ok_or_else(|| reject(&object, &field, format!("{s:?} is not an IP address")))?;
        if cluster_ips
            .iter()
            .any(|c: &IpAddr| Family::of(c) == Family::of(&ip))
        {
            return Err(reject(&object, &field, "two ClusterIPs of the same family"));
        }
        cluster_ips.push(ip);
    }
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    if !matches!(service_type, "ClusterIP" | "NodePort" | "LoadBalancer") {
        return Err(reject(
            &object,
            "spec.type",
            format!("{service_type:?} is not ClusterIP, NodePort, LoadBalancer or ExternalName"),
        ));
    }
    let has_node_ports = service_type != "ClusterIP";
    let k8s_ports = spec.ports.as_deref().unwrap_or_default();
    let mut ports: Vec<ServicePort> = Vec::new();
    for (i, p) in k8s_ports.iter().enumerate() {
        let field = |f: &str| format!("spec.ports[{i}].{f}");
        let port_name = p.name.clone().unwrap_or_default();
        if port_name.is_empty() && k8s_ports.len() > 1 {
            return Err(reject(
                &object,
                field("name"),
                "must be set when a Service has several ports",
            ));
        }
        let protocol = parse_protocol(&object, &field("protocol"), p.protocol.as_ref())?;
        let port = parse_port(&object, &field("port"), p.port)?;
        let target_port = match &p.target_port {
            None => TargetPort::Number(port),
            Some(IntOrString::Int(n)) => {
                TargetPort::Number(parse_port(&object, &field("targetPort"), *n)?)
            }
            Some(IntOrString::String(s)) => match s.parse::<i32>() {
                Ok(n) => TargetPort::Number(parse_port(&object, &field("targetPort"), n)?),
                Err(_) if is_port_name(s) => TargetPort::Named(s.clone()),
                Err(_) => {
                    return Err(reject(
                        &object,
                        field("targetPort"),
                        format!("{s:?} is neither a port number nor a port name"),
                    ))
                }
            },
        };
        if ports.iter().any(|q| q.name == port_name) {
            return Err(reject(
                &object,
                field("name"),
                format!("duplicate port name {port_name:?}"),
            ));
        }
        if ports
            .iter()
            .any(|q| q.port == port && q.protocol == protocol)
        {
            return Err(reject(
                &object,
                field("port"),
                format!("duplicate {protocol} port {port}"),
            ));
        }
        let node_port = match p.node_port {
            Some(n) if has_node_ports && n != 0 => {
                Some(parse_port(&object, &field("nodePort"), n)?)
            }
            _ => None,
        };
        if let Some(n) = node_port {
            if ports
                .iter()
                .any(|q| q.node_port == Some(n) && q.protocol == protocol)
            {
                return Err(reject(
                    &object,
                    field("nodePort"),
                    format!("duplicate {protocol} node port {n}"),
                ));
            }
        }
        ports.push(ServicePort {
            name: port_name,
            protocol,
            port,
            target_port,
            node_port,
        });
    }
    let external_ips = each_ip(
        &object,
        |i| format!("spec.externalIPs[{i}]"),
        spec.external_ips.iter().flatten().map(|s| s.as_str()),
        skipped,
    );
    let mut load_balancer_ips = Vec::new();
    if service_type == "LoadBalancer" {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate() {
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(ip) = &ing.ip {
                for ip in each_ip(
                    &object,
                    |_| format!("status.loadBalancer.ingress[{i}].ip"),
                    [ip.as_str()],
                    skipped,
                ) {
                    if !load_balancer_ips.contains(&ip) {
                        load_balancer_ips.push(ip);
                    }
                }
            }
        }
    }
    // kube-proxy trims them (validation once let padding through) and skips
    // what does not parse. When every range is skipped, the load balancer IPs
    // are open to all, as with kube-proxy (docs/OPERATIONS.md says why).
    let mut source_ranges = Vec::new();
    for (i, r) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        let r = r.trim();
        if r.is_empty() {
            continue;
        }
        match parse_cidr_sloppy(r) {
            Some(net) => source_ranges.push(net),
            None => skipped.push(reject(
                &object,
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("{r:?} is not a CIDR"),
            )),
        }
    }
    let policy = |field: &str, value: Option<&String>| match value.map(String::as_str) {
        None | Some("Cluster") => Ok(false),
        Some("Local") => Ok(true),
        Some(other) => Err(reject(
            &object,
            field,
            format!("{other:?} is not Cluster or Local"),
        )),
    };
    let external_local = policy(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_ref(),
    )?;
    let internal_policy_local = policy(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_ref(),
    )?;
    let health_check_node_port = match spec.health_check_node_port {
        Some(n) if service_type == "LoadBalancer" && external_local && n != 0 => {
            Some(parse_port(&object, "spec.healthCheckNodePort", n)?)
        }
        _ => None,
    };
    let affinity_timeout = match spec.session_affinity.as_deref() {
        None | Some("None") => None,
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT as i32);
            if !(1..=86400).contains(&t) {
                return Err(reject(
                    &object,
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("{t} is not in 1..86400"),
                ));
            }
            Some(t as u32)
        }
        Some(other) => {
            return Err(reject(
                &object,
                "spec.sessionAffinity",
                format!("{other:?} is not None or ClientIP"),
            ))
        }
    };
    let ipvs_scheduler = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IPVS_SCHEDULER_ANNOTATION))
        .cloned();
    if let Some(s) = &ipvs_scheduler {
        crate::core::node_config::check_scheduler(s).map_err(|e| {
            reject(
                &object,
                format!("metadata.annotations[{IPVS_SCHEDULER_ANNOTATION}]"),
                e,
            )
        })?;
    }
    let conntrack_timeouts = ConntrackTimeouts {
        tcp_established: conntrack_timeout(
            &object,
            svc,
            CONNTRACK_TCP_ESTABLISHED_TIMEOUT_ANNOTATION,
            skipped,
        ),
        udp: conntrack_timeout(&object, svc, CONNTRACK_UDP_TIMEOUT_ANNOTATION, skipped),
    };
    let long_lived = traffic_hint(&object, svc, skipped);
    let mut svc = Service {
        key,
        cluster_ips: exact(cluster_ips),
        ports: exact(ports),
        external_ips: exact(external_ips),
        load_balancer_ips: exact(load_balancer_ips),
        source_ranges: exact(source_ranges),
        external_policy_local: false,
        internal_policy_local,
        health_check_node_port,
        affinity_timeout,
        ipvs_scheduler,
        conntrack_timeouts,
        long_lived,
    };
    // The external policy only means something where there is external traffic.
    svc.external_policy_local = external_local && svc.externally_accessible();
    Ok(Converted::Valid(svc))
}

/// A conntrack timeout annotation in whole seconds; one that is not a duration
/// of 1 s to `MAX_CONNTRACK_TIMEOUT` is skipped (the node's timeouts apply).
fn conntrack_timeout(
    object: &str,
    svc: &core::Service,
    annotation: &str,
    skipped: &mut Vec<Rejected>,
) -> Option<u32> {
    let value = svc.metadata.annotations.as_ref()?.get(annotation)?;
    let seconds = crate::core::duration::parse_duration(value)
        .map(|d| d.as_secs())
        .and_then(|s| {
            u32::try_from(s)
                .ok()
                .filter(|s| (1..=MAX_CONNTRACK_TIMEOUT).contains(s))
                .ok_or_else(|| {
                    format!(
                        "{value:?} is not between 1s and {}h",
                        MAX_CONNTRACK_TIMEOUT / 3600
                    )
                })
        });
    match seconds {
        Ok(s) => Some(s),
        Err(why) => {
            let field = format!("metadata.annotations[{annotation}]");
            skipped.push(reject(object, field, why));
            None
        }
    }
}

/// `kube-nft.io/traffic-hint`: `LongLived` or nothing; another value is
/// skipped (the Service keeps the normal path).
fn traffic_hint(object: &str, svc: &core::Service, skipped: &mut Vec<Rejected>) -> bool {
    let Some(value) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TRAFFIC_HINT_ANNOTATION))
    else {
        return false;
    };
    if value == "LongLived" {
        return true;
    }
    let field = format!("metadata.annotations[{TRAFFIC_HINT_ANNOTATION}]");
    skipped.push(reject(object, field, format!("{value:?} is not LongLived")));
    false
}

/// The vector without its spare room: a model holds 100k Services, whose
/// vectors grown one push at a time kept room for four (17 MiB at 100k).
fn exact<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

/// Each address that parses, once; one that does not is pushed to `skipped`
/// (an empty one is not an address, and kube-proxy passes over it silently).
fn each_ip<'a>(
    object: &str,
    field: impl Fn(usize) -> String,
    ips: impl IntoIterator<Item = &'a str>,
    skipped: &mut Vec<Rejected>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, s) in ips.into_iter().enumerate() {
        match parse_ip_sloppy(s) {
            Some(ip) if !out.contains(&ip) => out.push(ip),
            Some(_) => {}
            None if s.trim().is_empty() => {}
            None => skipped.push(reject(
                object,
                field(i),
                format!("{s:?} is not an IP address"),
            )),
        }
    }
    out
}

pub fn convert_endpoint_slice(
    slice: &discovery::EndpointSlice,
) -> Result<Converted<EndpointSlice>, Rejected> {
    let name = slice.metadata.name.clone().unwrap_or_default();
    let namespace = namespace_of(&slice.metadata);
    let object = format!("EndpointSlice {namespace}/{name}");
    if name.is_empty() {
        return Err(reject(&object, "metadata.name", "must be set"));
    }
    if let Some(skip) = not_for_a_proxy(&slice.metadata) {
        return Ok(Converted::Skipped(skip));
    }
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            reject(
                &object,
                "metadata.labels",
                format!("no {SERVICE_NAME_LABEL} label"),
            )
        })?;
    let family = match slice.address_type.as_str() {
        "IPv4" => Family::Ip,
        "IPv6" => Family::Ip6,
        "FQDN" => return Ok(Converted::Skipped(Skip::Fqdn)),
        other => {
            return Err(reject(
                &object,
                "addressType",
                format!("{other:?} is not IPv4, IPv6 or FQDN"),
            ))
        }
    };
    let mut ports = Vec::new();
    for (i, p) in slice
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let field = |f: &str| format!("ports[{i}].{f}");
        let Some(port) = p.port else {
            // A nil port means "all ports", which Services never produce; nothing to DNAT to.
            continue;
        };
        ports.push(EndpointPort {
            name: p.name.clone().unwrap_or_default(),
            protocol: parse_protocol(&object, &field("protocol"), p.protocol.as_ref())?,
            port: parse_port(&object, &field("port"), port)?,
        });
    }
    // Exactly as many: grown one by one, ten endpoints took room for sixteen.
    let mut endpoints = Vec::with_capacity(slice.endpoints.as_ref().map_or(0, Vec::len));
    for (i, ep) in slice.endpoints.iter().flatten().enumerate() {
        let cond = ep.conditions.as_ref();
        // Unknown readiness is ready; serving defaults to ready; terminating to false.
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        let conditions = Conditions {
            ready,
            serving: cond.and_then(|c| c.serving).unwrap_or(ready),
            terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
        };
        // Only the first address is used, as the API documents.
        let Some(a) = ep.addresses.first() else {
            return Err(reject(
                &object,
                format!("endpoints[{i}].addresses"),
                "is empty",
            ));
        };
        let field = format!("endpoints[{i}].addresses[0]");
        let addr = parse_ip_sloppy(a)
            .ok_or_else(|| reject(&object, &field, format!("{a:?} is not an IP address")))?;
        if Family::of(&addr) != family {
            return Err(reject(
                &object,
                &field,
                format!("{a} does not match addressType {}", slice.address_type),
            ));
        }
        let hints = ep
            .hints
            .as_ref()
            .map(|h| {
                Hints::new(
                    h.for_zones
                        .iter()
                        .flatten()
                        .map(|z| z.name.clone())
                        .collect(),
                    h.for_nodes
                        .iter()
                        .flatten()
                        .map(|n| n.name.clone())
                        .collect(),
                )
            })
            .unwrap_or_default();
        endpoints.push(Endpoint {
            addr,
            conditions,
            node_name: ep.node_name.as_deref().map(model::name),
            zone: ep.zone.as_deref().map(model::name),
            hints,
        });
    }
    Ok(Converted::Valid(EndpointSlice {
        name,
        service: ServiceKey {
            namespace: namespace.into(),
            name: service.clone(),
        },
        family,
        ports: exact(ports),
        endpoints,
    }))
}

pub fn convert_node(node: &core::Node) -> Result<NodeInfo, Rejected> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let object = format!("Node {name}");
    if name.is_empty() {
        return Err(reject(&object, "metadata.name", "must be set"));
    }
    let mut addresses: Vec<(&str, IpAddr)> = Vec::new();
    if let Some(status) = &node.status {
        for (i, a) in status
            .addresses
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if a.type_ == "InternalIP" || a.type_ == "ExternalIP" {
                let ip = parse_ip_sloppy(&a.address).ok_or_else(|| {
                    reject(
                        &object,
                        format!("status.addresses[{i}].address"),
                        format!("{:?} is not an IP address", a.address),
                    )
                })?;
                addresses.push((a.type_.as_str(), ip));
            }
        }
    }
    let mut primary_ips = Vec::new();
    for family in Family::ALL {
        let of = |kind: &str| {
            addresses
                .iter()
                .find(|(t, ip)| *t == kind && Family::of(ip) == family)
                .map(|(_, ip)| *ip)
        };
        if let Some(ip) = of("InternalIP").or_else(|| of("ExternalIP")) {
            primary_ips.push(ip);
        }
    }
    let mut pod_cidrs = Vec::new();
    let spec = node.spec.as_ref();
    for (i, c) in spec
        .and_then(|s| s.pod_cidrs.as_deref())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let net = parse_cidr_sloppy(c).ok_or_else(|| {
            reject(
                &object,
                format!("spec.podCIDRs[{i}]"),
                format!("{c:?} is not a CIDR"),
            )
        })?;
        pod_cidrs.push(net);
    }
    Ok(NodeInfo {
        name,
        pod_cidrs,
        zone: node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .cloned(),
        primary_ips,
        from_object: true,
        leaving: node.metadata.deletion_timestamp.is_some()
            || spec
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == TO_BE_DELETED_TAINT),
    })
}

/// Objects as read from a source, before validation.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    pub services: Vec<core::Service>,
    pub slices: Vec<discovery::EndpointSlice>,
    pub nodes: Vec<core::Node>,
}

/// The result of validating a batch of objects.
#[derive(Debug, Clone, Default)]
pub struct Validated {
    pub state: ClusterState,
    pub rejected: Vec<Rejected>,
    /// Values skipped in objects that were kept (`convert_service`).
    pub skipped_values: Vec<Rejected>,
    pub skipped: Vec<(String, Skip)>,
}

/// Validates every object on its own; `node_name` picks this node's Node object.
pub fn build_state(objects: &Objects, node_name: Option<&str>) -> Validated {
    let mut out = Validated::default();
    for s in &objects.services {
        match convert_service(s, &mut out.skipped_values) {
            Ok(Converted::Valid(svc)) => {
                out.state.put_service(svc);
            }
            Ok(Converted::Skipped(why)) => out.skipped.push((
                format!(
                    "Service {}/{}",
                    namespace_of(&s.metadata),
                    s.metadata.name.clone().unwrap_or_default()
                ),
                why,
            )),
            Err(r) => out.rejected.push(r),
        }
    }
    for s in &objects.slices {
        match convert_endpoint_slice(s) {
            Ok(Converted::Valid(slice)) => {
                out.state
                    .slices
                    .entry(slice.service.clone())
                    .or_default()
                    .insert(slice);
            }
            Ok(Converted::Skipped(why)) => out.skipped.push((
                format!(
                    "EndpointSlice {}",
                    s.metadata.name.clone().unwrap_or_default()
                ),
                why,
            )),
            Err(r) => out.rejected.push(r),
        }
    }
    for n in &objects.nodes {
        if node_name.is_some_and(|want| n.metadata.name.as_deref() != Some(want)) {
            continue;
        }
        match convert_node(n) {
            Ok(info) => out.state.node = Some(info),
            Err(r) => out.rejected.push(r),
        }
    }
    // Without its Node object, this node is still known by name (for locality).
    if let (None, Some(name)) = (&out.state.node, node_name) {
        out.state.node = Some(NodeInfo {
            name: name.to_string(),
            ..NodeInfo::default()
        });
    }
    out
}

/// Validates the objects, logging each one rejected or skipped.
pub fn validate(objects: &Objects, node_name: Option<&str>) -> Validated {
    let validated = build_state(objects, node_name);
    log_rejected(&validated.rejected);
    log_skipped_values(&validated.skipped_values);
    for (object, why) in &validated.skipped {
        tracing::debug!("{object}: not proxied ({why:?})");
    }
    validated
}

/// One line per rejected object, naming it and the field at fault
/// (`Service default/web: spec.ports[1].port: 0 is not a valid port`); the
/// message says it all, so no structured field repeats it.
pub fn log_rejected(rejected: &[Rejected]) {
    for r in rejected {
        tracing::warn!("rejected: {r}");
    }
}

/// One line per value skipped in an object that was kept.
pub fn log_skipped_values(skipped: &[Rejected]) {
    for r in skipped {
        tracing::warn!("skipped: {r}; the rest of the object is proxied");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert_service_alone(svc: &core::Service) -> Result<Converted<Service>, Rejected> {
        let mut skipped = Vec::new();
        let converted = convert_service(svc, &mut skipped);
        assert!(skipped.is_empty(), "{skipped:?}");
        converted
    }

    fn service(yaml: &str) -> core::Service {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn slice(yaml: &str) -> discovery::EndpointSlice {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.0.0.10
  ports:
  - {name: http, port: 80, targetPort: http-alt}
  - {name: dns, port: 53, protocol: UDP, targetPort: 5353}
"#;

    #[test]
    fn a_node_being_deleted_or_tainted_for_deletion_is_leaving() {
        let node = |extra: &str| -> core::Node {
            serde_saphyr::from_str(&format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: n1{extra}}}\nspec: {{taints: [{{key: other, effect: NoSchedule}}]}}\n"
            ))
            .unwrap()
        };
        let staying = convert_node(&node("")).unwrap();
        assert!(staying.from_object && !staying.leaving);
        let deleted = convert_node(&node(", deletionTimestamp: '2026-11-25T10:00:00Z'")).unwrap();
        assert!(deleted.leaving);
        let tainted: core::Node = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {taints: [{key: ToBeDeletedByClusterAutoscaler, value: '1764000000', effect: NoSchedule}]}\n",
        )
        .unwrap();
        assert!(convert_node(&tainted).unwrap().leaving);
    }

    #[test]
    fn service_with_named_and_numeric_target_ports_is_valid() {
        let Ok(Converted::Valid(svc)) = convert_service_alone(&service(WEB)) else {
            panic!("expected a valid service");
        };
        assert_eq!(
            svc.cluster_ips,
            vec!["10.0.0.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            svc.ports[0].target_port,
            TargetPort::Named("http-alt".into())
        );
        assert_eq!(svc.ports[1].protocol, Protocol::Udp);
        assert_eq!(svc.ports[1].target_port, TargetPort::Number(5353));
    }

    #[test]
    fn port_zero_is_rejected_with_object_and_field() {
        let bad = WEB.replace("port: 53,", "port: 0,");
        let err = convert_service_alone(&service(&bad)).err().unwrap();
        assert_eq!(
            err.to_string(),
            "Service default/web: spec.ports[1].port: 0 is not a valid port"
        );
    }

    #[test]
    fn unknown_protocol_and_bad_ip_are_rejected() {
        let bad = WEB.replace("protocol: UDP", "protocol: ICMP");
        let err = convert_service_alone(&service(&bad)).err().unwrap();
        assert_eq!(err.field, "spec.ports[1].protocol");
        let bad = WEB.replace("10.0.0.10", "10.0.0.300");
        let err = convert_service_alone(&service(&bad)).err().unwrap();
        assert_eq!(
            err.to_string(),
            "Service default/web: spec.clusterIP: \"10.0.0.300\" is not an IP address"
        );
    }

    /// As kube-proxy reads them: value by value, a bad one skipped and named,
    /// leading zeros read as decimal; the Service is kept.
    #[test]
    fn a_bad_external_ip_ingress_ip_or_source_range_is_skipped_alone() {
        let lb = WEB.replace("  clusterIP: 10.0.0.10\n", "  clusterIP: 010.000.000.010\n  type: LoadBalancer\n  externalIPs: [192.0.2.1, 192.0.2.300, '', 198.051.100.007]\n  loadBalancerSourceRanges: [' 10.0.0.0/8', 10.0.0.0/33, 0172.016.0.0/12]\n")
            + "status: {loadBalancer: {ingress: [{ip: 203.0.113.300}, {ip: 203.0.113.9}, {hostname: lb.example}]}}\n";
        let mut skipped = Vec::new();
        let Ok(Converted::Valid(svc)) = convert_service(&service(&lb), &mut skipped) else {
            panic!("the Service is kept");
        };
        let ips = |list: &[IpAddr]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(ips(&svc.cluster_ips), ["10.0.0.10"]);
        assert_eq!(ips(&svc.external_ips), ["192.0.2.1", "198.51.100.7"]);
        assert_eq!(ips(&svc.load_balancer_ips), ["203.0.113.9"]);
        let ranges: Vec<String> = svc.source_ranges.iter().map(|n| n.to_string()).collect();
        assert_eq!(ranges, ["10.0.0.0/8", "172.16.0.0/12"]);
        let said: Vec<String> = skipped.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            said,
            [
                "Service default/web: spec.externalIPs[1]: \"192.0.2.300\" is not an IP address",
                "Service default/web: status.loadBalancer.ingress[0].ip: \"203.0.113.300\" is not an IP address",
                "Service default/web: spec.loadBalancerSourceRanges[1]: \"10.0.0.0/33\" is not a CIDR",
            ]
        );
        // Every range skipped leaves none: open to all, as kube-proxy leaves it.
        let open = lb.replace("[' 10.0.0.0/8', 10.0.0.0/33, 0172.016.0.0/12]", "[bogus]");
        let mut skipped = Vec::new();
        let Ok(Converted::Valid(svc)) = convert_service(&service(&open), &mut skipped) else {
            panic!("the Service is kept");
        };
        assert!(svc.source_ranges.is_empty());
        assert_eq!(skipped.len(), 3, "{skipped:?}");
    }

    #[test]
    fn conntrack_timeout_annotations_take_go_durations_and_skip_a_bad_one_alone() {
        let annotated = |udp: &str, tcp: &str| {
            WEB.replace(
                "metadata: {name: web, namespace: default}",
                &format!("metadata: {{name: web, namespace: default, annotations: {{{CONNTRACK_UDP_TIMEOUT_ANNOTATION}: '{udp}', {CONNTRACK_TCP_ESTABLISHED_TIMEOUT_ANNOTATION}: '{tcp}'}}}}"),
            )
        };
        let convert = |yaml: &str| {
            let mut skipped = Vec::new();
            let Ok(Converted::Valid(svc)) = convert_service(&service(yaml), &mut skipped) else {
                panic!("the Service is kept");
            };
            let said: Vec<String> = skipped.iter().map(|r| r.to_string()).collect();
            (svc.conntrack_timeouts, said)
        };
        let (t, said) = convert(&annotated("5s", "24h"));
        assert_eq!((t.udp, t.tcp_established), (Some(5), Some(86400)));
        assert!(said.is_empty(), "{said:?}");
        // Whole seconds, as the kernel keeps them.
        let (t, _) = convert(&annotated("1m30.9s", "1h"));
        assert_eq!((t.udp, t.tcp_established), (Some(90), Some(3600)));
        for bad in ["soon", "0s", "500ms", "721h", "-5s"] {
            let (t, said) = convert(&annotated(bad, "2h"));
            assert_eq!((t.udp, t.tcp_established), (None, Some(7200)), "{bad}");
            assert_eq!(said.len(), 1, "{bad}: {said:?}");
            assert!(
                said[0].starts_with(&format!(
                    "Service default/web: metadata.annotations[{CONNTRACK_UDP_TIMEOUT_ANNOTATION}]: "
                )),
                "{said:?}"
            );
        }
        let (t, said) = convert(WEB);
        assert_eq!(t, ConntrackTimeouts::default());
        assert!(said.is_empty());
    }

    #[test]
    fn the_traffic_hint_takes_long_lived_and_skips_another_value_alone() {
        let convert = |hint: Option<&str>| {
            let yaml = match hint {
                Some(h) => WEB.replace(
                    "metadata: {name: web, namespace: default}",
                    &format!("metadata: {{name: web, namespace: default, annotations: {{{TRAFFIC_HINT_ANNOTATION}: '{h}'}}}}"),
                ),
                None => WEB.to_string(),
            };
            let mut skipped = Vec::new();
            let Ok(Converted::Valid(svc)) = convert_service(&service(&yaml), &mut skipped) else {
                panic!("the Service is kept");
            };
            let said: Vec<String> = skipped.iter().map(|r| r.to_string()).collect();
            (svc.long_lived, said)
        };
        assert_eq!(convert(Some("LongLived")), (true, vec![]));
        assert_eq!(convert(None), (false, vec![]));
        let (long_lived, said) = convert(Some("longlived"));
        assert!(!long_lived);
        assert_eq!(
            said,
            vec![format!("Service default/web: metadata.annotations[{TRAFFIC_HINT_ANNOTATION}]: \"longlived\" is not LongLived")]
        );
    }

    #[test]
    fn services_a_proxy_must_leave_alone_are_skipped() {
        let headless = WEB.replace("clusterIP: 10.0.0.10", "clusterIP: None");
        assert!(matches!(
            convert_service_alone(&service(&headless)),
            Ok(Converted::Skipped(Skip::Headless))
        ));
        let ext = "apiVersion: v1\nkind: Service\nmetadata: {name: e}\nspec: {type: ExternalName, externalName: example.org}";
        assert!(matches!(
            convert_service_alone(&service(ext)),
            Ok(Converted::Skipped(Skip::ExternalName))
        ));
        let other = WEB.replace(
            "namespace: default}",
            "namespace: default, labels: {service.kubernetes.io/service-proxy-name: other}}",
        );
        assert!(matches!(
            convert_service_alone(&service(&other)),
            Ok(Converted::Skipped(Skip::OtherProxy(_)))
        ));
    }

    const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.244.0.11]
- addresses: [10.244.0.12]
  conditions: {ready: false, serving: true, terminating: true}
"#;

    #[test]
    fn slice_without_service_name_label_is_rejected() {
        let bad = SLICE.replace("labels: {kubernetes.io/service-name: web}", "labels: {}");
        let err = convert_endpoint_slice(&slice(&bad)).err().unwrap();
        assert_eq!(
            err.to_string(),
            "EndpointSlice default/web-a: metadata.labels: no kubernetes.io/service-name label"
        );
    }

    #[test]
    fn endpoint_address_of_the_wrong_family_is_rejected() {
        let bad = SLICE.replace("[10.244.0.12]", "[fd00::12]");
        let err = convert_endpoint_slice(&slice(&bad)).err().unwrap();
        assert_eq!(err.field, "endpoints[1].addresses[0]");
    }

    #[test]
    fn slices_are_merged_and_deduplicated_preferring_ready() {
        let second = SLICE
            .replace("name: web-a", "name: web-b")
            .replace(
                "- addresses: [10.244.0.11]\n",
                "- addresses: [10.244.0.13]\n",
            )
            .replace(
                "{ready: false, serving: true, terminating: true}",
                "{ready: true}",
            );
        let objects = Objects {
            services: vec![service(WEB)],
            slices: vec![slice(SLICE), slice(&second)],
            nodes: vec![],
        };
        let v = build_state(&objects, None);
        assert!(v.rejected.is_empty(), "{:?}", v.rejected);
        let svc = v.state.services.values().next().unwrap();
        let eps = v.state.endpoints_for(svc, &svc.ports[0]);
        let addrs: Vec<String> = eps
            .iter()
            .map(|e| format!("{}:{}/{}", e.addr, e.port, e.conditions.ready))
            .collect();
        assert_eq!(
            addrs,
            vec![
                "10.244.0.11:8080/true",
                "10.244.0.12:8080/true",
                "10.244.0.13:8080/true"
            ]
        );
        // The UDP port has no slice port of that name: no endpoints.
        assert!(v.state.endpoints_for(svc, &svc.ports[1]).is_empty());
    }
}
