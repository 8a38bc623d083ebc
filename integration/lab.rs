//! `kube-nft lab`, the demo, as a user runs it: the built-in example and a user's
//! own manifests.

mod common;

use common::*;
use std::process::Command;

fn lab(args: &[&str]) -> (bool, String) {
    require_root();
    let out = Command::new(BIN).arg("lab").args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn lab_shows_the_three_hostnames_pods_answering() {
    let prefix = unique("lab");
    let (ok, out) = lab(&["--requests", "30", "--prefix", &prefix]);
    assert!(ok, "{out}");
    for pod in [
        "hostnames-632524106-bbpiw",
        "hostnames-632524106-ly40y",
        "hostnames-632524106-tlaok",
    ] {
        assert!(
            out.contains(&format!("→  {pod}")),
            "{pod} never answered:\n{out}"
        );
    }
    assert!(out.contains("30/30 answered"), "{out}");
    assert!(
        out.contains("kernel readback matches the desired ruleset"),
        "{out}"
    );
    assert!(out.contains("0 : 10.244.0.11 . 9376"), "{out}");
    assert!(
        out.contains("comment \"default/hostnames:default\""),
        "{out}"
    );
    assert!(
        !netns_exists(&format!("{prefix}-node")),
        "the lab left its namespaces behind"
    );
}

#[test]
fn lab_runs_a_users_manifests_with_udp_and_an_empty_service() {
    let scratch = Scratch::new("labm");
    let m = service("dns", &["10.0.5.10"], &[udp(53, 5353), tcp(80, 8080)])
        + &slice(
            "dns",
            "a",
            &[udp(53, 5353), tcp(80, 8080)],
            &["10.244.7.1", "10.244.7.2"],
        )
        + &service("empty", &["10.0.5.11"], &[tcp(80, 80)]);
    let path = scratch.write("m.yaml", &m);
    let prefix = unique("labm");
    let (ok, out) = lab(&[
        "--manifests",
        path.to_str().unwrap(),
        "--requests",
        "20",
        "--prefix",
        &prefix,
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("default/dns:dns (10.0.5.10:53/udp): 20/20 answered"),
        "{out}"
    );
    assert!(
        out.contains("default/dns:http (10.0.5.10:80/tcp): 20/20 answered"),
        "{out}"
    );
    assert!(out.contains("no endpoints: 20/20 refused"), "{out}");
}

fn netns_exists(name: &str) -> bool {
    kube_nft::testbed::netns::netns_path(name).exists()
}

/// Fewer requests than pods: the lab fails, and its last line says why.
#[test]
fn a_lab_that_fails_says_which_pods_got_no_request() {
    let prefix = unique("labfew");
    let (ok, out) = lab(&["--requests", "1", "--prefix", &prefix]);
    assert!(!ok, "{out}");
    let last = out.lines().rfind(|l| l.starts_with("lab ")).unwrap_or("");
    assert!(
        last.starts_with("lab FAILED: default/hostnames:default: 2 pod(s) got no request: ")
            && last.ends_with("(1 requests for 3 pods: use more)"),
        "{out}"
    );
}

/// `lab --keep` leaves the pod servers running; they must not hold the lab's
/// output open, or `kube-nft lab --keep 2>&1 | tail` never ends.
#[test]
fn a_kept_lab_does_not_hold_its_output_pipe_open() {
    require_root();
    let prefix = unique("labkeep");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("{BIN} lab --keep --prefix {prefix} 2>&1 | tail -1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let finished = exit_within(&mut child, std::time::Duration::from_secs(30));
    for ns in ["node", "client", "p0", "p1", "p2"].map(|n| format!("{prefix}-{n}")) {
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ip netns pids {ns} | xargs -r kill; ip netns del {ns}"
            ))
            .status();
    }
    assert!(
        finished.is_some_and(|s| s.success()),
        "the pipe stayed open after the lab ended"
    );
}
