//! Network namespaces for the lab and the tests: create and delete named ones
//! (through `ip`, like an operator would), and run code inside one.
//!
//! Entering a namespace is per thread (`setns`), so code runs on a fresh thread
//! that enters first; sockets it opens stay in that namespace for their lifetime.

use std::io;
use std::path::PathBuf;
use std::process::Command;

/// Runs `ip ARGS`, turning a failure into an error that shows the command.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("running `ip` (is iproute2 installed?): {e}"),
        )
    })?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Runs `ip -n NS ARGS`.
pub fn ip_in(ns: &str, args: &[&str]) -> io::Result<()> {
    let mut full = vec!["-n", ns];
    full.extend_from_slice(args);
    ip(&full)
}

/// Sets a sysctl inside a namespace (`/proc/sys` there belongs to the namespace).
pub fn sysctl_in(ns: &str, key: &str, value: &str) -> io::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let value = value.to_string();
    in_netns(ns, move || std::fs::write(&path, value))?
}

pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Moves the calling thread into the named namespace.
pub fn enter(name: &str) -> io::Result<()> {
    let f = std::fs::File::open(netns_path(name))
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {name}: {e}")))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&f),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| io::Error::other(format!("entering network namespace {name}: {e}")))
}

/// Runs `f` on a new thread inside the named namespace and returns its result.
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let name = name.to_string();
    std::thread::spawn(move || {
        enter(&name)?;
        Ok(f())
    })
    .join()
    .map_err(|_| io::Error::other("thread inside the namespace panicked"))?
}

/// A named network namespace that is deleted (with the processes started in it by
/// us killed) when dropped.
pub struct Netns {
    pub name: String,
    keep: bool,
}

impl Netns {
    pub fn create(name: &str) -> io::Result<Netns> {
        if netns_path(name).exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("network namespace {name} already exists (left by an earlier run? `ip netns del {name}`)"),
            ));
        }
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
            keep: false,
        };
        ip_in(name, &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Leave the namespace in place when dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.keep {
            let _ = ip(&["netns", "del", &self.name]);
        }
    }
}
