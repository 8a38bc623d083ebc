//! `kube-nft run`: keeps the kernel in step with the source.
//!
//! Events (objects changed, someone else changed our table, the resync period
//! elapsed) only mark work; syncs happen at most once per `min_sync_period`, so a
//! burst of changes becomes one transaction. A failed sync leaves the previous
//! ruleset in place and is retried with backoff, as a full sync. With the API
//! server as source nothing is programmed until every kind has been listed once:
//! programming a partial picture would delete the rules of Services not yet seen.
//! SIGTERM and SIGINT stop the daemon and leave the rules serving.

use crate::config::{DetectLocal, Settings, Source};
use crate::core::convert::{log_rejected, log_skipped_values};
use crate::core::model::{ClusterState, TRAFFIC_HINT_ANNOTATION};
use crate::core::net::Family;
use crate::core::node_config::{FastPath, NodeConfig, ProxyMode};
use crate::engine::dataplane::{SyncKind, Verification};
use crate::engine::{Engine, SyncReport};
use crate::netlink::monitor::{Change, Monitor};
use crate::netlink::route;
use crate::node::fast_path;
use crate::node::healthcheck::{self, HealthServers};
use crate::node::metrics::Metrics;
use crate::node::metrics_server::MetricsServer;
use crate::node::nat_hold::NatHold;
use crate::node::proxy_health::{node_eligible, ProxyHealth};
use crate::node::stale_flows::StaleFlowCleaner;
use crate::ruleset::TableId;
use crate::source::files::{self, ManifestStore};
use crate::source::store::ClusterStore;
use crate::source::{kubernetes, Update};
use ipnet::IpNet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

enum Event {
    ManifestsChanged,
    Api(Update),
    Drift(Change),
    /// An interface came, went or changed (the fast path's devices).
    Links,
    Terminate(&'static str),
}

impl From<Update> for Event {
    fn from(u: Update) -> Event {
        Event::Api(u)
    }
}

/// What the manifest files look like from outside: each file's (or path's)
/// modification time and size, `None` where it cannot be read.
type ManifestStamp = Vec<(PathBuf, Option<(SystemTime, u64)>)>;

fn manifests_stamp(paths: &[PathBuf]) -> ManifestStamp {
    let mut all = paths.to_vec();
    for p in paths {
        all.extend(files::manifest_files(std::slice::from_ref(p)).unwrap_or_default());
    }
    all.into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).ok();
            let stamp = m.and_then(|m| Some((m.modified().ok()?, m.len())));
            (p, stamp)
        })
        .collect()
}

/// Reads this node's addresses into the config when `--nodeport-addresses` CIDRs
/// need them; on failure the addresses known before are kept.
pub fn with_local_addresses(mut config: NodeConfig) -> NodeConfig {
    if !config.nodeport_addresses.cidrs.is_empty() {
        match route::local_addresses() {
            Ok(addrs) => config.local_addresses = addrs,
            Err(e) => tracing::warn!("reading this node's addresses: {e}"),
        }
    }
    config
}

/// The first CIDR of each family (local traffic detection takes one pod CIDR
/// per family).
fn one_per_family(cidrs: &[IpNet]) -> Vec<IpNet> {
    Family::ALL
        .into_iter()
        .filter_map(|f| cidrs.iter().find(|c| Family::of_net(c) == f).copied())
        .collect()
}

/// Keeps the node settings that the cluster decides (pod CIDRs for NodeCIDR
/// detection, ServiceCIDRs, this node's addresses) in step with it.
struct NodeSettings {
    base: NodeConfig,
    detect_local: DetectLocal,
    service_cidrs_from_api: bool,
}

impl NodeSettings {
    /// Recomputes the engine's config from the settings and what the store knows
    /// of this node and the cluster's ServiceCIDRs.
    fn apply(&self, engine: &mut Engine, store: &ClusterStore, read_addresses: bool) {
        let mut config = self.base.clone();
        if self.detect_local == DetectLocal::NodeCidr {
            config.cluster_cidrs = store
                .state()
                .node
                .as_ref()
                .map(|n| one_per_family(&n.pod_cidrs))
                .unwrap_or_default();
        }
        if self.service_cidrs_from_api {
            config.service_cidrs = store.service_cidrs();
        }
        config.local_addresses = engine.config().local_addresses.clone();
        if read_addresses {
            config = with_local_addresses(config);
        }
        engine.set_config(config);
    }
}

/// Starts the healthz and metrics servers; a port that cannot be bound is
/// logged and tried again until it can be, as kube-proxy does by default.
fn start_servers(
    settings: &Settings,
    flags: &[(String, String)],
    health: &Arc<ProxyHealth>,
    metrics: &Arc<Metrics>,
) {
    if let Some(addr) = settings.healthz_bind_address {
        let (h, m) = (health.clone(), metrics.clone());
        crate::node::http::serve_when_free("healthz (/healthz, /livez)", addr, move |path| {
            let answer = h.respond(path);
            m.health_answered(path, answer.status);
            answer
        });
    }
    if let Some(addr) = settings.metrics_bind_address {
        let server = MetricsServer::new(settings, flags, metrics.clone());
        crate::node::http::serve_when_free(
            "metrics (/metrics, /healthz, /proxyMode, /configz, /flagz, /statusz)",
            addr,
            move |path| server.respond(path),
        );
    }
}

/// Sends `Terminate` on SIGTERM or SIGINT.
fn watch_signals(tx: mpsc::SyncSender<Event>) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("signal handling: {e}"))?;
    let (mut term, mut int) = runtime
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
            ))
        })
        .map_err(|e| format!("signal handling: {e}"))?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            let _ = tx.send(Event::Terminate(name));
        })
    });
    Ok(())
}

/// Events that may wait for the daemon: a few pages' worth of objects.
const EVENTS_QUEUED: usize = 1024;

/// How often the manifests are looked at. A change is read once it has stood
/// still for one period, so a file being written in pieces is not read half-way
/// (and if it is, the store keeps its last good objects).
const MANIFEST_POLL: Duration = Duration::from_millis(250);

/// How often the kernel is verified against the whole state when nothing
/// asked for a full sync, while the drift monitor watches our tables (drift is
/// then seen as it happens), as kube-proxy's nftables mode forces a full sync
/// once an hour (`proxyutil.FullSyncPeriod`). The verification reads and plans
/// on a thread of its own, beside the syncs (`nft::verifier`): at 100k
/// Services that takes ~3 s, which every change waited out when it was a full
/// sync. IPVS has no notifications: in that mode, and without a monitor, a
/// full sync every `--sync-period` verifies.
const MONITORED_FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// A verification whose every round is unsettled (its reads disturbed by
/// commits without pause) ends in a full sync after this many rounds, so that
/// it still ends within its period.
const VERIFICATION_ROUNDS: u32 = 8;

/// How soon a verification in progress is asked for its answer.
const VERIFICATION_POLL: Duration = Duration::from_millis(100);

fn watch_manifests(paths: Vec<PathBuf>, tx: mpsc::SyncSender<Event>) {
    std::thread::spawn(move || {
        let mut read = manifests_stamp(&paths);
        let mut last = read.clone();
        loop {
            std::thread::sleep(MANIFEST_POLL);
            let now = manifests_stamp(&paths);
            if now == last && now != read {
                read = now.clone();
                if tx.send(Event::ManifestsChanged).is_err() {
                    return;
                }
            }
            last = now;
        }
    });
}

/// Starts the drift monitor; `watching` says whether it runs.
fn watch_drift(tx: mpsc::SyncSender<Event>, watching: Arc<AtomicBool>) {
    match Monitor::open().and_then(|m| m.away_during_own_commits().map(|()| m)) {
        Ok(mut monitor) => {
            watching.store(true, Ordering::Relaxed);
            std::thread::spawn(move || {
                let own = crate::netlink::nftables::committed_by_this_process;
                let stopped = loop {
                    match monitor.next_foreign_change(TableId::is_ours, own) {
                        Ok(change) => {
                            if tx.send(Event::Drift(change)).is_err() {
                                return;
                            }
                        }
                        Err(e) => break e,
                    }
                };
                watching.store(false, Ordering::Relaxed);
                tracing::error!(
                    "nf_tables notifications: {stopped}; no longer watched, drift is repaired every sync period"
                );
                let _ = tx.send(Event::Drift(Change::Lost));
            });
        }
        Err(e) => tracing::warn!(
            "not watching nf_tables notifications ({e}); drift is repaired every sync period"
        ),
    }
}

/// Re-reads the manifests into the store, as complete lists of each kind. A file
/// that fails keeps its last good objects; each new failure is logged once, with
/// the file and line, and counted.
fn load_manifests(
    manifests: &mut ManifestStore,
    store: &mut ClusterStore,
    engine: &mut Engine,
    metrics: &Metrics,
) {
    let reloaded = manifests.reload();
    for (e, kept) in &reloaded.new_errors {
        if *kept {
            tracing::error!("manifest {e}; keeping the objects it had when it last read well");
        } else {
            tracing::error!("manifest {e}; skipped until it reads well");
        }
    }
    for f in &reloaded.recovered {
        tracing::info!("manifest {} reads well again", f.display());
    }
    metrics.manifests_read(reloaded.new_errors.len(), manifests.errors().count());
    if !manifests.ready() {
        return;
    }
    log_rejected(&reloaded.loaded.rejected);
    metrics.rejected(&reloaded.loaded.rejected);
    for update in files::updates(reloaded.loaded.objects) {
        absorb(update, store, engine, metrics);
    }
}

/// Applies one update to the store and hands the engine what changed.
fn absorb(update: Update, store: &mut ClusterStore, engine: &mut Engine, metrics: &Metrics) {
    let outcome = store.apply(update);
    log_rejected(&outcome.rejected);
    metrics.rejected(&outcome.rejected);
    log_skipped_values(&outcome.skipped_values);
    metrics.skipped_values(&outcome.skipped_values);
    metrics.changes_seen(outcome.service_changes, outcome.endpoint_changes);
    let changes = store.take_changes();
    engine.mark(changes.services);
    if changes.node {
        engine.request_full_sync();
    }
}

/// Settles `oomScoreAdj` for this process, as kube-proxy does (it should be the
/// last thing the kernel kills: the node's Services depend on it).
fn set_oom_score_adj(adj: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        tracing::warn!("setting oom_score_adj to {adj}: {e}");
    }
}

/// Whether an earlier run's tables are in the kernel, serving (a restart).
fn inherited_ruleset() -> bool {
    let found = crate::netlink::NftSocket::open()
        .map_err(|e| e.to_string())
        .and_then(|mut sock| {
            crate::nft::kernel::holds_our_tables(&mut sock).map_err(|e| e.to_string())
        });
    found.unwrap_or_else(|e| {
        tracing::warn!("could not tell whether our tables are in place: {e}");
        false
    })
}

/// `kube-nft run`. `flags`: every flag of `run` with its value, for `/flagz`.
pub fn run(settings: Settings, flags: &[(String, String)], once: bool) -> Result<(), String> {
    settings.node.validate().map_err(|e| e.to_string())?;
    if let Some(adj) = settings.oom_score_adj {
        set_oom_score_adj(adj);
    }
    // Before anything listens, as kube-proxy: a node that cannot hold the
    // connections asked for should not look healthy.
    crate::node::conntrack_sysctls::settle(&settings.conntrack)?;
    let mut engine = crate::assemble::engine(settings.node.clone()).map_err(|e| e.to_string())?;
    let mut store = ClusterStore::new(&settings.node_name);
    let mut node_settings = NodeSettings {
        base: settings.node.clone(),
        detect_local: settings.detect_local,
        service_cidrs_from_api: settings.service_cidrs_from_api,
    };
    node_settings.apply(&mut engine, &store, true);
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(ProxyHealth::new(2 * settings.sync_period));
    health.queued();
    if inherited_ruleset() {
        tracing::info!(
            "our tables are in place from an earlier run and serve until the first sync: /healthz answers 200"
        );
        health.inherit_ruleset();
    }
    metrics.queued(SystemTime::now());
    let from_api = matches!(settings.source, Source::Api(_));

    // Bounded: the API source reads a list faster than the store takes it in,
    // and a list of 100k slices queued whole would be most of the peak RSS. A
    // full queue stops the reading, and TCP stops the API server.
    let (tx, rx) = mpsc::sync_channel::<Event>(EVENTS_QUEUED);
    let mut manifests = None;
    match &settings.source {
        Source::Manifests(paths) => {
            let mut m = ManifestStore::new(paths);
            load_manifests(&mut m, &mut store, &mut engine, &metrics);
            if once && !m.ready() {
                let errors: Vec<String> = m.errors().map(|e| e.to_string()).collect();
                return Err(format!(
                    "nothing programmed: manifest {}",
                    errors.join("; manifest ")
                ));
            }
            if !m.ready() {
                tracing::error!("nothing is programmed until every manifest file reads well");
            }
            manifests = Some(m);
            if !once {
                watch_manifests(paths.clone(), tx.clone());
            }
        }
        Source::Api(conn) => {
            kubernetes::spawn(&conn.connection(), &settings.node_name, tx.clone())?;
            tracing::info!("watching the API server as node {:?}", settings.node_name);
        }
    }
    node_settings.apply(&mut engine, &store, false);
    watch_signals(tx.clone())?;
    let watching = Arc::new(AtomicBool::new(false));
    if !once {
        watch_drift(tx.clone(), watching.clone());
        start_servers(&settings, flags, &health, &metrics);
    }
    let links_tx = tx.clone();
    drop(tx);
    // Before the first sync: a kernel that cannot hold our rules stops the
    // start here, with what it lacks, rather than refusing every sync. While
    // the lists come in, and after the health server is up over an earlier
    // run's rules, so that it costs the start nothing.
    let mut sock = crate::netlink::NftSocket::open().map_err(|e| format!("nf_tables: {e}"))?;
    let probing = std::time::Instant::now();
    crate::node::kernel_probe::probe(&mut sock).map_err(|e| e.to_string())?;
    tracing::info!(
        "this kernel takes every shape kube-nft writes (probed in {:.1} ms)",
        probing.elapsed().as_secs_f64() * 1000.0
    );
    let asked = node_settings.base.fast_path;
    settle_fast_path(&mut sock, &mut node_settings)?;
    if node_settings.base.fast_path != asked {
        node_settings.apply(&mut engine, &store, false);
    }
    drop(sock);
    let mut fast_path = FastPathState::default();
    if !once && node_settings.base.fast_path != FastPath::Off {
        let tx = links_tx.clone();
        crate::netlink::route::watch_links(move || tx.send(Event::Links).is_ok())
            .map_err(|e| format!("watching the interfaces: {e}"))?;
    }
    drop(links_tx);

    // Taken after the first sync (nothing is programmed before), and held for
    // the life of the process: the kernel deletes its tables when their socket
    // closes.
    let mut nat_hold: Option<NatHold> = None;
    let service_health = (!once).then(HealthServers::start);
    let mut flows = StaleFlowCleaner::default();
    let mut last_sync: Option<Instant> = None;
    // Every sync period the node's addresses are read again, and a full sync is
    // asked for if one is due (`MONITORED_FULL_SYNC_PERIOD`). The tick moves on
    // when it passes, not only when a full sync is done: until every kind is
    // listed none can be, and a deadline left in the past would turn the wait
    // below into a busy loop.
    let full_period = || {
        if watching.load(Ordering::Relaxed) && !settings.node.mode.is_ipvs() {
            (settings.verification_period)
                .unwrap_or(MONITORED_FULL_SYNC_PERIOD)
                .max(settings.sync_period)
        } else {
            settings.sync_period
        }
    };
    let mut next_tick = Instant::now() + settings.sync_period;
    // When a full sync was last asked for or done: the next is due a
    // `full_period()` later (which shrinks if the monitor stops).
    let mut full_asked = Instant::now();
    // Due when the period has passed: begun once nothing waits to be synced,
    // so that its snapshot is what the kernel was last given
    // (`nft::verifier`). Its rounds so far.
    let mut verification_due = false;
    let mut verification_rounds = 0;
    let mut retry_at: Option<Instant> = None;
    let mut backoff = Duration::from_secs(1);
    let mut was_ready = false;
    // Said once per different reason: NodePorts with no address to serve them on.
    let mut unserved: Option<String> = None;
    // Connections may have met no rules of ours: before the first sync, and
    // when our tables changed outside kube-nft (stale_flows::unnated).
    let mut rules_had_gap = true;
    loop {
        // Before the list, no Node object says nothing: over an earlier run's
        // rules, /healthz must not turn 503 while the API server is slow or away.
        if store.node_listed() {
            health.set_node_eligible(node_eligible(store.state().node.as_ref(), from_api));
        }
        let ready = store.synced() && manifests.as_ref().is_none_or(ManifestStore::ready);
        if ready && !was_ready {
            tracing::info!(
                services = store.state().services.len(),
                peak_rss_kib = crate::node::metrics::peak_rss_kib(),
                "every kind listed; programming"
            );
            was_ready = true;
        }
        let now = Instant::now();
        if now >= next_tick {
            node_settings.apply(&mut engine, &store, true);
            if let Some(hold) = &mut nat_hold {
                hold.refresh();
            }
            if now >= full_asked + full_period() {
                verification_due = true;
                full_asked = now;
            }
            next_tick = now + settings.sync_period;
        }
        if let Some(answer) = engine.verification() {
            let drift = matches!(answer, Verification::Differs(_));
            verification_due |= verified(answer, &mut verification_rounds, &mut engine, &metrics);
            // As after a drift event: flows may have met none of our rules.
            rules_had_gap |= drift;
        }
        if verification_due && ready && !engine.pending() && !engine.verifying() {
            verification_due = false;
            if !engine.begin_verification(store.state().snapshot()) {
                verification_rounds = 0;
            }
        }
        let earliest = last_sync
            .map_or(now, |t| t + settings.min_sync_period)
            .max(retry_at.unwrap_or(now));
        if ready && engine.pending() && now >= earliest {
            last_sync = Some(now);
            let result = engine.sync(store.state());
            if let Some(s) = &service_health {
                s.update(healthcheck::wanted(store.state()), result.is_ok());
            }
            match result {
                Ok(r) => {
                    let done = SystemTime::now();
                    if r.kind == SyncKind::Full {
                        full_asked = now;
                    }
                    log_sync(&r);
                    let now_unserved = engine.config().nodeports_unserved(store.state());
                    if now_unserved != unserved {
                        if let Some(why) = &now_unserved {
                            tracing::warn!("{why}");
                        }
                        unserved = now_unserved;
                    }
                    health.updated();
                    metrics.sync_succeeded(&r, store.state(), done);
                    metrics.programmed(&programmed_triggers(&mut store, &r), done);
                    if !once && nat_hold.is_none() {
                        match NatHold::take() {
                            Ok(hold) => nat_hold = Some(hold),
                            Err(e) => tracing::warn!("nf_tables: the NAT hold: {e}"),
                        }
                    }
                    let after_gap = rules_had_gap && r.kind == SyncKind::Full;
                    rules_had_gap &= !after_gap;
                    clean_flows(&mut flows, store.state(), &engine, &r, after_gap, &metrics);
                    let wanted = fast_path::wanted(store.state(), engine.config());
                    fast_path.look(wanted, r.kind == SyncKind::Full);
                    retry_at = None;
                    backoff = Duration::from_secs(1);
                    if once {
                        tracing::info!(
                            peak_rss_kib = crate::node::metrics::peak_rss_kib(),
                            "synced once; exiting"
                        );
                        return Ok(());
                    }
                }
                Err(e) => {
                    if once {
                        return Err(e.to_string());
                    }
                    metrics.sync_failed();
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
        let mut wake = if ready && engine.pending() {
            earliest.min(next_tick)
        } else {
            next_tick
        };
        if engine.verifying() {
            wake = wake.min(now + VERIFICATION_POLL);
        }
        let event = match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err("event sources stopped".into()),
        };
        match event {
            Event::ManifestsChanged => {
                if let Some(m) = manifests.as_mut() {
                    load_manifests(m, &mut store, &mut engine, &metrics);
                    node_settings.apply(&mut engine, &store, false);
                }
            }
            Event::Api(update) => {
                let reconfigures = matches!(update, Update::Node(_) | Update::ServiceCidr(_));
                absorb(update, &mut store, &mut engine, &metrics);
                if reconfigures {
                    node_settings.apply(&mut engine, &store, false);
                }
            }
            Event::Drift(change) => {
                tracing::warn!("our table was changed outside kube-nft ({change:?}); repairing");
                metrics.drift_seen(change);
                engine.request_full_sync();
                rules_had_gap = true;
                // A sync refused while someone else changed our tables (a
                // flush between its read-back and its commit) may pass now:
                // the repair does not wait out the backoff.
                retry_at = None;
            }
            Event::Links => {
                if let Some(wanted) = fast_path.wanted.filter(|w| w.contains(&true)) {
                    fast_path.look(wanted, true);
                }
            }
            Event::Terminate(signal) => {
                tracing::info!("{signal}: stopping; the rules stay in place and keep serving");
                return Ok(());
            }
        }
        if engine.pending() {
            health.queued();
            metrics.queued(SystemTime::now());
        }
    }
}

/// Turns the fast path off where it cannot be had: with the IPVS backend, or
/// (the kernel is asked unless `--fast-path off`) without flowtables, where
/// `long-lived` turns off (annotated Services keep the normal path) and
/// `all` stops the start.
fn settle_fast_path(
    sock: &mut crate::netlink::NftSocket,
    settings: &mut NodeSettings,
) -> Result<(), String> {
    let asked = settings.base.fast_path;
    if asked == FastPath::Off || settings.base.mode.is_ipvs() {
        settings.base.fast_path = FastPath::Off;
        return Ok(());
    }
    if fast_path::kernel_has_it(sock)? {
        return Ok(());
    }
    let why = "this kernel has no flowtables (CONFIG_NF_FLOW_TABLE, CONFIG_NFT_FLOW_OFFLOAD)";
    if asked == FastPath::All {
        return Err(format!("--fast-path all: {why}"));
    }
    tracing::warn!(
        "{why}: Services annotated {TRAFFIC_HINT_ANNOTATION}=LongLived keep the normal path"
    );
    settings.base.fast_path = FastPath::Off;
    Ok(())
}

/// The fast path's tables as last looked at (`fast_path::reconcile`).
#[derive(Default)]
struct FastPathState {
    /// Which families' were wanted at the last look; `None` before one.
    wanted: Option<[bool; 2]>,
    /// The last look failed: the next sync looks again.
    failed: bool,
}

impl FastPathState {
    /// Looks when `wanted` changed, after a failure, or when `again` (a full
    /// sync, an interface that changed); a failure is logged and retried.
    fn look(&mut self, wanted: [bool; 2], again: bool) {
        if !again && !self.failed && self.wanted == Some(wanted) {
            return;
        }
        let looked = crate::netlink::NftSocket::open()
            .map_err(|e| format!("nf_tables: {e}"))
            .and_then(|mut sock| fast_path::reconcile(&mut sock, wanted));
        match looked {
            Ok(done) => {
                if done != fast_path::Reconciled::default() {
                    tracing::info!(?done, ?wanted, "the fast path");
                }
                self.failed = false;
            }
            Err(e) => {
                tracing::warn!("{e}; looked at again after the next sync");
                self.failed = true;
            }
        }
        self.wanted = Some(wanted);
    }
}

/// Acts on a verification's answer: a difference, a kernel that could not be
/// read, or rounds that never settle ask for a full sync; true if a next round
/// is due.
fn verified(
    answer: Verification,
    rounds: &mut u32,
    engine: &mut Engine,
    metrics: &Metrics,
) -> bool {
    *rounds += 1;
    match answer {
        Verification::Matches => {
            tracing::info!(
                rounds = *rounds,
                "verified: our tables hold what was last synced"
            );
        }
        Verification::Unsettled if *rounds < VERIFICATION_ROUNDS => return true,
        Verification::Unsettled => {
            tracing::info!(
                rounds = *rounds,
                "verification: no round was judged whole; a full sync verifies instead"
            );
            engine.request_full_sync();
        }
        Verification::Differs(tables) => {
            tracing::warn!(
                "verification: {tables} changed outside kube-nft, unannounced; repairing"
            );
            metrics.drift_found_by_verification();
            engine.request_full_sync();
        }
        Verification::Failed(e) => {
            tracing::warn!("verification: {e}; a full sync verifies instead");
            engine.request_full_sync();
        }
    }
    *rounds = 0;
    false
}

/// The trigger times of the changes a sync programmed, with their family.
fn programmed_triggers(store: &mut ClusterStore, r: &SyncReport) -> Vec<(Family, SystemTime)> {
    match r.kind {
        SyncKind::Full => store.take_all_triggers(),
        SyncKind::Partial => store.take_triggers(&r.recomputed),
    }
}

/// The conntrack cleanup after a sync (`StaleFlowCleaner::after_sync`).
/// `after_gap`: the sync wrote our rules where they may have been missing, so
/// the flows that met none of them go too, so that their next packet is
/// balanced. IPVS serves Service addresses without our table, so it leaves no
/// such gap.
fn clean_flows(
    cleaner: &mut StaleFlowCleaner,
    state: &ClusterState,
    engine: &Engine,
    sync: &SyncReport,
    after_gap: bool,
    metrics: &Metrics,
) {
    let after_gap = after_gap && engine.config().mode == ProxyMode::Nftables;
    match cleaner.after_sync(state, engine.config(), sync, after_gap) {
        Ok(None) => {}
        Ok(Some(cleaned)) => {
            metrics.conntrack_reconciled(cleaned.took, &cleaned.deleted);
            tracing::debug!(
                read = cleaned.read,
                deleted = cleaned.total(),
                took_ms = cleaned.took.as_secs_f64() * 1000.0,
                "conntrack cleaned"
            );
            let stale = cleaned.total() - cleaned.unnated;
            if stale > 0 {
                tracing::info!("deleted {stale} stale UDP conntrack entries");
            }
            if cleaned.unnated > 0 {
                tracing::info!(
                    "deleted {} conntrack entries to Service addresses that met none of our rules",
                    cleaned.unnated
                );
            }
        }
        Err(e) => tracing::warn!("cleaning conntrack entries: {e}"),
    }
}

fn log_sync(r: &SyncReport) {
    let ms = r.duration.as_secs_f64() * 1000.0;
    // Each dataplane's own counts, as `ipvs_commands=2`.
    let counts: String = r
        .written
        .iter()
        .flat_map(|(name, w)| {
            w.counts
                .iter()
                .map(move |(k, v)| format!(" {name}_{k}={v}"))
        })
        .collect();
    tracing::info!(
        kind = ?r.kind,
        services = r.services,
        messages = r.committed.messages,
        bytes = r.committed.bytes,
        "synced in {ms:.1} ms{counts}"
    );
}
