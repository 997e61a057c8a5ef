//! A streaming safetensors writer: tensor bytes go straight to the sink, so
//! files larger than memory are written piece by piece.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, SeekFrom};
use std::path::Path;

use super::header::shape_bytes;
use super::{Dtype, SafetensorsError, METADATA_KEY};
use crate::gguf::Sink;

/// Header bytes are padded with spaces so the data section starts at a
/// multiple of this (as the reference writer does).
const HEADER_ALIGN: usize = 8;

/// Writes one safetensors file.
///
/// Order of calls: [`add_metadata`](Self::add_metadata) and
/// [`add_tensor`](Self::add_tensor) in any order, then
/// [`begin_data`](Self::begin_data) (writes the header), then the tensors'
/// bytes in the order they were added, in pieces of any size, with
/// [`write_tensor_data`](Self::write_tensor_data) and
/// [`skip_tensor_data`](Self::skip_tensor_data) (a hole that reads as
/// zeros), then [`finish`](Self::finish). The tensors tile the data section
/// in the order added. After an error the writer should be dropped.
pub struct SafetensorsWriter<W: Sink> {
    out: W,
    metadata: Vec<(String, String)>,
    tensors: Vec<(String, Dtype, Vec<u64>, u64)>,
    names: HashSet<String>,
    /// Data bytes declared so far.
    data_len: u64,
    /// Absolute start of the data section, once the header is written.
    data_start: Option<u64>,
    /// Data bytes streamed so far.
    written: u64,
}

impl SafetensorsWriter<BufWriter<File>> {
    /// A writer to a new file at `path` (created or truncated).
    pub fn create(path: &Path) -> Result<Self, SafetensorsError> {
        let f = File::create(path).map_err(|e| SafetensorsError::io(Some(path), e))?;
        Ok(SafetensorsWriter::new(BufWriter::with_capacity(1 << 20, f)))
    }
}

impl<W: Sink> SafetensorsWriter<W> {
    /// A writer to `out`, which should be empty and positioned at 0.
    pub fn new(out: W) -> Self {
        SafetensorsWriter {
            out,
            metadata: Vec::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            data_len: 0,
            data_start: None,
            written: 0,
        }
    }

    fn building(&self, what: &str) -> Result<(), SafetensorsError> {
        match self.data_start {
            None => Ok(()),
            Some(_) => Err(SafetensorsError::Writer(format!("{what} after begin_data"))),
        }
    }

    /// Adds a `__metadata__` string pair.
    pub fn add_metadata(&mut self, key: &str, value: &str) -> Result<(), SafetensorsError> {
        self.building("add_metadata")?;
        if self.metadata.iter().any(|(k, _)| k == key) {
            return Err(SafetensorsError::Writer(format!(
                "metadata key `{key}` added twice"
            )));
        }
        self.metadata.push((key.to_owned(), value.to_owned()));
        Ok(())
    }

    /// Declares a tensor; returns its data-relative byte range start.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
    ) -> Result<u64, SafetensorsError> {
        self.building("add_tensor")?;
        if name == METADATA_KEY || !self.names.insert(name.to_owned()) {
            return Err(SafetensorsError::Writer(format!(
                "tensor name `{name}` is reserved or added twice"
            )));
        }
        let (_, bytes) = shape_bytes(name, dtype, shape)?;
        let start = self.data_len;
        self.data_len = start.checked_add(bytes).ok_or_else(|| {
            SafetensorsError::Writer(format!("tensor `{name}`: data section overflows"))
        })?;
        self.tensors
            .push((name.to_owned(), dtype, shape.to_vec(), start));
        Ok(start)
    }

    /// The JSON header, padded with spaces to [`HEADER_ALIGN`].
    fn header(&self) -> Vec<u8> {
        let q = |s: &str| serde_json::to_string(s).expect("strings serialize");
        let mut h = String::from("{");
        let mut first = true;
        let mut sep = |h: &mut String| {
            if !first {
                h.push(',');
            }
            first = false;
        };
        if !self.metadata.is_empty() {
            sep(&mut h);
            h.push_str(&q(METADATA_KEY));
            h.push_str(":{");
            for (i, (k, v)) in self.metadata.iter().enumerate() {
                if i > 0 {
                    h.push(',');
                }
                h.push_str(&format!("{}:{}", q(k), q(v)));
            }
            h.push('}');
        }
        let mut starts: Vec<u64> = self.tensors.iter().map(|t| t.3).collect();
        starts.push(self.data_len);
        for (i, (name, dtype, shape, start)) in self.tensors.iter().enumerate() {
            sep(&mut h);
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            h.push_str(&format!(
                "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                q(name),
                dtype.name(),
                dims.join(","),
                start,
                starts[i + 1]
            ));
        }
        h.push('}');
        let mut bytes = h.into_bytes();
        let padded = (8 + bytes.len()).div_ceil(HEADER_ALIGN) * HEADER_ALIGN - 8;
        bytes.resize(padded, b' ');
        bytes
    }

    /// Writes the header; the data follows.
    pub fn begin_data(&mut self) -> Result<(), SafetensorsError> {
        self.building("begin_data")?;
        let header = self.header();
        let io = |e| SafetensorsError::io(None, e);
        self.out
            .write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        self.out.write_all(&header).map_err(io)?;
        self.data_start = Some(8 + header.len() as u64);
        Ok(())
    }

    fn advance(&mut self, n: u64) -> Result<u64, SafetensorsError> {
        let Some(start) = self.data_start else {
            return Err(SafetensorsError::Writer(
                "tensor data before begin_data".into(),
            ));
        };
        let left = self.data_len - self.written;
        if n > left {
            return Err(SafetensorsError::Writer(format!(
                "{} bytes of tensor data beyond the last tensor",
                n - left
            )));
        }
        self.written += n;
        Ok(start)
    }

    /// Streams the next `bytes` of tensor data.
    pub fn write_tensor_data(&mut self, bytes: &[u8]) -> Result<(), SafetensorsError> {
        self.advance(bytes.len() as u64)?;
        self.out
            .write_all(bytes)
            .map_err(|e| SafetensorsError::io(None, e))
    }

    /// Skips the next `n` bytes of tensor data (they read as zeros).
    pub fn skip_tensor_data(&mut self, n: u64) -> Result<(), SafetensorsError> {
        let start = self.advance(n)?;
        let pos = start + self.written;
        self.out
            .seek(SeekFrom::Start(pos))
            .map(drop)
            .map_err(|e| SafetensorsError::io(None, e))
    }

    /// Bytes of tensor data still owed.
    pub fn remaining(&self) -> u64 {
        self.data_len - self.written
    }

    /// Checks every tensor got its bytes, sets the file length and returns
    /// the sink (flushed).
    pub fn finish(mut self) -> Result<W, SafetensorsError> {
        let Some(start) = self.data_start else {
            return Err(SafetensorsError::Writer("finish before begin_data".into()));
        };
        if self.written != self.data_len {
            return Err(SafetensorsError::Writer(format!(
                "finish with {} of {} tensor data bytes written",
                self.written, self.data_len
            )));
        }
        let io = |e| SafetensorsError::io(None, e);
        self.out.set_len(start + self.data_len).map_err(io)?;
        self.out
            .seek(SeekFrom::Start(start + self.data_len))
            .map_err(io)?;
        self.out.flush().map_err(io)?;
        Ok(self.out)
    }
}
