//! What the kernel holds in one of our tables, kept compact: for each rule its
//! handle, a fingerprint of its bytecode and its DNAT target; for each set its
//! definition and elements. Enough to diff against, at a fraction of the memory of
//! the decoded rules (100k rules: a few MiB).

use crate::netlink::attr::AttrWriter;
use crate::netlink::expr::{Data, Expr, REG_1, REG_2};
use crate::netlink::nftables::{
    parse_chain, parse_elements, parse_set, NftError, NftSocket, GETCHAIN, GETSET, GETSETELEM,
};
use crate::netlink::objects::{KernelCounter, KernelElement, KernelRule, KernelSet};
use crate::ruleset::{BaseChain, Family};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleView {
    pub handle: u64,
    pub fingerprint: u64,
    /// Where the rule DNATs to, if it does: the endpoint in a Service port chain.
    pub dnat: Option<(IpAddr, u16)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainView {
    pub name: String,
    pub base: Option<BaseChain>,
    pub userdata: Option<Vec<u8>>,
    pub rules: Vec<RuleView>,
}

/// The endpoints of a Service port chain's rules by cascade slot (slot 0 is the
/// last rule).
pub fn slots(rules: &[RuleView]) -> Vec<(IpAddr, u16)> {
    rules.iter().rev().filter_map(|r| r.dnat).collect()
}

#[derive(Debug, Clone)]
pub struct SetView {
    /// The set's definition; its `elements` are empty (see `elements`).
    pub def: KernelSet,
    pub elements: HashMap<Vec<u8>, KernelElement>,
}

#[derive(Debug, Clone)]
pub struct TableView {
    pub family: Family,
    pub userdata: Option<Vec<u8>>,
    /// Named counters by name (their values are of no concern to a sync).
    pub counters: HashMap<String, KernelCounter>,
    pub sets: Vec<SetView>,
    pub chains: Vec<ChainView>,
    chain_index: HashMap<String, usize>,
}

impl TableView {
    pub fn chain(&self, name: &str) -> Option<&ChainView> {
        self.chain_index.get(name).map(|&i| &self.chains[i])
    }

    pub fn set(&self, name: &str) -> Option<&SetView> {
        self.sets.iter().find(|s| s.def.name == name)
    }
}

/// A hash of what a rule does (its bytecode, counters zeroed) and its comment.
/// Equal for a rule we are about to write and the same rule read back.
pub fn fingerprint(rule: &KernelRule) -> u64 {
    let mut w = AttrWriter::new();
    for e in &rule.exprs {
        match e {
            Expr::Counter { .. } => Expr::Counter {
                packets: 0,
                bytes: 0,
            }
            .emit(&mut w),
            other => other.emit(&mut w),
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    w.into_bytes().hash(&mut h);
    rule.userdata.hash(&mut h);
    h.finish()
}

/// The DNAT target of a rule: the immediates loaded into the registers a DNAT reads.
pub fn dnat_target(exprs: &[Expr]) -> Option<(IpAddr, u16)> {
    let Some(Expr::Dnat {
        addr_reg: REG_1,
        proto_reg: Some(REG_2),
        ..
    }) = exprs.last()
    else {
        return None;
    };
    let (mut addr, mut port) = (None, None);
    for e in exprs {
        if let Expr::Immediate {
            dreg,
            data: Data::Value(v),
        } = e
        {
            match (*dreg, v.len()) {
                (REG_1, 4) => addr = <[u8; 4]>::try_from(v.as_slice()).ok().map(IpAddr::from),
                (REG_1, 16) => addr = <[u8; 16]>::try_from(v.as_slice()).ok().map(IpAddr::from),
                (REG_2, 2) => port = Some(u16::from_be_bytes([v[0], v[1]])),
                _ => {}
            }
        }
    }
    Some((addr?, port?))
}

pub fn rule_view(handle: u64, rule: &KernelRule) -> RuleView {
    RuleView {
        handle,
        fingerprint: fingerprint(rule),
        dnat: dnat_target(&rule.exprs),
    }
}

impl NftSocket {
    /// Reads one of our tables compactly; `None` if it does not exist.
    pub fn read_view(&mut self, family: Family, name: &str) -> Result<Option<TableView>, NftError> {
        let Some(userdata) = self.find_table(family, name)? else {
            return Ok(None);
        };
        let mut chains = Vec::new();
        self.dump_each(
            GETCHAIN,
            family,
            |w| w.put_str(1, name),
            |c| {
                if let Some(ch) = parse_chain(c, name)? {
                    chains.push(ChainView {
                        name: ch.name,
                        base: ch.base,
                        userdata: ch.userdata,
                        rules: Vec::new(),
                    });
                }
                Ok(())
            },
        )?;
        let chain_index: HashMap<String, usize> = chains
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        for chain in &mut chains {
            chain.rules = self.read_chain_rules(family, name, &chain.name)?;
        }
        let mut sets = Vec::new();
        self.dump_each(
            GETSET,
            family,
            |w| w.put_str(1, name),
            |s| {
                if let Some(def) = parse_set(s, name)? {
                    sets.push(SetView {
                        def,
                        elements: HashMap::new(),
                    });
                }
                Ok(())
            },
        )?;
        for set in &mut sets {
            let set_name = set.def.name.clone();
            self.dump_each(
                GETSETELEM,
                family,
                |w| {
                    w.put_str(1, name);
                    w.put_str(2, &set_name);
                },
                |e| {
                    for el in parse_elements(e)? {
                        set.elements.insert(el.key.clone(), el);
                    }
                    Ok(())
                },
            )?;
        }
        let counters = self
            .read_counters(family, name)?
            .into_iter()
            .map(|r| (r.counter.name.clone(), r.counter))
            .collect();
        Ok(Some(TableView {
            family,
            userdata,
            counters,
            sets,
            chains,
            chain_index,
        }))
    }

    /// Reads the rules of one chain (empty if the chain has none or does not exist).
    pub fn read_chain_rules(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
    ) -> Result<Vec<RuleView>, NftError> {
        let mut rules = Vec::new();
        self.each_chain_rule(family, table, chain, |r| {
            rules.push(rule_view(r.handle.unwrap_or(0), &r))
        })?;
        Ok(rules)
    }
}
