//! The synthetic cluster of the benches that run against a real API server
//! (`versus`, `nodes`): N Services × 10 endpoints, 1,000 to a namespace,
//! Services without selectors and EndpointSlices as a controller would write
//! them (the EndpointSlice controller would need 10 pods per Service, which
//! this machine cannot hold at 10k). With an etcd, the Services go straight
//! into it, with the IPAddress that reserves each ClusterIP (`etcd_load`: the
//! API server's create path is quadratic in the Services); the slices always
//! go through the API server.

use super::etcd_load::{self, Etcd};
use crate::source::store::TRIGGER_TIME_ANNOTATION;
use crate::testbed::synthetic::{endpoint_addr, node_number, CLUSTER_CIDR};
use futures_util::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IPAddress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// Services per namespace. A real cluster's Services are spread over many,
/// and kube-controller-manager's EndpointSlice mirroring lists a namespace's
/// slices for each Service without a selector it syncs: 100k of them in one
/// namespace kept most of a core of this 2-core machine busy through the whole
/// run (docs/BENCHMARKS.md).
const SERVICES_PER_NAMESPACE: usize = 1000;
/// The namespaces' names: this, then their number.
const NAMESPACE_PREFIX: &str = "bench-";
pub(crate) const ENDPOINTS: usize = 10;
pub(crate) const PROBE_PORT: u16 = 8080;

pub(crate) async fn client(kubeconfig: &std::path::Path) -> Result<Client, String> {
    let conn = crate::source::kubernetes::Connection {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        master: None,
    };
    let config = crate::source::kubernetes::client_config(&conn).await?;
    Client::try_from(config).map_err(|e| e.to_string())
}

/// Service `i`'s ClusterIP: from 10.96.1.0 on (10.96.0.1 is the API server's).
pub(crate) fn vip(i: usize) -> IpAddr {
    IpAddr::from((0x0a60_0100u32 + i as u32).to_be_bytes())
}

pub(crate) fn service_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// The name of Service `i`'s one EndpointSlice.
pub(crate) fn slice_name(i: usize) -> String {
    format!("{}-a", service_name(i))
}

/// Service `i`'s namespace.
pub(crate) fn namespace(i: usize) -> String {
    format!("{NAMESPACE_PREFIX}{:03}", i / SERVICES_PER_NAMESPACE)
}

/// Service `i`'s endpoints; the probe Service (the last) has one, on the node.
pub(crate) fn addresses(i: usize, probe: bool, node_ip: Ipv4Addr) -> Vec<IpAddr> {
    if probe {
        return vec![IpAddr::V4(node_ip)];
    }
    (0..ENDPOINTS)
        .map(|k| endpoint_addr(i * ENDPOINTS + k))
        .collect()
}

/// The node of the pod at `addr`, as the EndpointSlice controller records it:
/// the pods are spread over 100 nodes as in the synthetic bench, named as the
/// bench scripts name the nodes they run (`node-1` to `node-100`), so a node
/// under test hosts 1 % of them. The probe's endpoint, the node's own address,
/// has none. An endpoint without a node may be any node's and needs a hairpin
/// element on every node: before the bench's endpoints had nodes, a node's
/// hairpin set at 100k held a million elements (docs/BENCHMARKS.md).
fn pod_node(addr: IpAddr) -> Option<String> {
    let pods: ipnet::IpNet = CLUSTER_CIDR.parse().expect("a CIDR");
    let pod = pods.contains(&addr);
    pod.then(|| format!("node-{}", node_number(addr) + 1))
}

pub(crate) fn slice_json(i: usize, addrs: &[IpAddr]) -> Value {
    let endpoints: Vec<Value> = addrs
        .iter()
        .map(|a| {
            let mut e = json!({"addresses": [a.to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false}});
            if let Some(node) = pod_node(*a) {
                e["nodeName"] = node.into();
            }
            e
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice_name(i), "namespace": namespace(i),
            "labels": {"kubernetes.io/service-name": service_name(i),
                "endpointslice.kubernetes.io/managed-by": "bench.kube-nft.io"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": PROBE_PORT}],
        "endpoints": endpoints,
    })
}

fn service_json(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(i), "namespace": namespace(i)},
        "spec": {"clusterIP": vip(i).to_string(),
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": PROBE_PORT}]},
    })
}

/// Service `i` as kube-apiserver stores it (its defaults filled in), and the
/// IPAddress object that reserves its ClusterIP, as the allocator writes it:
/// their etcd keys and values. `uid` tells this run's objects apart.
fn stored_service(i: usize, uid: u32, created: &str) -> [(String, Vec<u8>); 2] {
    let (name, ip) = (service_name(i), vip(i).to_string());
    let mut svc = service_json(i);
    svc["metadata"]["uid"] = json!(format!("{uid:08x}-0000-4000-8000-{i:012x}"));
    svc["metadata"]["creationTimestamp"] = json!(created);
    let spec = &mut svc["spec"];
    spec["ports"][0]["protocol"] = json!("TCP");
    for (k, v) in [
        ("clusterIPs", json!([ip])),
        ("type", json!("ClusterIP")),
        ("sessionAffinity", json!("None")),
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
        ("internalTrafficPolicy", json!("Cluster")),
    ] {
        spec[k] = v;
    }
    svc["status"] = json!({"loadBalancer": {}});
    let address = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IPAddress",
        "metadata": {"name": ip, "uid": format!("{uid:08x}-0001-4000-8000-{i:012x}"),
            "creationTimestamp": created,
            "labels": {"ipaddress.kubernetes.io/ip-family": "IPv4",
                "ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io"}},
        "spec": {"parentRef": {"group": "", "resource": "services",
            "namespace": namespace(i), "name": name}},
    });
    [
        (
            format!("/registry/services/specs/{}/{name}", namespace(i)),
            svc.to_string().into_bytes(),
        ),
        (
            format!("/registry/ipaddresses/{ip}"),
            address.to_string().into_bytes(),
        ),
    ]
}

/// Writes Services `from..to` into etcd (see `etcd_load` for why), and waits
/// until the API server serves them. Their IPAddresses go first, as the
/// allocator writes them: the API server's repair loop (`RepairIPAddress`)
/// takes a Service it sees before its IPAddress for one whose ClusterIP was
/// never reserved, and tries to create one (an error and an Event for each),
/// while an IPAddress seen before its Service has a minute's grace.
pub(crate) fn store_services(
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    etcd: &Etcd,
    from: usize,
    to: usize,
) -> Result<(), String> {
    let uid = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as u32);
    let created = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let (services, addresses): (Vec<_>, Vec<_>) = (from..to)
        .map(|i| {
            let [svc, address] = stored_service(i, uid, &created);
            (svc, address)
        })
        .unzip();
    etcd_load::put_all(etcd, addresses)?;
    let last_ip = vip(to - 1).to_string();
    runtime.block_on(served(Api::<IPAddress>::all(client.clone()), &last_ip))?;
    etcd_load::put_all(etcd, services)?;
    let stored = etcd_load::count(
        etcd,
        &format!("/registry/services/specs/{NAMESPACE_PREFIX}"),
    )?;
    if stored < to as u64 {
        return Err(format!("etcd holds {stored} Services of {to}"));
    }
    runtime.block_on(served(service_api(client, to - 1), &service_name(to - 1)))
}

/// Waits until the API server serves the object `name` (its reads come from
/// its watch cache, once that has caught up with etcd).
async fn served<K>(api: Api<K>, name: &str) -> Result<(), String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let t = Instant::now();
    loop {
        match api.get_opt(name).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if t.elapsed() < Duration::from_secs(120) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(None) => return Err(format!("the API server does not serve {name}")),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The namespaces of Services `from..to`.
pub(crate) async fn create_namespaces(
    client: &Client,
    from: usize,
    to: usize,
) -> Result<(), String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for n in from / SERVICES_PER_NAMESPACE..to.div_ceil(SERVICES_PER_NAMESPACE) {
        let name = namespace(n * SERVICES_PER_NAMESPACE);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
            .map_err(|e| e.to_string())?;
        exists_ok(namespaces.create(&PostParams::default(), &ns).await)?;
    }
    Ok(())
}

/// Creates Services `from..to` (unless they exist already, written into etcd)
/// and their slices (32 requests in flight); what exists already is kept.
pub(crate) async fn populate(
    client: &Client,
    from: usize,
    to: usize,
    probe: Option<usize>,
    node_ip: Ipv4Addr,
    services_exist: bool,
) -> Result<(), String> {
    stream::iter(from..to)
        .map(|i| async move {
            if !services_exist {
                let svc: Service =
                    serde_json::from_value(service_json(i)).map_err(|e| e.to_string())?;
                exists_ok(
                    service_api(client, i)
                        .create(&PostParams::default(), &svc)
                        .await,
                )?;
            }
            let addrs = addresses(i, Some(i) == probe, node_ip);
            let slice: EndpointSlice =
                serde_json::from_value(slice_json(i, &addrs)).map_err(|e| e.to_string())?;
            exists_ok(
                slice_api(client, i)
                    .create(&PostParams::default(), &slice)
                    .await,
            )
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

fn exists_ok<T>(r: Result<T, kube::Error>) -> Result<(), String> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Service `i`'s namespace, for Services.
pub(crate) fn service_api(client: &Client, i: usize) -> Api<Service> {
    Api::namespaced(client.clone(), &namespace(i))
}

/// Service `i`'s namespace, for EndpointSlices.
pub(crate) fn slice_api(client: &Client, i: usize) -> Api<EndpointSlice> {
    Api::namespaced(client.clone(), &namespace(i))
}

pub(crate) async fn set_endpoints(
    client: &Client,
    i: usize,
    addrs: &[IpAddr],
) -> Result<(), String> {
    patch_endpoints(client, i, addrs, None).await
}

/// Service `i`'s endpoints set to `addrs`; with a trigger time, that time in
/// the annotation where the EndpointSlice controller records a change's, from
/// which proxies report their network programming latency.
pub(crate) async fn patch_endpoints(
    client: &Client,
    i: usize,
    addrs: &[IpAddr],
    trigger_time: Option<&str>,
) -> Result<(), String> {
    let name = slice_name(i);
    let mut patch = json!({"endpoints": slice_json(i, addrs)["endpoints"]});
    if let Some(t) = trigger_time {
        patch["metadata"] = json!({"annotations": {TRIGGER_TIME_ANNOTATION: t}});
    }
    slice_api(client, i)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("updating {name}: {e}"))
}

/// The flags every proxy of the benches takes, kube-nft and kube-proxy alike:
/// the cluster's pods are in `CLUSTER_CIDR` (`endpoint_addr`), and
/// nf_conntrack_max is the host's, read-only in a node's namespace, so both
/// leave it (the timeouts are the namespace's, and both set them).
pub(crate) fn proxy_flags(kubeconfig: &std::path::Path, node_name: &str) -> Vec<String> {
    [
        "--kubeconfig",
        kubeconfig.to_str().unwrap_or_default(),
        "--hostname-override",
        node_name,
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--conntrack-max-per-core",
        "0",
    ]
    .map(String::from)
    .to_vec()
}
