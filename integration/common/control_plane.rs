//! A real control plane for the tests: etcd, kube-apiserver and
//! kube-controller-manager started by `integration/k8s/cluster.sh`, and one node
//! namespace serving a Service from two pods the harness reports Ready.

use super::*;
use std::io::Write;
use std::process::Stdio;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/integration/k8s/cluster.sh");

/// `cluster.sh` for the control plane whose namespaces start with `prefix-`:
/// give it a prefix from [`cluster_prefix`], so that two test runs at once
/// (two checkouts, two binaries) never name the same namespace.
pub fn script(prefix: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg(SCRIPT)
        .env("KUBE_NFT_BIN", BIN)
        .env("KUBE_NFT_CLUSTER_PREFIX", prefix)
        .env("RUST_LOG", "info,kube_nft::engine=debug");
    c
}

pub fn checked(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A prefix for a control plane's namespaces, unique to this process and `tag`:
/// `kt<pid>-<tag>`, which the test command's leftover check also covers.
pub fn cluster_prefix(tag: &str) -> String {
    unique(tag)
}

/// A control plane that `cluster.sh up` started; `down` on drop.
pub struct ControlPlane {
    pub prefix: String,
    dir: PathBuf,
}

impl ControlPlane {
    pub fn up(tag: &str) -> ControlPlane {
        let prefix = cluster_prefix(tag);
        let dir = std::env::temp_dir().join(format!("{prefix}-cluster"));
        let cp = ControlPlane { prefix, dir };
        let out = script(&cp.prefix).arg("up").arg(&cp.dir).output().unwrap();
        checked("cluster.sh up", out);
        cp
    }

    pub fn dir(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    /// `cluster.sh SUBCOMMAND DIR ARGS…`.
    pub fn run(&self, subcommand: &str, args: &[&str]) -> String {
        let out = script(&self.prefix)
            .args([subcommand, self.dir()])
            .args(args)
            .output()
            .unwrap();
        checked(&format!("cluster.sh {subcommand} {args:?}"), out)
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.run("kubectl", args)
    }

    pub fn cluster_ip(&self, service: &str) -> String {
        self.kubectl(&[
            "get",
            "service",
            service,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
    }

    pub fn apply(&self, yaml: &str) {
        let mut child = script(&self.prefix)
            .args(["kubectl", self.dir(), "apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        checked("kubectl apply", child.wait_with_output().unwrap());
    }

    /// A Pod labelled `app: web` on `node`, reported running and Ready at `ip`
    /// as its kubelet would (its server is already listening there).
    pub fn pod(&self, name: &str, node: &str, ip: &str) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, labels: {{app: web}}}}\nspec: {{nodeName: {node}, containers: [{{name: web, image: none, ports: [{{containerPort: 9376}}]}}]}}\n"
        ));
        self.run("pod-ready", &["default", name, ip]);
    }

    /// kube-nft in `netns` as the DaemonSet runs it, until dropped.
    pub fn daemonset(&self, netns: &str, node: &str, log: PathBuf) -> Daemon {
        self.daemonset_with(netns, node, log, &[])
    }

    /// `daemonset`, with these variables in kube-nft's environment.
    pub fn daemonset_with(
        &self,
        netns: &str,
        node: &str,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut command = script(&self.prefix);
        command.args(["daemonset", self.dir(), netns, node]);
        command.envs(env.iter().copied());
        Daemon::spawn_command(command, log)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = script(&self.prefix).args(["down", self.dir()]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub const PODS: [(&str, &str); 2] = [("web-a", "10.244.0.11"), ("web-b", "10.244.0.12")];

/// One node namespace on a control plane's bridge, registered as node-a, with
/// deploy/ applied, pods web-a and web-b serving their names and reported Ready,
/// and a Service `web` selecting them.
pub struct Serving {
    // Dropped in this order: the control plane before the namespaces it joined.
    pub cp: ControlPlane,
    pub c: Cluster,
    pub cluster_ip: String,
}

impl Serving {
    pub fn new(tag: &str, prefix: &str) -> Serving {
        let pods: Vec<(&str, &[&str])> =
            vec![("web-a", &["10.244.0.11"]), ("web-b", &["10.244.0.12"])];
        let c = Cluster::new(tag, &pods, &[9376]);
        let cp = ControlPlane::up(prefix);
        cp.run("join", &[c.node(), "10.100.0.11"]);
        cp.run("node", &["node-a", "10.100.0.11", "10.244.0.0/24"]);
        cp.run("deploy", &[]);
        cp.apply(&service_yaml("web"));
        for (name, ip) in PODS {
            cp.pod(name, "node-a", ip);
        }
        let cluster_ip = cp.cluster_ip("web");
        Serving { cp, c, cluster_ip }
    }

    pub fn vip(&self) -> String {
        format!("{}:80", self.cluster_ip)
    }

    pub fn daemonset(&self, log: &str) -> Daemon {
        self.daemonset_with(log, &[])
    }

    pub fn daemonset_with(&self, log: &str, env: &[(&str, &str)]) -> Daemon {
        let log = self.c.scratch.0.join(log);
        self.cp.daemonset_with(self.c.node(), "node-a", log, env)
    }
}

pub fn service_yaml(name: &str) -> String {
    format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{selector: {{app: web}}, ports: [{{name: http, port: 80, targetPort: 9376}}]}}\n")
}
