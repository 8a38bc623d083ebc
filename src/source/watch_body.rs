//! A watch response's events, read as they arrive: protobuf frames from a
//! kube-apiserver (`super::protobuf::WatchReader`), or JSON lines from a server
//! that will not speak protobuf.
//!
//! In protobuf an event is about a third of its JSON bytes, and the API
//! server's watch cache encodes each object once for all the watchers that ask
//! for the same encoding: kube-proxy's, which asks for protobuf.

use super::protobuf::{self, WatchReader};
use http_body_util::BodyExt;
use kube::api::WatchEvent;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use std::future::Future;

/// A watch's body, and what of it has arrived but not yet been read.
pub enum WatchBody<K> {
    Protobuf {
        body: kube::client::Body,
        reader: WatchReader<K>,
    },
    Json {
        body: kube::client::Body,
        buf: Vec<u8>,
        /// The offset in `buf` of the next line.
        pos: usize,
    },
    /// Ended: the server closed it, or it went silent or broke.
    Ended,
}

impl<K: kube::Resource + DeserializeOwned> WatchBody<K> {
    /// The next event; `None` once the body has ended, after an error or a
    /// silence longer than the watch's own timeout (`idle_limited`).
    pub async fn next(&mut self, config: &watcher::Config) -> Option<kube::Result<WatchEvent<K>>> {
        loop {
            let (body, event) = match self {
                WatchBody::Ended => return None,
                WatchBody::Protobuf { body, reader } => {
                    (body, reader.next_event().map_err(invalid))
                }
                WatchBody::Json { body, buf, pos } => (body, next_line(buf, pos)),
            };
            match event {
                Ok(Some(event)) => return Some(Ok(event)),
                Ok(None) => {}
                Err(e) => {
                    *self = WatchBody::Ended;
                    return Some(Err(e));
                }
            }
            let frame = match idle_limited(config, body.frame()).await {
                Some(Some(Ok(frame))) => frame,
                Some(Some(Err(e))) => {
                    *self = WatchBody::Ended;
                    return Some(Err(e));
                }
                // The end, or a silence: a body cut inside an event is an error.
                Some(None) | None => {
                    let cut = match self {
                        WatchBody::Protobuf { reader, .. } => {
                            reader.finish().map_err(invalid).err()
                        }
                        WatchBody::Json { buf, pos, .. } => {
                            let cut = buf[*pos..].iter().any(|b| !b.is_ascii_whitespace());
                            cut.then(|| {
                                kube::Error::ReadEvents(std::io::Error::new(
                                    std::io::ErrorKind::UnexpectedEof,
                                    "the watch ends inside an event",
                                ))
                            })
                        }
                        WatchBody::Ended => None,
                    };
                    *self = WatchBody::Ended;
                    return cut.map(Err);
                }
            };
            if let Some(data) = frame.data_ref() {
                match self {
                    WatchBody::Protobuf { reader, .. } => reader.feed(data),
                    // `next_line` has dropped the lines read before asking for more.
                    WatchBody::Json { buf, .. } => buf.extend_from_slice(data),
                    WatchBody::Ended => {}
                }
            }
        }
    }
}

/// The next whole line of a JSON watch as an event, skipping blank ones.
fn next_line<K: DeserializeOwned>(
    buf: &mut Vec<u8>,
    pos: &mut usize,
) -> kube::Result<Option<WatchEvent<K>>> {
    loop {
        let Some(n) = buf[*pos..].iter().position(|&b| b == b'\n') else {
            if *pos > 0 {
                buf.drain(..*pos);
                *pos = 0;
            }
            return Ok(None);
        };
        let line = &buf[*pos..*pos + n];
        *pos += n + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        return serde_json::from_slice(line)
            .map(Some)
            .map_err(kube::Error::SerdeError);
    }
}

/// How long a watch or a list's response may stay silent before its
/// connection is taken for dead: the server's watch timeout (kube-rs's default,
/// 290 s) and 5 s, as kube-rs's watcher waits. The client sets no read timeout,
/// and a half-open connection would otherwise be waited on for ever.
pub async fn idle_limited<T>(config: &watcher::Config, next: impl Future<Output = T>) -> Option<T> {
    let server = u64::from(config.timeout.unwrap_or(290));
    let limit = std::time::Duration::from_secs(server + 5);
    match tokio::time::timeout(limit, next).await {
        Ok(item) => Some(item),
        Err(_) => {
            tracing::info!("no word from the API server in {limit:?}; reconnecting");
            None
        }
    }
}

/// A decoding error, as kube-rs reports a body it cannot read.
pub fn invalid(e: protobuf::DecodeError) -> kube::Error {
    kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
