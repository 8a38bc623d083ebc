//! A change made while the periodic verification runs (`nft::verifier`),
//! against the same change on a quiet proxy and behind a full sync, which is
//! how the verification ran before it moved off the path of changes.
//!
//! One proxy in a scratch namespace holds a synthetic cluster. Each run
//! changes one endpoint of a Service three ways, timed from the change to the
//! model to the kernel's commit:
//! - quiet: nothing else going on;
//! - beside a verification: a round begun (its snapshot included), then the
//!   change after an offset that moves across the round from run to run, so
//!   that changes meet it reading, planning and ending;
//! - behind a full sync: the full sync begun at the change, then the change,
//!   as a change waited when the period's full sync had just begun.
//!
//! Then rounds under steady changes: a change every `CHURN_EVERY` from each
//! round's begin to its answer, to see how much of a round its own changes
//! leave unjudged.

use super::median;
use crate::core::model::ClusterState;
use crate::engine::dataplane::Verification;
use crate::engine::Proxy;
use crate::testbed::netns::{in_netns, Netns};
use crate::testbed::synthetic;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How often a change comes in the rounds under steady changes.
pub const CHURN_EVERY: Duration = Duration::from_millis(100);

/// What one size measured, in milliseconds (medians unless said).
pub struct VerificationRow {
    pub services: usize,
    pub endpoints: usize,
    pub quiet_ms: f64,
    pub beside_ms: f64,
    pub beside_max_ms: f64,
    pub behind_full_ms: f64,
    /// The round, from its begin to its answer.
    pub round_ms: f64,
    /// Of the round: the state's snapshot, on the proxy's own thread.
    pub snapshot_ms: f64,
    /// Each round's answer: on a kernel nobody else touches, `Matches`, or
    /// `Unsettled` where the round read what the change had changed.
    pub answers: Vec<Verification>,
    /// Under steady changes: each round's answer, and the changes' times.
    pub churn_answers: Vec<Verification>,
    pub churn_ms: Vec<f64>,
}

pub fn run(sizes: &[usize], endpoints: usize, runs: usize) -> Result<Vec<VerificationRow>, String> {
    sizes
        .iter()
        .map(|&services| {
            let ns = Netns::create(&format!("kn-verify-{services}")).map_err(|e| e.to_string())?;
            in_netns(&ns.name, move || measure(services, endpoints, runs))
                .map_err(|e| e.to_string())?
        })
        .collect()
}

fn measure(services: usize, endpoints: usize, runs: usize) -> Result<VerificationRow, String> {
    let mut p = crate::assemble::proxy(synthetic::node_config()).map_err(|e| e.to_string())?;
    p.replace_state(synthetic::state(services, endpoints * services));
    p.sync().map_err(|e| e.to_string())?;
    let mut next_addr = 0u32;
    // One endpoint of a Service moves to an address not used before.
    let mut change = |p: &mut Proxy, r: usize| -> Result<f64, String> {
        let i = (r * 7919) % services;
        let key = synthetic::service_key(i);
        next_addr += 1;
        let addr = IpAddr::from((0x0b00_0000u32 + next_addr).to_be_bytes());
        let start = Instant::now();
        p.update(&key, |s: &mut ClusterState| {
            let slices = s
                .slices
                .get_mut(&key)
                .expect("a synthetic Service has its slice");
            if let Some(e) = slices
                .values_mut()
                .next()
                .and_then(|sl| sl.endpoints.first_mut())
            {
                e.addr = addr;
            }
        });
        p.sync().map_err(|e| e.to_string())?;
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    };
    let (mut quiet, mut beside, mut behind, mut rounds, mut snapshots) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut answers = Vec::new();
    // The first round measures how long a round takes, for the offsets.
    let mut round = Duration::from_millis(100);
    for r in 0..runs {
        quiet.push(change(&mut p, 3 * r)?);

        let begun = Instant::now();
        let snapshot = p.state().snapshot();
        snapshots.push(begun.elapsed().as_secs_f64() * 1000.0);
        drop(snapshot);
        if !p.begin_verification() {
            return Err("this kernel gave no second socket to verify with".into());
        }
        // Offsets from 5% to 95% of a round.
        let share = 0.05 + 0.9 * r as f64 / (runs.max(2) - 1) as f64;
        std::thread::sleep(round.mul_f64(share));
        beside.push(change(&mut p, 3 * r + 1)?);
        let answer = loop {
            if let Some(a) = p.verification() {
                break a;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        round = begun.elapsed();
        rounds.push(round.as_secs_f64() * 1000.0);
        answers.push(answer);

        let start = Instant::now();
        p.request_full_sync();
        p.sync().map_err(|e| e.to_string())?;
        let full = start.elapsed().as_secs_f64() * 1000.0;
        behind.push(full + change(&mut p, 3 * r + 2)?);
    }
    let (mut churn_answers, mut churn_ms) = (Vec::new(), Vec::new());
    for r in 0..runs {
        if !p.begin_verification() {
            return Err("this kernel gave no second socket to verify with".into());
        }
        let mut k = 0;
        let answer = loop {
            std::thread::sleep(CHURN_EVERY);
            churn_ms.push(change(&mut p, 1_000_003 * (r + 1) + k)?);
            k += 1;
            if let Some(a) = p.verification() {
                break a;
            }
        };
        churn_answers.push(answer);
    }
    Ok(VerificationRow {
        services,
        endpoints,
        quiet_ms: median(quiet),
        beside_max_ms: beside.iter().copied().fold(0.0, f64::max),
        beside_ms: median(beside),
        behind_full_ms: median(behind),
        round_ms: median(rounds),
        snapshot_ms: median(snapshots),
        answers,
        churn_answers,
        churn_ms,
    })
}

pub fn table(rows: &[VerificationRow], runs: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "One endpoint moved, from the change to the kernel's commit (medians of {runs}; the verification's own thread reads and plans beside it)\n"
    );
    let _ = writeln!(
        out,
        "| Services × endpoints | quiet | during a verification (max) | ÷ quiet | behind a full sync (before) | verification round | of which the snapshot | answers |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for r in rows {
        let (matched, unsettled) = tally(&r.answers);
        let _ = writeln!(
            out,
            "| {} × {} | {:.2} ms | {:.2} ms ({:.2}) | {:.2} | {:.0} ms | {:.0} ms | {:.1} ms | {} matched, {} unsettled, {} other |",
            r.services,
            r.endpoints,
            r.quiet_ms,
            r.beside_ms,
            r.beside_max_ms,
            r.beside_ms / r.quiet_ms,
            r.behind_full_ms,
            r.round_ms,
            r.snapshot_ms,
            matched,
            unsettled,
            r.answers.len() - matched - unsettled,
        );
    }
    let _ = writeln!(
        out,
        "\nRounds under a change every {} ms, from each round's begin to its answer\n",
        CHURN_EVERY.as_millis()
    );
    let _ = writeln!(
        out,
        "| Services × endpoints | rounds: matched, unsettled, other | changes | a change, median (max) |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for r in rows {
        let (matched, unsettled) = tally(&r.churn_answers);
        let _ = writeln!(
            out,
            "| {} × {} | {matched}, {unsettled}, {} | {} | {:.2} ms ({:.2}) |",
            r.services,
            r.endpoints,
            r.churn_answers.len() - matched - unsettled,
            r.churn_ms.len(),
            median(r.churn_ms.clone()),
            r.churn_ms.iter().copied().fold(0.0, f64::max),
        );
    }
    for r in rows {
        let others = r.answers.iter().chain(&r.churn_answers);
        for a in others.filter(|a| !matches!(a, Verification::Matches | Verification::Unsettled)) {
            let _ = writeln!(out, "\nat {} Services, a round answered {a:?}", r.services);
        }
    }
    out
}

/// How many answers matched, and how many were unsettled.
fn tally(answers: &[Verification]) -> (usize, usize) {
    let count = |want: &Verification| answers.iter().filter(|a| *a == want).count();
    (
        count(&Verification::Matches),
        count(&Verification::Unsettled),
    )
}
