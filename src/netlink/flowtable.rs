//! nf_tables flowtables: the one object of ours that lives on devices. A
//! flowtable hooks the ingress of each device it lists; a flow that a rule
//! adds to it (`flow add`) has its later packets forwarded from there,
//! past the forward path. Devices join and leave one flowtable by updates of
//! it, so a pod's interface coming or going rewrites nothing else.

use super::attr::{AttrWriter, Attrs, ParseError, Payload};
use super::batch::{Batch, DELFLOWTABLE, GETFLOWTABLE, NEWFLOWTABLE, NLM_F_CREATE};
use super::nftables::{NftError, NftSocket};
use crate::core::net::Family;

// enum nft_flowtable_attributes
const NFTA_FLOWTABLE_TABLE: u16 = 1;
const NFTA_FLOWTABLE_NAME: u16 = 2;
const NFTA_FLOWTABLE_HOOK: u16 = 3;
// enum nft_flowtable_hook_attributes
const NFTA_FLOWTABLE_HOOK_NUM: u16 = 1;
const NFTA_FLOWTABLE_HOOK_PRIORITY: u16 = 2;
const NFTA_FLOWTABLE_HOOK_DEVS: u16 = 3;
// enum nft_devices_attributes
const NFTA_DEVICE_NAME: u16 = 1;
/// `NF_NETDEV_INGRESS`: the only hook a flowtable takes.
const NF_NETDEV_INGRESS: u32 = 0;

/// A flowtable as the kernel holds it: its ingress priority and devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFlowtable {
    pub name: String,
    pub priority: i32,
    /// In the order the kernel lists them (the order they were added).
    pub devices: Vec<String>,
}

fn emit(w: &mut AttrWriter, table: &str, name: &str, hook: Option<i32>, devices: &[String]) {
    w.put_str(NFTA_FLOWTABLE_TABLE, table);
    w.put_str(NFTA_FLOWTABLE_NAME, name);
    if hook.is_none() && devices.is_empty() {
        return;
    }
    w.nest(NFTA_FLOWTABLE_HOOK, |w| {
        if let Some(priority) = hook {
            w.put_u32(NFTA_FLOWTABLE_HOOK_NUM, NF_NETDEV_INGRESS);
            w.put_u32(NFTA_FLOWTABLE_HOOK_PRIORITY, priority as u32);
        }
        if !devices.is_empty() {
            w.nest(NFTA_FLOWTABLE_HOOK_DEVS, |w| {
                for d in devices {
                    w.put_str(NFTA_DEVICE_NAME, d);
                }
            });
        }
    });
}

impl KernelFlowtable {
    /// One flowtable of a dump, if it is in `table`.
    fn parse(buf: &[u8], table: &str) -> Result<Option<KernelFlowtable>, ParseError> {
        let mut ft = KernelFlowtable {
            name: String::new(),
            priority: 0,
            devices: Vec::new(),
        };
        let mut in_table = false;
        for a in Attrs::new(buf) {
            let (k, p) = a?;
            match k {
                NFTA_FLOWTABLE_TABLE => {
                    in_table = Payload::new("flowtable", k, p).string()? == table
                }
                NFTA_FLOWTABLE_NAME => ft.name = Payload::new("flowtable", k, p).string()?,
                NFTA_FLOWTABLE_HOOK => {
                    for h in Attrs::new(p) {
                        let (hk, hp) = h?;
                        match hk {
                            NFTA_FLOWTABLE_HOOK_PRIORITY => {
                                ft.priority = Payload::new("flowtable hook", hk, hp).u32()? as i32
                            }
                            NFTA_FLOWTABLE_HOOK_DEVS => {
                                for d in Attrs::new(hp) {
                                    let (dk, dp) = d?;
                                    if dk == NFTA_DEVICE_NAME {
                                        ft.devices.push(
                                            Payload::new("flowtable device", dk, dp).string()?,
                                        );
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(in_table.then_some(ft))
    }
}

impl Batch {
    /// Creates the flowtable, or adds `devices` to the one of that name (the
    /// kernel takes a second create without `NLM_F_EXCL` as an update). A
    /// device that does not exist refuses the whole transaction.
    pub fn add_flowtable(
        &mut self,
        family: Family,
        table: &str,
        name: &str,
        priority: i32,
        devices: &[String],
    ) {
        self.message(NEWFLOWTABLE, NLM_F_CREATE, family, |w| {
            emit(w, table, name, Some(priority), devices)
        });
    }

    /// Takes `devices` out of the flowtable, which stays.
    pub fn delete_flowtable_devices(
        &mut self,
        family: Family,
        table: &str,
        name: &str,
        devices: &[String],
    ) {
        self.message(DELFLOWTABLE, 0, family, |w| {
            emit(w, table, name, None, devices)
        });
    }
}

impl NftSocket {
    /// The flowtables of one table.
    pub fn flowtables(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Vec<KernelFlowtable>, NftError> {
        let mut found = Vec::new();
        self.dump_each(
            GETFLOWTABLE,
            family,
            |w| w.put_str(NFTA_FLOWTABLE_TABLE, table),
            |f| {
                if let Some(ft) = KernelFlowtable::parse(f, table)? {
                    found.push(ft);
                }
                Ok(())
            },
        )?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flowtable_message_parses_back() {
        let mut w = AttrWriter::new();
        let devices = vec!["eth0".to_string(), "veth1".to_string()];
        emit(&mut w, "t", "fast-path", Some(-5), &devices);
        let bytes = w.into_bytes();
        let ft = KernelFlowtable::parse(&bytes, "t").unwrap().unwrap();
        assert_eq!(
            ft,
            KernelFlowtable {
                name: "fast-path".into(),
                priority: -5,
                devices
            }
        );
        assert_eq!(KernelFlowtable::parse(&bytes, "other").unwrap(), None);
    }
}
