//! The header parser: JSON through serde_json, then every tensor checked
//! against the file before anything uses it.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{Dtype, SafetensorsError, MAX_DIMS, MAX_HEADER_LEN, METADATA_KEY};

/// One tensor of a safetensors file, checked against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first (row-major: the last varies fastest).
    pub shape: Vec<u64>,
    /// Byte range relative to the data section (`data_offsets`).
    pub data: Range<u64>,
}

impl TensorInfo {
    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn n_elems(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.shape.iter().product()
    }

    /// Number of bytes.
    pub fn n_bytes(&self) -> u64 {
        self.data.end - self.data.start
    }
}

/// Element count and byte count of `shape` of `dtype`, checked.
pub(super) fn shape_bytes(
    name: &str,
    dtype: Dtype,
    shape: &[u64],
) -> Result<(u64, u64), SafetensorsError> {
    let overflow = || SafetensorsError::ShapeOverflow {
        tensor: name.to_owned(),
        shape: shape.to_vec(),
        dtype,
    };
    let elems = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let bits = elems.checked_mul(dtype.bits()).ok_or_else(overflow)?;
    if bits % 8 != 0 {
        return Err(SafetensorsError::NotWholeBytes {
            tensor: name.to_owned(),
            elems,
            dtype,
        });
    }
    Ok((elems, bits / 8))
}

/// A parsed safetensors header: the tensors (sorted by offset, tiling the
/// data section) and the `__metadata__` strings. Tensor data stays in the
/// file.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    header_len: u64,
    file_size: u64,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    metadata: Vec<(String, String)>,
}

impl SafetensorsFile {
    /// Parses a whole file held in memory (e.g. a mapping).
    pub fn parse(bytes: &[u8]) -> Result<SafetensorsFile, SafetensorsError> {
        Self::parse_header(bytes, bytes.len() as u64)
    }

    /// Parses the header of a file of `file_size` bytes from `prefix`, its
    /// first bytes (at least `8 + header length` of them; more is fine).
    pub fn parse_header(
        prefix: &[u8],
        file_size: u64,
    ) -> Result<SafetensorsFile, SafetensorsError> {
        let header_len = check_header_len(prefix.get(..8), file_size)?;
        let need = 8 + header_len; // <= file_size, so no overflow
        let available = prefix.len() as u64;
        if available < need {
            return Err(SafetensorsError::Truncated { need, available });
        }
        // `need <= prefix.len()`, so it fits usize.
        let json = &prefix[8..need as usize];
        let parsed = parse_json(json)?;
        build(parsed, header_len, file_size)
    }

    /// Opens `path` and parses its header, reading only the header bytes.
    /// Errors name the file.
    pub fn open(path: &Path) -> Result<SafetensorsFile, SafetensorsError> {
        let read = || -> Result<SafetensorsFile, SafetensorsError> {
            let io = |e| SafetensorsError::io(None, e);
            let mut f = crate::sys::open_regular(path).map_err(io)?;
            let file_size = f.metadata().map_err(io)?.len();
            let mut len = [0u8; 8];
            let got = read_up_to(&mut f, &mut len).map_err(io)?;
            let header_len = check_header_len(len.get(..got).filter(|b| b.len() == 8), file_size)?;
            // Bounded by MAX_HEADER_LEN and by the file size.
            let mut buf = vec![0u8; 8 + header_len as usize];
            buf[..8].copy_from_slice(&len);
            let got = read_up_to(&mut f, &mut buf[8..]).map_err(io)?;
            if got < buf.len() - 8 {
                // The file shrank under us.
                return Err(SafetensorsError::Truncated {
                    need: buf.len() as u64,
                    available: 8 + got as u64,
                });
            }
            Self::parse_header(&buf, file_size)
        };
        read().map_err(|e| e.in_file(path))
    }

    /// The header length field (the JSON bytes after the first 8).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Absolute offset of the data section: `8 + header_len`.
    pub fn data_offset(&self) -> u64 {
        8 + self.header_len
    }

    /// File size the header was checked against.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// Tensors in data order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The `__metadata__` pairs, sorted by key.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    /// Absolute byte range of a tensor's data in the file.
    pub fn tensor_range(&self, t: &TensorInfo) -> Range<u64> {
        let base = self.data_offset();
        base + t.data.start..base + t.data.end
    }

    /// A tensor's bytes within `bytes` (the whole file these headers were
    /// parsed from), or `None` if they do not lie inside.
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], t: &TensorInfo) -> Option<&'a [u8]> {
        let r = self.tensor_range(t);
        bytes.get(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?)
    }

    /// Reads a small tensor's bytes from `file` (the file this header came
    /// from), refusing tensors of more than `max_bytes` bytes.
    pub fn read_tensor(
        &self,
        file: &mut File,
        t: &TensorInfo,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SafetensorsError> {
        if t.n_bytes() > max_bytes {
            return Err(SafetensorsError::TensorTooLarge {
                tensor: t.name.clone(),
                bytes: t.n_bytes(),
                max: max_bytes,
            });
        }
        let io = |e| SafetensorsError::io(None, e);
        let r = self.tensor_range(t);
        file.seek(SeekFrom::Start(r.start)).map_err(io)?;
        let mut buf = vec![0u8; t.n_bytes() as usize];
        file.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The header length from the first 8 bytes, checked against the limit and
/// the file size.
fn check_header_len(first8: Option<&[u8]>, file_size: u64) -> Result<u64, SafetensorsError> {
    let Some(Ok(b)) = first8.map(<[u8; 8]>::try_from) else {
        return Err(SafetensorsError::TooShort { file_size });
    };
    let len = u64::from_le_bytes(b);
    if len > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLarge {
            len,
            max: MAX_HEADER_LEN,
        });
    }
    if file_size < 8 || len > file_size - 8 {
        return Err(SafetensorsError::HeaderPastEnd { len, file_size });
    }
    Ok(len)
}

/// A tensor entry as written in the JSON, before checking.
#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Shape,
    data_offsets: (u64, u64),
}

/// A shape of at most [`MAX_DIMS`] non-negative integers.
struct Shape(Vec<u64>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of at most {MAX_DIMS} non-negative integers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                let mut dims = Vec::new();
                while let Some(d) = seq.next_element::<u64>()? {
                    if dims.len() == MAX_DIMS {
                        return Err(de::Error::custom(format_args!(
                            "shape has more than {MAX_DIMS} dimensions"
                        )));
                    }
                    dims.push(d);
                }
                Ok(Shape(dims))
            }
        }
        d.deserialize_seq(V)
    }
}

/// The header object: tensors in header order, metadata, the first name
/// seen twice.
struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: Vec<(String, String)>,
    duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawHeader, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
                let mut h = RawHeader {
                    tensors: Vec::new(),
                    metadata: Vec::new(),
                    duplicate: None,
                };
                let mut seen_metadata = false;
                let mut names = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == METADATA_KEY {
                        let md: Option<std::collections::BTreeMap<String, String>> = map
                            .next_value()
                            .map_err(|e| de::Error::custom(format_args!("{METADATA_KEY}: {e}")))?;
                        if seen_metadata && h.duplicate.is_none() {
                            h.duplicate = Some(key);
                        }
                        seen_metadata = true;
                        h.metadata = md.unwrap_or_default().into_iter().collect();
                        continue;
                    }
                    if names.contains(&key) {
                        map.next_value::<IgnoredAny>()?;
                        if h.duplicate.is_none() {
                            h.duplicate = Some(key);
                        }
                        continue;
                    }
                    let t: RawTensor = map
                        .next_value()
                        .map_err(|e| de::Error::custom(format_args!("tensor `{key}`: {e}")))?;
                    names.insert(key.clone());
                    h.tensors.push((key, t));
                }
                Ok(h)
            }
        }
        d.deserialize_map(V)
    }
}

fn parse_json(json: &[u8]) -> Result<RawHeader, SafetensorsError> {
    let text = std::str::from_utf8(json).map_err(|e| SafetensorsError::HeaderNotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    if !text.starts_with('{') {
        return Err(SafetensorsError::HeaderNotObject {
            first: json.first().copied(),
        });
    }
    serde_json::from_str(text).map_err(|e| SafetensorsError::BadJson {
        message: e.to_string(),
    })
}

/// Checks the raw entries against each other and the file.
fn build(
    raw: RawHeader,
    header_len: u64,
    file_size: u64,
) -> Result<SafetensorsFile, SafetensorsError> {
    if let Some(tensor) = raw.duplicate {
        return Err(SafetensorsError::DuplicateTensor { tensor });
    }
    let data_len = file_size - 8 - header_len; // checked by check_header_len
    let mut tensors = Vec::with_capacity(raw.tensors.len());
    for (name, t) in raw.tensors {
        let Some(dtype) = Dtype::from_name(&t.dtype) else {
            return Err(SafetensorsError::UnknownDtype {
                tensor: name,
                dtype: t.dtype,
            });
        };
        let (start, end) = t.data_offsets;
        if end < start {
            return Err(SafetensorsError::ReversedOffsets {
                tensor: name,
                start,
                end,
            });
        }
        let shape = t.shape.0;
        let (_, bytes) = shape_bytes(&name, dtype, &shape)?;
        if end - start != bytes {
            return Err(SafetensorsError::SizeMismatch {
                tensor: name,
                shape,
                dtype,
                expected: bytes,
                found: end - start,
            });
        }
        if end > data_len {
            return Err(SafetensorsError::TensorPastEnd {
                tensor: name,
                start,
                end,
                data_len,
                file_size,
            });
        }
        tensors.push(TensorInfo {
            name,
            dtype,
            shape,
            data: start..end,
        });
    }
    tensors.sort_by_key(|t| (t.data.start, t.data.end));
    let mut pos = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        if t.data.start > pos {
            return Err(SafetensorsError::Gap {
                start: pos,
                end: t.data.start,
                next: t.name.clone(),
            });
        }
        if t.data.start < pos {
            // The previous tensor reaching furthest is the one overlapped.
            let first = tensors[..i]
                .iter()
                .rev()
                .find(|p| p.data.end > t.data.start)
                .unwrap_or(&tensors[i - 1]);
            return Err(SafetensorsError::Overlap {
                first: first.name.clone(),
                first_start: first.data.start,
                first_end: first.data.end,
                second: t.name.clone(),
                second_start: t.data.start,
                second_end: t.data.end,
            });
        }
        pos = t.data.end;
    }
    if pos != data_len {
        return Err(SafetensorsError::TrailingBytes {
            extra: data_len - pos,
            data_end: 8 + header_len + pos,
            file_size,
        });
    }
    let index = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), i))
        .collect();
    Ok(SafetensorsFile {
        header_len,
        file_size,
        tensors,
        index,
        metadata: raw.metadata,
    })
}
