//! `kube-nft top`: the Service ports ranked by traffic, from the named counters
//! `--counters` keeps (one per Service port and family, see `translate`).

use crate::core::net::Family;
use crate::netlink::nftables::{NftError, NftSocket};
use crate::netlink::objects::comment_of;
use crate::netlink::objects::ObjectReading;
use crate::ruleset::TABLE_NAME;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One Service port's traffic, both families together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortTraffic {
    /// `namespace/name:port`, from the counter's comment (its name if it has none).
    pub service_port: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Sums the families' readings per Service port; busiest (by bytes) first.
pub fn rank(readings: impl IntoIterator<Item = ObjectReading>) -> Vec<PortTraffic> {
    let mut by_port: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in readings {
        let label = comment_of(&r.object.userdata).unwrap_or(r.object.name);
        let sum = by_port.entry(label).or_default();
        sum.0 += r.packets;
        sum.1 += r.bytes;
    }
    let mut out: Vec<PortTraffic> = by_port
        .into_iter()
        .map(|(service_port, (packets, bytes))| PortTraffic {
            service_port,
            packets,
            bytes,
        })
        .collect();
    out.sort_by(|a, b| {
        (b.bytes, b.packets)
            .cmp(&(a.bytes, a.packets))
            .then_with(|| a.service_port.cmp(&b.service_port))
    });
    out
}

/// The counters of our tables in the current network namespace. `None` when no
/// table has any: kube-nft is not running here, or runs without `--counters`.
pub fn read(sock: &mut NftSocket) -> Result<Option<Vec<PortTraffic>>, NftError> {
    let mut readings = Vec::new();
    for family in Family::ALL {
        if sock.find_table(family, TABLE_NAME)?.is_some() {
            readings.extend(sock.read_counters(family, TABLE_NAME)?);
        }
    }
    Ok((!readings.is_empty()).then(|| rank(readings)))
}

pub fn table(rows: &[PortTraffic]) -> String {
    let width = rows
        .iter()
        .map(|r| r.service_port.len())
        .max()
        .unwrap_or(0)
        .max("SERVICE PORT".len());
    let mut out = format!(
        "{:<width$}  {:>12}  {:>14}\n",
        "SERVICE PORT", "PACKETS", "BYTES"
    );
    for r in rows {
        writeln!(
            out,
            "{:<width$}  {:>12}  {:>14}",
            r.service_port, r.packets, r.bytes
        )
        .unwrap();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::objects::{comment_udata, KernelObject, ObjectKind};

    fn reading(name: &str, label: &str, packets: u64, bytes: u64) -> ObjectReading {
        ObjectReading {
            object: KernelObject {
                name: name.into(),
                kind: ObjectKind::Counter,
                userdata: comment_udata(&Some(label.into())),
            },
            packets,
            bytes,
        }
    }

    #[test]
    fn families_add_up_and_the_busiest_port_comes_first() {
        let rows = rank([
            reading("svc-A", "default/a:http", 10, 1_000),
            reading("svc-B", "default/b:dns", 50, 4_000),
            reading("svc-A", "default/a:http", 5, 3_500),
        ]);
        let got: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.service_port.as_str(), r.packets, r.bytes))
            .collect();
        assert_eq!(
            got,
            vec![("default/a:http", 15, 4_500), ("default/b:dns", 50, 4_000)]
        );
    }
}
