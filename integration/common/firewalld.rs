//! firewalld, Debian 12's (1.3, nftables backend), running on a test's node:
//! from the chroot `integration/nft-versions/chroots.sh` builds, inside the
//! node's network namespace and a mount namespace of its own, with a system bus
//! of its own. Its configuration is a copy in the test's scratch directory, so
//! that `--permanent` changes last across a restart and end with the test.

use super::*;
use std::process::{Child, Stdio};

const ROOT: &str = "/var/cache/kube-nft/chroots/firewalld";

pub struct Firewalld {
    /// The shell that runs dbus-daemon and then becomes firewalld.
    child: Child,
    log: PathBuf,
}

impl Firewalld {
    /// Starts firewalld in `ns` and waits until it says it runs.
    pub fn start(ns: &str, scratch: &Scratch) -> Firewalld {
        assert!(
            Path::new(ROOT).join("usr/sbin/firewalld").exists(),
            "no firewalld chroot at {ROOT}: integration/nft-versions/chroots.sh builds it"
        );
        let etc = scratch.0.join("firewalld-etc");
        let run = scratch.0.join("firewalld-run");
        std::fs::create_dir_all(run.join("dbus")).unwrap();
        // A restart keeps what `--permanent` wrote, as on a node.
        if !etc.exists() {
            let from = format!("{ROOT}/etc/firewalld");
            let copied = Command::new("cp")
                .args(["-a", &from, etc.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(copied.success());
        }
        let script = format!(
            "set -e
mount -t proc proc {ROOT}/proc
mount -t sysfs sys {ROOT}/sys
mount --bind /dev {ROOT}/dev
mount --bind {run} {ROOT}/run
mount --bind {etc} {ROOT}/etc/firewalld
chroot {ROOT} dbus-daemon --system --nofork --nopidfile &
while [ ! -S {ROOT}/run/dbus/system_bus_socket ]; do sleep 0.05; done
exec chroot {ROOT} /usr/sbin/firewalld --nofork --nopid
",
            run = run.display(),
            etc = etc.display()
        );
        let log = scratch.0.join("firewalld.log");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "unshare",
                "-m",
                "--propagation",
                "private",
            ])
            .args(["sh", "-c", &script])
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .unwrap();
        let f = Firewalld { child, log };
        wait_until(Duration::from_secs(30), "firewalld to run", || {
            f.try_cmd(&["--state"]).is_ok_and(|s| s.trim() == "running")
        });
        f
    }

    pub fn try_cmd(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("nsenter")
            .args([
                "-t",
                &self.child.id().to_string(),
                "-m",
                "-n",
                "chroot",
                ROOT,
            ])
            .arg("firewall-cmd")
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// `firewall-cmd ARGS`, which must succeed: what it printed.
    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args).unwrap_or_else(|e| {
            panic!(
                "firewall-cmd {args:?}: {e}\nfirewalld's log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })
    }
}

impl Drop for Firewalld {
    /// Its mount namespace, and so its mounts, end with the last process in it:
    /// firewalld, and its bus, started by the shell that became firewalld.
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-P", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
