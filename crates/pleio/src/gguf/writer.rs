//! A streaming GGUF writer: tensor bytes go straight to the sink, so a
//! table larger than memory can be written piece by piece.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::value::{put_string, Le};
use super::{
    align_up, check_alignment, GgufError, Metadata, TensorInfo, Value, ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, WRITE_VERSION,
};
use crate::quant::GgmlType;

/// Where a [`GgufWriter`] writes: a seekable byte sink whose length can be
/// set (so skipped tensor data ends up as a hole that reads as zeros).
pub trait Sink: Write + Seek {
    /// Sets the total length, extending with zeros or truncating.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl Sink for File {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

impl Sink for BufWriter<File> {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.flush()?;
        self.get_ref().set_len(len)
    }
}

impl Sink for io::Cursor<Vec<u8>> {
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("length exceeds memory"))?;
        self.get_mut().resize(len, 0);
        Ok(())
    }
}

/// Gaps up to this size are filled by writing zeros; longer ones by seeking
/// (leaving a sparse hole).
const MAX_ZERO_FILL: u64 = 4096;

/// Writes a GGUF version 3 file.
///
/// Order of calls: [`add_metadata`](Self::add_metadata) and
/// [`add_tensor`](Self::add_tensor) in any order, then
/// [`begin_data`](Self::begin_data) (writes header, metadata, tensor infos
/// and padding), then the tensors' bytes in the order they were added with
/// [`write_tensor_data`](Self::write_tensor_data) and
/// [`skip_tensor_data`](Self::skip_tensor_data) in pieces of any size
/// (padding between tensors is inserted automatically), then
/// [`finish`](Self::finish). `general.alignment`, if set (as a `u32`), is
/// honored. After an error the writer should be dropped.
pub struct GgufWriter<W: Sink> {
    out: W,
    path: Option<PathBuf>,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
    alignment: u64,
    stream: Option<Stream>,
}

/// Progress through the data section.
struct Stream {
    /// Absolute position of the data section in the sink.
    data_start: u64,
    /// Current absolute position of the sink.
    pos: u64,
    /// The tensor receiving bytes: the first one still owed bytes.
    tensor: usize,
    /// Bytes it has received.
    done: u64,
    /// Bytes still owed to all tensors.
    left: u64,
    /// Length of the data section, trailing padding included.
    total: u64,
}

impl Stream {
    /// Moves past tensors that need no bytes, so `tensor` names the next
    /// tensor still owed bytes (or is past the end when all are done).
    fn skip_empty(&mut self, tensors: &[TensorInfo]) {
        while tensors.get(self.tensor).is_some_and(|t| t.n_bytes == 0) {
            self.tensor += 1;
        }
    }
}

impl GgufWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path`, buffered.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|e| GgufError::io(Some(path), e))?;
        let mut w = GgufWriter::new(BufWriter::with_capacity(1 << 20, file));
        w.path = Some(path.to_path_buf());
        Ok(w)
    }
}

impl<W: Sink> GgufWriter<W> {
    /// A writer that writes the file starting at the sink's current
    /// position.
    pub fn new(out: W) -> Self {
        GgufWriter {
            out,
            path: None,
            metadata: Metadata::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
            stream: None,
        }
    }

    fn io(&self, e: io::Error) -> GgufError {
        GgufError::io(self.path.as_deref(), e)
    }

    fn building(&self, what: &'static str) -> Result<(), GgufError> {
        match self.stream {
            None => Ok(()),
            Some(_) => Err(GgufError::WriterState(what)),
        }
    }

    /// Adds a metadata pair (keys must be unique). `general.alignment` must
    /// be a `u32` nonzero power of two.
    pub fn add_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<(), GgufError> {
        self.building("metadata added after begin_data")?;
        let (key, value) = (key.into(), value.into());
        if key == ALIGNMENT_KEY {
            let alignment = check_alignment(&value)?;
            if !matches!(value, Value::U32(_)) {
                return Err(GgufError::BadAlignment {
                    value: format!("{value} ({}, not u32)", value.value_type()),
                });
            }
            if self.metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey { key, offset: None });
            }
            self.alignment = alignment;
        }
        if let Value::Array(a) = &value {
            if a.depth() > MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    key,
                    offset: None,
                    max: MAX_ARRAY_DEPTH,
                });
            }
        }
        self.metadata
            .insert(key, value)
            .map_err(|key| GgufError::DuplicateKey { key, offset: None })
    }

    /// Adds a tensor of shape `dims` (`dims[0]` fastest); its data follows
    /// the previous tensor's. Checks the row is whole blocks, the sizes do
    /// not overflow and the name is new.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<(), GgufError> {
        self.building("tensor added after begin_data")?;
        let info = TensorInfo::new(name, ty, dims.to_vec(), 0)?;
        if !self.names.insert(info.name.clone()) {
            return Err(GgufError::DuplicateTensor { tensor: info.name });
        }
        self.tensors.push(info);
        Ok(())
    }

    /// The tensors added so far; their offsets are final after
    /// [`begin_data`](Self::begin_data).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The alignment in force.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Assigns tensor offsets and writes header, metadata, tensor infos and
    /// the padding before the data section.
    pub fn begin_data(&mut self) -> Result<(), GgufError> {
        self.building("begin_data called twice")?;
        let mut end = 0u64;
        for t in &mut self.tensors {
            t.offset = end;
            end = t
                .offset
                .checked_add(t.n_bytes)
                .and_then(|e| align_up(e, self.alignment))
                .ok_or_else(|| GgufError::DimsOverflow {
                    tensor: t.name.clone(),
                    dims: t.dims.clone(),
                })?;
        }
        let header = self.header();
        let start = self.out.stream_position().map_err(|e| self.io(e))?;
        let data_start = align_up(header.len() as u64, self.alignment)
            .and_then(|h| h.checked_add(start))
            .filter(|d| d.checked_add(end).is_some())
            .ok_or(GgufError::WriterState(
                "data section does not fit in 2^64 bytes",
            ))?;
        self.out.write_all(&header).map_err(|e| self.io(e))?;
        let mut pos = start + header.len() as u64;
        move_to(&mut self.out, &mut pos, data_start).map_err(|e| self.io(e))?;
        let mut stream = Stream {
            data_start,
            pos,
            tensor: 0,
            done: 0,
            left: self.tensors.iter().map(|t| t.n_bytes).sum(),
            total: end,
        };
        stream.skip_empty(&self.tensors);
        self.stream = Some(stream);
        Ok(())
    }

    fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        WRITE_VERSION.put_le(&mut h);
        (self.tensors.len() as u64).put_le(&mut h);
        (self.metadata.len() as u64).put_le(&mut h);
        for (key, value) in self.metadata.iter() {
            put_string(key, &mut h);
            value.value_type().id().put_le(&mut h);
            value.encode(&mut h);
        }
        for t in &self.tensors {
            put_string(&t.name, &mut h);
            (t.dims.len() as u32).put_le(&mut h);
            t.dims.iter().for_each(|d| d.put_le(&mut h));
            t.ty.id().put_le(&mut h);
            t.offset.put_le(&mut h);
        }
        h
    }

    /// Writes the next `bytes` of tensor data (they may span tensors).
    pub fn write_tensor_data(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.feed(bytes.len() as u64, Some(bytes))
    }

    /// Skips the next `n` bytes of tensor data, leaving a hole that reads
    /// as zeros.
    pub fn skip_tensor_data(&mut self, n: u64) -> Result<(), GgufError> {
        self.feed(n, None)
    }

    /// Streams `len` bytes of tensor data, written from `bytes` if given.
    fn feed(&mut self, len: u64, bytes: Option<&[u8]>) -> Result<(), GgufError> {
        let path = self.path.as_deref();
        let Some(s) = &mut self.stream else {
            return Err(GgufError::WriterState("tensor data before begin_data"));
        };
        if len > s.left {
            return Err(GgufError::TooMuchTensorData {
                extra: len - s.left,
            });
        }
        let mut fed = 0u64;
        while fed < len {
            // `left > 0`, so `s.tensor` names a tensor still owed bytes.
            let Some(t) = self.tensors.get(s.tensor) else {
                break;
            };
            let n = (t.n_bytes - s.done).min(len - fed);
            if let Some(b) = bytes {
                let target = s.data_start + t.offset + s.done;
                move_to(&mut self.out, &mut s.pos, target).map_err(|e| GgufError::io(path, e))?;
                // `fed + n <= len == b.len()`.
                let piece = &b[fed as usize..(fed + n) as usize];
                self.out
                    .write_all(piece)
                    .map_err(|e| GgufError::io(path, e))?;
                s.pos += n;
            }
            s.done += n;
            s.left -= n;
            fed += n;
            if s.done == t.n_bytes {
                s.tensor += 1;
                s.done = 0;
                s.skip_empty(&self.tensors);
            }
        }
        Ok(())
    }

    /// Checks every tensor got exactly its bytes, sets the file length
    /// (data section padded to the alignment) and flushes. Returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if self.stream.is_none() {
            self.begin_data()?;
        }
        let Some(s) = &self.stream else {
            return Err(GgufError::WriterState("finish without data section"));
        };
        if let Some(t) = self.tensors.get(s.tensor) {
            return Err(GgufError::IncompleteTensorData {
                tensor: t.name.clone(),
                written: s.done,
                expected: t.n_bytes,
            });
        }
        let end = s.data_start + s.total;
        self.out.set_len(end).map_err(|e| self.io(e))?;
        self.out.flush().map_err(|e| self.io(e))?;
        Ok(self.out)
    }
}

/// Moves the sink from `*pos` to `target`: small forward gaps are written as
/// zeros, anything else is a seek.
fn move_to<W: Write + Seek>(out: &mut W, pos: &mut u64, target: u64) -> io::Result<()> {
    if target == *pos {
        return Ok(());
    }
    if target > *pos && target - *pos <= MAX_ZERO_FILL {
        out.write_all(&[0u8; MAX_ZERO_FILL as usize][..(target - *pos) as usize])?;
    } else {
        out.seek(SeekFrom::Start(target))?;
    }
    *pos = target;
    Ok(())
}
