//! `model.safetensors.index.json`: which file of a multi-file checkpoint
//! holds each tensor.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
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
struct RawIndex<'a> {
    #[serde(borrow)]
    weight_map: Pairs<'a>,
}

/// A JSON object of strings, kept in order with duplicates (to refuse them).
/// The strings borrow the file's bytes where they hold no escape: a 3M-entry
/// index allocates once per tensor name (its key in the map), not three
/// times per entry (issue 26).
struct Pairs<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl<'de: 'a, 'a> Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pairs<'a>, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Pairs<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object mapping tensor names to file names")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Pairs<'a>, A::Error> {
                let mut v = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some((k, f)) = m.next_entry::<Borrowed<'a>, Borrowed<'a>>()? {
                    v.push((k.0, f.0));
                }
                Ok(Pairs(v))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A JSON string borrowed from the input when it has no escapes.
struct Borrowed<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Borrowed<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Borrowed<'a>, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Borrowed<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

impl WeightIndex {
    /// Parses the JSON text of an index. Every file name must be a plain
    /// relative path without `..` (it is joined to the index's directory).
    pub fn parse(json: &[u8]) -> Result<WeightIndex, SafetensorsError> {
        let bad = |message: String| SafetensorsError::BadIndex { message };
        let raw: RawIndex = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
        let mut files: Vec<String> = Vec::new();
        // Each distinct file is checked once, when first named.
        let mut file_ids: HashMap<Cow<'_, str>, usize> = HashMap::new();
        let mut map = HashMap::with_capacity(raw.weight_map.0.len());
        for (tensor, file) in raw.weight_map.0 {
            let id = match file_ids.get(&file) {
                Some(&id) => id,
                None => {
                    if !is_plain_relative(&file) {
                        return Err(bad(format!(
                            "weight_map[`{tensor}`] = {file:?} is not a relative path inside the checkpoint directory"
                        )));
                    }
                    files.push(file.clone().into_owned());
                    file_ids.insert(file, files.len() - 1);
                    files.len() - 1
                }
            };
            match map.entry(tensor.into_owned()) {
                Entry::Occupied(e) => {
                    return Err(bad(format!("tensor `{}` is mapped twice", e.key())));
                }
                Entry::Vacant(e) => {
                    e.insert(id);
                }
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

    /// The files and the map of tensor names to indexes into them, taken
    /// apart (the checkpoint's catalog keeps them without a copy).
    pub fn into_parts(self) -> (Vec<String>, HashMap<String, usize>) {
        (self.files, self.map)
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
