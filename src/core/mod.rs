//! The backend-neutral core: the validated model of Services and endpoints
//! (`model`, built only through `convert`), kube-proxy's endpoint policy
//! (`policy`) and this node's settings (`node_config`). Every source feeds it
//! and every dataplane reads it; it knows neither.

pub mod convert;
pub mod duration;
pub mod endpoint_key;
pub mod model;
pub mod net;
pub mod node_config;
pub mod policy;
