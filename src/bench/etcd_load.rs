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
//! etcd speaks JSON through its gRPC gateway (`POST /v3/kv/txn`, keys and
//! values in base64); a transaction carries at most 128 operations (etcd's
//! default `--max-txn-ops`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// etcd's default `--max-txn-ops`.
const OPS_PER_TXN: usize = 128;
/// Transactions in flight.
const WORKERS: usize = 4;

/// Where etcd's client port is, and the network namespace it is reached from
/// (the control plane's: the bench runs on a node, and etcd serves loopback).
#[derive(Debug, Clone)]
pub struct Etcd {
    pub addr: SocketAddr,
    pub netns: Option<String>,
}

/// Puts every `(key, value)`, unconditionally, in transactions of up to 128.
pub fn put_all(etcd: &Etcd, kvs: Vec<(String, Vec<u8>)>) -> Result<(), String> {
    let (send, recv) = mpsc::channel::<String>();
    let recv = Arc::new(Mutex::new(recv));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (etcd, recv) = (etcd.clone(), recv.clone());
            std::thread::spawn(move || -> Result<(), String> {
                if let Some(ns) = &etcd.netns {
                    crate::netns::enter(ns).map_err(|e| e.to_string())?;
                }
                loop {
                    let body = match recv.lock().map_err(|e| e.to_string())?.recv() {
                        Ok(body) => body,
                        Err(_) => return Ok(()),
                    };
                    post(etcd.addr, "/v3/kv/txn", body.as_bytes())?;
                }
            })
        })
        .collect();
    for batch in kvs.chunks(OPS_PER_TXN) {
        // A worker that failed has dropped its end; its error is reported below.
        if send.send(txn_body(batch)).is_err() {
            break;
        }
    }
    drop(send);
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
        let answer = post(etcd.addr, "/v3/kv/range", body.to_string().as_bytes())?;
        let v: serde_json::Value = serde_json::from_slice(&answer)
            .map_err(|e| format!("etcd's answer to a count: {e}"))?;
        // int64 fields come as strings, and a zero is left out.
        Ok(v["count"]
            .as_str()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0))
    };
    match etcd.netns.clone() {
        Some(ns) => crate::netns::in_netns(&ns, ask).map_err(|e| e.to_string())?,
        None => ask(),
    }
}

fn txn_body(batch: &[(String, Vec<u8>)]) -> String {
    let ops: Vec<_> = batch
        .iter()
        .map(|(k, v)| {
            serde_json::json!({"requestPut": {"key": base64(k.as_bytes()), "value": base64(v)}})
        })
        .collect();
    serde_json::json!({ "success": ops }).to_string()
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

/// One HTTP/1.1 request on its own connection; the body of a 200, or an error
/// that holds etcd's answer.
fn post(addr: SocketAddr, path: &str, body: &[u8]) -> Result<Vec<u8>, String> {
    let io = |e: std::io::Error| format!("etcd at {addr}: {e}");
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io)?;
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(io)?;
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .map_err(io)?;
    conn.write_all(body).map_err(io)?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).map_err(io)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("etcd at {addr}: an answer without a head"))?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let body = answer[split + 4..].to_vec();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!(
            "etcd at {addr}: {path} answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(&body));
    }
    Ok(body)
}

/// The body of a chunked answer (etcd's gateway may stream its JSON).
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size.filter(|&s| s > 0 && eol + 2 + s <= body.len()) else {
            break;
        };
        out.extend_from_slice(&body[eol + 2..eol + 2 + size]);
        body = &body[(eol + 4 + size).min(body.len())..];
    }
    out
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
    fn a_transaction_puts_each_pair_in_order() {
        let body = txn_body(&[("k1".into(), b"v1".to_vec()), ("k2".into(), b"v2".to_vec())]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let puts = v["success"].as_array().unwrap();
        assert_eq!(puts.len(), 2);
        assert_eq!(puts[1]["requestPut"]["key"], base64(b"k2"));
        assert_eq!(puts[1]["requestPut"]["value"], base64(b"v2"));
    }

    #[test]
    fn a_chunked_body_is_joined() {
        assert_eq!(
            dechunk(b"4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n"),
            b"{\"a\":1}"
        );
    }
}
