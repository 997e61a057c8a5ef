//! The GGUF parser: one checked cursor over the file bytes, or over a
//! prefix of them read with `pread` ([`GgufFile::read_header`]).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;

use super::tensor::check_disjoint;
use super::value::Le;
use super::{
    align_up, check_alignment, Array, GgufError, Metadata, TensorInfo, Value, ValueType,
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
use crate::quant::GgmlType;

/// Smallest encoding of one tensor info: name length, `n_dims`, type and
/// offset (a tensor may have no dims and an empty name).
const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
/// Smallest encoding of one metadata pair: key length, value type and a
/// one-byte value.
const MIN_KV: u64 = 8 + 4 + 1;
/// Capacity reserved up front for collections whose elements are larger in
/// memory than in the file; they grow only as elements are decoded.
const MAX_PREALLOC: u64 = 1024;

fn prealloc(n: u64) -> usize {
    n.min(MAX_PREALLOC) as usize
}

/// What is being read, for error messages; only formatted on failure.
type What<'w> = &'w dyn Fn() -> String;

/// Header bytes read first by [`GgufFile::read_header`]; it reads this
/// many times more whenever the parse runs past them.
const FIRST_READ: u64 = 64 << 10;
const GROWTH: u64 = 4;

/// A position in the file bytes with bounds-checked reads. `buf` holds the
/// file's first bytes: all of them, or a prefix of a file of `file_size`.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file_size: u64,
    /// Set when a read ran past `buf` but not past the file: the prefix
    /// must reach this offset (the error returned then is not the file's).
    wants: Option<u64>,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left in the file.
    fn remaining(&self) -> u64 {
        self.file_size - self.pos as u64
    }

    /// The next `n` bytes, or [`GgufError::Truncated`].
    fn take(&mut self, n: u64, what: What<'_>) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        let in_buf = (self.buf.len() - self.pos) as u64;
        if n > available || n > in_buf {
            if n <= available {
                // `pos + n <= file_size`: no overflow.
                self.wants = Some(self.pos as u64 + n);
            }
            return Err(GgufError::Truncated {
                offset: self.offset(),
                what: what(),
                need: n,
                available,
            });
        }
        // `n <= in_buf`, so it fits `usize` and the slice is in bounds.
        let (start, end) = (self.pos, self.pos + n as usize);
        self.pos = end;
        Ok(&self.buf[start..end])
    }

    fn read<T: Le>(&mut self, what: What<'_>) -> Result<T, GgufError> {
        self.take(T::SIZE as u64, what).map(T::from_le)
    }

    /// A `u64` count of items taking at least `min_size` bytes each,
    /// refused unless that many bytes remain after it.
    fn count(&mut self, min_size: u64, what: What<'_>) -> Result<u64, GgufError> {
        let offset = self.offset();
        let count: u64 = self.read(what)?;
        let available = self.remaining();
        if count > available / min_size {
            return Err(GgufError::CountTooLarge {
                what: what(),
                offset,
                count,
                min_size,
                available,
            });
        }
        Ok(count)
    }

    /// `n` fixed-size numbers; the bytes are checked before allocating, so
    /// the vector is never larger than the bytes it is decoded from.
    fn numbers<T: Le>(&mut self, n: u64, what: What<'_>) -> Result<Vec<T>, GgufError> {
        let bytes = match n.checked_mul(T::SIZE as u64) {
            Some(len) => self.take(len, what)?,
            None => self.take(u64::MAX, what)?,
        };
        Ok(bytes.chunks_exact(T::SIZE).map(T::from_le).collect())
    }

    fn string(&mut self, what: What<'_>) -> Result<String, GgufError> {
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let offset = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                offset,
                what: what(),
            }),
        }
    }

    fn value_type(&mut self, key: &str, what: What<'_>) -> Result<ValueType, GgufError> {
        let offset = self.offset();
        let type_id: u32 = self.read(what)?;
        ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            type_id,
            offset,
            key: key.to_owned(),
        })
    }

    fn bools(&mut self, n: u64, key: &str, what: What<'_>) -> Result<Vec<bool>, GgufError> {
        let offset = self.offset();
        let bytes = self.take(n, what)?;
        bytes
            .iter()
            .enumerate()
            .map(|(i, &byte)| match byte {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(GgufError::InvalidBool {
                    byte,
                    offset: offset + i as u64,
                    key: key.to_owned(),
                }),
            })
            .collect()
    }

    fn value(&mut self, ty: ValueType, key: &str) -> Result<Value, GgufError> {
        let what: What<'_> = &|| format!("value of key `{key}`");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.read(what)?),
            ValueType::I8 => Value::I8(self.read(what)?),
            ValueType::U16 => Value::U16(self.read(what)?),
            ValueType::I16 => Value::I16(self.read(what)?),
            ValueType::U32 => Value::U32(self.read(what)?),
            ValueType::I32 => Value::I32(self.read(what)?),
            ValueType::F32 => Value::F32(self.read(what)?),
            ValueType::U64 => Value::U64(self.read(what)?),
            ValueType::I64 => Value::I64(self.read(what)?),
            ValueType::F64 => Value::F64(self.read(what)?),
            ValueType::Bool => Value::Bool(self.bools(1, key, what)?[0]),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array(key, 1)?),
        })
    }

    /// An array (element type, length, elements) at nesting level `depth`.
    fn array(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                key: key.to_owned(),
                offset: Some(self.offset()),
                max: MAX_ARRAY_DEPTH,
            });
        }
        let ty = self.value_type(key, &|| format!("element type of array `{key}`"))?;
        let n = self.count(ty.min_encoded_size(), &|| {
            format!("length of array `{key}`")
        })?;
        let what: What<'_> = &|| format!("elements of array `{key}`");
        Ok(match ty {
            ValueType::U8 => Array::U8(self.numbers(n, what)?),
            ValueType::I8 => Array::I8(self.numbers(n, what)?),
            ValueType::U16 => Array::U16(self.numbers(n, what)?),
            ValueType::I16 => Array::I16(self.numbers(n, what)?),
            ValueType::U32 => Array::U32(self.numbers(n, what)?),
            ValueType::I32 => Array::I32(self.numbers(n, what)?),
            ValueType::F32 => Array::F32(self.numbers(n, what)?),
            ValueType::U64 => Array::U64(self.numbers(n, what)?),
            ValueType::I64 => Array::I64(self.numbers(n, what)?),
            ValueType::F64 => Array::F64(self.numbers(n, what)?),
            ValueType::Bool => Array::Bool(self.bools(n, key, what)?),
            ValueType::String => {
                let mut v = Vec::with_capacity(prealloc(n));
                for i in 0..n {
                    v.push(self.string(&|| format!("element {i} of array `{key}`"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(prealloc(n));
                for _ in 0..n {
                    v.push(self.array(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, i: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string(&|| format!("name of tensor #{i}"))?;
        let n_dims: u32 = self.read(&|| format!("n_dims of tensor `{name}`"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims: n_dims.into(),
                max: MAX_DIMS,
            });
        }
        let dims = self.numbers(n_dims.into(), &|| format!("dims of tensor `{name}`"))?;
        let type_offset = self.offset();
        let type_id: u32 = self.read(&|| format!("type of tensor `{name}`"))?;
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownGgmlType {
                tensor: name,
                type_id,
                offset: type_offset,
            });
        };
        let offset: u64 = self.read(&|| format!("data offset of tensor `{name}`"))?;
        TensorInfo::new(name, ty, dims, offset)
    }
}

/// A parsed GGUF file: header facts, metadata and tensor infos. Tensor data
/// stays in the caller's bytes; every tensor's range was checked to lie
/// inside them.
#[derive(Debug, Clone)]
pub struct GgufFile {
    version: u32,
    alignment: u64,
    data_offset: u64,
    file_size: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl GgufFile {
    /// Parses a whole GGUF file (versions 2 and 3, little-endian).
    ///
    /// Checks, besides the encoding itself: the alignment is a nonzero
    /// power of two, every tensor has a known type, whole-block rows and
    /// non-overflowing sizes, an aligned offset, bytes inside `bytes`, a
    /// unique name and no overlap with another tensor; keys are unique.
    pub fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let mut c = Cursor {
            buf: bytes,
            pos: 0,
            file_size: bytes.len() as u64,
            wants: None,
        };
        Self::parse_with(&mut c)
    }

    /// Reads and parses the header of `file` with positioned reads (`pread`),
    /// never through a mapping: a device error or a file cut short while it
    /// is read is an error, not `SIGBUS`. Reads the first 64 KiB, and four
    /// times more whenever the header runs past what was read, up to the
    /// file's length; the tensor data is never read. Checks as
    /// [`GgufFile::parse`] does, against the file's length. Errors do not
    /// name the file (see [`GgufError::in_file`]).
    pub fn read_header(file: &File) -> Result<GgufFile, GgufError> {
        let io = |e| GgufError::io(None, e);
        let mut file_size = file.metadata().map_err(io)?.len();
        let mut buf: Vec<u8> = Vec::new();
        let mut want = FIRST_READ.min(file_size);
        loop {
            let have = buf.len();
            // `want <= file_size`, the length of a file on this machine,
            // and not more than what the parse asked to hold: allocatable
            // as the parsed values are.
            buf.resize(usize::try_from(want).map_err(|_| io(too_large()))?, 0);
            let got = read_at_most(file, &mut buf[have..], have as u64).map_err(io)?;
            if have + got < buf.len() {
                // The file is shorter than it was: parse what it holds.
                buf.truncate(have + got);
                file_size = buf.len() as u64;
            }
            let mut c = Cursor {
                buf: &buf,
                pos: 0,
                file_size,
                wants: None,
            };
            match Self::parse_with(&mut c) {
                Err(_) if c.wants.is_some() => {
                    let wants = c.wants.unwrap_or(file_size);
                    want = wants.max(want.saturating_mul(GROWTH)).min(file_size);
                }
                r => return r,
            }
        }
    }

    fn parse_with(c: &mut Cursor<'_>) -> Result<GgufFile, GgufError> {
        let magic = c.take(4, &|| "magic".to_owned())?;
        if magic != MAGIC {
            let mut found = [0; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version: u32 = c.read(&|| "version".to_owned())?;
        if !matches!(version, 2 | 3) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let n_tensors = c.count(MIN_TENSOR_INFO, &|| "tensor count".to_owned())?;
        let n_kv = c.count(MIN_KV, &|| "metadata count".to_owned())?;

        let mut metadata = Metadata::with_capacity(prealloc(n_kv));
        for i in 0..n_kv {
            let key_offset = c.offset();
            let key = c.string(&|| format!("key of metadata pair #{i}"))?;
            let ty = c.value_type(&key, &|| format!("value type of key `{key}`"))?;
            let value = c.value(ty, &key)?;
            metadata
                .insert(key, value)
                .map_err(|key| GgufError::DuplicateKey {
                    key,
                    offset: Some(key_offset),
                })?;
        }
        let alignment = match metadata.get(ALIGNMENT_KEY) {
            Some(v) => check_alignment(v)?,
            None => DEFAULT_ALIGNMENT,
        };

        let mut tensors = Vec::with_capacity(prealloc(n_tensors));
        for i in 0..n_tensors {
            tensors.push(c.tensor_info(i)?);
        }
        let data_offset = align_up(c.offset(), alignment).unwrap_or(u64::MAX);
        let file_size = c.file_size;
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data_offset.saturating_add(t.offset);
            let end = start.saturating_add(t.n_bytes);
            if end > file_size {
                return Err(GgufError::TensorPastEnd {
                    tensor: t.name.clone(),
                    start,
                    end,
                    file_size,
                });
            }
        }
        check_disjoint(&tensors)?;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            version,
            alignment,
            data_offset,
            file_size,
            metadata,
            tensors,
            index,
        })
    }

    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data-section alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the parsed bytes.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Absolute byte range of a tensor's data (checked at parse time to
    /// lie inside the file for this file's tensors).
    pub fn tensor_range(&self, t: &TensorInfo) -> Range<u64> {
        let start = self.data_offset.saturating_add(t.offset);
        start..start.saturating_add(t.n_bytes)
    }

    /// A tensor's bytes within `bytes` (the bytes this file was parsed
    /// from), or `None` if the range does not lie inside them.
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], t: &TensorInfo) -> Option<&'a [u8]> {
        let r = self.tensor_range(t);
        bytes.get(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)
    }
}

/// Reads into `buf` from `offset` until it is full or the file ends;
/// returns the bytes read.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn too_large() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "header too large for memory",
    )
}
