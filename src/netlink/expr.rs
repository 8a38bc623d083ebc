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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq = 0,
    Neq = 1,
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
    /// A connection-tracking key of the packet's own flow loaded into a register.
    Ct {
        dreg: u32,
        key: CtKey,
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
            Expr::Payload { .. } => "payload",
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Immediate { .. } => "immediate",
            Expr::Numgen { .. } => "numgen",
            Expr::Dnat { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Reject { .. } => "reject",
            Expr::Ct { .. } => "ct",
            Expr::ObjrefMap { .. } => "objref",
            Expr::Fib { .. } => "fib",
            Expr::DynsetUpdate { .. } => "dynset",
            Expr::Counter { .. } => "counter",
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
                w.put_u32(1, *dreg);
                w.put_u32(2, *base as u32);
                w.put_u32(3, *offset);
                w.put_u32(4, *len);
            }
            Expr::Meta { dreg, key } => {
                w.put_u32(2, *key as u32);
                w.put_u32(1, *dreg);
            }
            Expr::MetaSet { sreg, key } => {
                w.put_u32(2, *key as u32);
                w.put_u32(3, *sreg);
            }
            Expr::Cmp { sreg, op, data } => {
                w.put_u32(1, *sreg);
                w.put_u32(2, *op as u32);
                write_data(w, 3, &Data::Value(data.clone()));
            }
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            } => {
                w.put_u32(1, *sreg);
                w.put_u32(2, *dreg);
                w.put_u32(3, *len);
                write_data(w, 4, &Data::Value(mask.clone()));
                write_data(w, 5, &Data::Value(xor.clone()));
            }
            Expr::Lookup {
                sreg,
                set,
                dreg,
                invert,
            } => {
                w.put_str(1, set);
                w.put_u32(2, *sreg);
                if let Some(d) = dreg {
                    w.put_u32(3, *d);
                }
                if *invert {
                    w.put_u32(5, 1);
                }
            }
            Expr::Immediate { dreg, data } => {
                w.put_u32(1, *dreg);
                write_data(w, 2, data);
            }
            Expr::Numgen { dreg, modulus } => {
                w.put_u32(1, *dreg);
                w.put_u32(2, *modulus);
                w.put_u32(3, 1);
                w.put_u32(4, 0);
            }
            Expr::Dnat {
                family,
                addr_reg,
                proto_reg,
                flags,
            } => {
                w.put_u32(1, 1);
                w.put_u32(2, *family as u32);
                w.put_u32(3, *addr_reg);
                if let Some(p) = proto_reg {
                    w.put_u32(5, *p);
                }
                if *flags != 0 {
                    w.put_u32(7, *flags);
                }
            }
            Expr::Masq { flags } => {
                if *flags != 0 {
                    w.put_u32(1, *flags);
                }
            }
            Expr::Reject { kind, code } => {
                w.put_u32(1, *kind);
                w.put(2, &[*code]);
            }
            Expr::Ct { dreg, key } => {
                w.put_u32(2, *key as u32);
                w.put_u32(1, *dreg);
            }
            Expr::ObjrefMap { sreg, set } => {
                w.put_u32(3, *sreg);
                w.put_str(4, set);
            }
            Expr::DynsetUpdate { sreg, set } => {
                w.put_str(1, set);
                w.put_u32(3, DYNSET_OP_UPDATE);
                w.put_u32(4, *sreg);
            }
            Expr::Fib {
                dreg,
                result,
                flags,
            } => {
                w.put_u32(1, *dreg);
                w.put_u32(2, *result);
                w.put_u32(3, *flags);
            }
            Expr::Counter { packets, bytes } => {
                w.put_u64(1, *bytes);
                w.put_u64(2, *packets);
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
        let ctx: &'static str = match name.as_str() {
            "payload" => "payload",
            "meta" => "meta",
            "cmp" => "cmp",
            "bitwise" => "bitwise",
            "lookup" => "lookup",
            "immediate" => "immediate",
            "numgen" => "numgen",
            "nat" => "nat",
            "masq" => "masq",
            "reject" => "reject",
            "ct" => "ct",
            "fib" => "fib",
            "dynset" => "dynset",
            "counter" => "counter",
            "objref" => "objref",
            _ => return Ok(Expr::Other(name)),
        };
        let u = |k: u16| f.u32(ctx, k);
        Ok(match ctx {
            "payload" if f.get(5).is_none() => Expr::Payload {
                dreg: u(1)?,
                base: match u(2)? {
                    1 => PayloadBase::Network,
                    2 => PayloadBase::Transport,
                    _ => return Ok(Expr::Other(name)),
                },
                offset: u(3)?,
                len: u(4)?,
            },
            "meta" => {
                let key = match u(2)? {
                    3 => MetaKey::Mark,
                    16 => MetaKey::L4Proto,
                    _ => return Ok(Expr::Other(name)),
                };
                match f.get(1) {
                    Some(_) => Expr::Meta { dreg: u(1)?, key },
                    None => Expr::MetaSet { sreg: u(3)?, key },
                }
            }
            "cmp" => Expr::Cmp {
                sreg: u(1)?,
                op: match u(2)? {
                    0 => CmpOp::Eq,
                    1 => CmpOp::Neq,
                    _ => return Ok(Expr::Other(name)),
                },
                data: value(f.req(ctx, 3)?)?,
            },
            // Only the boolean form (NFTA_BITWISE_OP absent or NFT_BITWISE_BOOL).
            "bitwise" if f.get(6).is_none_or(|p| p == [0, 0, 0, 0]) => Expr::Bitwise {
                sreg: u(1)?,
                dreg: u(2)?,
                len: u(3)?,
                mask: value(f.req(ctx, 4)?)?,
                xor: value(f.req(ctx, 5)?)?,
            },
            "lookup" => Expr::Lookup {
                set: Payload::new(ctx, 1, f.req(ctx, 1)?).string()?,
                sreg: u(2)?,
                dreg: f.get(3).map(|_| u(3)).transpose()?,
                invert: f.get(5).map(|_| u(5)).transpose()?.unwrap_or(0) & 1 == 1,
            },
            "immediate" => Expr::Immediate {
                dreg: u(1)?,
                data: parse_data(f.req(ctx, 2)?)?,
            },
            "numgen" if u(3)? == 1 && f.get(4).map(|_| u(4)).transpose()?.unwrap_or(0) == 0 => {
                Expr::Numgen {
                    dreg: u(1)?,
                    modulus: u(2)?,
                }
            }
            // The kernel dumps the max registers equal to the min ones we sent.
            "nat"
                if u(1)? == 1
                    && f.get(4).is_none_or(|p| Some(p) == f.get(3))
                    && f.get(6).is_none_or(|p| Some(p) == f.get(5)) =>
            {
                let proto_reg = f.get(5).map(|_| u(5)).transpose()?;
                // The kernel records that an address was given; nft never sends that bit.
                let flags = f.get(7).map(|_| u(7)).transpose()?.unwrap_or(0) & !NAT_MAP_IPS;
                Expr::Dnat {
                    family: u(2)? as u8,
                    addr_reg: u(3)?,
                    proto_reg,
                    flags,
                }
            }
            "masq" if f.get(2).is_none() => Expr::Masq {
                flags: f.get(1).map(|_| u(1)).transpose()?.unwrap_or(0),
            },
            "reject" => Expr::Reject {
                kind: u(1)?,
                code: Payload::new(ctx, 2, f.get(2).unwrap_or(&[0])).u8()?,
            },
            // The kernel dumps a zero timeout and zero flags we never send.
            "dynset"
                if u(3)? == DYNSET_OP_UPDATE
                    && f.get(5).is_none()
                    && f.get(7).is_none()
                    && f.get(6).is_none_or(|p| p.iter().all(|b| *b == 0))
                    && f.get(8).is_none_or(|p| p.iter().all(|b| *b == 0)) =>
            {
                Expr::DynsetUpdate {
                    sreg: u(4)?,
                    set: Payload::new(ctx, 1, f.req(ctx, 1)?).string()?,
                }
            }
            "fib" => Expr::Fib {
                dreg: u(1)?,
                result: u(2)?,
                flags: u(3)?,
            },
            "ct" if f.get(1).is_some() && f.get(3).is_none() => Expr::Ct {
                dreg: u(1)?,
                key: match u(2)? {
                    0 => CtKey::State,
                    1 => CtKey::Direction,
                    _ => return Ok(Expr::Other(name)),
                },
            },
            "objref" if f.get(3).is_some() => Expr::ObjrefMap {
                sreg: u(3)?,
                set: Payload::new(ctx, 4, f.req(ctx, 4)?).string()?,
            },
            "counter" => Expr::Counter {
                bytes: f
                    .get(1)
                    .map(|p| Payload::new(ctx, 1, p).u64())
                    .transpose()?
                    .unwrap_or(0),
                packets: f
                    .get(2)
                    .map(|p| Payload::new(ctx, 2, p).u64())
                    .transpose()?
                    .unwrap_or(0),
            },
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
        });
        round_trip(Expr::Ct {
            dreg: 1,
            key: CtKey::Direction,
        });
        round_trip(Expr::ObjrefMap {
            sreg: 1,
            set: "service-counters".into(),
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
