//! The nftables dataplane: reads our tables back, has the planner plan the
//! difference and commits it as one transaction. All decisions are the
//! planner's; this only does the I/O around them.

use crate::core::model::{ClusterState, ServiceKey, Snapshot};
use crate::core::node_config::NodeConfig;
use crate::engine::dataplane::{Dataplane, SyncError, Verification, Written};
use crate::netlink::{Committed, NftError, NftSocket};
use crate::nft::kernel::{kernel_matches, read_views, NftKernel};
use crate::nft::plan::Plan;
use crate::nft::planner::{desired_as_placed, plan_full, Footprints, Reread};
use crate::nft::service_tables;
use crate::nft::verifier::Verifier;
use crate::ruleset::Ruleset;
use std::sync::Arc;

pub struct NftDataplane<K = NftSocket> {
    kernel: K,
    footprints: Footprints,
    verifier: Verifier,
    /// The count of Service tables the last full sync programmed.
    service_tables: Option<u16>,
}

impl NftDataplane<NftSocket> {
    /// Opens the nf_tables socket in the current network namespace.
    pub fn open() -> std::io::Result<Self> {
        let sock = NftSocket::open().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("opening the nf_tables netlink socket: {e}"),
            )
        })?;
        Ok(NftDataplane::with_kernel(sock))
    }
}

impl<K: NftKernel> NftDataplane<K> {
    pub fn with_kernel(kernel: K) -> Self {
        NftDataplane {
            kernel,
            footprints: Footprints::default(),
            verifier: Verifier::default(),
            service_tables: None,
        }
    }

    /// `config` with the count of Service tables to program: the config's own
    /// if it sets one, else the count the kernel has while it fits the state
    /// (`service_tables::keep_or_choose`).
    fn with_service_tables(
        config: &NodeConfig,
        found: Option<u16>,
        state: &ClusterState,
    ) -> NodeConfig {
        let count = config
            .service_tables
            .unwrap_or_else(|| service_tables::keep_or_choose(found, state.services.len()));
        NodeConfig {
            service_tables: Some(count),
            ..config.clone()
        }
    }

    /// The desired ruleset with endpoints in the slots the kernel has them in.
    pub fn desired_as_placed(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<Ruleset, NftError> {
        let views = read_views(&mut self.kernel)?;
        let found = self.service_tables.or(service_tables::found_in(&views));
        let config = Self::with_service_tables(config, found, state);
        Ok(desired_as_placed(&views, state, &config))
    }

    /// Commits the plan's transaction, and the one it holds for after it.
    fn commit(&mut self, plan: Plan) -> Result<Committed, NftError> {
        if plan.is_empty() {
            return Ok(Committed::default());
        }
        let (first, then) = plan.into_batches();
        let mut committed = self.kernel.commit(first)?;
        if let Some(then) = then {
            self.kernel.let_packets_pass();
            committed += self.kernel.commit(then)?;
        }
        Ok(committed)
    }

    pub fn full(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<Committed, NftError> {
        let started = std::time::Instant::now();
        let views = read_views(&mut self.kernel)?;
        let read = started.elapsed();
        let found = service_tables::found_in(&views);
        let config = Self::with_service_tables(config, found, state);
        let count = config.service_tables;
        if found.is_some() && found != count {
            tracing::info!(
                from = found,
                to = count,
                services = state.services.len(),
                "regrouping the Services into another count of Service tables, in this full sync"
            );
        }
        let (plan, footprints) = plan_full(&views, state, &config);
        drop(views);
        let planned = started.elapsed();
        let committed = self.commit(plan)?;
        self.verifier.supersede();
        tracing::debug!(
            read_ms = read.as_millis() as u64,
            plan_ms = (planned - read).as_millis() as u64,
            commit_ms = (started.elapsed() - planned).as_millis() as u64,
            "full sync: our tables read back, the plan made, committed"
        );
        self.footprints = footprints;
        self.service_tables = count;
        Ok(committed)
    }

    pub fn partial(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        changed: &[ServiceKey],
    ) -> Result<Committed, NftError> {
        let Some(count) = self.service_tables else {
            return self.full(state, config);
        };
        let config = &Self::with_service_tables(config, Some(count), state);
        if config.service_tables != Some(count) {
            // Grown or shrunk past what the tables are for: only a full sync
            // moves every Service at once.
            return self.full(state, config);
        }
        let mut reread = Reread::default();
        for (table, chain) in self.footprints.chains_of(changed) {
            let rules = self.kernel.read_chain_rules(*table, chain)?;
            reread.chains.insert((*table, chain.clone()), rules);
        }
        // What it changes is kept only for a verification to judge by.
        let plan = match self.verifier.running() {
            true => Plan::recording(),
            false => Plan::default(),
        };
        let (plan, change) = self
            .footprints
            .plan_partial(plan, reread, changed, state, config);
        if let Some((map, held, size)) = &change.overflow {
            tracing::info!(
                map = %map,
                held,
                size,
                "an endpoint map would pass its size: made again with room, in a full sync"
            );
            return self.full(state, config);
        }
        if change.from_memo > 0 {
            tracing::debug!(
                from_memo = change.from_memo,
                "large Services planned from the slices that changed"
            );
        }
        self.verifier.committed(plan.touches().as_ref());
        let committed = self.commit(plan)?;
        self.footprints.apply(change);
        Ok(committed)
    }
}

fn written(r: Result<Committed, NftError>) -> Result<Written, SyncError> {
    r.map(|committed| Written {
        committed,
        counts: Vec::new(),
    })
    .map_err(|e| SyncError::new("nftables", e))
}

impl<K: NftKernel> Dataplane for NftDataplane<K> {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn full_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<Written, SyncError> {
        written(self.full(state, config))
    }

    fn partial_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        changed: &[ServiceKey],
    ) -> Result<Written, SyncError> {
        written(self.partial(state, config, changed))
    }

    fn verify(&mut self, state: &ClusterState, config: &NodeConfig) -> Result<bool, SyncError> {
        let check = |this: &mut Self| -> Result<bool, NftError> {
            let want = this.desired_as_placed(state, config)?;
            kernel_matches(&mut this.kernel, &want)
        };
        check(self).map_err(|e| SyncError::new("nftables", e))
    }

    fn begin_verification(&mut self, snapshot: Arc<Snapshot>, config: &NodeConfig) -> bool {
        let Some(count) = self.service_tables else {
            return false;
        };
        match self.kernel.second_socket() {
            Some(Ok(sock)) => {
                let config = NodeConfig {
                    service_tables: config.service_tables.or(Some(count)),
                    ..config.clone()
                };
                self.verifier.begin(sock, snapshot, config);
                true
            }
            Some(Err(e)) => {
                tracing::warn!("a socket for the verification: {e}; a full sync verifies");
                false
            }
            None => false,
        }
    }

    fn verification(&mut self) -> Option<Verification> {
        self.verifier.answer()
    }
}
