//! Fuzz target `api_protobuf`: its body is `kube_nft::testbed::fuzzing::api_protobuf`, which
//! `integration/fuzz_corpus.rs` also replays over the corpus and past findings.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kube_nft::testbed::fuzzing::api_protobuf(data));
