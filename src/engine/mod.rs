//! The engine: a thin scheduler over the dataplanes of the proxy mode. It knows
//! which Services changed since the last sync and whether the next sync must be
//! a full one; each dataplane decides what to write.
//!
//! - A **full sync** runs at start (so a restart over a correct kernel writes
//!   nothing), after any failed sync, when the node or its settings changed,
//!   when someone else changed our tables, and periodically where a dataplane
//!   cannot verify beside the syncs.
//! - A **partial sync** brings only the changed Services to their desired state;
//!   its cost follows the change, not the cluster.
//! - A **verification** checks, beside the syncs, that the kernel holds what a
//!   snapshot of the model asks for; what it finds different, a full sync
//!   repairs.
//!
//! Dataplanes run in order, full after full and partial after partial. If one
//! fails the kernel keeps what it had there, and the next sync is full.
//!
//! The engine does not own the model: the daemon's source store does, and
//! `Proxy` pairs a model edited in place with an engine for the one-shot
//! commands, the lab, the benchmarks and tests.
//!
//! `dataplane` is the seam every dataplane implements; the engine names none of
//! them (`assemble`, above both, does).

pub mod dataplane;

use crate::core::model::{ClusterState, ServiceKey, Snapshot};
use crate::core::node_config::NodeConfig;
use crate::netlink::Committed;
use dataplane::{Dataplane, SyncError, SyncKind, Verification, Written};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    pub kind: SyncKind,
    /// Services recomputed (all of them for a full sync).
    pub services: usize,
    /// Which ones, after a partial sync (a full one recomputes every Service).
    pub recomputed: Vec<ServiceKey>,
    /// The nf_tables transactions of every dataplane, added up.
    pub committed: Committed,
    /// Each dataplane's share, in sync order.
    pub written: Vec<(&'static str, Written)>,
    pub duration: Duration,
}

pub struct Engine {
    config: NodeConfig,
    dataplanes: Vec<Box<dyn Dataplane>>,
    dirty: BTreeSet<ServiceKey>,
    full_sync_needed: bool,
    /// Each dataplane's answer to the verification in progress, as it comes.
    verifying: Option<Vec<Option<Verification>>>,
}

impl Engine {
    /// An engine over `dataplanes`, run in that order (`assemble` opens those of
    /// a proxy mode). The first sync is a full one: it adopts whatever correct
    /// state the kernel already has.
    pub fn new(config: NodeConfig, dataplanes: Vec<Box<dyn Dataplane>>) -> Engine {
        Engine {
            config,
            dataplanes,
            dirty: BTreeSet::new(),
            full_sync_needed: true,
            verifying: None,
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Changes the node settings (for example its addresses); a change makes the
    /// next sync a full one.
    pub fn set_config(&mut self, config: NodeConfig) {
        if config != self.config {
            self.config = config;
            self.full_sync_needed = true;
        }
    }

    /// These Services changed: the next sync recomputes them.
    /// While a full sync is due they need no record: it recomputes them all
    /// (at start, the lists mark every Service, 9 MiB of keys at 100k).
    pub fn mark(&mut self, changed: impl IntoIterator<Item = ServiceKey>) {
        if !self.full_sync_needed {
            self.dirty.extend(changed);
        }
    }

    /// Makes the next sync a full readback and diff (drift, resync period, a
    /// changed node).
    pub fn request_full_sync(&mut self) {
        self.full_sync_needed = true;
        self.dirty.clear();
    }

    pub fn pending(&self) -> bool {
        self.full_sync_needed || !self.dirty.is_empty()
    }

    /// Brings the kernel to the desired state of `state`: a full sync when one
    /// is due, else a partial one over the changed Services.
    pub fn sync(&mut self, state: &ClusterState) -> Result<SyncReport, SyncError> {
        let started = Instant::now();
        let kind = if self.full_sync_needed {
            SyncKind::Full
        } else {
            SyncKind::Partial
        };
        let recomputed: Vec<ServiceKey> = match kind {
            SyncKind::Full => Vec::new(),
            SyncKind::Partial => self.dirty.iter().cloned().collect(),
        };
        if kind == SyncKind::Partial {
            let keys: Vec<String> = recomputed.iter().take(8).map(|k| k.to_string()).collect();
            tracing::debug!(
                "partial sync of {} Service(s): {}",
                recomputed.len(),
                keys.join(", ")
            );
        }
        let mut written = Vec::new();
        for d in &mut self.dataplanes {
            let before = tracing::enabled!(tracing::Level::DEBUG).then(ThreadTime::now);
            let result = match kind {
                SyncKind::Full => d.full_sync(state, &self.config),
                SyncKind::Partial => d.partial_sync(state, &self.config, &recomputed),
            };
            match result {
                Ok(w) => {
                    let (on_cpu, runnable) = before.map(ThreadTime::since).unwrap_or_default();
                    tracing::debug!(
                        dataplane = d.name(),
                        kind = ?kind,
                        messages = w.committed.messages,
                        bytes = w.committed.bytes,
                        on_cpu_ms = on_cpu.as_secs_f64() * 1000.0,
                        runnable_ms = runnable.as_secs_f64() * 1000.0,
                        "dataplane synced"
                    );
                    written.push((d.name(), w))
                }
                Err(e) => {
                    self.full_sync_needed = true;
                    return Err(e);
                }
            }
        }
        self.dirty.clear();
        if kind == SyncKind::Full {
            // It read everything back: a verification in progress is moot.
            self.verifying = None;
        }
        self.full_sync_needed = false;
        let mut committed = Committed::default();
        for (_, w) in &written {
            committed += w.committed;
        }
        Ok(SyncReport {
            kind,
            services: match kind {
                SyncKind::Full => state.services.len(),
                SyncKind::Partial => recomputed.len(),
            },
            recomputed,
            committed,
            written,
            duration: started.elapsed(),
        })
    }

    /// Begins the periodic verification off the path of changes, against
    /// `snapshot` (the state as last synced: nothing pending). Where a
    /// dataplane cannot, the next sync is a full one instead, and false.
    pub fn begin_verification(&mut self, snapshot: Snapshot) -> bool {
        let snapshot = Arc::new(snapshot);
        let mut all = true;
        for d in &mut self.dataplanes {
            all &= d.begin_verification(snapshot.clone(), &self.config);
        }
        if all {
            self.verifying = Some(vec![None; self.dataplanes.len()]);
        } else {
            self.full_sync_needed = true;
        }
        all
    }

    /// Whether a verification is in progress.
    pub fn verifying(&self) -> bool {
        self.verifying.is_some()
    }

    /// The verification's answer, once every dataplane has given its own:
    /// the first that is not `Matches`, else `Matches`.
    pub fn verification(&mut self) -> Option<Verification> {
        let answers = self.verifying.as_mut()?;
        for (d, a) in self.dataplanes.iter_mut().zip(answers.iter_mut()) {
            if a.is_none() {
                *a = d.verification();
            }
        }
        if answers.iter().any(Option::is_none) {
            return None;
        }
        let mut answers = self.verifying.take()?.into_iter().flatten();
        Some(
            answers
                .find(|a| *a != Verification::Matches)
                .unwrap_or(Verification::Matches),
        )
    }

    /// Whether every dataplane's kernel state is exactly what `state` asks for.
    pub fn verify(&mut self, state: &ClusterState) -> Result<bool, SyncError> {
        for d in &mut self.dataplanes {
            if !d.verify(state, &self.config)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// This thread's time on a CPU (its CPU clock), and its time runnable but
/// waiting for one (the scheduler's `/proc/thread-self/schedstat`; zero where
/// it is absent): a sync that is slow on a busy node shows whether it worked
/// or queued.
#[derive(Clone, Copy)]
struct ThreadTime {
    on_cpu_ns: u64,
    runnable_ns: u64,
}

impl ThreadTime {
    fn now() -> ThreadTime {
        // The CPU clock, not schedstat's first field: that one lags by up to
        // a scheduler tick for the running thread.
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        let read = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        ThreadTime {
            on_cpu_ns: cpu.tv_sec as u64 * 1_000_000_000 + cpu.tv_nsec as u64,
            runnable_ns: read
                .split_whitespace()
                .nth(1)
                .and_then(|f| f.parse().ok())
                .unwrap_or(0),
        }
    }

    /// On a CPU and runnable since `earlier`.
    fn since(earlier: ThreadTime) -> (Duration, Duration) {
        let now = ThreadTime::now();
        (
            Duration::from_nanos(now.on_cpu_ns.saturating_sub(earlier.on_cpu_ns)),
            Duration::from_nanos(now.runnable_ns.saturating_sub(earlier.runnable_ns)),
        )
    }
}

/// A model held and edited in place, with the engine that programs it.
pub struct Proxy {
    state: ClusterState,
    engine: Engine,
}

impl Proxy {
    pub fn new(engine: Engine) -> Proxy {
        Proxy {
            state: ClusterState::default(),
            engine,
        }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Changes the model through `change`, marking the Service `key` for the next sync.
    pub fn update(&mut self, key: &ServiceKey, change: impl FnOnce(&mut ClusterState)) {
        change(&mut self.state);
        self.engine.mark([key.clone()]);
    }

    /// Replaces the model; only Services whose Service or EndpointSlices differ
    /// are marked, and a changed node makes the next sync full.
    pub fn replace_state(&mut self, state: ClusterState) {
        if self.state.node != state.node {
            self.engine.request_full_sync();
        }
        self.engine.mark(self.state.changed_services(&state));
        self.state = state;
    }

    pub fn request_full_sync(&mut self) {
        self.engine.request_full_sync();
    }

    pub fn sync(&mut self) -> Result<SyncReport, SyncError> {
        self.engine.sync(&self.state)
    }

    pub fn verify(&mut self) -> Result<bool, SyncError> {
        self.engine.verify(&self.state)
    }

    /// `Engine::begin_verification` against the model as it is.
    pub fn begin_verification(&mut self) -> bool {
        self.engine.begin_verification(self.state.snapshot())
    }

    pub fn verification(&mut self) -> Option<Verification> {
        self.engine.verification()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::synthetic::{node_config, service_key};

    /// A dataplane that records what it was asked, and refuses while told to.
    #[derive(Default)]
    struct Recorder {
        refuse: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Dataplane for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn full_sync(&mut self, _: &ClusterState, _: &NodeConfig) -> Result<Written, SyncError> {
            self.answer()
        }
        fn partial_sync(
            &mut self,
            _: &ClusterState,
            _: &NodeConfig,
            _: &[ServiceKey],
        ) -> Result<Written, SyncError> {
            self.answer()
        }
        fn verify(&mut self, _: &ClusterState, _: &NodeConfig) -> Result<bool, SyncError> {
            Ok(true)
        }
    }

    impl Recorder {
        fn answer(&self) -> Result<Written, SyncError> {
            if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(SyncError::new("recorder", std::io::Error::other("refused")));
            }
            Ok(Written::default())
        }
    }

    #[test]
    fn changes_marked_while_a_full_sync_is_due_are_not_kept_and_the_next_sync_is_full() {
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let recorder = Recorder {
            refuse: refuse.clone(),
        };
        let mut engine = Engine::new(node_config(), vec![Box::new(recorder)]);
        let state = ClusterState::default();
        engine.mark([service_key(0), service_key(1)]);
        assert!(engine.dirty.is_empty());
        assert!(engine.pending());
        assert_eq!(engine.sync(&state).unwrap().kind, SyncKind::Full);

        engine.mark([service_key(2)]);
        let r = engine.sync(&state).unwrap();
        assert_eq!(
            (r.kind, r.recomputed),
            (SyncKind::Partial, vec![service_key(2)])
        );

        // A full sync requested drops what was marked before it.
        engine.mark([service_key(3)]);
        engine.request_full_sync();
        assert!(engine.dirty.is_empty());
        assert_eq!(engine.sync(&state).unwrap().kind, SyncKind::Full);

        // A refused partial sync makes the next one full, whatever comes meanwhile.
        engine.mark([service_key(4)]);
        refuse.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(engine.sync(&state).is_err());
        engine.mark([service_key(5)]);
        refuse.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(engine.sync(&state).unwrap().kind, SyncKind::Full);
        assert!(!engine.pending());
    }
}
