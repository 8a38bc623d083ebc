//! Where the program is put together: the dataplanes of a proxy mode, opened in
//! the current network namespace and handed to an engine. The daemon and the
//! one-shot commands (and the lab and benchmarks) start here; the engine itself
//! names no dataplane.

use crate::core::node_config::{NodeConfig, ProxyMode};
use crate::engine::dataplane::{Dataplane, SyncError};
use crate::engine::{Engine, Proxy};
use crate::ipvs::IpvsDataplane;
use crate::nft::dataplane::NftDataplane;

/// The dataplanes `mode` runs, in sync order. The one place that names them.
pub fn dataplanes(mode: &ProxyMode) -> Result<Vec<Box<dyn Dataplane>>, SyncError> {
    let nft = NftDataplane::open().map_err(|e| SyncError::new("nftables", e))?;
    Ok(match mode {
        ProxyMode::Nftables => vec![Box::new(nft)],
        // IPVS balances; the nftables table beside it masquerades and filters.
        ProxyMode::Ipvs(_) => vec![
            Box::new(nft),
            Box::new(IpvsDataplane::open().map_err(|e| SyncError::new("ipvs", e))?),
        ],
    })
}

/// An engine over the dataplanes of `config.mode`.
pub fn engine(config: NodeConfig) -> Result<Engine, SyncError> {
    let dataplanes = dataplanes(&config.mode)?;
    Ok(Engine::new(config, dataplanes))
}

/// A model to edit in place, with an engine over the dataplanes of `config.mode`.
pub fn proxy(config: NodeConfig) -> Result<Proxy, SyncError> {
    Ok(Proxy::new(engine(config)?))
}
