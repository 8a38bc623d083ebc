//! kube-nft against a real Kubernetes control plane (issue #17, first part):
//! `integration/k8s/cluster.sh smoke` starts etcd, kube-apiserver and
//! kube-controller-manager v1.36 in network namespaces, checks deploy/ with a
//! server-side dry run and its RBAC with `kubectl auth can-i`, makes a Service
//! and two Pods Ready (as a kubelet would report them), waits for the real
//! EndpointSlice controller's slice, and has kube-nft, run as the DaemonSet
//! runs it (its ServiceAccount's token, deploy/'s ConfigMap), program it in a
//! node namespace.

mod common;

use common::require_root;
use std::process::Command;

#[test]
fn a_real_api_server_and_endpointslice_controller_drive_kube_nft_run_as_the_daemonset_runs_it() {
    require_root();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/integration/k8s/cluster.sh");
    let out = Command::new("bash")
        .args([script, "smoke"])
        .env("KUBE_NFT_BIN", env!("CARGO_BIN_EXE_kube-nft"))
        .env("KUBE_NFT_CLUSTER_PREFIX", "kc1")
        .output()
        .expect("running integration/k8s/cluster.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(out.status.success(), "cluster.sh smoke failed:\n{stderr}");
    assert!(stderr.contains("smoke passed"), "{stderr}");
    assert!(stderr.contains("kube-apiserver v1.36"), "{stderr}");
}
