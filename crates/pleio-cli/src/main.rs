//! `pleio`: inspect GGUF embedding tables, write synthetic ones, and gather rows.

mod cmd;
mod lists;
mod outfile;
mod output;
mod plot;
mod report;
mod table_args;

use clap::{Parser, Subcommand};

/// Serve rows of huge on-disk embedding tables (GGUF per-layer embeddings).
#[derive(Parser)]
#[command(name = "pleio", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what gathering PLE rows costs here, strategy by strategy (no arguments needed).
    Demo(cmd::demo::Args),
    /// Show a GGUF file's metadata, tensors and PLE table geometry.
    Inspect(cmd::inspect::Args),
    /// Write a synthetic qwen4exp or gemma4 GGUF with a seeded random PLE table.
    Synth(cmd::synth::Args),
    /// Gather rows of a table and write them as little-endian f32.
    Gather(cmd::gather::Args),
    /// Print the row ids a text or token stream needs (qwen4exp n-gram hash, gemma4 identity).
    Rows(cmd::rows::Args),
    /// Show how much of a table is in the page cache, with a heat strip along it.
    Residency(cmd::residency::Args),
    /// Replay a token stream's prefill and decode through the PLE stage with any strategy.
    Replay(cmd::replay::Args),
    /// Measure cold and warm gather latency of every strategy against the device floor.
    Bench(cmd::bench::Args),
    /// Compare the row cache's eviction policies' hit rates on a token stream (simulated).
    CacheSim(cmd::cache_sim::Args),
    /// Read a profile's hottest rows into the row cache or the page cache ahead of use.
    Warm(cmd::warm::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Gather(a) => cmd::gather::run(a),
        Command::Rows(a) => cmd::rows::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Residency(a) => cmd::residency::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::CacheSim(a) => cmd::cache_sim::run(a),
        Command::Warm(a) => cmd::warm::run(a),
    };
    if let Err(e) = result {
        eprintln!("pleio: error: {e:#}");
        std::process::exit(2);
    }
}
