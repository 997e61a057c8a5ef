//! pleio's measurement lab, built on the engine's public API only:
//! synthetic model files ([`synth`], [`random`]), the cold/warm strategy
//! benchmark ([`bench`]), its device floor ([`floor`]) and warm floor
//! ([`warm_floor`]), prompt replays
//! through the PLE stage ([`replay`]), row-cache policy simulation
//! ([`cache_sim`]), page-cache residency scans ([`residency`]) and memory
//! cgroups for capped runs ([`cgroup`]), with the OS readers only the lab
//! needs ([`os`]: peak RSS, process counters, free space). The CLI and the tests use it; an
//! engine never needs it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod cache_sim;
pub mod cgroup;
pub mod floor;
pub mod os;
pub mod random;
pub mod replay;
pub mod residency;
pub mod synth;
pub mod synth_ckpt;
pub mod units;
pub mod warm_floor;
