//! Netlink attributes (TLVs): a writer that emits them and a reader that walks them.
//!
//! Owns only the generic `nlattr` framing (length, type, 4-byte padding, the nested
//! flag). What each attribute means lives with the object that uses it.

/// Set on the type of an attribute whose payload is itself a list of attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLA_HDRLEN: usize = 4;

/// An address attribute's payload: 4 bytes IPv4, 16 bytes IPv6.
pub fn ip_from_bytes(p: &[u8]) -> Option<std::net::IpAddr> {
    match p.len() {
        4 => Some(<[u8; 4]>::try_from(p).ok()?.into()),
        16 => Some(<[u8; 16]>::try_from(p).ok()?.into()),
        _ => None,
    }
}

pub fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends attributes to a buffer; nests are opened and closed in LIFO order.
#[derive(Default)]
pub struct AttrWriter {
    buf: Vec<u8>,
}

impl AttrWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes onto the end of an existing message buffer.
    pub fn over(buf: Vec<u8>) -> Self {
        Self { buf }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn put(&mut self, kind: u16, payload: &[u8]) {
        let len = NLA_HDRLEN + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// nf_tables integers are big endian on the wire.
    pub fn put_u32(&mut self, kind: u16, v: u32) {
        self.put(kind, &v.to_be_bytes());
    }

    pub fn put_u64(&mut self, kind: u16, v: u64) {
        self.put(kind, &v.to_be_bytes());
    }

    /// Host byte order, as generic netlink families such as IPVS use.
    pub fn put_u16_host(&mut self, kind: u16, v: u16) {
        self.put(kind, &v.to_ne_bytes());
    }

    pub fn put_u32_host(&mut self, kind: u16, v: u32) {
        self.put(kind, &v.to_ne_bytes());
    }

    /// A NUL-terminated string, as the kernel's NLA_STRING policy expects.
    pub fn put_str(&mut self, kind: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(kind, &v);
    }

    pub fn begin_nest(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    pub fn end_nest(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn nest(&mut self, kind: u16, body: impl FnOnce(&mut AttrWriter)) {
        let at = self.begin_nest(kind);
        body(self);
        self.end_nest(at);
    }
}

/// Why a buffer could not be read as the attributes we expect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("truncated netlink attribute")]
    Truncated,
    #[error("attribute {kind} of {context}: {problem}")]
    Bad {
        context: &'static str,
        kind: u16,
        problem: &'static str,
    },
    #[error("{context}: missing attribute {kind}")]
    Missing { context: &'static str, kind: u16 },
    #[error("unknown expression `{0}`")]
    UnknownExpr(String),
}

/// Iterates over the attributes in a buffer, yielding `(type, payload)`.
pub struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { rest: buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([self.rest[0], self.rest[1]]) as usize;
        let kind = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > self.rest.len() {
            self.rest = &[];
            return Some(Err(ParseError::Truncated));
        }
        let payload = &self.rest[NLA_HDRLEN..len];
        self.rest = &self.rest[align4(len).min(self.rest.len())..];
        Some(Ok((kind, payload)))
    }
}

/// Typed accessors for attribute payloads, each naming the context on failure.
pub struct Payload<'a> {
    pub context: &'static str,
    pub kind: u16,
    pub bytes: &'a [u8],
}

impl<'a> Payload<'a> {
    pub fn new(context: &'static str, kind: u16, bytes: &'a [u8]) -> Self {
        Self {
            context,
            kind,
            bytes,
        }
    }

    fn bad(&self, problem: &'static str) -> ParseError {
        ParseError::Bad {
            context: self.context,
            kind: self.kind,
            problem,
        }
    }

    pub fn u32(&self) -> Result<u32, ParseError> {
        let b: [u8; 4] = self
            .bytes
            .try_into()
            .map_err(|_| self.bad("expected 4 bytes"))?;
        Ok(u32::from_be_bytes(b))
    }

    pub fn u64(&self) -> Result<u64, ParseError> {
        let b: [u8; 8] = self
            .bytes
            .try_into()
            .map_err(|_| self.bad("expected 8 bytes"))?;
        Ok(u64::from_be_bytes(b))
    }

    /// A port or other 16-bit field in network byte order.
    pub fn u16(&self) -> Result<u16, ParseError> {
        let b: [u8; 2] = self
            .bytes
            .try_into()
            .map_err(|_| self.bad("expected 2 bytes"))?;
        Ok(u16::from_be_bytes(b))
    }

    pub fn u16_host(&self) -> Result<u16, ParseError> {
        let b: [u8; 2] = self
            .bytes
            .try_into()
            .map_err(|_| self.bad("expected 2 bytes"))?;
        Ok(u16::from_ne_bytes(b))
    }

    pub fn u32_host(&self) -> Result<u32, ParseError> {
        let b: [u8; 4] = self
            .bytes
            .try_into()
            .map_err(|_| self.bad("expected 4 bytes"))?;
        Ok(u32::from_ne_bytes(b))
    }

    pub fn u8(&self) -> Result<u8, ParseError> {
        self.bytes.first().copied().ok_or(self.bad("empty"))
    }

    pub fn string(&self) -> Result<String, ParseError> {
        let end = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.bytes.len());
        String::from_utf8(self.bytes[..end].to_vec()).map_err(|_| self.bad("not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip_with_padding() {
        let mut w = AttrWriter::new();
        w.put_str(1, "kube-nft");
        w.nest(4, |w| {
            w.put_u32(1, 3);
            w.put(2, &[0xff, 0xff, 0xff, 0x9c]);
        });
        let bytes = w.into_bytes();
        assert_eq!(bytes.len() % 4, 0);
        let attrs: Vec<_> = Attrs::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].0, 1);
        assert_eq!(
            Payload::new("t", 1, attrs[0].1).string().unwrap(),
            "kube-nft"
        );
        let inner: Vec<_> = Attrs::new(attrs[1].1).map(Result::unwrap).collect();
        assert_eq!(Payload::new("t", 1, inner[0].1).u32().unwrap(), 3);
        assert_eq!(inner[1].1, &[0xff, 0xff, 0xff, 0x9c]);
    }

    #[test]
    fn truncated_attribute_is_an_error_not_a_panic() {
        let bytes = [200u8, 0, 1, 0, 0, 0];
        assert_eq!(
            Attrs::new(&bytes).next().unwrap(),
            Err(ParseError::Truncated)
        );
    }
}
