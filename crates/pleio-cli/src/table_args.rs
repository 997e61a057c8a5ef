//! The options every command that opens a table shares (`--tensor`,
//! `--layer`), and the one place they become [`pleio::OpenOptions`].

use std::path::Path;

use pleio::{OpenOptions, Table};

/// `--layer L`: which PLE layer's table to open.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LayerArg {
    /// The PLE table of decoder layer L (0-based, as
    /// `model.model.layers[L]`; config.json's `ple_layer_ids` are 1-based).
    /// Default: the lowest PLE layer. A GGUF file accepts its one
    /// `qwen4exp.ple.layers` entry.
    #[arg(long, value_name = "L")]
    pub layer: Option<u64>,
}

impl LayerArg {
    /// The open options: this layer and `tensor`, if given.
    pub fn options(&self, tensor: Option<&str>) -> OpenOptions {
        OpenOptions::new().layer(self.layer).tensor(tensor)
    }

    /// Opens the table at `path` (the error names the file, tensor and
    /// layer itself).
    pub fn open(&self, path: &Path, tensor: Option<&str>) -> pleio::Result<Table> {
        self.options(tensor).open(path)
    }
}

/// Refuses a table in Redis (`redis://`, `rediss://`) for `command`, which
/// reads table files: the error says which commands and doors read one.
pub fn files_only(path: &Path, command: &str) -> anyhow::Result<()> {
    let text = path.to_string_lossy();
    if pleio::remote::is_remote(&text) {
        anyhow::bail!(
            "{}: pleio {command} reads table files; a table in Redis is read by pleio gather, \
             pleio rows and pleio inspect, and by the library's doors (docs/remote.md)",
            pleio::remote::url::redact(&text)
        );
    }
    Ok(())
}
