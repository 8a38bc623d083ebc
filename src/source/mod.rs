//! Where Kubernetes objects come from. Today: manifest files (`files`). The API
//! server watch source will live beside it and produce the same `model::Objects`.

pub mod files;
