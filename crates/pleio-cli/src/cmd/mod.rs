//! One module per subcommand, each with its `Args` and `run`.

pub mod bench;
pub mod cache;
pub mod cache_sim;
pub mod demo;
pub mod gather;
pub mod inspect;
pub mod publish;
pub mod replay;
pub mod residency;
pub mod rows;
pub mod synth;
pub mod warm;
