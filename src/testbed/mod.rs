//! What the tests, the lab and the benchmarks share, and the shipped daemon
//! never runs: the `synthetic` cluster, named network namespaces (`netns`), and
//! the bodies of the fuzz targets (`fuzzing`, behind its feature).

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod netns;
pub mod synthetic;
