//! The API-path benchmark: `kube-nft run` as a node runs it, fed N Services and
//! their EndpointSlices by the loopback API server, in a scratch network
//! namespace. That server speaks JSON only, so this is kube-nft's fallback
//! path, in pages of 500 (the server pages, as a real one may); the protobuf
//! lists are measured against a real kube-apiserver (`integration/k8s/bench.sh`). It measures the time from
//! start to the first full sync committed and the daemon's peak RSS, which is
//! what an operator's node pays, not only the model's share that the control-plane
//! benchmark measures.
//!
//! The objects look like a real cluster's: Services with the metadata, spec and
//! status a kube-apiserver returns (managed fields included), EndpointSlices as
//! the EndpointSlice controller writes them (owner reference, managed fields, a
//! target reference per endpoint). Their pods are spread over 100 nodes.

use super::apiserver::{ApiServer, Kind};
use crate::testbed::netns::Netns;
use crate::testbed::synthetic::{endpoint_addr, node_of, vip, CLUSTER_CIDR, THIS_NODE};
use serde_json::{json, Value};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

const NAMESPACE: &str = "bench";

fn managed_fields(manager: &str, api_version: &str, fields: Value) -> Value {
    json!([{
        "manager": manager, "operation": "Update", "apiVersion": api_version,
        "time": "2026-11-22T00:13:42Z", "fieldsType": "FieldsV1", "fieldsV1": fields
    }])
}

fn uid(kind: u8, i: usize) -> String {
    format!("{kind:02x}{i:06x}-0183-465b-a9b5-9f186903a94e")
}

/// Service `i`: ClusterIP, TCP 80 → 8080, selecting `app: svc-i`.
pub fn service_json(i: usize) -> Value {
    let name = format!("svc-{i:05}");
    json!({
        "metadata": {
            "name": name, "namespace": NAMESPACE, "uid": uid(1, i),
            "resourceVersion": "1", "creationTimestamp": "2026-11-22T00:13:42Z",
            "labels": {"app": name},
            "managedFields": managed_fields("kubectl-create", "v1", json!({
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
                    "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {},
                        "f:protocol": {}, "f:targetPort": {}}},
                    "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}
            })),
        },
        "spec": {
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": name},
            "clusterIP": vip(i).to_string(), "clusterIPs": [vip(i).to_string()],
            "type": "ClusterIP", "sessionAffinity": "None",
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
        },
        "status": {"loadBalancer": {}},
    })
}

/// The EndpointSlice of Service `i`, with ready endpoints at `addrs`.
pub fn slice_json(i: usize, addrs: &[IpAddr]) -> Value {
    let service = format!("svc-{i:05}");
    let endpoints: Vec<Value> = addrs
        .iter()
        .enumerate()
        .map(|(k, a)| {
            json!({
                "addresses": [a.to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": NAMESPACE,
                    "name": format!("{service}-pod-{k}"), "uid": uid(3, i * 16 + k)},
                "nodeName": node_of(*a),
            })
        })
        .collect();
    json!({
        "metadata": {
            "name": format!("{service}-a"), "generateName": format!("{service}-"),
            "namespace": NAMESPACE, "uid": uid(2, i), "resourceVersion": "1", "generation": 1,
            "creationTimestamp": "2026-11-22T00:13:42Z",
            "labels": {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": service},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-22T00:13:42Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                "uid": uid(1, i), "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed_fields("kube-controller-manager", "discovery.k8s.io/v1", json!({
                "f:addressType": {}, "f:endpoints": {},
                "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                    "f:generateName": {}, "f:labels": {".": {}, "f:endpointslice.kubernetes.io/managed-by": {},
                        "f:kubernetes.io/service-name": {}},
                    "f:ownerReferences": {".": {}, "k:{\"uid\":\"\"}": {}}},
                "f:ports": {}
            })),
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
    })
}

fn node_json() -> Value {
    json!({
        "metadata": {"name": THIS_NODE, "uid": uid(4, 0), "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": THIS_NODE}},
        "spec": {"podCIDR": "10.128.0.0/24", "podCIDRs": ["10.128.0.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"},
            {"type": "Hostname", "address": THIS_NODE}]},
    })
}

/// `services` Services with `endpoints_each` endpoints each, this node's Node and
/// the default ServiceCIDR, as the API server holds them.
pub fn cluster_objects(services: usize, endpoints_each: usize) -> Vec<(Kind, Value)> {
    let mut out = Vec::with_capacity(2 * services + 2);
    for i in 0..services {
        let addrs: Vec<IpAddr> = (0..endpoints_each)
            .map(|k| endpoint_addr(i * endpoints_each + k))
            .collect();
        out.push((Kind::Service, service_json(i)));
        out.push((Kind::Slice, slice_json(i, &addrs)));
    }
    out.push((Kind::Node, node_json()));
    out.push((
        Kind::ServiceCidr,
        json!({"metadata": {"name": "kubernetes", "resourceVersion": "1"},
            "spec": {"cidrs": ["10.96.0.0/12"]}}),
    ));
    out
}

/// One run through the API path.
#[derive(Debug, Clone)]
pub struct ApiPathResult {
    pub services: usize,
    pub endpoints: usize,
    /// Start of the process to its first full sync committed.
    pub synced_ms: f64,
    pub peak_rss_kib: u64,
    /// The peak when every kind had been listed, before the first sync.
    pub listed_rss_kib: u64,
    /// A second process over the ruleset the first left: it lists the same
    /// objects, reads the whole ruleset back and writes nothing.
    pub restart_ms: f64,
    pub restart_peak_rss_kib: u64,
}

/// Starts `kube-nft run --once` against a loopback API server holding the
/// cluster, in a scratch namespace, then again over what it wrote, and reads
/// their reports.
pub fn api_path(
    prefix: &str,
    services: usize,
    endpoints_each: usize,
) -> Result<ApiPathResult, String> {
    let ns = Netns::create(&format!("{prefix}api")).map_err(|e| e.to_string())?;
    let server = ApiServer::serving_in(&ns.name, cluster_objects(services, endpoints_each))
        .map_err(|e| format!("the API server: {e}"))?;
    server.page_by(500);
    let first = run_once(&ns.name, &server.url())?;
    let restart = run_once(&ns.name, &server.url())?;
    Ok(ApiPathResult {
        services,
        endpoints: services * endpoints_each,
        synced_ms: first.ms,
        peak_rss_kib: first.peak_rss_kib,
        listed_rss_kib: first.listed_rss_kib,
        restart_ms: restart.ms,
        restart_peak_rss_kib: restart.peak_rss_kib,
    })
}

struct OnceReport {
    ms: f64,
    peak_rss_kib: u64,
    listed_rss_kib: u64,
}

fn run_once(netns: &str, url: &str) -> Result<OnceReport, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", netns])
        .arg(exe)
        .args(["run", "--master", url, "--hostname-override", THIS_NODE])
        .args(["--cluster-cidr", CLUSTER_CIDR, "--once"])
        // nf_conntrack_max is the host's, read-only in a namespace.
        .args(["--conntrack-max-per-core", "0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("kube-nft run --once failed:\n{log}"));
    }
    // The last report is the one at exit; the first, when every kind was listed.
    let reports: Vec<u64> = log
        .lines()
        .filter_map(|l| {
            let after = l.split("peak_rss_kib=").nth(1)?;
            after.split_whitespace().next()?.parse().ok()
        })
        .collect();
    let (Some(&listed_rss_kib), Some(&peak_rss_kib)) = (reports.first(), reports.last()) else {
        return Err(format!("no peak_rss_kib in the daemon's log:\n{log}"));
    };
    Ok(OnceReport {
        ms,
        peak_rss_kib,
        listed_rss_kib,
    })
}

/// The API-path table: a row per size, medians over the runs.
pub fn api_table(results: &[Vec<ApiPathResult>]) -> String {
    let mut out = String::from(
        "| Services × endpoints | start → first full sync | peak RSS | of which before the sync (lists absorbed) | restart over it: time, peak RSS | runs (synced ms / peak MiB; restart ms / peak MiB) |\n|---|---|---|---|---|---|\n",
    );
    let mib = |kib: f64| kib / 1024.0;
    for runs in results.iter().filter(|r| !r.is_empty()) {
        let median =
            |f: &dyn Fn(&ApiPathResult) -> f64| super::median(runs.iter().map(f).collect());
        let each: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "{:.0}/{:.0}; {:.0}/{:.0}",
                    r.synced_ms,
                    mib(r.peak_rss_kib as f64),
                    r.restart_ms,
                    mib(r.restart_peak_rss_kib as f64)
                )
            })
            .collect();
        out += &format!(
            "| {} × {} | {:.2} s | {:.0} MiB | {:.0} MiB | {:.2} s, {:.0} MiB | {} |\n",
            runs[0].services,
            runs[0].endpoints,
            median(&|r| r.synced_ms) / 1000.0,
            mib(median(&|r| r.peak_rss_kib as f64)),
            mib(median(&|r| r.listed_rss_kib as f64)),
            median(&|r| r.restart_ms) / 1000.0,
            mib(median(&|r| r.restart_peak_rss_kib as f64)),
            each.join(", ")
        );
    }
    out
}
