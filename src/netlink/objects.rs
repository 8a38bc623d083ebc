//! The nf_tables objects as the kernel stores them: tables, chains, rules (as
//! expressions), sets and their elements, named counters, and the userdata TLVs
//! that `nft` writes beside them (comments, set key byte order). Both what we
//! write and what we read back are these types, which is what makes desired and
//! actual comparable.

use super::expr::Expr;
use crate::ruleset::{BaseChain, Family, Mapped};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTable {
    pub family: Family,
    pub name: String,
    pub userdata: Option<Vec<u8>>,
    pub counters: Vec<KernelCounter>,
    pub sets: Vec<KernelSet>,
    pub chains: Vec<KernelChain>,
}

impl KernelTable {
    pub fn id(&self) -> crate::ruleset::TableId {
        crate::ruleset::TableId::named(self.family, &self.name).expect("one of our tables")
    }
}

/// A named counter object; its values are state, so only name and comment
/// describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCounter {
    pub name: String,
    pub userdata: Option<Vec<u8>>,
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
pub const UDATA_SET_DATA_INTERVAL: u8 = 6;
pub const UDATA_SET_COMMENT: u8 = 7;
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nft's `EXPR_CONCAT`, recorded as the "typeof" of a concatenated key.
pub const EXPR_CONCAT: u32 = 13;
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
