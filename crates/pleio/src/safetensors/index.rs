//! `model.safetensors.index.json`: which file of a multi-file checkpoint
//! holds each tensor.

use std::collections::HashMap;
use std::path::{Component, Path};

use serde::Deserialize;

use super::SafetensorsError;

/// The conventional name of the index file.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// Largest index file read (real ones are a few MB).
pub const MAX_INDEX_LEN: u64 = 256 << 20;

/// A parsed index: the distinct files (in order of first mention) and, for
/// each tensor, the file holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightIndex {
    files: Vec<String>,
    map: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: Pairs,
}

/// A JSON object of strings, kept in order with duplicates (to refuse them).
struct Pairs(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pairs, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object mapping tensor names to file names")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                let mut v = Vec::new();
                while let Some(pair) = m.next_entry::<String, String>()? {
                    v.push(pair);
                }
                Ok(Pairs(v))
            }
        }
        d.deserialize_map(V)
    }
}

impl WeightIndex {
    /// Parses the JSON text of an index. Every file name must be a plain
    /// relative path without `..` (it is joined to the index's directory).
    pub fn parse(json: &[u8]) -> Result<WeightIndex, SafetensorsError> {
        let bad = |message: String| SafetensorsError::BadIndex { message };
        let raw: RawIndex = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
        let mut files: Vec<String> = Vec::new();
        let mut file_ids: HashMap<String, usize> = HashMap::new();
        let mut map = HashMap::with_capacity(raw.weight_map.0.len());
        for (tensor, file) in raw.weight_map.0 {
            let file = file.as_str();
            if !is_plain_relative(file) {
                return Err(bad(format!(
                    "weight_map[`{tensor}`] = {file:?} is not a relative path inside the checkpoint directory"
                )));
            }
            let id = match file_ids.get(file) {
                Some(&id) => id,
                None => {
                    files.push(file.to_owned());
                    file_ids.insert(file.to_owned(), files.len() - 1);
                    files.len() - 1
                }
            };
            if map.insert(tensor.clone(), id).is_some() {
                return Err(bad(format!("tensor `{tensor}` is mapped twice")));
            }
        }
        Ok(WeightIndex { files, map })
    }

    /// Reads and parses an index file; errors name it.
    pub fn open(path: &Path) -> Result<WeightIndex, SafetensorsError> {
        let read = || -> Result<WeightIndex, SafetensorsError> {
            let bytes =
                read_bounded(path, MAX_INDEX_LEN).map_err(|e| SafetensorsError::io(None, e))?;
            WeightIndex::parse(&bytes)
        };
        read().map_err(|e| e.in_file(path))
    }

    /// The files named, in order of first mention.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// Index into [`files`](Self::files) of the file holding `tensor`.
    pub fn file_of(&self, tensor: &str) -> Option<usize> {
        self.map.get(tensor).copied()
    }

    /// Every (tensor, file index) pair, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, usize)> {
        self.map.iter().map(|(t, &f)| (t.as_str(), f))
    }

    /// Number of tensors mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no tensor is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// True if `p` is a non-empty relative path of normal components only.
pub(crate) fn is_plain_relative(p: &str) -> bool {
    let path = Path::new(p);
    !p.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Reads a whole file of at most `max` bytes; a longer file is an
/// `InvalidData` error.
pub(crate) fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = crate::sys::open_regular(path)?;
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("more than the {max} bytes allowed"),
        ));
    }
    Ok(buf)
}
