//! A dataplane is one way of programming the kernel from the model: nftables
//! (`nft`) or IPVS (`ipvs`). The engine runs the dataplanes of the proxy mode in
//! order, each through the same two syncs. Adding a dataplane means writing its
//! module and naming it in `assemble::dataplanes`.

use crate::core::model::{ClusterState, ServiceKey, Snapshot};
use crate::core::node_config::NodeConfig;
use crate::netlink::Committed;
use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Readback of everything we own and diff against the whole desired state.
    Full,
    /// Only the Services that changed.
    Partial,
}

/// What one dataplane wrote in one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Its nf_tables transaction (none for a dataplane that writes none).
    pub committed: Committed,
    /// Other counts for the sync's log line, named without the dataplane's
    /// prefix (IPVS: `commands`, `bytes`, `addresses`).
    pub counts: Vec<(&'static str, usize)>,
}

/// A sync that failed in one dataplane; the kernel keeps what it had, and the
/// next sync is a full one.
#[derive(Debug)]
pub struct SyncError {
    pub dataplane: &'static str,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for SyncError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

impl SyncError {
    pub fn new(dataplane: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        SyncError {
            dataplane,
            source: Box::new(e),
        }
    }
}

pub trait Dataplane {
    /// Short and lowercase: it names the dataplane in logs and errors.
    fn name(&self) -> &'static str;

    /// Reads back what this dataplane owns in the kernel and brings all of it to
    /// the desired state. A kernel already in that state gets no write.
    fn full_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
    ) -> Result<Written, SyncError>;

    /// Brings only the Services `changed` to their desired state, trusting what
    /// the last successful sync left.
    fn partial_sync(
        &mut self,
        state: &ClusterState,
        config: &NodeConfig,
        changed: &[ServiceKey],
    ) -> Result<Written, SyncError>;

    /// Whether the kernel holds exactly what this dataplane wants (full readback).
    fn verify(&mut self, state: &ClusterState, config: &NodeConfig) -> Result<bool, SyncError>;

    /// Begins checking, off the path of changes, that the kernel holds what
    /// `snapshot` asks for; `verification` has the answer once done. False
    /// where the dataplane cannot: a full sync verifies it.
    fn begin_verification(&mut self, _snapshot: Arc<Snapshot>, _config: &NodeConfig) -> bool {
        false
    }

    /// The answer of the verification begun, once there is one.
    fn verification(&mut self) -> Option<Verification> {
        None
    }
}

/// What a verification off the path of changes found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// The kernel holds what the snapshot asked for.
    Matches,
    /// It does not, where said: a full sync repairs it.
    Differs(String),
    /// Not judged whole (a read disturbed by a commit, or drift to confirm):
    /// begin again, with a newer snapshot.
    Unsettled,
    /// The kernel could not be read.
    Failed(String),
}
