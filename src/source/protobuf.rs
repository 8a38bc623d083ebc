//! Lists of Services and EndpointSlices in the API server's protobuf encoding
//! (`application/vnd.kubernetes.protobuf`, kube-proxy's default content type),
//! decoded into k8s-openapi's types so that `core::convert` reads them as it
//! reads JSON.
//!
//! The API server encodes a list in about a third of JSON's bytes and less of
//! its CPU, which at 100k Services is most of the time to first traffic.
//! Only what kube-nft reads is decoded (a Service's metadata, spec and
//! load-balancer status; a slice's addresses, conditions, placement, hints and
//! ports); every other field is skipped, as protobuf lets a reader skip what it
//! does not know. Field numbers are those of k8s.io/api's and
//! k8s.io/apimachinery's generated.proto, which never renumber a field.
//!
//! The API server writes a Go field that is not a pointer even when it holds
//! its zero value, where JSON's `omitempty` leaves it out; those zero values
//! are read as absent here, so that both encodings give the same object.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::watch::{Bookmark, BookmarkMeta};
use kube::core::{TypeMeta, WatchEvent};
use std::collections::BTreeMap;

/// The media type to ask for.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// What every protobuf body of the API server starts with, before its
/// `runtime.Unknown` envelope.
const MAGIC: &[u8] = b"k8s\0";

/// A body that is not what it should be, with where in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protobuf: {what}")]
pub struct DecodeError {
    what: String,
}

fn error(what: impl Into<String>) -> DecodeError {
    DecodeError { what: what.into() }
}

type Result<T> = std::result::Result<T, DecodeError>;

/// A value on the wire. Groups (wire types 3 and 4) are long deprecated and
/// never written by the API server; they are refused.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one message, in order.
struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields { buf }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| error("a varint runs past the end"))?;
            self.buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(error("a varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.buf.len() {
            return Err(error(format!(
                "a field of {n} bytes where {} are left",
                self.buf.len()
            )));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field's number and value, or `None` at the message's end.
    fn next(&mut self) -> Result<Option<(u64, Value<'a>)>> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let h =
            header(self.buf)?.ok_or_else(|| error("a field's key or length runs past the end"))?;
        let value = &self.take(h.len + h.value_len)?[h.len..];
        let value = match h.wire_type {
            0 => Value::Varint(Fields::new(value).varint()?),
            2 => Value::Bytes(value),
            _ => Value::Fixed,
        };
        Ok(Some((h.number, value)))
    }
}

/// Reads each field of `buf` with `each`, which ignores the ones it does not want.
fn message<'a>(buf: &'a [u8], mut each: impl FnMut(u64, Value<'a>) -> Result<()>) -> Result<()> {
    let mut fields = Fields::new(buf);
    while let Some((number, value)) = fields.next()? {
        each(number, value)?;
    }
    Ok(())
}

fn bytes<'a>(value: Value<'a>, field: &str) -> Result<&'a [u8]> {
    match value {
        Value::Bytes(b) => Ok(b),
        _ => Err(error(format!("{field} is not length-delimited"))),
    }
}

fn string(value: Value<'_>, field: &str) -> Result<String> {
    let b = bytes(value, field)?;
    String::from_utf8(b.to_vec()).map_err(|_| error(format!("{field} is not UTF-8")))
}

fn varint(value: Value<'_>, field: &str) -> Result<u64> {
    match value {
        Value::Varint(v) => Ok(v),
        _ => Err(error(format!("{field} is not a varint"))),
    }
}

/// An int32 as protobuf writes it: negative values sign-extended to 64 bits.
fn int32(value: Value<'_>, field: &str) -> Result<i32> {
    let v = varint(value, field)? as i64;
    i32::try_from(v).map_err(|_| error(format!("{field}: {v} is not an int32")))
}

fn boolean(value: Value<'_>, field: &str) -> Result<bool> {
    Ok(varint(value, field)? != 0)
}

/// A Go string that is not a pointer: empty is absent, as in JSON.
fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// A Go int32 that is not a pointer: zero is absent, as in JSON.
fn non_zero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// A repeated field, absent while empty (as JSON leaves out an empty slice).
fn push<T>(list: &mut Option<Vec<T>>, item: T) {
    list.get_or_insert_with(Vec::new).push(item);
}

/// One entry of a `map<string, string>`: a message of key 1 and value 2.
fn map_entry(
    value: Value<'_>,
    map: &mut Option<BTreeMap<String, String>>,
    field: &str,
) -> Result<()> {
    let (mut key, mut val) = (String::new(), String::new());
    message(bytes(value, field)?, |n, v| {
        match n {
            1 => key = string(v, field)?,
            2 => val = string(v, field)?,
            _ => {}
        }
        Ok(())
    })?;
    map.get_or_insert_with(BTreeMap::new).insert(key, val);
    Ok(())
}

/// Opens the `runtime.Unknown` envelope of a body: the encoded object inside.
pub fn unwrap(body: &[u8]) -> Result<&[u8]> {
    let inner = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| error("the body does not start with the API server's magic"))?;
    let mut raw = None;
    message(inner, |n, v| {
        match n {
            2 => raw = Some(bytes(v, "raw")?),
            3 => {
                let encoding = string(v, "contentEncoding")?;
                if !encoding.is_empty() {
                    return Err(error(format!("content encoding {encoding:?}")));
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    raw.ok_or_else(|| error("the envelope holds no object"))
}

fn object_meta(buf: &[u8]) -> Result<ObjectMeta> {
    let mut m = ObjectMeta::default();
    message(buf, |n, v| {
        match n {
            1 => m.name = non_empty(string(v, "metadata.name")?),
            3 => m.namespace = non_empty(string(v, "metadata.namespace")?),
            5 => m.uid = non_empty(string(v, "metadata.uid")?),
            6 => m.resource_version = non_empty(string(v, "metadata.resourceVersion")?),
            11 => map_entry(v, &mut m.labels, "metadata.labels")?,
            12 => map_entry(v, &mut m.annotations, "metadata.annotations")?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(m)
}

pub fn service(buf: &[u8]) -> Result<core::Service> {
    let mut svc = core::Service::default();
    message(buf, |n, v| {
        match n {
            1 => svc.metadata = object_meta(bytes(v, "metadata")?)?,
            2 => svc.spec = Some(service_spec(bytes(v, "spec")?)?),
            3 => svc.status = Some(service_status(bytes(v, "status")?)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(svc)
}

fn service_spec(buf: &[u8]) -> Result<core::ServiceSpec> {
    let mut s = core::ServiceSpec::default();
    message(buf, |n, v| {
        match n {
            1 => push(&mut s.ports, service_port(bytes(v, "spec.ports")?)?),
            2 => map_entry(v, &mut s.selector, "spec.selector")?,
            3 => s.cluster_ip = non_empty(string(v, "spec.clusterIP")?),
            4 => s.type_ = non_empty(string(v, "spec.type")?),
            5 => push(&mut s.external_ips, string(v, "spec.externalIPs")?),
            7 => s.session_affinity = non_empty(string(v, "spec.sessionAffinity")?),
            8 => s.load_balancer_ip = non_empty(string(v, "spec.loadBalancerIP")?),
            9 => push(
                &mut s.load_balancer_source_ranges,
                string(v, "spec.loadBalancerSourceRanges")?,
            ),
            10 => s.external_name = non_empty(string(v, "spec.externalName")?),
            11 => s.external_traffic_policy = non_empty(string(v, "spec.externalTrafficPolicy")?),
            12 => s.health_check_node_port = non_zero(int32(v, "spec.healthCheckNodePort")?),
            13 => {
                s.publish_not_ready_addresses =
                    boolean(v, "spec.publishNotReadyAddresses")?.then_some(true)
            }
            14 => {
                let mut config = core::SessionAffinityConfig::default();
                message(bytes(v, "spec.sessionAffinityConfig")?, |n, v| {
                    if n == 1 {
                        let mut client_ip = core::ClientIPConfig::default();
                        message(bytes(v, "clientIP")?, |n, v| {
                            if n == 1 {
                                client_ip.timeout_seconds = Some(int32(v, "timeoutSeconds")?);
                            }
                            Ok(())
                        })?;
                        config.client_ip = Some(client_ip);
                    }
                    Ok(())
                })?;
                s.session_affinity_config = Some(config);
            }
            17 => s.ip_family_policy = Some(string(v, "spec.ipFamilyPolicy")?),
            18 => push(&mut s.cluster_ips, string(v, "spec.clusterIPs")?),
            19 => push(&mut s.ip_families, string(v, "spec.ipFamilies")?),
            20 => {
                s.allocate_load_balancer_node_ports =
                    Some(boolean(v, "spec.allocateLoadBalancerNodePorts")?)
            }
            21 => s.load_balancer_class = Some(string(v, "spec.loadBalancerClass")?),
            22 => s.internal_traffic_policy = Some(string(v, "spec.internalTrafficPolicy")?),
            23 => s.traffic_distribution = Some(string(v, "spec.trafficDistribution")?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(s)
}

fn service_port(buf: &[u8]) -> Result<core::ServicePort> {
    let mut p = core::ServicePort::default();
    message(buf, |n, v| {
        match n {
            1 => p.name = non_empty(string(v, "name")?),
            2 => p.protocol = non_empty(string(v, "protocol")?),
            3 => p.port = int32(v, "port")?,
            4 => p.target_port = int_or_string(bytes(v, "targetPort")?)?,
            5 => p.node_port = non_zero(int32(v, "nodePort")?),
            6 => p.app_protocol = Some(string(v, "appProtocol")?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(p)
}

/// An IntOrString (type 1: 0 an int, 1 a string; intVal 2; strVal 3). Go's
/// zero value, the int 0, is what JSON's `omitempty` leaves out.
fn int_or_string(buf: &[u8]) -> Result<Option<IntOrString>> {
    let (mut is_string, mut int, mut text) = (false, 0, String::new());
    message(buf, |n, v| {
        match n {
            1 => is_string = varint(v, "targetPort.type")? == 1,
            2 => int = int32(v, "targetPort.intVal")?,
            3 => text = string(v, "targetPort.strVal")?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(match (is_string, int) {
        (true, _) => Some(IntOrString::String(text)),
        (false, 0) => None,
        (false, n) => Some(IntOrString::Int(n)),
    })
}

fn service_status(buf: &[u8]) -> Result<core::ServiceStatus> {
    let mut status = core::ServiceStatus::default();
    message(buf, |n, v| {
        if n == 1 {
            let mut lb = core::LoadBalancerStatus::default();
            message(bytes(v, "status.loadBalancer")?, |n, v| {
                if n == 1 {
                    push(&mut lb.ingress, ingress(bytes(v, "ingress")?)?);
                }
                Ok(())
            })?;
            status.load_balancer = Some(lb);
        }
        Ok(())
    })?;
    Ok(status)
}

fn ingress(buf: &[u8]) -> Result<core::LoadBalancerIngress> {
    let mut i = core::LoadBalancerIngress::default();
    message(buf, |n, v| {
        match n {
            1 => i.ip = non_empty(string(v, "ingress.ip")?),
            2 => i.hostname = non_empty(string(v, "ingress.hostname")?),
            3 => i.ip_mode = Some(string(v, "ingress.ipMode")?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(i)
}

pub fn endpoint_slice(buf: &[u8]) -> Result<discovery::EndpointSlice> {
    let mut slice = discovery::EndpointSlice::default();
    message(buf, |n, v| {
        match n {
            1 => slice.metadata = object_meta(bytes(v, "metadata")?)?,
            2 => push(&mut slice.endpoints, endpoint(bytes(v, "endpoints")?)?),
            3 => push(&mut slice.ports, endpoint_port(bytes(v, "ports")?)?),
            4 => slice.address_type = string(v, "addressType")?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(slice)
}

fn endpoint(buf: &[u8]) -> Result<discovery::Endpoint> {
    let mut ep = discovery::Endpoint::default();
    message(buf, |n, v| {
        match n {
            1 => ep.addresses.push(string(v, "addresses")?),
            2 => {
                let mut c = discovery::EndpointConditions::default();
                message(bytes(v, "conditions")?, |n, v| {
                    match n {
                        1 => c.ready = Some(boolean(v, "conditions.ready")?),
                        2 => c.serving = Some(boolean(v, "conditions.serving")?),
                        3 => c.terminating = Some(boolean(v, "conditions.terminating")?),
                        _ => {}
                    }
                    Ok(())
                })?;
                ep.conditions = Some(c);
            }
            3 => ep.hostname = Some(string(v, "hostname")?),
            6 => ep.node_name = Some(string(v, "nodeName")?),
            7 => ep.zone = Some(string(v, "zone")?),
            8 => {
                let mut h = discovery::EndpointHints::default();
                message(bytes(v, "hints")?, |n, v| {
                    let name = |v| -> Result<String> {
                        let mut name = String::new();
                        message(bytes(v, "hints")?, |n, v| {
                            if n == 1 {
                                name = string(v, "hints.name")?;
                            }
                            Ok(())
                        })?;
                        Ok(name)
                    };
                    match n {
                        1 => push(&mut h.for_zones, discovery::ForZone { name: name(v)? }),
                        2 => push(&mut h.for_nodes, discovery::ForNode { name: name(v)? }),
                        _ => {}
                    }
                    Ok(())
                })?;
                ep.hints = Some(h);
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(ep)
}

fn endpoint_port(buf: &[u8]) -> Result<discovery::EndpointPort> {
    let mut p = discovery::EndpointPort::default();
    message(buf, |n, v| {
        match n {
            1 => p.name = Some(string(v, "ports.name")?),
            2 => p.protocol = Some(string(v, "ports.protocol")?),
            3 => p.port = Some(int32(v, "ports.port")?),
            4 => p.app_protocol = Some(string(v, "ports.appProtocol")?),
            _ => {}
        }
        Ok(())
    })?;
    Ok(p)
}

/// The Status of a failed request (status 2, message 3, reason 4, code 6).
pub fn status(body: &[u8]) -> Result<kube::core::Status> {
    let (mut message_text, mut reason, mut code) = (String::new(), String::new(), 0);
    message(unwrap(body)?, |n, v| {
        match n {
            3 => message_text = string(v, "message")?,
            4 => reason = string(v, "reason")?,
            6 => code = int32(v, "code")?,
            _ => {}
        }
        Ok(())
    })?;
    let code = u16::try_from(code).map_err(|_| error(format!("code {code}")))?;
    Ok(kube::core::Status::failure(&message_text, &reason).with_code(code))
}

/// A field's key and, for a length-delimited field, its length: what comes
/// before its value.
struct Header {
    number: u64,
    wire_type: u64,
    /// Bytes of the key and the length.
    len: usize,
    /// Bytes of the value.
    value_len: usize,
}

/// The header of the field at the start of `buf`, or `None` while `buf` does
/// not hold all of it yet.
fn header(buf: &[u8]) -> Result<Option<Header>> {
    // A varint's value and length, or None if it is cut short.
    fn varint_at(buf: &[u8]) -> Result<Option<(u64, usize)>> {
        let mut fields = Fields::new(buf);
        match fields.varint() {
            Ok(v) => Ok(Some((v, buf.len() - fields.buf.len()))),
            Err(_) if buf.len() < 10 => Ok(None),
            Err(e) => Err(e),
        }
    }
    let Some((key, key_len)) = varint_at(buf)? else {
        return Ok(None);
    };
    let wire_type = key & 7;
    let (len, value_len) = match wire_type {
        0 => match varint_at(&buf[key_len..])? {
            Some((_, n)) => (key_len, n),
            None => return Ok(None),
        },
        1 => (key_len, 8),
        2 => match varint_at(&buf[key_len..])? {
            Some((n, n_len)) => (key_len + n_len, address(n)?),
            None => return Ok(None),
        },
        5 => (key_len, 4),
        t => return Err(error(format!("wire type {t} (field {})", key >> 3))),
    };
    Ok(Some(Header {
        number: key >> 3,
        wire_type,
        len,
        value_len,
    }))
}

/// A length as an offset in memory, or an error for one that cannot be: at
/// most `isize::MAX`, so that adding it to an offset in a body cannot overflow.
fn address(n: u64) -> Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= isize::MAX as usize)
        .ok_or_else(|| error("a length beyond the address space"))
}

/// Where a `ListReader` is in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Magic,
    /// In the envelope, before its `raw`.
    Envelope,
    /// In the list, which ends at this offset of the body.
    List {
        end: usize,
    },
    /// In the envelope, after its `raw`.
    Trailer,
}

/// Reads a list body as it arrives, one object at a time, so that a list of
/// any length is never held whole, neither as bytes nor as objects: only the
/// object being read and what has arrived after it.
///
/// The API server writes a list's metadata (resourceVersion, continue) before
/// its items, so both are known before the first object is returned.
pub struct ListReader<K> {
    buf: Vec<u8>,
    /// The offset in `buf` of the next byte to read.
    pos: usize,
    /// The offset in the body of `buf[0]`.
    base: usize,
    place: Place,
    item: fn(&[u8]) -> Result<K>,
    pub resource_version: Option<String>,
    pub continue_token: Option<String>,
}

/// Bytes read and dropped from the front of the buffer once there are this many.
const COMPACT_AT: usize = 1 << 16;

impl<K> ListReader<K> {
    pub fn new(item: fn(&[u8]) -> Result<K>) -> Self {
        ListReader {
            buf: Vec::new(),
            pos: 0,
            base: 0,
            place: Place::Magic,
            item,
            resource_version: None,
            continue_token: None,
        }
    }

    /// Takes the next bytes of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.pos >= COMPACT_AT {
            self.buf.drain(..self.pos);
            self.base += self.pos;
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next object, or `None` until more of the body has been fed.
    pub fn next_item(&mut self) -> Result<Option<K>> {
        loop {
            let rest = &self.buf[self.pos..];
            match self.place {
                Place::Magic => {
                    if rest.len() < MAGIC.len() {
                        return Ok(None);
                    }
                    if !rest.starts_with(MAGIC) {
                        return Err(error("the body does not start with the API server's magic"));
                    }
                    self.pos += MAGIC.len();
                    self.place = Place::Envelope;
                }
                Place::Envelope | Place::Trailer => {
                    let Some(h) = header(rest)? else {
                        return Ok(None);
                    };
                    if self.place == Place::Envelope && h.number == 2 && h.wire_type == 2 {
                        self.pos += h.len;
                        let end = self.base + self.pos + h.value_len;
                        self.place = Place::List { end };
                        continue;
                    }
                    if rest.len() < h.len + h.value_len {
                        return Ok(None);
                    }
                    if h.number == 3 && h.wire_type == 2 && h.value_len > 0 {
                        let encoding = String::from_utf8_lossy(&rest[h.len..h.len + h.value_len]);
                        return Err(error(format!("content encoding {encoding:?}")));
                    }
                    self.pos += h.len + h.value_len;
                }
                Place::List { end } => {
                    let left = end - (self.base + self.pos);
                    if left == 0 {
                        self.place = Place::Trailer;
                        continue;
                    }
                    let Some(h) = header(&rest[..rest.len().min(left)])? else {
                        if rest.len() >= left {
                            return Err(error("the list ends inside a field's header"));
                        }
                        return Ok(None);
                    };
                    let total = h.len + h.value_len;
                    if total > left {
                        return Err(error("an item runs past the list's end"));
                    }
                    if rest.len() < total {
                        return Ok(None);
                    }
                    let value = &rest[h.len..total];
                    self.pos += total;
                    match (h.number, h.wire_type) {
                        (1, 2) => {
                            let (rv, cont) = list_meta(value)?;
                            self.resource_version = rv;
                            self.continue_token = cont;
                        }
                        (2, 2) => return (self.item)(value).map(Some),
                        _ => {}
                    }
                }
            }
        }
    }

    /// At the body's end: an error unless all of it was read.
    pub fn finish(&mut self) -> Result<()> {
        match self.next_item()? {
            Some(_) => Err(error("objects left unread")),
            None if self.place == Place::Trailer && self.pos == self.buf.len() => Ok(()),
            None => Err(error("the body ends before the list does")),
        }
    }
}

/// Reads a watch's body as it arrives (`;stream=watch`): each event a frame of
/// a 4-byte big-endian length and a `metav1.WatchEvent` (type 1; object 2, a
/// `RawExtension` whose raw 1 is the object in its envelope, as a body is).
/// A bookmark's object is one of the kind's, with only its resourceVersion and
/// annotations; an error's is a Status.
pub struct WatchReader<K> {
    buf: Vec<u8>,
    pos: usize,
    item: fn(&[u8]) -> Result<K>,
}

/// The largest event read. The API server's own limit on an object is 1.5 MiB
/// in etcd, its request limit 3 MiB; a length above this is a corrupt stream,
/// not an object to wait for.
const MAX_EVENT: usize = 64 << 20;

impl<K: kube::Resource> WatchReader<K> {
    pub fn new(item: fn(&[u8]) -> Result<K>) -> Self {
        WatchReader {
            buf: Vec::new(),
            pos: 0,
            item,
        }
    }

    /// Takes the next bytes of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.pos >= COMPACT_AT || self.pos == self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next event, or `None` until more of the body has been fed.
    pub fn next_event(&mut self) -> Result<Option<WatchEvent<K>>> {
        let rest = &self.buf[self.pos..];
        let Some(len) = rest.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len > MAX_EVENT {
            return Err(error(format!("a watch event of {len} bytes")));
        }
        let Some(frame) = rest.get(4..4 + len) else {
            return Ok(None);
        };
        self.pos += 4 + len;
        let (kind, object) = watch_event(frame)?;
        let event = match kind.as_str() {
            "ADDED" => WatchEvent::Added((self.item)(unwrap(object)?)?),
            "MODIFIED" => WatchEvent::Modified((self.item)(unwrap(object)?)?),
            "DELETED" => WatchEvent::Deleted((self.item)(unwrap(object)?)?),
            "BOOKMARK" => {
                let mut obj = (self.item)(unwrap(object)?)?;
                let meta = obj.meta_mut();
                WatchEvent::Bookmark(Bookmark {
                    types: TypeMeta::default(),
                    metadata: BookmarkMeta {
                        resource_version: meta.resource_version.take().unwrap_or_default(),
                        annotations: meta.annotations.take().unwrap_or_default(),
                    },
                })
            }
            "ERROR" => WatchEvent::Error(Box::new(status(object)?)),
            other => return Err(error(format!("a watch event of type {other:?}"))),
        };
        Ok(Some(event))
    }

    /// At the body's end: an error if it ends inside an event.
    pub fn finish(&self) -> Result<()> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(error("the watch ends inside an event"))
        }
    }
}

/// A `metav1.WatchEvent`: its type, and its object still in its envelope.
fn watch_event(buf: &[u8]) -> Result<(String, &[u8])> {
    let (mut kind, mut object) = (String::new(), None);
    message(buf, |n, v| {
        match n {
            1 => kind = string(v, "type")?,
            2 => {
                message(bytes(v, "object")?, |n, v| {
                    if n == 1 {
                        object = Some(bytes(v, "object.raw")?);
                    }
                    Ok(())
                })?;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok((
        kind,
        object.ok_or_else(|| error("a watch event without an object"))?,
    ))
}

/// A ListMeta's resourceVersion (2) and continue token (3).
fn list_meta(buf: &[u8]) -> Result<(Option<String>, Option<String>)> {
    let (mut rv, mut cont) = (None, None);
    message(buf, |n, v| {
        match n {
            2 => rv = non_empty(string(v, "metadata.resourceVersion")?),
            3 => cont = non_empty(string(v, "metadata.continue")?),
            _ => {}
        }
        Ok(())
    })?;
    Ok((rv, cont))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectList;
    use std::path::PathBuf;

    /// Recorded from a real kube-apiserver by integration/k8s/record-protobuf.sh.
    fn fixture(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("integration/fixtures/kube-apiserver/protobuf")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// A whole body, fed `piece` bytes at a time: its objects, resourceVersion
    /// and continue token.
    fn read<K>(
        body: &[u8],
        piece: usize,
        item: fn(&[u8]) -> Result<K>,
    ) -> Result<(Vec<K>, ListReader<K>)> {
        let mut reader = ListReader::new(item);
        let mut items = Vec::new();
        for chunk in body.chunks(piece) {
            reader.feed(chunk);
            while let Some(obj) = reader.next_item()? {
                items.push(obj);
            }
        }
        reader.finish()?;
        Ok((items, reader))
    }

    /// What the decoder leaves out of the metadata: everything but name,
    /// namespace, uid, resourceVersion, labels and annotations.
    fn kept_meta(m: &mut ObjectMeta) {
        *m = ObjectMeta {
            name: m.name.take(),
            namespace: m.namespace.take(),
            uid: m.uid.take(),
            resource_version: m.resource_version.take(),
            labels: m.labels.take(),
            annotations: m.annotations.take(),
            ..ObjectMeta::default()
        };
    }

    /// A Service read from JSON as the decoder reads it from protobuf.
    fn decoded_service(svc: &mut core::Service) {
        kept_meta(&mut svc.metadata);
        // Not decoded: a Service's status conditions, an ingress's ports.
        if let Some(status) = &mut svc.status {
            status.conditions = None;
            for i in status
                .load_balancer
                .iter_mut()
                .flat_map(|lb| lb.ingress.iter_mut().flatten())
            {
                i.ports = None;
            }
        }
    }

    /// An EndpointSlice read from JSON as the decoder reads it from protobuf.
    fn decoded_slice(slice: &mut discovery::EndpointSlice) {
        kept_meta(&mut slice.metadata);
        // Not decoded: an endpoint's targetRef and deprecatedTopology. An
        // empty list reads as none, as kube-nft treats both.
        for ep in slice.endpoints.iter_mut().flatten() {
            ep.target_ref = None;
            ep.deprecated_topology = None;
        }
        slice.endpoints = slice.endpoints.take().filter(|e| !e.is_empty());
        slice.ports = slice.ports.take().filter(|p| !p.is_empty());
    }

    #[test]
    fn services_in_protobuf_decode_to_what_their_json_says() {
        let mut json: ObjectList<core::Service> =
            serde_json::from_slice(&fixture("services.json")).unwrap();
        json.items.iter_mut().for_each(decoded_service);
        let (items, reader) = read(&fixture("services.pb"), usize::MAX, service).unwrap();
        assert_eq!(items, json.items);
        assert_eq!(reader.resource_version, json.metadata.resource_version);
        assert_eq!(reader.continue_token, None);
        // Every field kube-nft reads is in the fixture, so a field read wrongly
        // shows above: check that the fixture still has them.
        let lb = items
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some("lb"))
            .unwrap();
        let spec = lb.spec.as_ref().unwrap();
        assert!(spec.health_check_node_port.is_some() && spec.external_ips.is_some());
        let ingress = lb
            .status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap();
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("Proxy"));
        let web = items
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some("web"))
            .unwrap();
        let spec = web.spec.as_ref().unwrap();
        assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
        assert_eq!(
            spec.ports.as_ref().unwrap()[0].target_port,
            Some(IntOrString::String("http".into()))
        );
    }

    #[test]
    fn endpoint_slices_in_protobuf_decode_to_what_their_json_says() {
        let mut json: ObjectList<discovery::EndpointSlice> =
            serde_json::from_slice(&fixture("endpointslices.json")).unwrap();
        json.items.iter_mut().for_each(decoded_slice);
        let (items, reader) =
            read(&fixture("endpointslices.pb"), usize::MAX, endpoint_slice).unwrap();
        assert_eq!(items, json.items);
        assert_eq!(reader.resource_version, json.metadata.resource_version);
        let web = items
            .iter()
            .find(|s| s.metadata.name.as_deref() == Some("web-abcde"))
            .unwrap();
        let first = &web.endpoints.as_ref().unwrap()[0];
        assert!(first.hints.as_ref().unwrap().for_nodes.is_some());
        assert_eq!(first.hostname.as_deref(), Some("web-0"));
    }

    #[test]
    fn a_body_read_in_pieces_of_any_size_gives_the_same_objects() {
        for name in ["services.pb", "endpointslices.pb"] {
            let body = fixture(name);
            let whole = read(&body, usize::MAX, endpoint_slice_or_service(name))
                .unwrap()
                .0;
            for piece in [1, 2, 3, 7, 64, 1000] {
                let (items, _) = read(&body, piece, endpoint_slice_or_service(name)).unwrap();
                assert_eq!(items, whole, "{name} in pieces of {piece}");
            }
        }
    }

    /// Either kind, as one type: the body's objects as their Debug text.
    fn endpoint_slice_or_service(name: &str) -> fn(&[u8]) -> Result<String> {
        if name.starts_with("services") {
            |b| service(b).map(|s| format!("{s:?}"))
        } else {
            |b| endpoint_slice(b).map(|s| format!("{s:?}"))
        }
    }

    #[test]
    fn a_page_gives_its_continue_token_before_its_first_object() {
        let body = fixture("services-page1.pb");
        let mut reader = ListReader::new(service);
        reader.feed(&body);
        let first = reader.next_item().unwrap().unwrap();
        assert!(reader.continue_token.is_some(), "no continue token");
        assert!(reader.resource_version.is_some());
        let all = read(&fixture("services.pb"), usize::MAX, service)
            .unwrap()
            .0;
        assert_eq!(first.metadata.name, all[0].metadata.name);
        assert!(reader.next_item().unwrap().is_some());
        assert!(reader.next_item().unwrap().is_none());
        reader.finish().unwrap();
    }

    #[test]
    fn a_refusal_gives_its_code_reason_and_message() {
        let status = status(&fixture("status-bad-continue.pb")).unwrap();
        assert_eq!(status.code, 400);
        assert_eq!(status.reason, "BadRequest");
        assert!(
            status.message.contains("invalid continue token"),
            "{}",
            status.message
        );
    }

    #[test]
    fn a_cut_or_foreign_body_is_an_error_not_a_panic() {
        let body = fixture("endpointslices.pb");
        // Cut anywhere: an error at the end, never a wrong object.
        for cut in [0, 3, 4, 10, body.len() / 2, body.len() - 1] {
            let result = read(&body[..cut], usize::MAX, endpoint_slice);
            assert!(result.is_err(), "cut at {cut} read as whole");
        }
        let json = fixture("endpointslices.json");
        let err = read(&json, usize::MAX, endpoint_slice).err().unwrap();
        assert!(err.to_string().contains("magic"), "{err}");
        // A field's length past the end of the list it is in.
        let mut bad = MAGIC.to_vec();
        bad.extend_from_slice(&[0x12, 3, 0x12, 9, 0]);
        assert!(read(&bad, usize::MAX, endpoint_slice).is_err());
        // A length past anything addressable, in the envelope and in the list.
        let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        for prefix in [&[0x12][..], &[0x12, 20, 0x12][..]] {
            let mut bad = MAGIC.to_vec();
            bad.extend_from_slice(prefix);
            bad.extend_from_slice(&huge);
            assert!(read(&bad, usize::MAX, endpoint_slice).is_err());
        }
        // A wire type protobuf has no more (a group).
        assert!(read(&[b'k', b'8', b's', 0, 0x0b], usize::MAX, endpoint_slice).is_err());
    }

    /// A watch body fed `piece` bytes at a time: its events, each as its type
    /// and its object (a bookmark: its resourceVersion and annotations).
    fn watch_events<K: kube::Resource + std::fmt::Debug>(
        body: &[u8],
        piece: usize,
        item: fn(&[u8]) -> Result<K>,
    ) -> Result<Vec<(&'static str, String)>> {
        let mut reader = WatchReader::new(item);
        let mut events = Vec::new();
        for chunk in body.chunks(piece) {
            reader.feed(chunk);
            while let Some(event) = reader.next_event()? {
                events.push(summary(event));
            }
        }
        reader.finish()?;
        Ok(events)
    }

    fn summary<K: std::fmt::Debug>(event: WatchEvent<K>) -> (&'static str, String) {
        match event {
            WatchEvent::Added(o) => ("ADDED", format!("{o:?}")),
            WatchEvent::Modified(o) => ("MODIFIED", format!("{o:?}")),
            WatchEvent::Deleted(o) => ("DELETED", format!("{o:?}")),
            WatchEvent::Bookmark(b) => (
                "BOOKMARK",
                format!(
                    "{} {:?}",
                    b.metadata.resource_version, b.metadata.annotations
                ),
            ),
            WatchEvent::Error(s) => ("ERROR", format!("{s:?}")),
        }
    }

    /// The same watch in JSON, one event a line, read as the decoder reads it.
    fn json_events<K: serde::de::DeserializeOwned + std::fmt::Debug>(
        body: &[u8],
        decoded: fn(&mut K),
    ) -> Vec<(&'static str, String)> {
        body.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|line| {
                let mut event: WatchEvent<K> = serde_json::from_slice(line).unwrap();
                if let WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) =
                    &mut event
                {
                    decoded(o);
                }
                summary(event)
            })
            .collect()
    }

    #[test]
    fn watch_streams_in_protobuf_decode_to_what_their_json_says() {
        let services = json_events(&fixture("watch-services.json"), decoded_service);
        let slices = json_events(&fixture("watch-endpointslices.json"), decoded_slice);
        for piece in [1, 3, 4, 5, 100, usize::MAX] {
            let pb = watch_events(&fixture("watch-services.pb"), piece, service).unwrap();
            assert_eq!(pb, services, "Services in pieces of {piece}");
            let pb =
                watch_events(&fixture("watch-endpointslices.pb"), piece, endpoint_slice).unwrap();
            assert_eq!(pb, slices, "EndpointSlices in pieces of {piece}");
        }
        // What the fixtures hold: the initial objects, the bookmark that ends
        // them, then a change and a deletion.
        for events in [&services, &slices] {
            let kinds: Vec<&str> = events.iter().map(|e| e.0).collect();
            let end = kinds.iter().position(|k| *k == "BOOKMARK").unwrap();
            assert!(
                end > 1 && kinds[..end].iter().all(|k| *k == "ADDED"),
                "{kinds:?}"
            );
            assert!(events[end]
                .1
                .contains("\"k8s.io/initial-events-end\": \"true\""));
            assert!(kinds[end..].contains(&"MODIFIED") && kinds[end..].contains(&"DELETED"));
        }
    }

    #[test]
    fn a_cut_or_broken_watch_is_an_error_not_a_panic() {
        let body = fixture("watch-services.pb");
        for cut in [1, 3, 5, body.len() / 2, body.len() - 1] {
            assert!(
                watch_events(&body[..cut], 7, service).is_err(),
                "cut at {cut}"
            );
        }
        // A length beyond any event: refused at once, not waited for.
        let mut reader = WatchReader::new(service);
        reader.feed(&[0xff, 0xff, 0xff, 0xff]);
        assert!(reader.next_event().is_err());
        // An event of no known type.
        let mut reader = WatchReader::new(service);
        reader.feed(&[0, 0, 0, 5, 0x0a, 3, b'B', b'A', b'D']);
        assert!(reader.next_event().is_err());
    }
}
