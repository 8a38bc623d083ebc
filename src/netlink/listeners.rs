//! Who else listens to nf_tables notifications in this network namespace.
//!
//! With any socket subscribed to the nf_tables group, the kernel builds a
//! notification of every object a transaction touches (each in a buffer of
//! about a page) and holds them all until the commit ends: a cold sync of 10k
//! Services x 10 grew the kernel's slab by about 1 GiB with an `nft monitor`
//! running beside it, against 12 MiB without. `NftSocket::commit` asks here,
//! and splits a large transaction when someone listens.

use std::io;

/// NETLINK_NETFILTER, as /proc/net/netlink numbers the protocol.
const NETLINK_NETFILTER: u32 = 12;
/// NFNLGRP_NFTABLES (7), as its bit in the groups mask.
const NFTABLES_GROUP_BIT: u32 = 1 << (7 - 1);

/// The netlink port ids of the sockets in the calling thread's network
/// namespace that are subscribed to nf_tables notifications.
pub fn nftables_listeners() -> io::Result<Vec<u32>> {
    let table = std::fs::read_to_string("/proc/thread-self/net/netlink")?;
    Ok(listeners_in(&table))
}

/// Reads /proc/net/netlink: `sk Eth Pid Groups …`, Groups being the first 32
/// groups' mask in hex.
fn listeners_in(table: &str) -> Vec<u32> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let protocol: u32 = fields.next()?.parse().ok()?;
            let port: u32 = fields.next()?.parse().ok()?;
            let groups = u32::from_str_radix(fields.next()?, 16).ok()?;
            (protocol == NETLINK_NETFILTER && groups & NFTABLES_GROUP_BIT != 0).then_some(port)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_netfilter_sockets_in_the_nftables_group_listen() {
        let table = "\
sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
0000000000000000 0   1234       00000550 0        0        0     2        0        100
0000000000000000 12  2345       00000040 0        0        0     2        0        101
0000000000000000 12  3456       00000000 0        0        0     2        0        102
0000000000000000 12  4567       00000044 0        0        0     2        0        103
0000000000000000 12  5678       00000004 0        0        0     2        0        104
";
        assert_eq!(listeners_in(table), [2345, 4567]);
    }

    /// A socket of ours that joins the group is seen, and not once it leaves.
    #[test]
    fn a_subscribed_socket_is_seen_in_this_namespace() {
        use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
        let mut sock = Socket::new(NETLINK_NETFILTER).unwrap();
        sock.bind(&SocketAddr::new(0, 0)).unwrap();
        let mut addr = SocketAddr::new(0, 0);
        sock.get_address(&mut addr).unwrap();
        let port = addr.port_number();
        assert!(!nftables_listeners().unwrap().contains(&port));
        sock.add_membership(7).unwrap();
        assert!(nftables_listeners().unwrap().contains(&port));
        sock.drop_membership(7).unwrap();
        assert!(!nftables_listeners().unwrap().contains(&port));
    }
}
