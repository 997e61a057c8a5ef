//! [`OpenOptions`]: how a table is opened (which tensor or PLE layer, the
//! strategy, the rounding rule), in one builder every door uses.

use std::path::Path;

use crate::checkpoint::{is_checkpoint_path, CheckpointError, CheckpointTable};
use crate::output::Rounding;
use crate::{Error, Strategy, Table};

/// How [`OpenOptions::open`] opens a table. `OpenOptions::new()` is what
/// [`Table::open`] does: the model's PLE table (the first PLE layer's, for
/// a checkpoint with several), [`Strategy::Auto`], [`Rounding::Exact`].
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
}

impl OpenOptions {
    /// The defaults (see the type).
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// Opens the 2-D tensor `name` of a GGUF file instead of its PLE table
    /// (a checkpoint has only its PLE tables: naming a tensor is an error).
    pub fn tensor(mut self, name: impl Into<String>) -> OpenOptions {
        self.tensor = Some(name.into());
        self
    }

    /// [`tensor`](Self::tensor) when `Some`.
    pub fn tensor_opt(mut self, name: Option<&str>) -> OpenOptions {
        self.tensor = name.map(str::to_owned);
        self
    }

    /// Opens the PLE table of decoder layer `layer` (0-based, as
    /// `model.model.layers[layer]` in transformers; its `ple_layer_ids`
    /// are 1-based). A layer that holds no PLE table is an error naming
    /// the layers that do.
    pub fn layer(mut self, layer: u64) -> OpenOptions {
        self.layer = Some(layer);
        self
    }

    /// [`layer`](Self::layer) when `Some`.
    pub fn layer_opt(mut self, layer: Option<u64>) -> OpenOptions {
        self.layer = layer;
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

    /// Opens `path` (a GGUF file or split shard, or a checkpoint: see
    /// [`Table::open`]) with these options.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Table, Error> {
        let path = path.as_ref();
        let table = if is_checkpoint_path(path) {
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
        table
            .with_strategy(self.strategy)
            .with_rounding(self.rounding)
    }
}
