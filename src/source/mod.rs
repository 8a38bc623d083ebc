//! Where Kubernetes objects come from: manifest files (`files`), or an API server
//! watched with kube-rs (`kubernetes`), Services and EndpointSlices listed and
//! watched in protobuf (`list_watch`, `protobuf`; each body read as it arrives,
//! `body`). The API source reports changes one object at a time (`Update`);
//! manifest files are read whole into the same updates. `store` applies them
//! to the model it owns and reports what changed.

pub mod api_metrics;
pub mod body;
pub mod files;
pub mod kubernetes;
pub mod list_watch;
pub mod protobuf;
pub mod store;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// A change to one kind of object, as a watch reports it.
#[derive(Debug, Clone)]
pub enum Delta<K> {
    /// Created or changed. (Boxed: a Node is a kilobyte and a half.)
    Applied(Box<K>),
    Deleted(Box<K>),
    /// A complete list begins (the first, or a relist after a dropped or expired
    /// watch). Its objects follow one by one as `Listing`, so that neither the
    /// source nor the store ever holds the whole list as API objects.
    ListStarted,
    /// One object of the list under way.
    Listing(Box<K>),
    /// The list is complete: anything not in it is gone.
    Listed,
}

impl<K> Delta<K> {
    /// The same change with each object made into another by `read`, told
    /// whether the object is present (false: deleted).
    pub fn map<T>(self, read: impl FnOnce(K, bool) -> T) -> Delta<T> {
        match self {
            Delta::Applied(o) => Delta::Applied(Box::new(read(*o, true))),
            Delta::Deleted(o) => Delta::Deleted(Box::new(read(*o, false))),
            Delta::ListStarted => Delta::ListStarted,
            Delta::Listing(o) => Delta::Listing(Box::new(read(*o, true))),
            Delta::Listed => Delta::Listed,
        }
    }
}

/// A complete list of one kind as the updates that carry it: its start, each
/// object, its end. `wrap` is the kind's `Update` variant.
pub fn list_updates<K>(
    items: Vec<K>,
    wrap: fn(Delta<K>) -> Update,
) -> impl Iterator<Item = Update> {
    std::iter::once(wrap(Delta::ListStarted))
        .chain(
            items
                .into_iter()
                .map(move |o| wrap(Delta::Listing(Box::new(o)))),
        )
        .chain(std::iter::once(wrap(Delta::Listed)))
}

/// Services and EndpointSlices arrive converted (`store::ServiceObject`,
/// `store::SliceObject`: `store::service_update`, `store::slice_update`), by
/// the thread that read them.
#[derive(Debug, Clone)]
pub enum Update {
    Service(Delta<store::ServiceObject>),
    Slice(Delta<store::SliceObject>),
    Node(Delta<core::Node>),
    ServiceCidr(Delta<ServiceCIDR>),
}
