//! The periodic verification, off the path of changes.
//!
//! Once an hour (while the drift monitor watches) the kernel is checked against
//! the whole desired state, for drift the monitor cannot have told: a lost
//! notification, a bug of ours. Done as a full sync on the daemon's thread, it
//! held every change behind its read-back and plan, ~3 s at 100k Services.
//! Here a thread of its own, with a socket of its own, reads our tables and
//! plans against a snapshot of the state, while the daemon goes on syncing.
//!
//! What a round can judge: what no commit of ours changed since the snapshot
//! holds what the snapshot asks for, unless someone else changed it. So each
//! thing the round's plan would change (`plan::Touch`) is drift, unless a
//! commit of ours changed it meanwhile, before it was read or after. Then the
//! next round, with a newer snapshot, judges it again.
//!
//! That holds for a read that no commit interrupted (the ruleset's generation
//! the same before and after it). A dump that a commit interrupts goes on by
//! count, so it may miss or repeat objects anywhere in the family: a round
//! whose read a commit interrupted judges nothing it found, and is
//! unsettled. A commit of someone else's to our tables is the monitor's to
//! tell; its repair is a full sync, which makes the verification moot.

use crate::core::model::Snapshot;
use crate::core::node_config::NodeConfig;
use crate::engine::dataplane::Verification;
use crate::netlink::{NftError, NftSocket};
use crate::nft::kernel::NftKernel;
use crate::nft::plan::{Plan, Touch};
use crate::nft::planner::plan_full_into;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The verification round in progress, if any.
#[derive(Default)]
pub struct Verifier {
    round: Option<Round>,
}

struct Round {
    worker: JoinHandle<Result<Found, NftError>>,
    /// What our commits changed since the snapshot was taken.
    committed: BTreeSet<Touch>,
}

/// What a round's plan would change, and whether its read was whole (no
/// commit during it).
struct Found {
    touches: BTreeSet<Touch>,
    whole: bool,
}

/// How many of the things found changed a warning names.
const NAMED: usize = 3;

impl Verifier {
    /// Starts a round on `sock` (a second socket into the same namespace).
    pub fn begin(&mut self, mut sock: NftSocket, snapshot: Arc<Snapshot>, config: NodeConfig) {
        let worker = std::thread::Builder::new()
            .name("verification".into())
            .spawn(move || {
                let state = snapshot.to_state();
                drop(snapshot);
                let before = sock.generation()?;
                let views = sock.read_views()?;
                let whole = sock.generation()? == before;
                drop(sock);
                let (plan, _) = plan_full_into(Plan::recording(), &views, &state, &config);
                let touches = plan.touches().cloned().unwrap_or_default();
                Ok(Found { touches, whole })
            })
            .expect("spawning the verification thread");
        self.round = Some(Round {
            worker,
            committed: BTreeSet::new(),
        });
    }

    /// Tells the round in progress what a commit of ours changed.
    pub fn committed(&mut self, touches: Option<&BTreeSet<Touch>>) {
        if let (Some(r), Some(t)) = (&mut self.round, touches) {
            r.committed.extend(t.iter().cloned());
        }
    }

    /// A full sync read everything back and repaired it: the round in
    /// progress has nothing left to tell. Its thread ends on its own.
    pub fn supersede(&mut self) {
        self.round = None;
    }

    /// The round's answer, once its thread is done.
    pub fn answer(&mut self) -> Option<Verification> {
        if !self.round.as_ref()?.worker.is_finished() {
            return None;
        }
        let round = self.round.take()?;
        let found = match round.worker.join() {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Some(Verification::Failed(e.to_string())),
            Err(_) => return Some(Verification::Failed("its thread panicked".into())),
        };
        let ours = |t: &Touch| {
            let set = match t {
                Touch::Element(table, set, _) => Some(Touch::Named(*table, set.clone())),
                _ => None,
            };
            round.committed.contains(&Touch::Table(t.table()))
                || set.is_some_and(|s| round.committed.contains(&s))
                || round.committed.contains(t)
        };
        if !found.whole {
            return Some(match found.touches.is_empty() {
                true => Verification::Matches,
                false => Verification::Unsettled,
            });
        }
        let (unsettled, drift): (Vec<&Touch>, Vec<&Touch>) =
            found.touches.iter().partition(|t| ours(t));
        Some(if !drift.is_empty() {
            let mut named: Vec<String> = drift.iter().map(|t| t.to_string()).collect();
            named.dedup();
            let mut said = named[..named.len().min(NAMED)].join(", ");
            if drift.len() > 1 {
                said += &format!(" ({} changes in all)", drift.len());
            }
            Verification::Differs(said)
        } else if !unsettled.is_empty() {
            Verification::Unsettled
        } else {
            Verification::Matches
        })
    }
}
