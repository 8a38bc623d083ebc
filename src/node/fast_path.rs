//! The fast path: a flowtable that takes the established flows of the
//! Services that ask for it (`kube-nft.io/traffic-hint: LongLived`, or every
//! Service with `--fast-path all`), so that their later packets are forwarded
//! from the ingress of their device, past the forward path.
//!
//! The Service tables label such a flow on its first packet (`ct label set
//! 127`, in the chain its dispatch element goes through), so that which
//! Services are on the fast path changes with their partial syncs. This
//! module keeps the rest, a table of its own in each family:
//!
//! ```text
//! table ip kube-nft-fast-path {
//!     flowtable fast-path {
//!         hook ingress priority filter
//!         devices = { eth0, veth0a1b2c3d, ... }
//!     }
//!     chain forward {
//!         type filter hook forward priority 100; policy accept;
//!         ct label 127 ct original packets > 2 ct reply packets > 2 flow add @fast-path
//!     }
//! }
//! ```
//!
//! - **Only while used.** A family's table exists while some Service with an
//!   address of that family is on the fast path, and goes with the last: its
//!   rule turns on conntrack accounting for the namespace, and each device it
//!   lists pays a lookup per packet.
//! - **After everyone else.** The forward chain runs after the forward chains
//!   of other tables (a firewall, a NetworkPolicy enforcer at `filter`), so a
//!   flow is offloaded from a packet that all of them let through.
//! - **Devices** are every interface of the namespace but loopback, read again
//!   when an interface comes or goes and at every full sync. They change in
//!   transactions of their own: a device that goes between the read and the
//!   commit refuses only that transaction, which the next look repeats, and
//!   never a Service's sync. The kernel takes a device it removes out of the
//!   flowtable itself.

use crate::core::model::ClusterState;
use crate::core::net::Family;
use crate::core::node_config::NodeConfig;
use crate::netlink::flowtable::KernelFlowtable;
use crate::netlink::objects::{comment_udata, KernelChain, KernelRule};
use crate::netlink::{Batch, NftError, NftSocket};
use crate::nft::lower::lower_rule;
use crate::nft::names::FAST_PATH_LABEL;
use crate::ruleset::{BaseChain, ChainType, Direction, Hook, Rule, Stmt};

/// The table of each family that holds the fast path.
pub const TABLE: &str = "kube-nft-fast-path";
const FLOWTABLE: &str = "fast-path";
const CHAIN: &str = "forward";
/// The flowtable's ingress priority (`filter`).
const FLOWTABLE_PRIORITY: i32 = 0;
/// After the forward chains of other tables, which sit at `filter` (0) or
/// near it (firewalld's at 10).
const CHAIN_PRIORITY: i32 = 100;
/// A flow is offloaded once more packets than this have gone each way: its
/// handshake done and data under way.
pub const AFTER_PACKETS: u64 = 2;
const COMMENT: &str =
    "kube-nft: the fast path of Services' long-lived flows (managed by kube-nft, do not edit)";

/// Which families' tables are wanted: those of the addresses of the Services
/// on the fast path (in `Family::ALL`'s order). A single-stack cluster pays
/// for one flowtable, not two.
pub fn wanted(state: &ClusterState, config: &NodeConfig) -> [bool; 2] {
    let mut wanted = [false; 2];
    if config.mode.is_ipvs() || config.fast_path == crate::core::node_config::FastPath::Off {
        return wanted;
    }
    for svc in state
        .services
        .values()
        .filter(|s| config.fast_path.offloads(s))
    {
        let addresses = svc
            .cluster_ips
            .iter()
            .chain(&svc.external_ips)
            .chain(&svc.load_balancer_ips);
        for a in addresses {
            let family = Family::of(a);
            wanted[Family::ALL
                .iter()
                .position(|f| *f == family)
                .expect("a family")] = true;
        }
        if wanted == [true; 2] {
            break;
        }
    }
    wanted
}

/// The forward chain's one rule.
fn offload_rule() -> Rule {
    let above = |direction| Stmt::CtPacketsAbove {
        direction,
        count: AFTER_PACKETS,
    };
    Rule::new(vec![
        Stmt::CtLabelHas(FAST_PATH_LABEL),
        above(Direction::Original),
        above(Direction::Reply),
        Stmt::FlowAdd(FLOWTABLE.to_string()),
    ])
}

fn chain(family: Family) -> KernelChain {
    KernelChain {
        name: CHAIN.to_string(),
        base: Some(BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Forward,
            priority: CHAIN_PRIORITY,
        }),
        userdata: None,
        rules: vec![lower_rule(family, &offload_rule())],
    }
}

/// The interfaces a flowtable takes: all but loopback, sorted.
fn devices() -> Result<Vec<String>, String> {
    let mut names: Vec<String> = crate::netlink::route::links()
        .map_err(|e| format!("reading the interfaces: {e}"))?
        .into_iter()
        .filter(|(_, loopback)| !loopback)
        .map(|(name, _)| name)
        .collect();
    names.sort();
    Ok(names)
}

/// What one look changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub created: bool,
    pub deleted: bool,
    pub devices_added: usize,
    pub devices_removed: usize,
}

/// Brings the fast-path table of each family to what `wanted` says for it:
/// created with its devices, devices kept in step, or deleted.
pub fn reconcile(sock: &mut NftSocket, wanted: [bool; 2]) -> Result<Reconciled, String> {
    let mut done = Reconciled::default();
    let devices = if wanted.contains(&true) {
        devices()?
    } else {
        Vec::new()
    };
    for (family, wanted) in Family::ALL.into_iter().zip(wanted) {
        reconcile_family(sock, family, wanted, &devices, &mut done)
            .map_err(|e| format!("the fast path ({} {TABLE}): {e}", family.keyword()))?;
    }
    Ok(done)
}

fn reconcile_family(
    sock: &mut NftSocket,
    family: Family,
    wanted: bool,
    devices: &[String],
    done: &mut Reconciled,
) -> Result<(), NftError> {
    let exists = sock.find_table(family, TABLE)?.is_some();
    if !wanted {
        if exists {
            let mut b = Batch::new();
            b.destroy_table(family, TABLE);
            sock.commit(b)?;
            done.deleted = true;
        }
        return Ok(());
    }
    let flowtable = if exists {
        sock.flowtables(family, TABLE)?
            .into_iter()
            .find(|f| f.name == FLOWTABLE)
    } else {
        None
    };
    let whole = flowtable
        .as_ref()
        .is_some_and(|f| f.priority == FLOWTABLE_PRIORITY)
        && chain_is_ours(sock, family)?;
    if !whole {
        // Missing, or changed by hand: written again from nothing.
        let mut b = Batch::new();
        write_table(&mut b, family, TABLE, Some(COMMENT));
        sock.commit(b)?;
        done.created = true;
    }
    let have: &[String] = match (&flowtable, whole) {
        (Some(KernelFlowtable { devices, .. }), true) => devices,
        _ => &[],
    };
    let add: Vec<String> = devices
        .iter()
        .filter(|d| !have.contains(d))
        .cloned()
        .collect();
    let remove: Vec<String> = have
        .iter()
        .filter(|d| !devices.contains(d))
        .cloned()
        .collect();
    if !add.is_empty() {
        let mut b = Batch::new();
        b.add_flowtable(family, TABLE, FLOWTABLE, FLOWTABLE_PRIORITY, &add);
        sock.commit(b)?;
        done.devices_added += add.len();
    }
    if !remove.is_empty() {
        let mut b = Batch::new();
        b.delete_flowtable_devices(family, TABLE, FLOWTABLE, &remove);
        sock.commit(b)?;
        done.devices_removed += remove.len();
    }
    Ok(())
}

/// Writes the table `name` from nothing, its flowtable without devices.
fn write_table(b: &mut Batch, family: Family, name: &str, comment: Option<&str>) {
    b.destroy_table(family, name);
    let comment = comment_udata(&comment.map(str::to_string));
    b.add_table(family, name, comment.as_deref());
    b.add_flowtable(family, name, FLOWTABLE, FLOWTABLE_PRIORITY, &[]);
    let chain = chain(family);
    b.add_chain(family, name, &chain);
    for r in &chain.rules {
        b.add_rule(family, name, CHAIN, r);
    }
}

/// Whether the forward chain holds exactly our rule.
fn chain_is_ours(sock: &mut NftSocket, family: Family) -> Result<bool, NftError> {
    let want = chain(family).rules;
    let mut got: Vec<KernelRule> = Vec::new();
    match sock.each_chain_rule(family, TABLE, CHAIN, |r| got.push(r)) {
        Ok(()) => {}
        Err(NftError::Refused { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    }
    Ok(got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.same_as(b)))
}

/// The fast-path tables as `nft list table` prints them, with these devices:
/// what the tests compare the kernel's listing with.
pub fn listing(family: Family, devices: &[String]) -> String {
    let rule = crate::ruleset::text::rule(family, &offload_rule());
    let devices = if devices.is_empty() {
        String::new()
    } else {
        format!("\t\tdevices = {{ {} }}\n", devices.join(", "))
    };
    format!(
        "table {} {TABLE} {{\n\tcomment \"{COMMENT}\"\n\tflowtable {FLOWTABLE} {{\n\t\thook ingress priority filter\n{devices}\t}}\n\n\tchain {CHAIN} {{\n\t\ttype filter hook forward priority {CHAIN_PRIORITY}; policy accept;\n\t\t{rule}\n\t}}\n}}\n",
        family.keyword()
    )
}

/// Whether the kernel takes the fast path: its table (a flowtable, `flow
/// add`, conntrack labels and counters) and the Service tables' `ct label
/// set`, tried in a scratch table deleted after.
pub fn kernel_has_it(sock: &mut NftSocket) -> Result<bool, String> {
    let name = format!("{}fast-path", crate::node::kernel_probe::PROBE_PREFIX);
    let family = Family::Ip;
    let mut b = Batch::new();
    write_table(&mut b, family, &name, None);
    let label = KernelChain {
        name: "label".into(),
        base: None,
        userdata: None,
        rules: vec![lower_rule(
            family,
            &Rule::new(vec![Stmt::CtLabelSet(FAST_PATH_LABEL)]),
        )],
    };
    b.add_chain(family, &name, &label);
    b.add_rule(family, &name, &label.name, &label.rules[0]);
    let taken = match sock.commit(b) {
        Ok(_) => true,
        // ENOENT (no flowtable type) or EOPNOTSUPP.
        Err(NftError::Refused { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::Unsupported
            ) =>
        {
            false
        }
        Err(e) => return Err(format!("probing for flowtables: {e}")),
    };
    if taken {
        let mut b = Batch::new();
        b.destroy_table(family, &name);
        sock.commit(b)
            .map_err(|e| format!("deleting the flowtable probe: {e}"))?;
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::lift::lift_rule;

    #[test]
    fn the_offload_rule_lowers_as_nft_lists_it_and_lifts_back() {
        let text = crate::ruleset::text::rule(Family::Ip, &offload_rule());
        assert_eq!(
            text,
            "ct label 127 ct original packets > 2 ct reply packets > 2 flow add @fast-path"
        );
        for family in Family::ALL {
            let k = lower_rule(family, &offload_rule());
            assert_eq!(lift_rule(family, &k).unwrap(), offload_rule());
        }
    }

    #[test]
    fn a_family_is_wanted_for_the_addresses_of_services_on_the_fast_path() {
        use crate::core::model::{Service, ServiceKey};
        use crate::core::node_config::{FastPath, ProxyMode};
        let mut state = ClusterState::default();
        let mut add = |name: &str, ips: &[&str], long_lived: bool| {
            let key = ServiceKey {
                namespace: "default".into(),
                name: name.into(),
            };
            let svc = Service {
                key: key.clone(),
                cluster_ips: ips.iter().map(|a| a.parse().unwrap()).collect(),
                long_lived,
                ..Service::default()
            };
            state.services.insert(key, std::sync::Arc::new(svc));
        };
        add("dual", &["10.96.0.1", "fd00::1"], false);
        add("v4", &["10.96.0.2"], true);
        let config = |fast_path, mode| NodeConfig {
            fast_path,
            mode,
            ..NodeConfig::default()
        };
        let nft = ProxyMode::Nftables;
        assert_eq!(
            wanted(&state, &config(FastPath::LongLived, nft.clone())),
            [true, false]
        );
        assert_eq!(
            wanted(&state, &config(FastPath::All, nft.clone())),
            [true, true]
        );
        assert_eq!(wanted(&state, &config(FastPath::Off, nft)), [false, false]);
        let ipvs = ProxyMode::Ipvs(Default::default());
        assert_eq!(wanted(&state, &config(FastPath::All, ipvs)), [false, false]);
    }

    #[test]
    fn the_listing_names_its_devices_in_order() {
        let l = listing(Family::Ip6, &["eth0".into(), "veth1".into()]);
        assert!(l.starts_with("table ip6 kube-nft-fast-path {\n"), "{l}");
        assert!(l.contains("\t\tdevices = { eth0, veth1 }\n"), "{l}");
        assert!(!listing(Family::Ip, &[]).contains("devices"));
    }
}
