//! Every fuzz target's seed corpus and every input a fuzzer ever found a bug
//! with (`integration/fuzz/regressions/<target>/`, one file each, named after
//! the bug) go through the target's body again, uninstrumented: a regression
//! panics here. The fuzzing itself is `integration/fuzz/run.sh`.

use std::path::Path;

fn replay(dir: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("integration/fuzz")
        .join(dir);
    let mut replayed = 0;
    for (target, body) in kube_nft::testbed::fuzzing::TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| body(&data));
            assert!(outcome.is_ok(), "{target} panics on {}", path.display());
            replayed += 1;
        }
    }
    replayed
}

#[test]
fn every_seed_goes_through_its_target() {
    // Each of the eight targets has seeds.
    for (target, _) in kube_nft::testbed::fuzzing::TARGETS {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("integration/fuzz/corpus")
            .join(target);
        assert!(
            std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()),
            "no seeds for {target}"
        );
    }
    assert!(replay("corpus") > 20);
}

#[test]
fn every_past_finding_stays_fixed() {
    assert!(replay("regressions") >= 2);
}
