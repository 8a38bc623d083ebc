//! `kube-nft run`: keeps the kernel in step with the source.
//!
//! Events (the manifests changed, someone else changed our table, the resync
//! period elapsed) only mark work; syncs happen at most once per `min_sync_period`,
//! so a burst of changes becomes one transaction. A failed sync leaves the previous
//! ruleset in place and is retried with backoff, as a full sync.

use crate::healthcheck::{self, HealthServers};
use crate::netlink::monitor::{Change, Monitor};
use crate::netlink::route;
use crate::proxy::{log_rejected, validate, Proxier, SyncKind, SyncReport};
use crate::ruleset::TABLE_NAME;
use crate::source::files;
use crate::stale_flows::StaleFlowCleaner;
use crate::translate::{NodeConfig, NodePortAddresses};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

pub struct RunOptions {
    pub manifests: Vec<PathBuf>,
    pub node_name: Option<String>,
    pub config: NodeConfig,
    pub once: bool,
    /// How often the whole table is read back and repaired.
    pub sync_period: Duration,
    /// The least time between two syncs; changes within it are coalesced.
    pub min_sync_period: Duration,
}

enum Event {
    ManifestsChanged,
    Drift(Change),
}

/// The newest modification time among the manifest files and directories.
fn manifests_stamp(paths: &[PathBuf]) -> Option<SystemTime> {
    let mut all = paths.to_vec();
    all.extend(files::manifest_files(paths).ok()?);
    all.iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
}

/// Reads this node's addresses into the config when `--nodeport-addresses` CIDRs
/// need them; on failure the addresses known before are kept.
pub fn with_local_addresses(mut config: NodeConfig) -> NodeConfig {
    if matches!(config.nodeport_addresses, NodePortAddresses::Cidrs(_)) {
        match route::local_addresses() {
            Ok(addrs) => config.local_addresses = addrs,
            Err(e) => tracing::warn!("reading this node's addresses: {e}"),
        }
    }
    config
}

fn refresh_addresses(proxier: &mut Proxier) {
    let config = with_local_addresses(proxier.config().clone());
    proxier.set_config(config);
}

fn load(opts: &RunOptions, proxier: &mut Proxier) -> Result<(), String> {
    refresh_addresses(proxier);
    let loaded = files::load(&opts.manifests).map_err(|e| e.to_string())?;
    log_rejected(&loaded.rejected);
    let validated = validate(&loaded.objects, opts.node_name.as_deref());
    proxier.replace_state(validated.state);
    Ok(())
}

/// Parses `30s`, `500ms`, `2m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (like 30s, 500ms, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

pub fn run(opts: RunOptions) -> Result<(), String> {
    opts.config.validate().map_err(|e| e.to_string())?;
    let mut proxier = Proxier::new(opts.config.clone())
        .map_err(|e| format!("opening the nf_tables netlink socket: {e}"))?;
    load(&opts, &mut proxier)?;
    let mut flows = StaleFlowCleaner::default();
    if opts.once {
        let r = proxier.sync().map_err(|e| e.to_string())?;
        log_sync(&r);
        clean_flows(&mut flows, &proxier, &r);
        return Ok(());
    }

    let (tx, rx) = mpsc::channel();
    let paths = opts.manifests.clone();
    let watcher_tx = tx.clone();
    std::thread::spawn(move || {
        let mut seen = manifests_stamp(&paths);
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let now = manifests_stamp(&paths);
            if now != seen {
                seen = now;
                if watcher_tx.send(Event::ManifestsChanged).is_err() {
                    return;
                }
            }
        }
    });
    match Monitor::open() {
        Ok(mut monitor) => {
            std::thread::spawn(move || {
                let own = std::process::id();
                while let Ok(change) = monitor.next_foreign_change(TABLE_NAME, own) {
                    if tx.send(Event::Drift(change)).is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!(
            "not watching nf_tables notifications ({e}); drift is repaired every sync period"
        ),
    }

    let health = HealthServers::start();
    let mut last_sync: Option<Instant> = None;
    let mut last_full = Instant::now();
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Duration::from_secs(1);
    loop {
        let now = Instant::now();
        if now.duration_since(last_full) >= opts.sync_period {
            refresh_addresses(&mut proxier);
            proxier.request_full_sync();
        }
        let earliest = last_sync
            .map_or(now, |t| t + opts.min_sync_period)
            .max(retry_at.unwrap_or(now));
        if proxier.pending() && now >= earliest {
            last_sync = Some(now);
            let result = proxier.sync();
            health.update(healthcheck::wanted(proxier.state()), result.is_ok());
            match result {
                Ok(r) => {
                    if r.kind == SyncKind::Full {
                        last_full = now;
                    }
                    log_sync(&r);
                    clean_flows(&mut flows, &proxier, &r);
                    retry_at = None;
                    backoff = Duration::from_secs(1);
                }
                Err(e) => {
                    tracing::error!(
                        "sync failed, the previous rules stay in place; full sync in {}s: {e}",
                        backoff.as_secs()
                    );
                    retry_at = Some(now + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            continue;
        }
        let next_full = last_full + opts.sync_period;
        let wake = if proxier.pending() {
            earliest.min(next_full)
        } else {
            next_full
        };
        match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(Event::ManifestsChanged) => {
                if let Err(e) = load(&opts, &mut proxier) {
                    tracing::error!("reading manifests: {e}");
                }
            }
            Ok(Event::Drift(change)) => {
                tracing::warn!("our table was changed outside kube-nft ({change:?}); repairing");
                proxier.request_full_sync();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err("event sources stopped".into()),
        }
    }
}

fn clean_flows(cleaner: &mut StaleFlowCleaner, proxier: &Proxier, sync: &SyncReport) {
    match cleaner.after_sync(proxier.state(), proxier.config(), sync) {
        Ok(0) => {}
        Ok(n) => tracing::info!("deleted {n} stale UDP conntrack entries"),
        Err(e) => tracing::warn!("cleaning stale UDP conntrack entries: {e}"),
    }
}

fn log_sync(r: &crate::proxy::SyncReport) {
    tracing::info!(
        kind = ?r.kind,
        services = r.services,
        messages = r.committed.messages,
        bytes = r.committed.bytes,
        "synced in {:.1} ms",
        r.duration.as_secs_f64() * 1000.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_kube_proxy_flags() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert!(parse_duration("5 parsecs").is_err());
    }
}
