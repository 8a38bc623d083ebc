//! Writes objects straight into etcd, as kube-apiserver would have stored them:
//! how `bench-kube-proxy --etcd` loads its Services.
//!
//! kube-apiserver v1.36.3 cannot take 100k Services in reasonable time: after
//! each Service it creates, its ClusterIP allocator refreshes two gauges, each
//! by listing every IPAddress object (`ipallocator.(*Allocator).createIPAddress`),
//! so N creates cost N² (81% of its CPU in a profile; 100k ≈ 1.7 hours here,
//! docs/BENCHMARKS.md). That is the API server's cost, paid by neither proxy.
//! Stored directly, a Service is read and served like one it wrote: the API
//! server decodes JSON from storage as well as protobuf, and its watch cache
//! hands each one to the proxies as an ADDED event.
//!
//! etcd speaks JSON through its gRPC gateway (`POST /v3/kv/put`, keys and
//! values in base64). Each object is a put of its own, at a revision of its
//! own, as the API server writes them: the API server's watch cache takes a
//! revision for one object's version, and a watcher that resumes from a
//! revision shared by several objects never sees the rest of them (a
//! transaction of 128 puts lost Services to the API server's own repair loop,
//! which then deleted their IPAddresses as leaked).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Requests in flight, each on a connection of its own.
const WORKERS: usize = 8;

/// Where etcd's client port is, and the network namespace it is reached from
/// (the control plane's: the bench runs on a node, and etcd serves loopback).
#[derive(Debug, Clone)]
pub struct Etcd {
    pub addr: SocketAddr,
    pub netns: Option<String>,
}

/// Puts every `(key, value)`, unconditionally, each at a revision of its own.
pub fn put_all(etcd: &Etcd, kvs: Vec<(String, Vec<u8>)>) -> Result<(), String> {
    let kvs = Arc::new(kvs);
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (etcd, kvs, next) = (etcd.clone(), kvs.clone(), next.clone());
            std::thread::spawn(move || -> Result<(), String> {
                if let Some(ns) = &etcd.netns {
                    crate::testbed::netns::enter(ns).map_err(|e| e.to_string())?;
                }
                let mut conn = Conn::open(etcd.addr)?;
                loop {
                    let Some((key, value)) = kvs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return Ok(());
                    };
                    let body =
                        serde_json::json!({"key": base64(key.as_bytes()), "value": base64(value)});
                    if let Err(e) = conn.post("/v3/kv/put", body.to_string().as_bytes()) {
                        // The others stop at their next put.
                        next.store(usize::MAX / 2, Ordering::Relaxed);
                        return Err(format!("putting {key}: {e}"));
                    }
                }
            })
        })
        .collect();
    let mut first_error = None;
    for w in workers {
        let r = w
            .join()
            .unwrap_or_else(|_| Err("an etcd worker panicked".into()));
        if let (Err(e), None) = (r, &first_error) {
            first_error = Some(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// How many keys start with `prefix`.
pub fn count(etcd: &Etcd, prefix: &str) -> Result<u64, String> {
    let (etcd, prefix) = (etcd.clone(), prefix.to_string());
    let ask = move || -> Result<u64, String> {
        let body = serde_json::json!({
            "key": base64(prefix.as_bytes()),
            "range_end": base64(&prefix_end(prefix.as_bytes())),
            "count_only": true,
        });
        let answer = Conn::open(etcd.addr)?.post("/v3/kv/range", body.to_string().as_bytes())?;
        let v: serde_json::Value = serde_json::from_slice(&answer)
            .map_err(|e| format!("etcd's answer to a count: {e}"))?;
        // int64 fields come as strings, and a zero is left out.
        Ok(v["count"]
            .as_str()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0))
    };
    match etcd.netns.clone() {
        Some(ns) => crate::testbed::netns::in_netns(&ns, ask).map_err(|e| e.to_string())?,
        None => ask(),
    }
}

/// The end of the range of keys that start with `prefix` (etcd's convention:
/// the prefix with its last byte incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An HTTP/1.1 connection kept alive across requests: a put per request, and
/// 200k of them would otherwise leave as many sockets in TIME_WAIT.
struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, String> {
        let io = |e: std::io::Error| format!("etcd at {addr}: {e}");
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        Ok(Conn {
            addr,
            reader: BufReader::new(stream),
        })
    }

    /// The body of a 200, or an error that holds etcd's answer.
    fn post(&mut self, path: &str, body: &[u8]) -> Result<Vec<u8>, String> {
        let addr = self.addr;
        let io = |e: std::io::Error| format!("etcd at {addr}: {e}");
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.reader.get_mut().write_all(&request).map_err(io)?;
        let (status, length, chunked) = self.head().map_err(io)?;
        let answer = if chunked {
            read_chunked(&mut self.reader).map_err(io)?
        } else {
            let mut b = vec![
                0;
                length.ok_or_else(|| format!(
                    "etcd at {addr}: an answer of no known length"
                ))?
            ];
            self.reader.read_exact(&mut b).map_err(io)?;
            b
        };
        if status != 200 {
            return Err(format!(
                "etcd at {addr}: {path} answered {status}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        Ok(answer)
    }

    /// The status, the Content-Length if any, and whether the body is chunked.
    fn head(&mut self) -> std::io::Result<(u16, Option<usize>, bool)> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("an answer without a status"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(bad("the connection closed in an answer's head"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                return Ok((status, length, chunked));
            }
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
    }
}

/// A chunked body, up to and including its last (empty) chunk and trailer.
fn read_chunked(reader: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a bad chunk size");
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| bad())?;
        if size == 0 {
            // The trailer: header lines until an empty one.
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let at = body.len();
        body.resize(at + size + 2, 0);
        reader.read_exact(&mut body[at..])?;
        body.truncate(at + size);
    }
}

/// Standard base64, with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | ((b as u32) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_test_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn a_prefix_range_ends_past_every_key_that_starts_with_it() {
        assert_eq!(prefix_end(b"/registry/services/"), b"/registry/services0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn a_chunked_body_is_joined_and_read_to_its_end() {
        let mut answer: &[u8] = b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\nHTTP/1.1 200 OK";
        let body = read_chunked(&mut answer).unwrap();
        assert_eq!(body, b"{\"a\":1}");
        assert_eq!(answer, b"HTTP/1.1 200 OK", "the next answer is left unread");
    }
}
