//! The metadata key/value table of a GGUF file.

use std::collections::HashMap;

use super::Value;

/// Metadata key/value pairs, in file order, with lookup by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty table.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// An empty table with room for `n` pairs.
    pub(crate) fn with_capacity(n: usize) -> Metadata {
        Metadata {
            entries: Vec::with_capacity(n),
            index: HashMap::with_capacity(n),
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// True if `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Pairs in file (or insertion) order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends a pair; hands the key back if it is already present.
    pub fn insert(&mut self, key: String, value: Value) -> Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(key);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a str, &'a Value);
    type IntoIter = Box<dyn ExactSizeIterator<Item = (&'a str, &'a Value)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}
