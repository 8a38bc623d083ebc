//! Where Kubernetes objects come from: manifest files (`files`), or an API server
//! watched with kube-rs (`kubernetes`). The API source reports changes one object
//! at a time (`Update`); manifest files are read whole into the same updates.
//! `store` applies them to the model it owns and reports what changed.

pub mod files;
pub mod kubernetes;
pub mod store;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// A change to one kind of object, as a watch reports it.
#[derive(Debug, Clone)]
pub enum Delta<K> {
    /// Created or changed. (Boxed: a Node is a kilobyte and a half.)
    Applied(Box<K>),
    Deleted(Box<K>),
    /// A complete list (the first, or a relist after a dropped or expired watch):
    /// anything not in it is gone.
    Listed(Vec<K>),
}

#[derive(Debug, Clone)]
pub enum Update {
    Service(Delta<core::Service>),
    Slice(Delta<discovery::EndpointSlice>),
    Node(Delta<core::Node>),
    ServiceCidr(Delta<ServiceCIDR>),
}
