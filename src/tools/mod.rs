//! The commands an operator runs against a node, beside `nft list ruleset`:
//! `explain` (the path of one packet through the rules) and `top` (the Service
//! ports by traffic).

pub mod explain;
pub mod top;
