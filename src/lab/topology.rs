//! A one-node cluster made of network namespaces: a "node" with a bridge, "pods"
//! each on a veth into the bridge, and an outside "client" on its own link.
//!
//! Pods get /32 (/128) addresses and a default route through the node, like most
//! routed CNIs: even two pods on the same bridge talk through the node's IP stack,
//! so replies always pass the node's conntrack and NAT is undone where it was done.
//! The node's default route points at the client side, so traffic to a VIP the
//! proxy does not DNAT still reaches the filter-forward hook (as on a real node).
//! Bridge ports are in hairpin mode, as CNIs set them (see `add_pod`).

use crate::testbed::netns::{ip_in, sysctl_in, Netns};
use std::io;
use std::net::IpAddr;

/// The pods' gateway on the bridge (Calico-style link-local gateway).
pub const GATEWAY_V4: &str = "169.254.1.1";
pub const GATEWAY_V6: &str = "fe80::1";
/// The client's link (documentation prefixes: never routed anywhere real).
pub const CLIENT_V4: &str = "192.0.2.2";
pub const UPLINK_V4: &str = "192.0.2.1";
pub const CLIENT_V6: &str = "2001:db8::2";
pub const UPLINK_V6: &str = "2001:db8::1";
/// The node's bridge, where pod addresses are routed.
pub const BRIDGE: &str = "kn-br0";

pub struct Pod {
    pub name: String,
    pub addrs: Vec<IpAddr>,
    pub ns: Netns,
}

pub struct Topology {
    pub prefix: String,
    // Pods first: fields drop in order, and pod links go before the node's bridge.
    pub pods: Vec<Pod>,
    pub client: Netns,
    pub node: Netns,
}

impl Topology {
    /// Creates the node and client namespaces; pods are added with `add_pod`.
    pub fn build(prefix: &str) -> io::Result<Topology> {
        let node = Netns::create(&format!("{prefix}-node"))?;
        let client = Netns::create(&format!("{prefix}-client"))?;
        let n = node.name.as_str();
        for (key, value) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ] {
            sysctl_in(n, key, value)?;
        }
        ip_in(n, &["link", "add", BRIDGE, "type", "bridge"])?;
        ip_in(
            n,
            &["addr", "add", &format!("{GATEWAY_V4}/32"), "dev", BRIDGE],
        )?;
        ip_in(
            n,
            &[
                "addr",
                "add",
                &format!("{GATEWAY_V6}/64"),
                "dev",
                BRIDGE,
                "nodad",
            ],
        )?;
        ip_in(n, &["link", "set", BRIDGE, "up"])?;

        let c = client.name.as_str();
        ip_in(
            n,
            &[
                "link", "add", "kn-up", "type", "veth", "peer", "name", "eth0", "netns", c,
            ],
        )?;
        ip_in(
            n,
            &["addr", "add", &format!("{UPLINK_V4}/24"), "dev", "kn-up"],
        )?;
        ip_in(
            n,
            &[
                "addr",
                "add",
                &format!("{UPLINK_V6}/64"),
                "dev",
                "kn-up",
                "nodad",
            ],
        )?;
        ip_in(n, &["link", "set", "kn-up", "up"])?;
        ip_in(
            c,
            &["addr", "add", &format!("{CLIENT_V4}/24"), "dev", "eth0"],
        )?;
        ip_in(
            c,
            &[
                "addr",
                "add",
                &format!("{CLIENT_V6}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        )?;
        ip_in(c, &["link", "set", "eth0", "up"])?;
        ip_in(c, &["route", "add", "default", "via", UPLINK_V4])?;
        ip_in(c, &["-6", "route", "add", "default", "via", UPLINK_V6])?;
        ip_in(n, &["route", "add", "default", "via", CLIENT_V4])?;
        ip_in(n, &["-6", "route", "add", "default", "via", CLIENT_V6])?;
        Ok(Topology {
            prefix: prefix.to_string(),
            pods: Vec::new(),
            client,
            node,
        })
    }

    /// Adds a pod namespace with these addresses, wired to the node's bridge.
    pub fn add_pod(&mut self, name: &str, addrs: &[IpAddr]) -> io::Result<&Pod> {
        let i = self.pods.len();
        let ns = Netns::create(&format!("{}-p{i}", self.prefix))?;
        let (n, p) = (self.node.name.as_str(), ns.name.as_str());
        let host_if = format!("kn-p{i}");
        ip_in(
            n,
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", p,
            ],
        )?;
        ip_in(n, &["link", "set", &host_if, "master", BRIDGE, "up"])?;
        // As the CNI bridge plugin's `hairpinMode: true`: where br_netfilter is
        // active, a pod's connection to its own Service is DNATed at the bridge
        // layer and must be allowed back out of the port it came in on.
        ip_in(
            n,
            &[
                "link",
                "set",
                &host_if,
                "type",
                "bridge_slave",
                "hairpin",
                "on",
            ],
        )?;
        ip_in(p, &["link", "set", "eth0", "up"])?;
        for a in addrs {
            match a {
                IpAddr::V4(_) => {
                    ip_in(p, &["addr", "add", &format!("{a}/32"), "dev", "eth0"])?;
                    ip_in(n, &["route", "add", &format!("{a}/32"), "dev", BRIDGE])?;
                }
                IpAddr::V6(_) => {
                    ip_in(
                        p,
                        &["addr", "add", &format!("{a}/128"), "dev", "eth0", "nodad"],
                    )?;
                    ip_in(
                        n,
                        &["-6", "route", "add", &format!("{a}/128"), "dev", BRIDGE],
                    )?;
                }
            }
        }
        if addrs.iter().any(|a| a.is_ipv4()) {
            ip_in(
                p,
                &["route", "add", GATEWAY_V4, "dev", "eth0", "scope", "link"],
            )?;
            ip_in(
                p,
                &["route", "add", "default", "via", GATEWAY_V4, "dev", "eth0"],
            )?;
        }
        if addrs.iter().any(|a| a.is_ipv6()) {
            ip_in(
                p,
                &[
                    "-6", "route", "add", "default", "via", GATEWAY_V6, "dev", "eth0",
                ],
            )?;
        }
        self.pods.push(Pod {
            name: name.to_string(),
            addrs: addrs.to_vec(),
            ns,
        });
        Ok(self.pods.last().unwrap())
    }

    /// Leave every namespace in place (`kube-nft lab --keep`).
    pub fn keep(&mut self) {
        self.node.keep();
        self.client.keep();
        for p in &mut self.pods {
            p.ns.keep();
        }
    }

    pub fn namespaces(&self) -> Vec<&str> {
        let mut v = vec![self.node.name.as_str(), self.client.name.as_str()];
        v.extend(self.pods.iter().map(|p| p.ns.name.as_str()));
        v
    }
}
