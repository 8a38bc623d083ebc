//! The conntrack sysctls kube-proxy sets when it starts, from the same flags and
//! `conntrack` section, with the same defaults and the same rules
//! (`pkg/proxy/conntrack/sysctls.go` in v1.36): a value is written only where
//! the kernel holds another, zero means "leave it", and any failure stops the
//! start, because a node whose connection table is smaller than asked drops
//! connections later, where nobody looks.
//!
//! `nf_conntrack_max` and the hash size are the host's, one for every network
//! namespace (outside the host's they read 0444); the timeouts and
//! `tcp_be_liberal` belong to the namespace that writes them.

use crate::config::ConntrackSettings;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the values live: the real paths, or a directory standing in for them.
#[derive(Debug, Clone)]
pub struct Host {
    /// `/proc/sys`, read and written in the caller's network namespace.
    pub proc_sys: PathBuf,
    /// `/sys/module/nf_conntrack/parameters/hashsize`.
    pub hashsize: PathBuf,
    /// Online CPUs, as kube-proxy counts them (every online thread).
    pub cpus: u32,
}

impl Host {
    pub fn real() -> Host {
        Host {
            proc_sys: "/proc/sys".into(),
            hashsize: "/sys/module/nf_conntrack/parameters/hashsize".into(),
            cpus: online_cpus(Path::new("/sys/devices/system/cpu/online")),
        }
    }
}

/// The online CPUs of `/sys/devices/system/cpu/online` (`0-3,8`), else those
/// this process may run on.
fn online_cpus(list: &Path) -> u32 {
    let from_sys = std::fs::read_to_string(list).ok().and_then(|text| {
        let mut n = 0;
        for range in text.trim().split(',') {
            n += match range.split_once('-') {
                Some((a, b)) => b.parse::<u32>().ok()? - a.parse::<u32>().ok()? + 1,
                None => range.parse::<u32>().map(|_| 1).ok()?,
            };
        }
        (n > 0).then_some(n)
    });
    from_sys.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
}

/// Each sysctl (under `net/netfilter/`) these settings give a value, in
/// kube-proxy's order, `nf_conntrack_max` first.
pub fn wanted(settings: &ConntrackSettings, cpus: u32) -> Vec<(&'static str, u64)> {
    let secs = |d: Duration| (!d.is_zero()).then_some(d.as_secs());
    [
        ("nf_conntrack_max", settings.max(cpus).map(u64::from)),
        (
            "nf_conntrack_tcp_timeout_established",
            secs(settings.tcp_established_timeout),
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            secs(settings.tcp_close_wait_timeout),
        ),
        (
            "nf_conntrack_tcp_be_liberal",
            settings.tcp_be_liberal.then_some(1),
        ),
        ("nf_conntrack_udp_timeout", secs(settings.udp_timeout)),
        (
            "nf_conntrack_udp_timeout_stream",
            secs(settings.udp_stream_timeout),
        ),
    ]
    .into_iter()
    .filter_map(|(name, value)| Some((name, value?)))
    .collect()
}

/// Brings the kernel to these settings, writing only what differs, and
/// returns what it wrote (`path=value`). The hash size is raised to a
/// quarter of `nf_conntrack_max` when it is smaller. The first failure is
/// returned, naming the file, and what came before it stays written.
pub fn apply(settings: &ConntrackSettings, host: &Host) -> Result<Vec<String>, String> {
    let mut written = Vec::new();
    for (name, value) in wanted(settings, host.cpus) {
        let path = host.proc_sys.join("net/netfilter").join(name);
        if write_if_different(&path, value)? {
            written.push(format!("net.netfilter.{name}={value}"));
        }
        if name == "nf_conntrack_max" {
            let hashsize = read_number(&host.hashsize)
                .map_err(|e| format!("reading {}: {e}", host.hashsize.display()))?;
            if hashsize < value / 4 {
                write(&host.hashsize, value / 4)?;
                written.push(format!("{}={}", host.hashsize.display(), value / 4));
            }
        }
    }
    Ok(written)
}

/// Sets this host's values at start, logging each one written; the error is
/// the start's (kube-proxy's message, with the file at fault).
pub fn settle(settings: &ConntrackSettings) -> Result<(), String> {
    let written = apply(settings, &Host::real())
        .map_err(|e| format!("could not set conntrack parameters: {e}"))?;
    for w in written {
        tracing::info!("set {w}");
    }
    Ok(())
}

fn read_number(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    text.trim()
        .parse()
        .map_err(|_| format!("{:?} is not a number", text.trim()))
}

/// Writes `value` unless the file already holds it; a file that cannot be read
/// counts as different (kube-proxy's rule), so the write reports the problem.
fn write_if_different(path: &Path, value: u64) -> Result<bool, String> {
    if read_number(path).ok() == Some(value) {
        return Ok(false);
    }
    write(path, value)?;
    Ok(true)
}

fn write(path: &Path, value: u64) -> Result<(), String> {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    std::fs::write(path, value.to_string()).map_err(|e| {
        let hint = match e.kind() {
            ReadOnlyFilesystem | PermissionDenied => {
                " (a container needs /proc/sys and /sys writable, as deploy/daemonset.yaml's init container has them; nf_conntrack_max and the hash size can only be set from the host's network namespace; 0 leaves a value as it is)"
            }
            _ => "",
        };
        format!("setting {} to {value}: {e}{hint}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximum_scales_with_cpus_between_min_and_the_cap_as_kube_proxy_s() {
        let d = ConntrackSettings::default();
        // kube-proxy's figures for its defaults: 4 CPUs 131072 (the floor),
        // 8 262144, 16 524288, 32 and more 1048576.
        for (cpus, max) in [
            (1, 131072),
            (4, 131072),
            (8, 262144),
            (16, 524288),
            (32, 1 << 20),
            (64, 1 << 20),
        ] {
            assert_eq!(d.max(cpus), Some(max), "{cpus} CPUs");
        }
        // The cap wins over a larger floor.
        let big_min = ConntrackSettings {
            min: 2 << 20,
            ..d.clone()
        };
        assert_eq!(big_min.max(64), Some(1 << 20));
        assert_eq!(big_min.max(2), Some(2 << 20));
        let leave = ConntrackSettings {
            max_per_core: 0,
            ..d
        };
        assert_eq!(leave.max(8), None);
    }

    #[test]
    fn online_cpus_count_every_listed_range() {
        let dir = std::env::temp_dir().join(format!("kn-cpus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("online");
        for (text, n) in [("0-1\n", 2), ("0-3,8,10-11\n", 7), ("0\n", 1)] {
            std::fs::write(&f, text).unwrap();
            assert_eq!(online_cpus(&f), n, "{text:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stand-in for /proc/sys and the hash size: plain files.
    fn fake_host(tag: &str, values: &[(&str, &str)], hashsize: &str) -> Host {
        let dir = std::env::temp_dir().join(format!("kn-sysctl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("net/netfilter")).unwrap();
        for (name, value) in values {
            std::fs::write(dir.join("net/netfilter").join(name), value).unwrap();
        }
        std::fs::write(dir.join("hashsize"), hashsize).unwrap();
        Host {
            hashsize: dir.join("hashsize"),
            proc_sys: dir,
            cpus: 8,
        }
    }

    fn read(host: &Host, name: &str) -> String {
        std::fs::read_to_string(host.proc_sys.join("net/netfilter").join(name)).unwrap()
    }

    #[test]
    fn only_what_differs_is_written_and_the_hash_size_follows_the_maximum() {
        let host = fake_host(
            "apply",
            &[
                ("nf_conntrack_max", "65536\n"),
                ("nf_conntrack_tcp_timeout_established", "432000\n"),
                ("nf_conntrack_tcp_timeout_close_wait", "3600\n"),
            ],
            "16384\n",
        );
        let written = apply(&ConntrackSettings::default(), &host).unwrap();
        assert_eq!(
            written,
            vec![
                "net.netfilter.nf_conntrack_max=262144".to_string(),
                format!("{}=65536", host.hashsize.display()),
                "net.netfilter.nf_conntrack_tcp_timeout_established=86400".into(),
            ]
        );
        assert_eq!(read(&host, "nf_conntrack_max"), "262144");
        assert_eq!(read(&host, "nf_conntrack_tcp_timeout_close_wait"), "3600\n");
        // The second start finds everything in place and writes nothing.
        assert_eq!(
            apply(&ConntrackSettings::default(), &host).unwrap(),
            Vec::<String>::new()
        );
        // Zero leaves a value; tcp_be_liberal and the UDP timeouts when asked.
        let asked = ConntrackSettings {
            max_per_core: 0,
            tcp_established_timeout: Duration::ZERO,
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(30),
            udp_stream_timeout: Duration::from_secs(120),
            ..ConntrackSettings::default()
        };
        let written = apply(&asked, &host).unwrap();
        assert_eq!(
            written,
            [
                "net.netfilter.nf_conntrack_tcp_be_liberal=1",
                "net.netfilter.nf_conntrack_udp_timeout=30",
                "net.netfilter.nf_conntrack_udp_timeout_stream=120",
            ]
        );
        assert_eq!(read(&host, "nf_conntrack_max"), "262144");
        std::fs::remove_dir_all(&host.proc_sys).unwrap();
    }

    #[test]
    fn a_failure_names_the_file_and_stops_there() {
        let host = fake_host("fail", &[("nf_conntrack_max", "262144")], "not a number");
        let err = apply(&ConntrackSettings::default(), &host).unwrap_err();
        assert!(
            err.starts_with("reading ") && err.contains("hashsize"),
            "{err}"
        );
        assert!(err.contains("\"not a number\" is not a number"), "{err}");
        // Nothing after the failure was written.
        assert!(!host
            .proc_sys
            .join("net/netfilter/nf_conntrack_tcp_timeout_established")
            .exists());
        std::fs::remove_dir_all(&host.proc_sys).unwrap();
    }
}
