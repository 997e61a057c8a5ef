//! Bounded reading of what users feed pleio: row-id lists (`gather
//! --rows-file`), token-id lists (`--tokens`) and text (`--text`).
//!
//! Nothing here holds more than a documented limit: a row list is parsed
//! as it streams in and stops at [`MAX_ROW_IDS`] ids (an item longer than
//! any number stops at once, so `/dev/zero` fails after a few bytes);
//! `--tokens` and `--text` inputs stop at [`MAX_INPUT_BYTES`] bytes.

use std::io::{self, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value as Json;

/// Most row ids one `gather` takes (64 Mi ids, 512 MiB as `u64`s).
pub const MAX_ROW_IDS: usize = 1 << 26;

/// Most bytes read from a `--text` or `--tokens` input (64 MiB).
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// Longest item a row or token list may hold (`u64::MAX` has 20 digits).
const MAX_ITEM_BYTES: usize = 24;

/// Reads row ids separated by whitespace and/or commas, optionally inside
/// one pair of `[` `]` (so a JSON array works too), from `input` as it
/// streams. `source` names the input in errors; more than `limit` ids is an
/// error.
pub fn read_row_list(input: impl Read, source: &str, limit: usize) -> Result<Vec<u64>> {
    let mut p = RowListParser {
        source,
        limit,
        ids: Vec::new(),
        item: Vec::with_capacity(MAX_ITEM_BYTES),
        opened: false,
        closed: false,
    };
    let mut input = input;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {source}")),
        };
        for &b in &buf[..n] {
            p.byte(b)?;
        }
    }
    p.finish()
}

/// [`read_row_list`] over text in memory.
pub fn parse_row_list(text: &str, source: &str) -> Result<Vec<u64>> {
    read_row_list(text.as_bytes(), source, MAX_ROW_IDS)
}

struct RowListParser<'a> {
    source: &'a str,
    limit: usize,
    ids: Vec<u64>,
    item: Vec<u8>,
    opened: bool,
    closed: bool,
}

impl RowListParser<'_> {
    fn byte(&mut self, b: u8) -> Result<()> {
        match b {
            b',' | b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => self.end_item(),
            b'[' if !self.opened && self.ids.is_empty() && self.item.is_empty() => {
                self.opened = true;
                Ok(())
            }
            b']' if self.opened && !self.closed => {
                self.end_item()?;
                self.closed = true;
                Ok(())
            }
            _ if self.closed => bail!("{}: text after the closing `]`", self.source),
            _ => {
                if self.item.len() == MAX_ITEM_BYTES {
                    bail!(
                        "{}: item {} ({:?}...) is not a row id",
                        self.source,
                        self.ids.len() + 1,
                        String::from_utf8_lossy(&self.item)
                    );
                }
                self.item.push(b);
                Ok(())
            }
        }
    }

    fn end_item(&mut self) -> Result<()> {
        if self.item.is_empty() {
            return Ok(());
        }
        let n = self.ids.len() + 1;
        let text = String::from_utf8_lossy(&self.item);
        let id = text
            .parse::<u64>()
            .with_context(|| format!("{}: item {n} ({text:?}) is not a row id", self.source))?;
        if self.ids.len() == self.limit {
            bail!(
                "{}: more than {} ids, the most one list may hold; split it",
                self.source,
                self.limit
            );
        }
        self.ids.push(id);
        self.item.clear();
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<u64>> {
        self.end_item()?;
        if self.opened && !self.closed {
            bail!("{}: `[` without a closing `]`", self.source);
        }
        Ok(self.ids)
    }
}

/// A whole input as bytes (stdin for `-`), refusing more than
/// [`MAX_INPUT_BYTES`]; `what` names the option in errors.
pub fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>> {
    let shown = if path == Path::new("-") {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        io::stdin()
            .lock()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes))
    };
    read.with_context(|| format!("reading {what} {shown}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        bail!(
            "{what} {shown} is longer than {} MiB, the most pleio reads",
            MAX_INPUT_BYTES >> 20
        );
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8.
pub fn read_bounded_text(path: &Path, what: &str) -> Result<String> {
    let bytes = read_bounded(path, what)?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{what} {}: not UTF-8 (at byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Parses token ids: integers separated by whitespace and/or commas (as
/// `gather --rows-file` reads them), a JSON array, or a JSON object with a `tokens` array (what `pleio rows --json`
/// and `scripts/tokenize_ref.py` print). `source` names the input in errors.
pub fn parse_token_list(text: &str, source: &str) -> Result<Vec<u32>> {
    let body = text.trim_start();
    if body.starts_with('{') {
        let j: Json =
            serde_json::from_str(body).with_context(|| format!("{source}: not valid JSON"))?;
        let arr = j
            .get("tokens")
            .and_then(Json::as_array)
            .with_context(|| format!("{source}: JSON object without a \"tokens\" array"))?;
        return arr
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .with_context(|| format!("{source}: item {} ({v}) is not a token id", i + 1))
            })
            .collect();
    }
    parse_row_list(text, source)?
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            u32::try_from(t)
                .with_context(|| format!("{source}: item {} ({t}) is not a token id", i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_lists_parse_in_every_form() {
        assert_eq!(parse_row_list("1,5 9\n2", "x").unwrap(), vec![1, 5, 9, 2]);
        assert_eq!(parse_row_list("[3, 4]", "x").unwrap(), vec![3, 4]);
        assert_eq!(parse_row_list(" [ 3,4 ]\n", "x").unwrap(), vec![3, 4]);
        assert_eq!(parse_row_list("[]", "x").unwrap(), Vec::<u64>::new());
        assert_eq!(parse_row_list("  ", "x").unwrap(), Vec::<u64>::new());
        let e = parse_row_list("1,-2", "f.txt").unwrap_err().to_string();
        assert!(e.contains("f.txt") && e.contains("item 2"), "{e}");
        for bad in ["[1, 2", "[1] 2", "1 [2]", "[[1]]", "1]"] {
            assert!(parse_row_list(bad, "x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endless_or_huge_inputs_stop_at_the_limits() {
        // An endless item (/dev/zero) stops after a few bytes.
        let e = read_row_list(io::repeat(0), "zeros", 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("zeros: item 1") && e.contains("not a row id"),
            "{e}"
        );
        // An endless number stops as soon as it is longer than any id.
        let e = read_row_list(io::repeat(b'7'), "sevens", 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sevens: item 1"), "{e}");
        // An endless valid list stops at the id limit.
        struct Ones;
        impl Read for Ones {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = if i % 2 == 0 { b'1' } else { b'\n' };
                }
                Ok(buf.len() & !1)
            }
        }
        let e = read_row_list(Ones, "ones", 100_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ones: more than 100000 ids"), "{e}");
        let ones = b"1,".repeat(1000);
        let e = read_row_list(&ones[..], "ones", 999)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 999 ids"), "{e}");
        assert_eq!(read_row_list(&ones[..], "ones", 1000).unwrap().len(), 1000);
        // The largest id still parses; one more digit does not.
        assert_eq!(
            parse_row_list("18446744073709551615", "x").unwrap(),
            vec![u64::MAX]
        );
        assert!(parse_row_list("18446744073709551616", "x").is_err());
    }
}
