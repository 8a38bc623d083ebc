//! The periodic verification, off the path of changes.
//!
//! Once an hour (while the drift monitor watches) the kernel is checked against
//! the whole desired state, for drift the monitor cannot have told: a lost
//! notification, a bug of ours. Done as a full sync on the daemon's thread, it
//! held every change behind its read-back and plan, 3.5 s at 100k Services.
//! Here a thread of its own, with a socket of its own, reads our tables and
//! plans against a snapshot of the state, while the daemon goes on syncing.
//!
//! What a round can judge: what no commit of ours changed since the snapshot
//! holds what the snapshot asks for, unless someone else changed it. So each
//! thing the round's plan would change (`plan::Touch`) is drift, unless a
//! commit of ours changed it meanwhile, before it was read or after: that is
//! as our commit left it, as a partial sync trusts. Drift is told when a
//! second round finds it again.
//!
//! That holds for what a dump read whole. A dump that a commit came during
//! goes on by count, so it may miss or repeat objects: anywhere in the family
//! for the dumps of chains, rules, sets and objects, anywhere in its set for
//! an element dump. The read notes which dumps a commit came during (the
//! ruleset's generation before and after each: `Interrupted`), and what the
//! round found in them (but what our commits touched) leaves the round
//! unsettled: the next judges again. A commit of someone else's to our
//! tables is the monitor's to tell; its repair is a full sync, which makes the
//! verification moot.

use crate::core::model::Snapshot;
use crate::core::node_config::NodeConfig;
use crate::engine::dataplane::Verification;
use crate::netlink::nftables::Interrupted;
use crate::netlink::{NftError, NftSocket};
use crate::nft::kernel::NftKernel;
use crate::nft::pick::EndpointMap;
use crate::nft::plan::{Plan, Touch};
use crate::nft::planner::plan_full_into;
use crate::ruleset::TableId;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The verification round in progress, if any.
#[derive(Default)]
pub struct Verifier {
    round: Option<Round>,
    /// What the last round took for drift, for the next to confirm.
    suspected: Option<BTreeSet<Touch>>,
}

struct Round {
    worker: JoinHandle<Result<Found, NftError>>,
    /// What our commits changed since the snapshot was taken.
    committed: BTreeSet<Touch>,
}

/// What a round's plan would change, and the dumps of its read that a commit
/// came during.
struct Found {
    touches: BTreeSet<Touch>,
    interrupted: Interrupted,
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
                sock.track_interruptions();
                let views = sock.read_views()?;
                let interrupted = sock.take_interruptions().unwrap_or_default();
                drop(sock);
                let (plan, _) = plan_full_into(Plan::recording(), &views, &state, &config);
                let touches = plan.touches().unwrap_or_default();
                Ok(Found {
                    touches,
                    interrupted,
                })
            })
            .expect("spawning the verification thread");
        self.round = Some(Round {
            worker,
            committed: BTreeSet::new(),
        });
    }

    /// Whether a round is in progress (its answer not yet taken).
    pub fn running(&self) -> bool {
        self.round.is_some()
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
        self.suspected = None;
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
        let cut = &found.interrupted;
        let cut_set = |table: &TableId, set: &dyn Fn(&str) -> bool| {
            let family = table.family;
            let name = table.name();
            cut.sets
                .iter()
                .any(|(f, t, s)| *f == family && t == name && set(s))
        };
        let read_cut = |t: &Touch| match t {
            Touch::Element(table, set, _) => cut_set(table, &|s| s == set),
            Touch::Entry(table, _) => cut_set(table, &|s| EndpointMap::of_name(s).is_some()),
            Touch::Table(t) | Touch::Named(t, _) => cut.structure.contains(&t.family),
        };
        // What our commits touched is as the last of them left it (a commit is
        // atomic, and a later one of someone else's is the monitor's to tell),
        // trusted as a partial sync trusts what it wrote.
        let (unsure, drift): (Vec<&Touch>, Vec<&Touch>) = found
            .touches
            .iter()
            .filter(|t| !ours(t))
            .partition(|t| read_cut(t));
        if !drift.is_empty() {
            // Told only when the next round finds it too: a read may also be
            // disturbed where no generation tells (a set's hash table resized
            // under its dump, after a large sync).
            let confirmed: Vec<&Touch> = match self.suspected.take() {
                Some(before) => drift
                    .iter()
                    .copied()
                    .filter(|t| before.contains(t))
                    .collect(),
                None => Vec::new(),
            };
            if confirmed.is_empty() {
                self.suspected = Some(drift.into_iter().cloned().collect());
                return Some(Verification::Unsettled);
            }
            return Some(Verification::Differs(describe(&confirmed)));
        }
        if !unsure.is_empty() {
            return Some(Verification::Unsettled);
        }
        self.suspected = None;
        Some(Verification::Matches)
    }
}

/// A few of `drift`, and how many in all.
fn describe(drift: &[&Touch]) -> String {
    let mut named: Vec<String> = drift.iter().map(|t| t.to_string()).collect();
    named.dedup();
    let mut said = named[..named.len().min(NAMED)].join(", ");
    if drift.len() > 1 {
        said += &format!(" ({} changes in all)", drift.len());
    }
    said
}
