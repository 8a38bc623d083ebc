//! nf_tables expressions as the kernel sees them: one `Expr` per kernel expression,
//! with `emit` and `parse` as each other's inverse.
//!
//! Only the expressions kube-nft writes are here. Anything else found in our table
//! (someone edited it by hand) parses as `Expr::Other`, so a readback never fails on
//! it and a diff sees it as different.

use super::attr::{AttrWriter, Attrs, ParseError, Payload};
use crate::ruleset::Verdict;

// enum nft_list_attributes / nft_expr_attributes
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
// enum nft_data_attributes / nft_verdict_attributes
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

// Expression names, as the kernel registers them: the one list of them.
const PAYLOAD: &str = "payload";
const META: &str = "meta";
const CMP: &str = "cmp";
const BITWISE: &str = "bitwise";
const LOOKUP: &str = "lookup";
const IMMEDIATE: &str = "immediate";
const NUMGEN: &str = "numgen";
const NAT: &str = "nat";
const MASQ: &str = "masq";
const REJECT: &str = "reject";
const CT: &str = "ct";
const OBJREF: &str = "objref";
const FIB: &str = "fib";
const DYNSET: &str = "dynset";
const COUNTER: &str = "counter";
const BYTEORDER: &str = "byteorder";
const FLOW_OFFLOAD: &str = "flow_offload";
const KNOWN: [&str; 17] = [
    PAYLOAD,
    META,
    CMP,
    BITWISE,
    LOOKUP,
    IMMEDIATE,
    NUMGEN,
    NAT,
    MASQ,
    REJECT,
    CT,
    OBJREF,
    FIB,
    DYNSET,
    COUNTER,
    BYTEORDER,
    FLOW_OFFLOAD,
];

// Each expression's attributes (enum nft_<expr>_attributes).
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_PAYLOAD_SREG: u16 = 5;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_META_SREG: u16 = 3;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_BITWISE_OP: u16 = 6;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
const NFTA_LOOKUP_FLAGS: u16 = 5;
const NFT_LOOKUP_F_INV: u32 = 1;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NG_DREG: u16 = 1;
const NFTA_NG_MODULUS: u16 = 2;
const NFTA_NG_TYPE: u16 = 3;
const NFTA_NG_OFFSET: u16 = 4;
const NFT_NG_RANDOM: u32 = 1;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
const NFTA_NAT_FLAGS: u16 = 7;
const NFT_NAT_DNAT: u32 = 1;
const NFTA_MASQ_FLAGS: u16 = 1;
const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_CT_DIRECTION: u16 = 3;
const NFTA_CT_SREG: u16 = 4;
const NFTA_FLOW_TABLE_NAME: u16 = 1;
const NFTA_OBJREF_IMM_TYPE: u16 = 1;
const NFTA_OBJREF_IMM_NAME: u16 = 2;
const NFTA_OBJREF_SET_SREG: u16 = 3;
const NFTA_OBJREF_SET_NAME: u16 = 4;
const NFTA_DYNSET_SET_NAME: u16 = 1;
const NFTA_DYNSET_OP: u16 = 3;
const NFTA_DYNSET_SREG_KEY: u16 = 4;
const NFTA_DYNSET_SREG_DATA: u16 = 5;
const NFTA_DYNSET_TIMEOUT: u16 = 6;
const NFTA_DYNSET_EXPR: u16 = 7;
const NFTA_DYNSET_PAD: u16 = 8;
const NFTA_FIB_DREG: u16 = 1;
const NFTA_FIB_RESULT: u16 = 2;
const NFTA_FIB_FLAGS: u16 = 3;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFT_BYTEORDER_HTON: u32 = 1;

// Verdict codes: NF_DROP, NF_ACCEPT and the nf_tables extensions (negative).
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// `NFT_REG_VERDICT`; data registers start at 1 (16-byte) or 8 (32-bit).
pub const REG_VERDICT: u32 = 0;
pub const REG_1: u32 = 1;
pub const REG_2: u32 = 2;

/// The register `nft` uses for the 32-bit slot `slot` (0-based) of a concatenation:
/// the 16-byte name where the slot starts one, else the 32-bit name.
pub fn reg32(slot: u32) -> u32 {
    if slot.is_multiple_of(4) {
        REG_1 + slot / 4
    } else {
        8 + slot
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    Network = 1,
    Transport = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey {
    Mark = 3,
    L4Proto = 16,
}

/// `enum nft_ct_keys` values we load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtKey {
    State = 0,
    Direction = 1,
    /// The connection's 128 label bits (`ct label`).
    Labels = 13,
    /// Packets counted in one direction (`ct original packets`): 64 bits,
    /// host endian; conntrack accounting counts them.
    Packets = 14,
}

impl CtKey {
    fn from_number(n: u32) -> Option<CtKey> {
        Some(match n {
            0 => CtKey::State,
            1 => CtKey::Direction,
            13 => CtKey::Labels,
            14 => CtKey::Packets,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq = 0,
    Neq = 1,
    /// Less than, comparing the bytes as a big-endian number.
    Lt = 2,
    /// Greater than, likewise.
    Gt = 4,
}

/// nf_nat_range flags we use.
pub const NAT_PROTO_SPECIFIED: u32 = 0x2;
/// `NFT_DYNSET_OP_UPDATE`: add the key, or refresh its timeout.
pub const DYNSET_OP_UPDATE: u32 = 1;
/// `NFT_FIB_RESULT_ADDRTYPE`: the route type of the looked-up address.
pub const FIB_RESULT_ADDRTYPE: u32 = 3;
/// `NFTA_FIB_F_SADDR`: look up the source address.
pub const FIB_F_SADDR: u32 = 1;
pub const NAT_MAP_IPS: u32 = 0x1;
pub const NAT_RANDOM_FULLY: u32 = 0x10;

/// What an `immediate` or a map element carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Data {
    Value(Vec<u8>),
    Verdict(Verdict),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Payload {
        dreg: u32,
        base: PayloadBase,
        offset: u32,
        len: u32,
    },
    Meta {
        dreg: u32,
        key: MetaKey,
    },
    MetaSet {
        sreg: u32,
        key: MetaKey,
    },
    Cmp {
        sreg: u32,
        op: CmpOp,
        data: Vec<u8>,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    Lookup {
        sreg: u32,
        set: String,
        dreg: Option<u32>,
        invert: bool,
    },
    Immediate {
        dreg: u32,
        data: Data,
    },
    /// `numgen random mod N` (type 1, offset 0).
    Numgen {
        dreg: u32,
        modulus: u32,
    },
    /// Host to network byte order, `len` bytes in words of `size` (what `nft`
    /// puts before comparing a host-endian value for order).
    Hton {
        sreg: u32,
        dreg: u32,
        len: u32,
        size: u32,
    },
    /// Destination NAT to the address in `addr_reg` and port in `proto_reg`.
    Dnat {
        family: u8,
        addr_reg: u32,
        proto_reg: Option<u32>,
        flags: u32,
    },
    Masq {
        flags: u32,
    },
    Reject {
        kind: u32,
        code: u8,
    },
    /// `update @set { key }` (NFT_DYNSET_OP_UPDATE), no per-rule timeout.
    DynsetUpdate {
        sreg: u32,
        set: String,
    },
    /// `fib` lookup; kube-nft uses the address type of the source.
    Fib {
        dreg: u32,
        result: u32,
        flags: u32,
    },
    /// A connection-tracking key of the packet's own flow loaded into a
    /// register; of one direction of it (`IP_CT_DIR_*`) where one is given.
    Ct {
        dreg: u32,
        key: CtKey,
        direction: Option<u8>,
    },
    /// Sets a connection-tracking key from a register (`ct label set`).
    CtSet {
        sreg: u32,
        key: CtKey,
    },
    /// `flow add @name`: the connection goes into that flowtable.
    FlowOffload {
        flowtable: String,
    },
    /// The named object of that type (`NFT_OBJECT_*`): `ct timeout set "name"`.
    Objref {
        obj_type: u32,
        name: String,
    },
    /// `counter name <key> map @set`: the counter object the map holds for the key.
    ObjrefMap {
        sreg: u32,
        set: String,
    },
    /// Counter values are state, not shape: two counters compare equal whatever they hold.
    Counter {
        packets: u64,
        bytes: u64,
    },
    /// An expression kube-nft never writes, kept by name so a diff can see it.
    Other(String),
}

fn write_data(w: &mut AttrWriter, kind: u16, data: &Data) {
    w.nest(kind, |w| match data {
        Data::Value(v) => w.put(NFTA_DATA_VALUE, v),
        Data::Verdict(v) => w.nest(NFTA_DATA_VERDICT, |w| write_verdict(w, v)),
    });
}

pub fn write_verdict(w: &mut AttrWriter, v: &Verdict) {
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    w.put_u32(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        w.put_str(NFTA_VERDICT_CHAIN, c);
    }
}

pub fn parse_verdict(buf: &[u8]) -> Result<Verdict, ParseError> {
    let (mut code, mut chain) = (None, None);
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        let p = Payload::new("verdict", k, p);
        match k {
            NFTA_VERDICT_CODE => code = Some(p.u32()? as i32),
            NFTA_VERDICT_CHAIN => chain = Some(p.string()?),
            _ => {}
        }
    }
    let bad = ParseError::Bad {
        context: "verdict",
        kind: NFTA_VERDICT_CODE,
        problem: "unsupported verdict",
    };
    Ok(match (code, chain) {
        (Some(NF_ACCEPT), _) => Verdict::Accept,
        (Some(NF_DROP), _) => Verdict::Drop,
        (Some(NFT_RETURN), _) => Verdict::Return,
        (Some(NFT_JUMP), Some(c)) => Verdict::Jump(c),
        (Some(NFT_GOTO), Some(c)) => Verdict::Goto(c),
        (None, _) => {
            return Err(ParseError::Missing {
                context: "verdict",
                kind: NFTA_VERDICT_CODE,
            })
        }
        _ => return Err(bad),
    })
}

/// Parses an `nft_data` nest (value or verdict).
pub fn parse_data(buf: &[u8]) -> Result<Data, ParseError> {
    for a in Attrs::new(buf) {
        let (k, p) = a?;
        match k {
            NFTA_DATA_VALUE => return Ok(Data::Value(p.to_vec())),
            NFTA_DATA_VERDICT => return Ok(Data::Verdict(parse_verdict(p)?)),
            _ => {}
        }
    }
    Err(ParseError::Missing {
        context: "data",
        kind: NFTA_DATA_VALUE,
    })
}

fn value(buf: &[u8]) -> Result<Vec<u8>, ParseError> {
    match parse_data(buf)? {
        Data::Value(v) => Ok(v),
        Data::Verdict(_) => Err(ParseError::Bad {
            context: "data",
            kind: NFTA_DATA_VERDICT,
            problem: "expected a value",
        }),
    }
}

impl Expr {
    fn name(&self) -> &str {
        match self {
            Expr::Payload { .. } => PAYLOAD,
            Expr::Meta { .. } | Expr::MetaSet { .. } => META,
            Expr::Cmp { .. } => CMP,
            Expr::Bitwise { .. } => BITWISE,
            Expr::Lookup { .. } => LOOKUP,
            Expr::Immediate { .. } => IMMEDIATE,
            Expr::Numgen { .. } => NUMGEN,
            Expr::Hton { .. } => BYTEORDER,
            Expr::Dnat { .. } => NAT,
            Expr::Masq { .. } => MASQ,
            Expr::Reject { .. } => REJECT,
            Expr::Ct { .. } | Expr::CtSet { .. } => CT,
            Expr::FlowOffload { .. } => FLOW_OFFLOAD,
            Expr::Objref { .. } | Expr::ObjrefMap { .. } => OBJREF,
            Expr::Fib { .. } => FIB,
            Expr::DynsetUpdate { .. } => DYNSET,
            Expr::Counter { .. } => COUNTER,
            Expr::Other(name) => name,
        }
    }

    /// Writes one `NFTA_LIST_ELEM` holding this expression.
    pub fn emit(&self, w: &mut AttrWriter) {
        w.nest(NFTA_LIST_ELEM, |w| {
            w.put_str(NFTA_EXPR_NAME, self.name());
            w.nest(NFTA_EXPR_DATA, |w| self.emit_data(w));
        });
    }

    fn emit_data(&self, w: &mut AttrWriter) {
        match self {
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                w.put_u32(NFTA_PAYLOAD_DREG, *dreg);
                w.put_u32(NFTA_PAYLOAD_BASE, *base as u32);
                w.put_u32(NFTA_PAYLOAD_OFFSET, *offset);
                w.put_u32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Meta { dreg, key } => {
                w.put_u32(NFTA_META_KEY, *key as u32);
                w.put_u32(NFTA_META_DREG, *dreg);
            }
            Expr::MetaSet { sreg, key } => {
                w.put_u32(NFTA_META_KEY, *key as u32);
                w.put_u32(NFTA_META_SREG, *sreg);
            }
            Expr::Cmp { sreg, op, data } => {
                w.put_u32(NFTA_CMP_SREG, *sreg);
                w.put_u32(NFTA_CMP_OP, *op as u32);
                write_data(w, NFTA_CMP_DATA, &Data::Value(data.clone()));
            }
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            } => {
                w.put_u32(NFTA_BITWISE_SREG, *sreg);
                w.put_u32(NFTA_BITWISE_DREG, *dreg);
                w.put_u32(NFTA_BITWISE_LEN, *len);
                write_data(w, NFTA_BITWISE_MASK, &Data::Value(mask.clone()));
                write_data(w, NFTA_BITWISE_XOR, &Data::Value(xor.clone()));
            }
            Expr::Lookup {
                sreg,
                set,
                dreg,
                invert,
            } => {
                w.put_str(NFTA_LOOKUP_SET, set);
                w.put_u32(NFTA_LOOKUP_SREG, *sreg);
                if let Some(d) = dreg {
                    w.put_u32(NFTA_LOOKUP_DREG, *d);
                }
                if *invert {
                    w.put_u32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
                }
            }
            Expr::Immediate { dreg, data } => {
                w.put_u32(NFTA_IMMEDIATE_DREG, *dreg);
                write_data(w, NFTA_IMMEDIATE_DATA, data);
            }
            Expr::Numgen { dreg, modulus } => {
                w.put_u32(NFTA_NG_DREG, *dreg);
                w.put_u32(NFTA_NG_MODULUS, *modulus);
                w.put_u32(NFTA_NG_TYPE, NFT_NG_RANDOM);
                w.put_u32(NFTA_NG_OFFSET, 0);
            }
            Expr::Hton {
                sreg,
                dreg,
                len,
                size,
            } => {
                w.put_u32(NFTA_BYTEORDER_SREG, *sreg);
                w.put_u32(NFTA_BYTEORDER_DREG, *dreg);
                w.put_u32(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON);
                w.put_u32(NFTA_BYTEORDER_LEN, *len);
                w.put_u32(NFTA_BYTEORDER_SIZE, *size);
            }
            Expr::Dnat {
                family,
                addr_reg,
                proto_reg,
                flags,
            } => {
                w.put_u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
                w.put_u32(NFTA_NAT_FAMILY, *family as u32);
                w.put_u32(NFTA_NAT_REG_ADDR_MIN, *addr_reg);
                if let Some(p) = proto_reg {
                    w.put_u32(NFTA_NAT_REG_PROTO_MIN, *p);
                }
                if *flags != 0 {
                    w.put_u32(NFTA_NAT_FLAGS, *flags);
                }
            }
            Expr::Masq { flags } => {
                if *flags != 0 {
                    w.put_u32(NFTA_MASQ_FLAGS, *flags);
                }
            }
            Expr::Reject { kind, code } => {
                w.put_u32(NFTA_REJECT_TYPE, *kind);
                w.put(NFTA_REJECT_ICMP_CODE, &[*code]);
            }
            Expr::Ct {
                dreg,
                key,
                direction,
            } => {
                w.put_u32(NFTA_CT_KEY, *key as u32);
                w.put_u32(NFTA_CT_DREG, *dreg);
                if let Some(d) = direction {
                    w.put(NFTA_CT_DIRECTION, &[*d]);
                }
            }
            Expr::CtSet { sreg, key } => {
                w.put_u32(NFTA_CT_KEY, *key as u32);
                w.put_u32(NFTA_CT_SREG, *sreg);
            }
            Expr::FlowOffload { flowtable } => w.put_str(NFTA_FLOW_TABLE_NAME, flowtable),
            Expr::Objref { obj_type, name } => {
                w.put_u32(NFTA_OBJREF_IMM_TYPE, *obj_type);
                w.put_str(NFTA_OBJREF_IMM_NAME, name);
            }
            Expr::ObjrefMap { sreg, set } => {
                w.put_u32(NFTA_OBJREF_SET_SREG, *sreg);
                w.put_str(NFTA_OBJREF_SET_NAME, set);
            }
            Expr::DynsetUpdate { sreg, set } => {
                w.put_str(NFTA_DYNSET_SET_NAME, set);
                w.put_u32(NFTA_DYNSET_OP, DYNSET_OP_UPDATE);
                w.put_u32(NFTA_DYNSET_SREG_KEY, *sreg);
            }
            Expr::Fib {
                dreg,
                result,
                flags,
            } => {
                w.put_u32(NFTA_FIB_DREG, *dreg);
                w.put_u32(NFTA_FIB_RESULT, *result);
                w.put_u32(NFTA_FIB_FLAGS, *flags);
            }
            Expr::Counter { packets, bytes } => {
                w.put_u64(NFTA_COUNTER_BYTES, *bytes);
                w.put_u64(NFTA_COUNTER_PACKETS, *packets);
            }
            Expr::Other(_) => {}
        }
    }

    /// Parses the payload of one `NFTA_LIST_ELEM`.
    pub fn parse(elem: &[u8]) -> Result<Expr, ParseError> {
        let (mut name, mut data) = (None, &[][..]);
        for a in Attrs::new(elem) {
            let (k, p) = a?;
            match k {
                NFTA_EXPR_NAME => name = Some(Payload::new("expr", k, p).string()?),
                NFTA_EXPR_DATA => data = p,
                _ => {}
            }
        }
        let name = name.ok_or(ParseError::Missing {
            context: "expr",
            kind: NFTA_EXPR_NAME,
        })?;
        let mut f = Fields::default();
        for a in Attrs::new(data) {
            let (k, p) = a?;
            f.set(k, p);
        }
        let Some(ctx) = KNOWN.into_iter().find(|known| *known == name) else {
            return Ok(Expr::Other(name));
        };
        let u = |k: u16| f.u32(ctx, k);
        let u_or_0 = |k: u16| f.get(k).map(|_| u(k)).transpose().map(|v| v.unwrap_or(0));
        let string = |k: u16| Payload::new(ctx, k, f.req(ctx, k)?).string();
        Ok(match ctx {
            PAYLOAD if f.get(NFTA_PAYLOAD_SREG).is_none() => Expr::Payload {
                dreg: u(NFTA_PAYLOAD_DREG)?,
                base: match u(NFTA_PAYLOAD_BASE)? {
                    1 => PayloadBase::Network,
                    2 => PayloadBase::Transport,
                    _ => return Ok(Expr::Other(name)),
                },
                offset: u(NFTA_PAYLOAD_OFFSET)?,
                len: u(NFTA_PAYLOAD_LEN)?,
            },
            META => {
                let key = match u(NFTA_META_KEY)? {
                    3 => MetaKey::Mark,
                    16 => MetaKey::L4Proto,
                    _ => return Ok(Expr::Other(name)),
                };
                match f.get(NFTA_META_DREG) {
                    Some(_) => Expr::Meta {
                        dreg: u(NFTA_META_DREG)?,
                        key,
                    },
                    None => Expr::MetaSet {
                        sreg: u(NFTA_META_SREG)?,
                        key,
                    },
                }
            }
            CMP => Expr::Cmp {
                sreg: u(NFTA_CMP_SREG)?,
                op: match u(NFTA_CMP_OP)? {
                    0 => CmpOp::Eq,
                    1 => CmpOp::Neq,
                    2 => CmpOp::Lt,
                    4 => CmpOp::Gt,
                    _ => return Ok(Expr::Other(name)),
                },
                data: value(f.req(ctx, NFTA_CMP_DATA)?)?,
            },
            // Only the boolean form (NFTA_BITWISE_OP absent or NFT_BITWISE_BOOL).
            BITWISE if f.get(NFTA_BITWISE_OP).is_none_or(|p| p == [0, 0, 0, 0]) => Expr::Bitwise {
                sreg: u(NFTA_BITWISE_SREG)?,
                dreg: u(NFTA_BITWISE_DREG)?,
                len: u(NFTA_BITWISE_LEN)?,
                mask: value(f.req(ctx, NFTA_BITWISE_MASK)?)?,
                xor: value(f.req(ctx, NFTA_BITWISE_XOR)?)?,
            },
            LOOKUP => Expr::Lookup {
                set: string(NFTA_LOOKUP_SET)?,
                sreg: u(NFTA_LOOKUP_SREG)?,
                dreg: f
                    .get(NFTA_LOOKUP_DREG)
                    .map(|_| u(NFTA_LOOKUP_DREG))
                    .transpose()?,
                invert: u_or_0(NFTA_LOOKUP_FLAGS)? & NFT_LOOKUP_F_INV != 0,
            },
            IMMEDIATE => Expr::Immediate {
                dreg: u(NFTA_IMMEDIATE_DREG)?,
                data: parse_data(f.req(ctx, NFTA_IMMEDIATE_DATA)?)?,
            },
            NUMGEN if u(NFTA_NG_TYPE)? == NFT_NG_RANDOM && u_or_0(NFTA_NG_OFFSET)? == 0 => {
                Expr::Numgen {
                    dreg: u(NFTA_NG_DREG)?,
                    modulus: u(NFTA_NG_MODULUS)?,
                }
            }
            BYTEORDER if u(NFTA_BYTEORDER_OP)? == NFT_BYTEORDER_HTON => Expr::Hton {
                sreg: u(NFTA_BYTEORDER_SREG)?,
                dreg: u(NFTA_BYTEORDER_DREG)?,
                len: u(NFTA_BYTEORDER_LEN)?,
                size: u(NFTA_BYTEORDER_SIZE)?,
            },
            // The kernel dumps the max registers equal to the min ones we sent.
            NAT if u(NFTA_NAT_TYPE)? == NFT_NAT_DNAT
                && f.get(NFTA_NAT_REG_ADDR_MAX)
                    .is_none_or(|p| Some(p) == f.get(NFTA_NAT_REG_ADDR_MIN))
                && f.get(NFTA_NAT_REG_PROTO_MAX)
                    .is_none_or(|p| Some(p) == f.get(NFTA_NAT_REG_PROTO_MIN)) =>
            {
                let proto_reg = f
                    .get(NFTA_NAT_REG_PROTO_MIN)
                    .map(|_| u(NFTA_NAT_REG_PROTO_MIN))
                    .transpose()?;
                // The kernel records that an address was given; nft never sends that bit.
                let flags = u_or_0(NFTA_NAT_FLAGS)? & !NAT_MAP_IPS;
                Expr::Dnat {
                    family: u(NFTA_NAT_FAMILY)? as u8,
                    addr_reg: u(NFTA_NAT_REG_ADDR_MIN)?,
                    proto_reg,
                    flags,
                }
            }
            MASQ if f.get(NFTA_MASQ_REG_PROTO_MIN).is_none() => Expr::Masq {
                flags: u_or_0(NFTA_MASQ_FLAGS)?,
            },
            REJECT => Expr::Reject {
                kind: u(NFTA_REJECT_TYPE)?,
                code: Payload::new(
                    ctx,
                    NFTA_REJECT_ICMP_CODE,
                    f.get(NFTA_REJECT_ICMP_CODE).unwrap_or(&[0]),
                )
                .u8()?,
            },
            // The kernel dumps a zero timeout (and its padding) we never send.
            DYNSET
                if u(NFTA_DYNSET_OP)? == DYNSET_OP_UPDATE
                    && f.get(NFTA_DYNSET_SREG_DATA).is_none()
                    && f.get(NFTA_DYNSET_EXPR).is_none()
                    && f.get(NFTA_DYNSET_TIMEOUT)
                        .is_none_or(|p| p.iter().all(|b| *b == 0))
                    && f.get(NFTA_DYNSET_PAD)
                        .is_none_or(|p| p.iter().all(|b| *b == 0)) =>
            {
                Expr::DynsetUpdate {
                    sreg: u(NFTA_DYNSET_SREG_KEY)?,
                    set: string(NFTA_DYNSET_SET_NAME)?,
                }
            }
            FIB => Expr::Fib {
                dreg: u(NFTA_FIB_DREG)?,
                result: u(NFTA_FIB_RESULT)?,
                flags: u(NFTA_FIB_FLAGS)?,
            },
            CT => {
                let Some(key) = CtKey::from_number(u(NFTA_CT_KEY)?) else {
                    return Ok(Expr::Other(name));
                };
                match f.get(NFTA_CT_DREG) {
                    Some(_) => Expr::Ct {
                        dreg: u(NFTA_CT_DREG)?,
                        key,
                        direction: f
                            .get(NFTA_CT_DIRECTION)
                            .map(|p| Payload::new(ctx, NFTA_CT_DIRECTION, p).u8())
                            .transpose()?,
                    },
                    None => Expr::CtSet {
                        sreg: u(NFTA_CT_SREG)?,
                        key,
                    },
                }
            }
            FLOW_OFFLOAD => Expr::FlowOffload {
                flowtable: string(NFTA_FLOW_TABLE_NAME)?,
            },
            OBJREF if f.get(NFTA_OBJREF_SET_SREG).is_some() => Expr::ObjrefMap {
                sreg: u(NFTA_OBJREF_SET_SREG)?,
                set: string(NFTA_OBJREF_SET_NAME)?,
            },
            OBJREF if f.get(NFTA_OBJREF_IMM_NAME).is_some() => Expr::Objref {
                obj_type: u(NFTA_OBJREF_IMM_TYPE)?,
                name: string(NFTA_OBJREF_IMM_NAME)?,
            },
            COUNTER => {
                let u64_or_0 = |k: u16| {
                    f.get(k)
                        .map(|p| Payload::new(ctx, k, p).u64())
                        .transpose()
                        .map(|v| v.unwrap_or(0))
                };
                Expr::Counter {
                    bytes: u64_or_0(NFTA_COUNTER_BYTES)?,
                    packets: u64_or_0(NFTA_COUNTER_PACKETS)?,
                }
            }
            _ => Expr::Other(name),
        })
    }

    /// Equality of what the expression does, ignoring state (counter values).
    pub fn same_shape(&self, other: &Expr) -> bool {
        match (self, other) {
            (Expr::Counter { .. }, Expr::Counter { .. }) => true,
            _ => self == other,
        }
    }
}

/// The attributes of one expression, by type (types are small integers).
#[derive(Default)]
struct Fields<'a> {
    by_kind: Vec<Option<&'a [u8]>>,
}

impl<'a> Fields<'a> {
    fn set(&mut self, k: u16, p: &'a [u8]) {
        let k = k as usize;
        if self.by_kind.len() <= k {
            self.by_kind.resize(k + 1, None);
        }
        self.by_kind[k] = Some(p);
    }

    fn get(&self, k: u16) -> Option<&'a [u8]> {
        self.by_kind.get(k as usize).copied().flatten()
    }

    fn req(&self, context: &'static str, k: u16) -> Result<&'a [u8], ParseError> {
        self.get(k).ok_or(ParseError::Missing { context, kind: k })
    }

    fn u32(&self, context: &'static str, k: u16) -> Result<u32, ParseError> {
        Payload::new(context, k, self.req(context, k)?).u32()
    }
}

/// Parses an `NFTA_RULE_EXPRESSIONS` list.
pub fn parse_list(buf: &[u8]) -> Result<Vec<Expr>, ParseError> {
    Attrs::new(buf)
        .map(|a| {
            let (_, p) = a?;
            Expr::parse(p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(e: Expr) {
        let mut w = AttrWriter::new();
        e.emit(&mut w);
        let bytes = w.into_bytes();
        assert_eq!(parse_list(&bytes).unwrap(), vec![e]);
    }

    #[test]
    fn every_expression_parses_back_to_itself() {
        round_trip(Expr::Payload {
            dreg: 1,
            base: PayloadBase::Network,
            offset: 16,
            len: 4,
        });
        round_trip(Expr::Meta {
            dreg: 9,
            key: MetaKey::L4Proto,
        });
        round_trip(Expr::MetaSet {
            sreg: 1,
            key: MetaKey::Mark,
        });
        round_trip(Expr::Cmp {
            sreg: 1,
            op: CmpOp::Neq,
            data: vec![10, 244],
        });
        round_trip(Expr::Bitwise {
            sreg: 1,
            dreg: 1,
            len: 4,
            mask: vec![0xff, 0xbf, 0xff, 0xff],
            xor: vec![0, 0x40, 0, 0],
        });
        round_trip(Expr::Lookup {
            sreg: 1,
            set: "service-ips".into(),
            dreg: Some(0),
            invert: false,
        });
        round_trip(Expr::Lookup {
            sreg: 1,
            set: "cluster-ips".into(),
            dreg: None,
            invert: true,
        });
        round_trip(Expr::Immediate {
            dreg: 0,
            data: Data::Verdict(Verdict::Goto("svc-x".into())),
        });
        round_trip(Expr::Immediate {
            dreg: 1,
            data: Data::Value(vec![10, 244, 0, 11]),
        });
        round_trip(Expr::Numgen {
            dreg: 1,
            modulus: 3,
        });
        round_trip(Expr::Hton {
            sreg: 1,
            dreg: 1,
            len: 4,
            size: 4,
        });
        round_trip(Expr::Cmp {
            sreg: 1,
            op: CmpOp::Lt,
            data: 1024u32.to_be_bytes().to_vec(),
        });
        round_trip(Expr::DynsetUpdate {
            sreg: 1,
            set: "affinity".into(),
        });
        round_trip(Expr::Fib {
            dreg: 1,
            result: FIB_RESULT_ADDRTYPE,
            flags: FIB_F_SADDR,
        });
        round_trip(Expr::Dnat {
            family: 2,
            addr_reg: 1,
            proto_reg: Some(2),
            flags: NAT_PROTO_SPECIFIED,
        });
        round_trip(Expr::Masq {
            flags: NAT_RANDOM_FULLY,
        });
        round_trip(Expr::Reject { kind: 0, code: 3 });
        round_trip(Expr::Ct {
            dreg: 1,
            key: CtKey::State,
            direction: None,
        });
        round_trip(Expr::Ct {
            dreg: 1,
            key: CtKey::Direction,
            direction: None,
        });
        round_trip(Expr::Ct {
            dreg: 1,
            key: CtKey::Packets,
            direction: Some(1),
        });
        round_trip(Expr::CtSet {
            sreg: 1,
            key: CtKey::Labels,
        });
        round_trip(Expr::Cmp {
            sreg: 1,
            op: CmpOp::Gt,
            data: vec![0, 0, 0, 0, 0, 0, 0, 2],
        });
        round_trip(Expr::FlowOffload {
            flowtable: "fast-path".into(),
        });
        round_trip(Expr::ObjrefMap {
            sreg: 1,
            set: "service-counters".into(),
        });
        round_trip(Expr::Objref {
            obj_type: 7,
            name: "timeout-x".into(),
        });
        round_trip(Expr::Counter {
            packets: 3,
            bytes: 180,
        });
    }

    #[test]
    fn registers_follow_nft_numbering() {
        assert_eq!(reg32(0), 1);
        assert_eq!(reg32(1), 9);
        assert_eq!(reg32(2), 10);
        assert_eq!(reg32(4), 2);
        assert_eq!(reg32(5), 13);
    }

    #[test]
    fn unknown_expressions_are_kept_by_name() {
        let mut w = AttrWriter::new();
        Expr::Other("osf".into()).emit(&mut w);
        assert_eq!(
            parse_list(&w.into_bytes()).unwrap(),
            vec![Expr::Other("osf".into())]
        );
    }
}
