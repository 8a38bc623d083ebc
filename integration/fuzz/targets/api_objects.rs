//! Fuzz target `api_objects`: its body is `kube_nft::testbed::fuzzing::api_objects`, which
//! `integration/fuzz_corpus.rs` also replays over the corpus and past findings.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kube_nft::testbed::fuzzing::api_objects(data));
