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
    /// List, inspect or remove the machine-wide row caches (strategy `shared`).
    Cache(cmd::cache::Args),
    /// Upload a table's stored rows to Redis, to be read as redis://HOST:PORT/NAME.
    Publish(cmd::publish::Args),
}

fn main() {
    report::mark_start();
    let cli = Cli::parse();
    // A reader that stops early (`pleio inspect f.gguf | head -1`) closes
    // the pipe: pleio then exits quietly with the status a shell shows for
    // SIGPIPE, like other Unix tools, instead of a panic (exit 101). The
    // unwind runs first, so temporary outputs are removed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !closed_stdout_panic(info.payload()) {
            default_hook(info);
        }
    }));
    let result = match std::panic::catch_unwind(|| run(cli)) {
        Ok(r) => r,
        Err(payload) if closed_stdout_panic(&*payload) => std::process::exit(CLOSED_STDOUT_STATUS),
        Err(payload) => std::panic::resume_unwind(payload),
    };
    if let Err(e) = result {
        if e.chain().any(is_broken_pipe) {
            std::process::exit(CLOSED_STDOUT_STATUS);
        }
        eprintln!("pleio: error: {}", error_text(&e));
        std::process::exit(2);
    }
}

/// The error and its causes on one line, each once: a cause whose text the
/// line holds already (an error that embeds its source's message and also
/// returns it from `source()`) is not printed again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// The exit status when the reader of standard output went away: what a
/// shell reports for a process ended by SIGPIPE (128 + 13).
const CLOSED_STDOUT_STATUS: i32 = 141;

/// True for the panic `println!` raises on a closed standard output.
fn closed_stdout_panic(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    // std's text: "failed printing to stdout: Broken pipe (os error 32)".
    text.starts_with("failed printing to stdout") && text.contains("Broken pipe")
}

/// True for a write error on a closed pipe, bare or inside a GGUF error
/// (also one `synth` passes on transparently, which hides it from the
/// error chain).
fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    use pleio::gguf::GgufError;
    let pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    let gguf =
        |g: Option<&GgufError>| matches!(g, Some(GgufError::Io { error, .. }) if pipe(error));
    e.downcast_ref::<std::io::Error>().is_some_and(pipe)
        || gguf(e.downcast_ref::<GgufError>())
        || gguf(match e.downcast_ref::<pleio_lab::synth::SynthError>() {
            Some(pleio_lab::synth::SynthError::Gguf(g)) => Some(g),
            _ => None,
        })
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
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
        Command::Cache(a) => cmd::cache::run(a),
        Command::Publish(a) => cmd::publish::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    /// An error that embeds its source's text and also returns it (as
    /// thiserror's `#[error("{path}: {source}")]` with `#[source]` does).
    #[derive(Debug)]
    struct Embeds {
        source: std::io::Error,
    }

    impl std::fmt::Display for Embeds {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "out/ck: {}", self.source)
        }
    }

    impl std::error::Error for Embeds {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = anyhow::Error::new(Embeds { source: io }).context("writing the checkpoint");
        // `{:#}` gave "writing the checkpoint: out/ck: No such file or
        // directory: No such file or directory".
        assert_eq!(
            error_text(&e),
            "writing the checkpoint: out/ck: No such file or directory"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&plain), "outer: inner");
    }
}
