//! Fuzz target `ipvs`: its body is `kube_nft::testbed::fuzzing::ipvs`, which
//! `integration/fuzz_corpus.rs` also replays over the corpus and past findings.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kube_nft::testbed::fuzzing::ipvs(data));
