//! The watchers of the two kinds that grow with the cluster, Services and
//! EndpointSlices, in protobuf, as kube-proxy's informers watch them.
//!
//! The initial state is streamed where the API server offers it (WatchList,
//! KEP-3157: a watch with `sendInitialEvents`, whose objects come from the
//! watch cache one event at a time, ended by a bookmark), as client-go does
//! since 1.35; where it does not, or the stream fails before its end, the
//! list is asked for whole, in protobuf, and read object by object as it
//! arrives (`super::protobuf::ListReader`), then watched from its
//! resourceVersion. Either way neither the bytes nor the objects of the
//! initial state are ever held whole. `KUBE_FEATURE_WatchListClient=false`
//! turns streaming off, as it does for client-go.
//!
//! Why not kube-rs's watcher, which lists in JSON pages of 500: at 100k
//! Services the API server spent 5.7 s of CPU on the 200 pages of Services
//! (each page walks its cache), and 0.4 s on the same list whole in protobuf
//! (docs/BENCHMARKS.md). The events and errors are kube-rs's own, so that
//! `super::kubernetes::forward` treats this stream and kube-rs's alike.
//!
//! As client-go's reflector (kube-proxy's), a first list is served from the
//! API server's cache (resourceVersion 0); after a watch that could not resume
//! (410 Gone) the relist is a consistent one.

use super::body::{Incoming, JsonLines, Next, WatchBody};
use super::protobuf::{self, ListReader, WatchReader};
use futures_util::Stream;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt::Debug;

/// Decodes one object of a protobuf list.
pub type DecodeItem<K> = fn(&[u8]) -> Result<K, protobuf::DecodeError>;

/// Which list to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Since {
    /// Whatever the API server's cache holds (resourceVersion 0): the first list.
    Cache,
    /// The latest, read consistently: after the watch could not resume.
    Latest,
}

/// A list response being read.
enum Reading<K> {
    /// Protobuf, read as it arrives.
    Protobuf(Incoming<ListReader<K>>),
    /// JSON (from a server that will not speak protobuf), read whole.
    Json(VecDeque<K>),
}

/// The watcher's state between two events.
enum State<K> {
    /// Next: the initial state, streamed if `stream` (and the server offers
    /// it), else listed.
    Empty { since: Since, stream: bool },
    /// The initial state streaming: its response once asked for, and the
    /// objects read so far; `since`, for a list if the stream fails.
    Streaming {
        since: Since,
        body: Option<WatchBody<K>>,
        objects: usize,
    },
    /// Listing: the response in hand (if any), then the next page while the
    /// list has a continue token, then `InitDone`.
    Paging(Listing<K>),
    /// Listed or caught up: next, a watch from here.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        body: WatchBody<K>,
    },
}

/// A list under way.
struct Listing<K> {
    since: Since,
    reading: Option<Reading<K>>,
    continue_token: Option<String>,
    resource_version: Option<String>,
    /// Objects read so far, and in what encoding: for the log line at its end.
    objects: usize,
    encoding: &'static str,
}

/// The lister and watcher of one kind.
struct Kind<K> {
    client: Client,
    api: Api<K>,
    config: watcher::Config,
    decode: DecodeItem<K>,
    /// Whether to ask for the initial state as a stream: until the server
    /// refuses it.
    stream_lists: bool,
}

type Step<K> = (Option<Result<Event<K>, watcher::Error>>, State<K>);

/// kube-rs's `watcher(Api::all(client), config)`, in protobuf, its initial
/// state streamed if `stream_lists`.
pub fn watcher<K>(
    client: Client,
    config: watcher::Config,
    decode: DecodeItem<K>,
    stream_lists: bool,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let kind = Kind {
        api: Api::all(client.clone()),
        client,
        config,
        decode,
        stream_lists,
    };
    let first = State::Empty {
        since: Since::Cache,
        stream: true,
    };
    futures_util::stream::unfold((kind, first), |(mut kind, mut state)| async move {
        loop {
            let (event, next) = step(&mut kind, state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (kind, state)));
            }
        }
    })
}

/// One step: maybe an event, and the state after it.
async fn step<K>(kind: &mut Kind<K>, state: State<K>) -> Step<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match state {
        State::Empty { since, stream } => (
            Some(Ok(Event::Init)),
            if stream && kind.stream_lists {
                State::Streaming {
                    since,
                    body: None,
                    objects: 0,
                }
            } else {
                State::Paging(Listing {
                    since,
                    reading: None,
                    continue_token: None,
                    resource_version: None,
                    objects: 0,
                    encoding: "protobuf",
                })
            },
        ),
        State::Streaming {
            since,
            body,
            objects,
        } => stream_initial(kind, since, body, objects).await,
        State::Paging(listing) => page(kind, listing).await,
        State::Listed { resource_version } => match watch(kind, &resource_version, false).await {
            Ok(body) => (
                None,
                State::Watching {
                    resource_version,
                    body,
                },
            ),
            Err(e) => (
                Some(Err(watcher::Error::WatchStartFailed(e))),
                State::Listed { resource_version },
            ),
        },
        State::Watching {
            resource_version,
            mut body,
        } => {
            let watching = |resource_version, body| State::Watching {
                resource_version,
                body,
            };
            // An object's event moves the watch on to its resourceVersion.
            let seen = |obj: &K, resource_version| {
                obj.meta()
                    .resource_version
                    .clone()
                    .unwrap_or(resource_version)
            };
            match body.next(&kind.config).await {
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    let rv = seen(&obj, resource_version);
                    (Some(Ok(Event::Apply(obj))), watching(rv, body))
                }
                Some(Ok(WatchEvent::Deleted(obj))) => {
                    let rv = seen(&obj, resource_version);
                    (Some(Ok(Event::Delete(obj))), watching(rv, body))
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    (None, watching(bookmark.metadata.resource_version, body))
                }
                // 410 Gone: the watch cannot resume from here; list again.
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => (
                    Some(Err(watcher::Error::WatchError(status))),
                    State::Empty {
                        since: Since::Latest,
                        stream: true,
                    },
                ),
                Some(Ok(WatchEvent::Error(status))) => (
                    Some(Err(watcher::Error::WatchError(status))),
                    watching(resource_version, body),
                ),
                Some(Err(e)) => (
                    Some(Err(watcher::Error::WatchFailed(e))),
                    watching(resource_version, body),
                ),
                // The server ended the watch (its timeout), or the connection
                // went silent for longer: watch again from here.
                None => (None, State::Listed { resource_version }),
            }
        }
    }
}

/// The annotation of the bookmark that ends a streamed initial state.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The next object of the initial state's stream, asking for it first; at its
/// closing bookmark `InitDone`, and the same stream goes on as the watch.
///
/// As client-go's reflector: a stream that fails before its end is followed by
/// a list, at once; a server that refuses to stream (the WatchList feature
/// off: 400 or 422) is not asked again. One that cannot be reached is asked
/// again after the caller's backoff, as after a failed list.
async fn stream_initial<K>(
    kind: &mut Kind<K>,
    since: Since,
    body: Option<WatchBody<K>>,
    mut objects: usize,
) -> Step<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // Next, a list: its own `Init` starts the initial state again.
    let list = |since| {
        (
            None,
            State::Empty {
                since,
                stream: false,
            },
        )
    };
    let list_instead = move |why: String| {
        let plural = K::plural(&());
        tracing::warn!("streaming the {plural}: {why}; listing them instead");
        list(since)
    };
    let mut body = match body {
        Some(body) => body,
        None => {
            return match watch(kind, "", true).await {
                Ok(body) => (
                    None,
                    State::Streaming {
                        since,
                        body: Some(body),
                        objects,
                    },
                ),
                Err(kube::Error::Api(status)) if matches!(status.code, 400 | 422) => {
                    tracing::info!(
                        "the API server does not stream the {} ({}); listing them",
                        K::plural(&()),
                        status.message
                    );
                    kind.stream_lists = false;
                    list(since)
                }
                // Unreachable, or failing: as a list that failed, retried
                // with backoff by the caller, a stream again.
                Err(e) => (
                    Some(Err(watcher::Error::InitialListFailed(e))),
                    State::Empty {
                        since,
                        stream: true,
                    },
                ),
            };
        }
    };
    match body.next(&kind.config).await {
        Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
            objects += 1;
            (
                Some(Ok(Event::InitApply(obj))),
                State::Streaming {
                    since,
                    body: Some(body),
                    objects,
                },
            )
        }
        Some(Ok(WatchEvent::Bookmark(bookmark))) => {
            let end = bookmark.metadata.annotations.get(INITIAL_EVENTS_END);
            if end.map(String::as_str) != Some("true") {
                return (
                    None,
                    State::Streaming {
                        since,
                        body: Some(body),
                        objects,
                    },
                );
            }
            let encoding = body.encoding();
            tracing::info!("listed {objects} {} (streamed, {encoding})", K::plural(&()));
            (
                Some(Ok(Event::InitDone)),
                State::Watching {
                    resource_version: bookmark.metadata.resource_version,
                    body,
                },
            )
        }
        Some(Ok(WatchEvent::Deleted(_))) => list_instead("a deletion before the end".into()),
        Some(Ok(WatchEvent::Error(status))) => list_instead(status.message),
        Some(Err(e)) => list_instead(e.to_string()),
        None => list_instead("it ended before its closing bookmark".into()),
    }
}

/// Opens a watch from `resource_version`; with `initial`, one that first
/// streams the state at the newest resourceVersion (which `""` asks for).
async fn watch<K>(
    kind: &Kind<K>,
    resource_version: &str,
    initial: bool,
) -> kube::Result<WatchBody<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let params = WatchParams {
        label_selector: kind.config.label_selector.clone(),
        field_selector: kind.config.field_selector.clone(),
        timeout: kind.config.timeout,
        bookmarks: kind.config.bookmarks || initial,
        send_initial_events: initial,
    };
    let request = kube::core::Request::new(kind.api.resource_url())
        .watch(&params, resource_version)
        .map_err(kube::Error::BuildRequest)?;
    let (body, is_protobuf) = send(kind, request).await?;
    Ok(if is_protobuf {
        WatchBody::Protobuf(Incoming::new(body, WatchReader::new(kind.decode)))
    } else {
        WatchBody::Json(Incoming::new(body, JsonLines::default()))
    })
}

/// The next object of the list under way, reading or asking for more as needed;
/// `InitDone` once the last page is read.
async fn page<K>(kind: &Kind<K>, mut l: Listing<K>) -> Step<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let failed = |e: kube::Error, since: Since| {
        // An expired continue token or a resourceVersion the server no
        // longer has: list the latest instead.
        let since = match &e {
            kube::Error::Api(status) if status.code == 410 => Since::Latest,
            _ => since,
        };
        (
            Some(Err(watcher::Error::InitialListFailed(e))),
            State::Empty {
                since,
                stream: true,
            },
        )
    };
    let object = |mut l: Listing<K>, obj: K| {
        l.objects += 1;
        (Some(Ok(Event::InitApply(obj))), State::Paging(l))
    };
    match l.reading.take() {
        Some(Reading::Protobuf(mut incoming)) => match incoming.next(&kind.config).await {
            Next::Item(obj) => {
                l.reading = Some(Reading::Protobuf(incoming));
                object(l, obj)
            }
            Next::End => {
                let reader = incoming.reader_mut();
                l.continue_token = reader.continue_token.take();
                l.resource_version = reader.resource_version.take();
                if l.continue_token.is_none() && l.resource_version.is_none() {
                    return no_resource_version(l.since);
                }
                (None, State::Paging(l))
            }
            Next::Silent => {
                let silent = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the list's response stopped arriving",
                );
                failed(kube::Error::ReadEvents(silent), l.since)
            }
            Next::Failed(e) => failed(e, l.since),
        },
        Some(Reading::Json(mut items)) => match items.pop_front() {
            Some(obj) => {
                l.reading = Some(Reading::Json(items));
                object(l, obj)
            }
            None => (None, State::Paging(l)),
        },
        None => {
            if l.continue_token.is_none() {
                if let Some(resource_version) = l.resource_version {
                    tracing::info!("listed {} {} ({})", l.objects, K::plural(&()), l.encoding);
                    return (
                        Some(Ok(Event::InitDone)),
                        State::Listed { resource_version },
                    );
                }
            }
            match request(kind, &l.since, l.continue_token.take()).await {
                // Its resourceVersion and continue token are read with it.
                Ok(Requested::Protobuf(reading)) => {
                    l.reading = Some(reading);
                    (None, State::Paging(l))
                }
                Ok(Requested::Json(list)) => {
                    l.continue_token = list.metadata.continue_.filter(|v| !v.is_empty());
                    l.resource_version = list.metadata.resource_version.filter(|v| !v.is_empty());
                    if l.continue_token.is_none() && l.resource_version.is_none() {
                        return no_resource_version(l.since);
                    }
                    l.reading = Some(Reading::Json(list.items.into()));
                    l.encoding = "JSON";
                    (None, State::Paging(l))
                }
                Err(e) => failed(e, l.since),
            }
        }
    }
}

fn no_resource_version<K>(since: Since) -> Step<K> {
    (
        Some(Err(watcher::Error::NoResourceVersion)),
        State::Empty {
            since,
            stream: true,
        },
    )
}

/// What a list request brought: a body to read, or a JSON list read whole.
enum Requested<K: Clone> {
    Protobuf(Reading<K>),
    Json(ObjectList<K>),
}

/// Protobuf first; JSON where the server cannot (as client-go asks). A watch
/// is answered in the same type, framed (`;stream=watch`).
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// Asks for a list, or its next page. No page size: the API server's cache
/// answers a whole list at a fraction of the CPU of pages of 500, and the
/// reader holds one object at a time. A server that pages anyway gives a
/// continue token, which is followed.
async fn request<K>(
    kind: &Kind<K>,
    since: &Since,
    continue_token: Option<String>,
) -> kube::Result<Requested<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams {
        label_selector: kind.config.label_selector.clone(),
        field_selector: kind.config.field_selector.clone(),
        ..ListParams::default()
    };
    match continue_token {
        // A continued list is read at the resourceVersion of its first page.
        Some(token) => params.continue_token = Some(token),
        None if *since == Since::Cache => params = params.match_any(),
        None => {}
    }
    let request = kube::core::Request::new(kind.api.resource_url())
        .list(&params)
        .map_err(kube::Error::BuildRequest)?;
    let (body, is_protobuf) = send(kind, request).await?;
    if is_protobuf {
        let reader = ListReader::new(kind.decode);
        return Ok(Requested::Protobuf(Reading::Protobuf(Incoming::new(
            body, reader,
        ))));
    }
    let body = body.collect_bytes().await?;
    let list = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
    Ok(Requested::Json(list))
}

/// Sends a list or watch request asking for protobuf: the body of a success,
/// and whether it is protobuf; the server's Status of a failure.
async fn send<K>(
    kind: &Kind<K>,
    mut request: http::Request<Vec<u8>>,
) -> kube::Result<(kube::client::Body, bool)> {
    request
        .headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
    let response = kind
        .client
        .send(request.map(kube::client::Body::from))
        .await?;
    let status = response.status();
    let is_protobuf = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(protobuf::CONTENT_TYPE));
    let body = response.into_body();
    if !status.is_success() {
        let body = body.collect_bytes().await?;
        return Err(kube::Error::Api(Box::new(error_status(
            status,
            &body,
            is_protobuf,
        ))));
    }
    Ok((body, is_protobuf))
}

/// The API server's Status of a failed request, in either encoding; the HTTP
/// status alone where the body says nothing readable.
fn error_status(status: http::StatusCode, body: &[u8], is_protobuf: bool) -> Status {
    let decoded = if is_protobuf {
        protobuf::status(body).ok()
    } else {
        serde_json::from_slice::<Status>(body).ok()
    };
    decoded.filter(|s| s.code != 0).unwrap_or_else(|| {
        Status::failure(
            &String::from_utf8_lossy(body),
            status.canonical_reason().unwrap_or(""),
        )
        .with_code(status.as_u16())
    })
}
