//! [`OpenOptions`]: how a table is opened (which tensor or PLE layer, the
//! strategy, the rounding rule), in one builder every door uses.

use std::path::Path;

use crate::checkpoint::{is_checkpoint_path, CheckpointError, CheckpointTable};
use crate::output::Rounding;
use crate::{Error, Strategy, Table};

/// How [`OpenOptions::open`] opens a table. `OpenOptions::new()` is what
/// [`Table::open`] does: the model's PLE table (the first PLE layer's, for
/// a checkpoint with several), [`Strategy::Auto`], [`Rounding::Exact`], a
/// row cache of 256 MiB.
///
/// ```no_run
/// # fn main() -> pleio::Result<()> {
/// use pleio::{OpenOptions, Rounding};
/// let t = OpenOptions::new().layer(1).rounding(Rounding::Vllm).open("ckpt/")?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct OpenOptions {
    tensor: Option<String>,
    layer: Option<u64>,
    strategy: Strategy,
    rounding: Rounding,
    cache_budget: Option<u64>,
}

impl OpenOptions {
    /// The defaults (see the type).
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Opens the 2-D tensor `name` of a GGUF file instead of its PLE table
    /// (a checkpoint has only its PLE tables: naming a tensor is an error).
    /// `None` is the default, the PLE table.
    pub fn tensor<'a>(mut self, name: impl Into<Option<&'a str>>) -> OpenOptions {
        self.tensor = name.into().map(str::to_owned);
        self
    }

    /// Opens the PLE table of decoder layer `layer` (0-based, as
    /// `model.model.layers[layer]` in transformers; its `ple_layer_ids`
    /// are 1-based). A layer that holds no PLE table is an error naming
    /// the layers that do. `None` is the default (see the type).
    pub fn layer(mut self, layer: impl Into<Option<u64>>) -> OpenOptions {
        self.layer = layer.into();
        self
    }

    /// The strategy gathers use (default [`Strategy::Auto`]).
    pub fn strategy(mut self, strategy: Strategy) -> OpenOptions {
        self.strategy = strategy;
        self
    }

    /// The rounding rule of 16-bit outputs (default [`Rounding::Exact`]);
    /// a rule that does not apply to the table's encoding makes `open`
    /// fail.
    pub fn rounding(mut self, rounding: Rounding) -> OpenOptions {
        self.rounding = rounding;
        self
    }

    /// The memory budget in bytes of the row cache of
    /// [`Strategy::Cached`] (default 256 MiB): its row slots, bookkeeping
    /// and read staging. A budget too small for one read plus one row makes
    /// `open` fail ([`crate::ErrorKind::Setup`]) naming the smallest that
    /// works.
    pub fn cache_budget(mut self, bytes: u64) -> OpenOptions {
        self.cache_budget = Some(bytes);
        self
    }

    /// Opens `path` (a GGUF file or split shard, or a checkpoint: see
    /// [`Table::open`]) with these options.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Table, Error> {
        let path = path.as_ref();
        let remote = path.to_str().filter(|s| crate::remote::is_remote(s));
        let table = if let Some(url) = remote {
            if self.tensor.is_some() || self.layer.is_some() {
                return Err(Error::from(CheckpointError::Unsupported {
                    what: "a tensor or layer of a published table: publish each table under its own name".into(),
                })
                .in_file(Path::new(&crate::remote::url::redact(url))));
            }
            return self.open_tiers(url);
        } else if is_checkpoint_path(path) {
            if let Some(name) = &self.tensor {
                return Err(Error::from(CheckpointError::Unsupported {
                    what: format!(
                        "tensor {name:?} of a safetensors checkpoint: pleio reads its PLE table only (leave out the tensor name)"
                    ),
                })
                .in_file(path));
            }
            let ckpt = CheckpointTable::open_layer(path, self.layer)
                .map_err(|e| Error::from(e).in_file(path))?;
            Table::from_checkpoint(std::sync::Arc::new(ckpt), path)?
        } else {
            Table::open_gguf(path, self.tensor.as_deref(), self.layer)?
        };
        self.finish(table)
    }
}

impl OpenOptions {
    /// A table in Redis, with its local copy as the next tier (or the
    /// first, with `order=local,redis`) when the address names one.
    ///
    /// A cluster that cannot be reached at start is left out (the local
    /// copy serves alone); a local copy that cannot be opened is an error
    /// naming it, as for any file.
    fn open_tiers(&self, url: &str) -> Result<Table, Error> {
        let parsed = crate::remote::url::RedisUrl::parse(url)
            .map_err(|e| Error::from(e).in_file(Path::new(&crate::remote::url::redact(url))))?;
        let remote = Table::from_remote(url).and_then(|t| self.finish(t));
        let Some(local) = &parsed.local else {
            return remote;
        };
        let local = self.open(local);
        match (remote, local) {
            (Ok(r), Ok(l)) if parsed.local_first => l.with_next_tier(r),
            (Ok(r), Ok(l)) => r.with_next_tier(l),
            (Err(_), Ok(local)) => Ok(local),
            (_, Err(e)) => Err(e),
        }
    }

    /// Applies the strategy, rounding and budget to a table just opened.
    fn finish(&self, table: Table) -> Result<Table, Error> {
        let table = table
            .with_strategy(self.strategy)
            .with_rounding(self.rounding)?;
        match self.cache_budget {
            Some(bytes) => table.with_budget(bytes),
            None => Ok(table),
        }
    }
}

impl Table {
    /// Opens the per-layer-embedding table of a model:
    ///
    /// - a GGUF file, or the split set it is a shard of:
    ///   `per_layer_token_embd.weight`;
    /// - a safetensors checkpoint, given as its directory, its
    ///   `model.safetensors.index.json`, one `.safetensors` file, or an
    ///   mlx-vlm `ple-store.json`: the qwen4exp n-gram table (its row shards
    ///   in shard order, wherever they are) or Gemma 4's
    ///   `embed_tokens_per_layer.weight` (see `docs/checkpoints.md`);
    /// - a table published to Redis by `pleio publish`:
    ///   `redis://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]/NAME` (see
    ///   `docs/remote.md`).
    pub fn open(path: impl AsRef<Path>) -> Result<Table, Error> {
        OpenOptions::new().open(path)
    }
}
