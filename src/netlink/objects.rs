//! The nf_tables objects as the kernel stores them: tables, chains, rules (as
//! expressions), sets and their elements, named objects (counters and
//! conntrack timeout policies), and the userdata TLVs
//! that `nft` writes beside them (comments, set key byte order). Both what we
//! write and what we read back are these types, which is what makes desired and
//! actual comparable.
//!
//! Each object's attributes are written by its `emit` and read by its `parse`,
//! side by side, with the kernel's `NFTA_*` names (the same layout serves a
//! NEW message and a dump's answer). `parse` takes the table the object must be
//! in and returns `None` for an object of another table.

use super::attr::{AttrWriter, Attrs, ParseError, Payload};
use super::expr::{
    parse_data, parse_list, write_verdict, Data, Expr, NFTA_DATA_VALUE, NFTA_DATA_VERDICT,
};
use crate::core::net::Family;
use crate::ruleset::{BaseChain, ChainType, Hook, Mapped};
use std::net::IpAddr;

// enum nft_table_attributes
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_TABLE_USERDATA: u16 = 6;
// enum nft_chain_attributes, nft_hook_attributes
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NF_ACCEPT: u32 = 1;
// enum nft_rule_attributes
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
// enum nft_set_attributes, nft_set_desc_attributes
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_OBJ_TYPE: u16 = 15;
const NFTA_SET_DESC_SIZE: u16 = 1;
/// `NFT_SET_ANONYMOUS`: a set that belongs to the rule using it.
const SET_F_ANONYMOUS: u32 = 0x1;
// enum nft_set_elem_list_attributes, nft_set_elem_attributes
pub(crate) const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub(crate) const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub(crate) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_OBJREF: u16 = 9;
// enum nft_object_attributes, nft_counter_attributes
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_OBJ_USERDATA: u16 = 8;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
// enum nft_ct_timeout_timeout_attributes
const NFTA_CT_TIMEOUT_L3PROTO: u16 = 1;
const NFTA_CT_TIMEOUT_L4PROTO: u16 = 2;
const NFTA_CT_TIMEOUT_DATA: u16 = 3;

/// `NFT_SET_MAP`.
pub const SET_F_MAP: u32 = 0x8;
/// `NFT_SET_TIMEOUT` and `NFT_SET_EVAL` (nft's `flags timeout` and `dynamic`).
pub const SET_F_TIMEOUT: u32 = 0x10;
pub const SET_F_EVAL: u32 = 0x20;
/// `NFT_SET_OBJECT`: a map whose values are stateful objects.
pub const SET_F_OBJECT: u32 = 0x40;
/// `NFT_DATA_VERDICT`: the data type of a verdict map.
pub const DATA_TYPE_VERDICT: u32 = 0xffff_ff00;
/// `NFT_OBJECT_COUNTER`.
pub const OBJECT_COUNTER: u32 = 1;
/// `NFT_OBJECT_CT_TIMEOUT`.
pub const OBJECT_CT_TIMEOUT: u32 = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTable {
    pub family: Family,
    pub name: String,
    pub userdata: Option<Vec<u8>>,
    /// Named objects, in creation order (as `nft` lists them).
    pub objects: Vec<KernelObject>,
    pub sets: Vec<KernelSet>,
    pub chains: Vec<KernelChain>,
}

impl KernelTable {
    /// A table with nothing read into it yet.
    pub fn empty(family: Family, name: &str) -> KernelTable {
        KernelTable {
            family,
            name: name.to_string(),
            userdata: None,
            objects: Vec::new(),
            sets: Vec::new(),
            chains: Vec::new(),
        }
    }

    pub fn id(&self) -> crate::ruleset::TableId {
        crate::ruleset::TableId::named(self.family, &self.name).expect("one of our tables")
    }
}

/// A named object of a table. A counter's values are state, so only name,
/// kind and comment describe one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelObject {
    pub name: String,
    pub kind: ObjectKind,
    pub userdata: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectKind {
    Counter,
    /// A conntrack timeout policy: the timeout of each state of the protocol,
    /// in seconds, indexed by `CTA_TIMEOUT_*` - 1 (every state, as `nft`
    /// sends them).
    CtTimeout {
        l3proto: u16,
        l4proto: u8,
        timeouts: Vec<u32>,
    },
}

impl ObjectKind {
    /// `NFTA_OBJ_TYPE`.
    pub fn type_id(&self) -> u32 {
        match self {
            ObjectKind::Counter => OBJECT_COUNTER,
            ObjectKind::CtTimeout { .. } => OBJECT_CT_TIMEOUT,
        }
    }

    /// What `nft` calls the kind.
    pub fn keyword(&self) -> &'static str {
        match self {
            ObjectKind::Counter => "counter",
            ObjectKind::CtTimeout { .. } => "ct timeout",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelChain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub userdata: Option<Vec<u8>>,
    pub rules: Vec<KernelRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRule {
    /// Assigned by the kernel; `None` for a rule not written yet.
    pub handle: Option<u64>,
    pub exprs: Vec<Expr>,
    pub userdata: Option<Vec<u8>>,
}

impl KernelRule {
    /// Same bytecode and comment, whatever the handle and counter values.
    pub fn same_as(&self, other: &KernelRule) -> bool {
        self.userdata == other.userdata
            && self.exprs.len() == other.exprs.len()
            && self
                .exprs
                .iter()
                .zip(&other.exprs)
                .all(|(a, b)| a.same_shape(b))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSet {
    pub name: String,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data_type: Option<u32>,
    /// The length of a value map's data (`NFTA_SET_DATA_LEN`); a verdict map's
    /// is the kernel's business (we send 0, it reports its own size).
    pub data_len: Option<u32>,
    /// The object type of an object map (`NFTA_SET_OBJ_TYPE`).
    pub obj_type: Option<u32>,
    /// Element timeout of a dynamic set, in milliseconds, and its size.
    pub timeout_ms: Option<u64>,
    pub size: Option<u32>,
    pub userdata: Option<Vec<u8>>,
    pub elements: Vec<KernelElement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelElement {
    pub key: Vec<u8>,
    pub data: Option<Mapped>,
    pub userdata: Option<Vec<u8>>,
}

// libnftnl's userdata TLVs (type u8, length u8, value), and nft's datatype ids.
pub const UDATA_COMMENT: u8 = 0; // table, chain, rule and element comments
pub const UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const UDATA_SET_DATABYTEORDER: u8 = 1;
pub const UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const UDATA_SET_DATA_TYPEOF: u8 = 4;
pub const UDATA_SET_DATA_INTERVAL: u8 = 6;
pub const UDATA_SET_COMMENT: u8 = 7;
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_HOST_ENDIAN: u32 = 1;
pub const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nft's `EXPR_CONCAT`, recorded as the "typeof" of a concatenated key.
pub const EXPR_CONCAT: u32 = 13;
/// nft's `EXPR_PAYLOAD`, `EXPR_META` and `EXPR_NUMGEN`, recorded in a "typeof".
pub const EXPR_PAYLOAD: u32 = 7;
pub const EXPR_META: u32 = 9;
pub const EXPR_NUMGEN: u32 = 23;
pub const TYPE_BITS: u32 = 6;

pub fn udata_tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

pub fn strz(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// The userdata `nft` writes for a table, chain, rule or element comment.
pub fn comment_udata(comment: &Option<String>) -> Option<Vec<u8>> {
    comment.as_ref().map(|c| {
        let mut out = Vec::new();
        udata_tlv(&mut out, UDATA_COMMENT, &strz(c));
        out
    })
}

/// Reads a comment back out of such userdata.
pub fn udata_comment(udata: &Option<Vec<u8>>, kind: u8) -> Option<String> {
    let mut rest = udata.as_deref()?;
    while rest.len() >= 2 {
        let (t, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if t == kind {
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return String::from_utf8(value[..end].to_vec()).ok();
        }
        rest = &rest[2 + len..];
    }
    None
}

pub fn comment_of(udata: &Option<Vec<u8>>) -> Option<String> {
    udata_comment(udata, UDATA_COMMENT)
}

pub fn set_comment_of(udata: &Option<Vec<u8>>) -> Option<String> {
    udata_comment(udata, UDATA_SET_COMMENT)
}

/// `NFT_TABLE_F_OWNER`: the table belongs to the netlink socket that made it,
/// which alone may change it; it goes when that socket closes, and a flush of
/// the whole ruleset passes it by (5.12).
pub const TABLE_F_OWNER: u32 = 0x2;

/// A table's own attributes (its contents are dumped apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableHeader {
    pub name: String,
    /// `NFT_TABLE_F_*`.
    pub flags: u32,
    pub userdata: Option<Vec<u8>>,
}

impl TableHeader {
    pub fn emit(&self, w: &mut AttrWriter) {
        w.put_str(NFTA_TABLE_NAME, &self.name);
        w.put_u32(NFTA_TABLE_FLAGS, self.flags);
        if let Some(u) = &self.userdata {
            w.put(NFTA_TABLE_USERDATA, u);
        }
    }

    /// The table an object message is about: its first attribute, in the
    /// message of a table, chain, rule, set, element list or object alike.
    pub fn parse_name(buf: &[u8]) -> Result<String, ParseError> {
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            if k == NFTA_TABLE_NAME {
                return Payload::new("table", k, p).string();
            }
        }
        Ok(String::new())
    }

    /// The flags are not read: every object message starts with its table's
    /// name, and this also reads that name from messages whose second
    /// attribute is something else.
    pub fn parse(buf: &[u8]) -> Result<TableHeader, ParseError> {
        let mut t = TableHeader {
            name: String::new(),
            flags: 0,
            userdata: None,
        };
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            match k {
                NFTA_TABLE_NAME => t.name = Payload::new("table", k, p).string()?,
                NFTA_TABLE_USERDATA => t.userdata = Some(p.to_vec()),
                _ => {}
            }
        }
        Ok(t)
    }
}

impl KernelChain {
    /// The chain's attributes (a NEWCHAIN creates it without rules).
    pub fn emit(&self, table: &str, w: &mut AttrWriter) {
        KernelChain::emit_name(table, &self.name, w);
        if let Some(base) = self.base {
            w.put_str(NFTA_CHAIN_TYPE, base.kind.name());
            w.put_u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
            w.nest(NFTA_CHAIN_HOOK, |w| {
                w.put_u32(NFTA_HOOK_HOOKNUM, base.hook.number());
                w.put_u32(NFTA_HOOK_PRIORITY, base.priority as u32);
            });
        }
        if let Some(u) = &self.userdata {
            w.put(NFTA_CHAIN_USERDATA, u);
        }
    }

    /// The attributes that name a chain (a delete carries only these).
    pub fn emit_name(table: &str, name: &str, w: &mut AttrWriter) {
        w.put_str(NFTA_CHAIN_TABLE, table);
        w.put_str(NFTA_CHAIN_NAME, name);
    }

    /// A chain of `table`, without its rules.
    pub fn parse(buf: &[u8], table: &str) -> Result<Option<KernelChain>, ParseError> {
        let (mut tname, mut name, mut kind, mut hook, mut prio, mut userdata) =
            (None, None, None, None, None, None);
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            let pl = Payload::new("chain", k, p);
            match k {
                NFTA_CHAIN_TABLE => tname = Some(pl.string()?),
                NFTA_CHAIN_NAME => name = Some(pl.string()?),
                NFTA_CHAIN_TYPE => kind = Some(pl.string()?),
                NFTA_CHAIN_USERDATA => userdata = Some(p.to_vec()),
                NFTA_CHAIN_HOOK => {
                    for h in Attrs::new(p) {
                        let (hk, hp) = h?;
                        let hp = Payload::new("chain hook", hk, hp);
                        match hk {
                            NFTA_HOOK_HOOKNUM => hook = Some(hp.u32()?),
                            NFTA_HOOK_PRIORITY => prio = Some(hp.u32()? as i32),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if tname.as_deref() != Some(table) {
            return Ok(None);
        }
        let base = match (kind.as_deref(), hook, prio) {
            (Some(kind), Some(hook), Some(priority)) => Some(BaseChain {
                kind: if kind == "nat" {
                    ChainType::Nat
                } else {
                    ChainType::Filter
                },
                hook: match hook {
                    0 => Hook::Prerouting,
                    1 => Hook::Input,
                    2 => Hook::Forward,
                    3 => Hook::Output,
                    _ => Hook::Postrouting,
                },
                priority,
            }),
            _ => None,
        };
        Ok(Some(KernelChain {
            name: name.unwrap_or_default(),
            base,
            userdata,
            rules: Vec::new(),
        }))
    }
}

impl KernelRule {
    /// The rule's attributes; `handle` names the rule a replace overwrites.
    pub fn emit(&self, table: &str, chain: &str, handle: Option<u64>, w: &mut AttrWriter) {
        KernelRule::emit_name(table, chain, handle, w);
        w.nest(NFTA_RULE_EXPRESSIONS, |w| {
            for e in &self.exprs {
                e.emit(w);
            }
        });
        if let Some(u) = &self.userdata {
            w.put(NFTA_RULE_USERDATA, u);
        }
    }

    /// The attributes that name a rule by handle, or with none every rule of
    /// the chain (a delete carries only these; without a handle it flushes).
    pub fn emit_name(table: &str, chain: &str, handle: Option<u64>, w: &mut AttrWriter) {
        w.put_str(NFTA_RULE_TABLE, table);
        w.put_str(NFTA_RULE_CHAIN, chain);
        if let Some(h) = handle {
            w.put_u64(NFTA_RULE_HANDLE, h);
        }
    }

    /// A rule of `table`, with the name of its chain.
    pub fn parse(buf: &[u8], table: &str) -> Result<Option<(String, KernelRule)>, ParseError> {
        let (mut tname, mut chain, mut handle, mut exprs, mut userdata) =
            (None, None, None, Vec::new(), None);
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            let pl = Payload::new("rule", k, p);
            match k {
                NFTA_RULE_TABLE => tname = Some(pl.string()?),
                NFTA_RULE_CHAIN => chain = Some(pl.string()?),
                NFTA_RULE_HANDLE => handle = Some(pl.u64()?),
                NFTA_RULE_EXPRESSIONS => exprs = parse_list(p)?,
                NFTA_RULE_USERDATA => userdata = Some(p.to_vec()),
                _ => {}
            }
        }
        if tname.as_deref() != Some(table) {
            return Ok(None);
        }
        Ok(chain.map(|c| {
            (
                c,
                KernelRule {
                    handle,
                    exprs,
                    userdata,
                },
            )
        }))
    }
}

impl KernelSet {
    /// The set's attributes (a NEWSET creates it without elements); `id` is
    /// the transaction-unique id the kernel requires of a new set.
    pub fn emit(&self, table: &str, id: u32, w: &mut AttrWriter) {
        KernelSet::emit_name(table, &self.name, w);
        w.put_u32(NFTA_SET_FLAGS, self.flags);
        w.put_u32(NFTA_SET_KEY_TYPE, self.key_type);
        w.put_u32(NFTA_SET_KEY_LEN, self.key_len);
        if let Some(d) = self.data_type {
            w.put_u32(NFTA_SET_DATA_TYPE, d);
            w.put_u32(NFTA_SET_DATA_LEN, self.data_len.unwrap_or(0));
        }
        if let Some(size) = self.size {
            w.nest(NFTA_SET_DESC, |w| w.put_u32(NFTA_SET_DESC_SIZE, size));
        }
        w.put_u32(NFTA_SET_ID, id);
        if let Some(t) = self.timeout_ms {
            w.put_u64(NFTA_SET_TIMEOUT, t);
        }
        if let Some(u) = &self.userdata {
            w.put(NFTA_SET_USERDATA, u);
        }
        if let Some(t) = self.obj_type {
            w.put_u32(NFTA_SET_OBJ_TYPE, t);
        }
    }

    /// The attributes that name a set (a delete carries only these).
    pub fn emit_name(table: &str, name: &str, w: &mut AttrWriter) {
        w.put_str(NFTA_SET_TABLE, table);
        w.put_str(NFTA_SET_NAME, name);
    }

    /// A named set of `table`, without its elements. Anonymous sets belong to
    /// the rules that use them, not to the table's sets: `None`.
    pub fn parse(buf: &[u8], table: &str) -> Result<Option<KernelSet>, ParseError> {
        let mut set = KernelSet::default();
        let mut tname = None;
        let mut data_len = None;
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            let pl = Payload::new("set", k, p);
            match k {
                NFTA_SET_TABLE => tname = Some(pl.string()?),
                NFTA_SET_NAME => set.name = pl.string()?,
                NFTA_SET_FLAGS => set.flags = pl.u32()?,
                NFTA_SET_KEY_TYPE => set.key_type = pl.u32()?,
                NFTA_SET_KEY_LEN => set.key_len = pl.u32()?,
                NFTA_SET_DATA_TYPE => set.data_type = Some(pl.u32()?),
                NFTA_SET_DATA_LEN => data_len = Some(pl.u32()?),
                NFTA_SET_DESC => {
                    for a in Attrs::new(p) {
                        let (k, v) = a?;
                        if k == NFTA_SET_DESC_SIZE {
                            set.size = Some(Payload::new("set desc", k, v).u32()?);
                        }
                    }
                }
                NFTA_SET_TIMEOUT => set.timeout_ms = Some(pl.u64()?),
                NFTA_SET_USERDATA => set.userdata = Some(p.to_vec()),
                NFTA_SET_OBJ_TYPE => set.obj_type = Some(pl.u32()?),
                _ => {}
            }
        }
        if tname.as_deref() != Some(table) || set.flags & SET_F_ANONYMOUS != 0 {
            return Ok(None);
        }
        if set.data_type.is_some_and(|t| t != DATA_TYPE_VERDICT) {
            set.data_len = data_len;
        }
        Ok(Some(set))
    }
}

impl KernelElement {
    /// One element of an element list; a delete names the key alone.
    pub fn emit(&self, with_data: bool, w: &mut AttrWriter) {
        w.nest(NFTA_LIST_ELEM, |w| {
            w.nest(NFTA_SET_ELEM_KEY, |w| w.put(NFTA_DATA_VALUE, &self.key));
            if !with_data {
                return;
            }
            match &self.data {
                Some(Mapped::Verdict(v)) => w.nest(NFTA_SET_ELEM_DATA, |w| {
                    w.nest(NFTA_DATA_VERDICT, |w| write_verdict(w, v))
                }),
                Some(Mapped::Counter(name)) => w.put_str(NFTA_SET_ELEM_OBJREF, name),
                Some(Mapped::Endpoint(addr, port)) => w.nest(NFTA_SET_ELEM_DATA, |w| {
                    w.put(NFTA_DATA_VALUE, &endpoint_bytes(addr, *port))
                }),
                None => {}
            }
            if let Some(u) = &self.userdata {
                w.put(NFTA_SET_ELEM_USERDATA, u);
            }
        });
    }

    /// The set an element-list message is about.
    pub fn list_set(buf: &[u8]) -> Result<Option<String>, ParseError> {
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            if k == NFTA_SET_ELEM_LIST_SET {
                return Payload::new("element list", k, p).string().map(Some);
            }
        }
        Ok(None)
    }

    /// The elements of an element-list message (NEWSETELEM, or a dump's answer).
    pub fn parse_list(buf: &[u8]) -> Result<Vec<KernelElement>, ParseError> {
        let mut out = Vec::new();
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            if k != NFTA_SET_ELEM_LIST_ELEMENTS {
                continue;
            }
            for e in Attrs::new(p) {
                let (_, ep) = e?;
                let mut el = KernelElement {
                    key: Vec::new(),
                    data: None,
                    userdata: None,
                };
                for f in Attrs::new(ep) {
                    let (fk, fp) = f?;
                    match fk {
                        NFTA_SET_ELEM_KEY => {
                            if let Data::Value(v) = parse_data(fp)? {
                                el.key = v;
                            }
                        }
                        NFTA_SET_ELEM_DATA => {
                            el.data = match parse_data(fp)? {
                                Data::Verdict(v) => Some(Mapped::Verdict(v)),
                                Data::Value(v) => endpoint_of(&v),
                            }
                        }
                        NFTA_SET_ELEM_USERDATA => el.userdata = Some(fp.to_vec()),
                        NFTA_SET_ELEM_OBJREF => {
                            let name = Payload::new("element", fk, fp).string()?;
                            el.data = Some(Mapped::Counter(name));
                        }
                        _ => {}
                    }
                }
                out.push(el);
            }
        }
        Ok(out)
    }
}

/// An endpoint as an endpoint map's data holds it: the address, then the port
/// in network byte order padded to a 32-bit register, as in a concatenation.
pub fn endpoint_bytes(addr: &IpAddr, port: u16) -> Vec<u8> {
    let mut out = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

/// The endpoint in a map element's data; `None` for data of another shape.
pub fn endpoint_of(v: &[u8]) -> Option<Mapped> {
    let (addr, port) = match v.len() {
        8 => (IpAddr::from(<[u8; 4]>::try_from(&v[..4]).ok()?), &v[4..6]),
        20 => (
            IpAddr::from(<[u8; 16]>::try_from(&v[..16]).ok()?),
            &v[16..18],
        ),
        _ => return None,
    };
    Some(Mapped::Endpoint(
        addr,
        u16::from_be_bytes([port[0], port[1]]),
    ))
}

/// A named object as a dump shows it, with a counter's values (zero for
/// other kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectReading {
    pub object: KernelObject,
    pub packets: u64,
    pub bytes: u64,
}

impl KernelObject {
    /// A counter at zero (a create that finds it existing keeps its values),
    /// or a timeout policy.
    pub fn emit(&self, table: &str, w: &mut AttrWriter) {
        KernelObject::emit_name(table, self.kind.type_id(), &self.name, w);
        w.nest(NFTA_OBJ_DATA, |w| match &self.kind {
            ObjectKind::Counter => {
                w.put_u64(NFTA_COUNTER_BYTES, 0);
                w.put_u64(NFTA_COUNTER_PACKETS, 0);
            }
            ObjectKind::CtTimeout {
                l3proto,
                l4proto,
                timeouts,
            } => {
                w.put(NFTA_CT_TIMEOUT_L3PROTO, &l3proto.to_be_bytes());
                w.put(NFTA_CT_TIMEOUT_L4PROTO, &[*l4proto]);
                w.nest(NFTA_CT_TIMEOUT_DATA, |w| {
                    for (i, t) in timeouts.iter().enumerate() {
                        w.put_u32(i as u16 + 1, *t);
                    }
                });
            }
        });
        if let Some(u) = &self.userdata {
            w.put(NFTA_OBJ_USERDATA, u);
        }
    }

    /// The attributes that name an object (a delete carries only these).
    pub fn emit_name(table: &str, type_id: u32, name: &str, w: &mut AttrWriter) {
        w.put_str(NFTA_OBJ_TABLE, table);
        w.put_str(NFTA_OBJ_NAME, name);
        w.put_u32(NFTA_OBJ_TYPE, type_id);
    }

    /// An object of `table` of a kind we write; `None` for any other.
    pub fn parse(buf: &[u8], table: &str) -> Result<Option<ObjectReading>, ParseError> {
        let (mut tname, mut name, mut type_id, mut userdata) = (None, None, None, None);
        let mut data: &[u8] = &[];
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            let pl = Payload::new("object", k, p);
            match k {
                NFTA_OBJ_TABLE => tname = Some(pl.string()?),
                NFTA_OBJ_NAME => name = Some(pl.string()?),
                NFTA_OBJ_TYPE => type_id = Some(pl.u32()?),
                NFTA_OBJ_DATA => data = p,
                NFTA_OBJ_USERDATA => userdata = Some(p.to_vec()),
                _ => {}
            }
        }
        let (Some(name), Some(type_id)) = (name, type_id) else {
            return Ok(None);
        };
        if tname.as_deref() != Some(table) {
            return Ok(None);
        }
        let (mut packets, mut bytes) = (0, 0);
        let kind = match type_id {
            OBJECT_COUNTER => {
                for c in Attrs::new(data) {
                    let (ck, cp) = c?;
                    let pl = Payload::new("counter", ck, cp);
                    match ck {
                        NFTA_COUNTER_BYTES => bytes = pl.u64()?,
                        NFTA_COUNTER_PACKETS => packets = pl.u64()?,
                        _ => {}
                    }
                }
                ObjectKind::Counter
            }
            OBJECT_CT_TIMEOUT => {
                let (mut l3proto, mut l4proto, mut timeouts) = (0, 0, Vec::new());
                for c in Attrs::new(data) {
                    let (ck, cp) = c?;
                    let pl = Payload::new("ct timeout", ck, cp);
                    match ck {
                        NFTA_CT_TIMEOUT_L3PROTO => l3proto = pl.u16()?,
                        NFTA_CT_TIMEOUT_L4PROTO => l4proto = pl.u8()?,
                        NFTA_CT_TIMEOUT_DATA => {
                            for t in Attrs::new(cp) {
                                let (tk, tp) = t?;
                                let at = usize::from(tk).saturating_sub(1);
                                if timeouts.len() <= at {
                                    timeouts.resize(at + 1, 0);
                                }
                                timeouts[at] = Payload::new("ct timeout", tk, tp).u32()?;
                            }
                        }
                        _ => {}
                    }
                }
                ObjectKind::CtTimeout {
                    l3proto,
                    l4proto,
                    timeouts,
                }
            }
            _ => return Ok(None),
        };
        Ok(Some(ObjectReading {
            object: KernelObject {
                name,
                kind,
                userdata,
            },
            packets,
            bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::net::Protocol;
    use crate::ruleset::CtTimeoutPolicy;

    /// A timeout policy goes out with every state of its protocol and comes back
    /// as the policy that set some of them.
    #[test]
    fn a_timeout_policy_round_trips_through_its_attributes() {
        let policy = CtTimeoutPolicy {
            protocol: Protocol::Tcp,
            set: vec![("established", 7200)],
        };
        let timeouts = policy.timeouts();
        assert_eq!(timeouts.len(), 11);
        assert_eq!(timeouts[2], 7200);
        let object = KernelObject {
            name: "timeout-x".into(),
            kind: ObjectKind::CtTimeout {
                l3proto: 10,
                l4proto: 6,
                timeouts: timeouts.clone(),
            },
            userdata: None,
        };
        let mut w = AttrWriter::new();
        object.emit("t", &mut w);
        let read = KernelObject::parse(&w.into_bytes(), "t").unwrap().unwrap();
        assert_eq!(read.object, object);
        assert_eq!(
            CtTimeoutPolicy::from_timeouts(Protocol::Tcp, &timeouts),
            Some(policy)
        );
        // Another table's object, or a kind we do not write, is not ours.
        let mut w = AttrWriter::new();
        object.emit("other", &mut w);
        assert_eq!(KernelObject::parse(&w.into_bytes(), "t").unwrap(), None);
        let mut w = AttrWriter::new();
        KernelObject::emit_name("t", 2, "a-quota", &mut w);
        assert_eq!(KernelObject::parse(&w.into_bytes(), "t").unwrap(), None);
    }
}
