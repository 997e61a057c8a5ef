//! Split sets: `NAME-00001-of-00003.gguf`, each shard a full GGUF file.

use std::path::{Path, PathBuf};

/// Key holding a shard's 0-based number (`u16`).
pub const SPLIT_NO_KEY: &str = "split.no";
/// Key holding the number of shards (`u16`).
pub const SPLIT_COUNT_KEY: &str = "split.count";
/// Key holding the number of tensors in the whole set (`i32`, shard 0).
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// A shard's place in a split set, as read from its file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitName {
    /// The path without the `-NNNNN-of-MMMMM.gguf` suffix.
    pub stem: PathBuf,
    /// 0-based shard number.
    pub no: u16,
    /// Shards in the set.
    pub count: u16,
}

/// The path of shard `no` (0-based) of `count`: `{stem}-{no+1:05}-of-{count:05}.gguf`,
/// the naming llama.cpp's `gguf-split` uses.
pub fn split_path(stem: impl AsRef<Path>, no: u16, count: u16) -> PathBuf {
    let mut s = stem.as_ref().as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", u32::from(no) + 1, count));
    PathBuf::from(s)
}

/// Reads a shard's place from its file name, if it follows the naming rule
/// of [`split_path`] (5 digits each, `1 <= number <= count`).
pub fn parse_split_path(path: &Path) -> Option<SplitName> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_suffix(".gguf")?;
    let (head, count) = rest.rsplit_once("-of-")?;
    let (stem, number) = head.rsplit_once('-')?;
    let five_digits = |s: &str| {
        (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    let (number, count) = (five_digits(number)?, five_digits(count)?);
    if stem.is_empty() || number == 0 || number > count {
        return None;
    }
    Some(SplitName {
        stem: path.with_file_name(stem),
        no: u16::try_from(number - 1).ok()?,
        count: u16::try_from(count).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let p = split_path("/m/qwen-iq4", 0, 3);
        assert_eq!(p, Path::new("/m/qwen-iq4-00001-of-00003.gguf"));
        let s = parse_split_path(&p).unwrap();
        assert_eq!(
            s,
            SplitName {
                stem: "/m/qwen-iq4".into(),
                no: 0,
                count: 3
            }
        );
        let last = split_path("x", 65534, 65535);
        assert_eq!(last, Path::new("x-65535-of-65535.gguf"));
        assert_eq!(
            parse_split_path(&last).map(|s| (s.no, s.count)),
            Some((65534, 65535))
        );
        assert_eq!(
            parse_split_path(Path::new("rel-00002-of-00002.gguf"))
                .unwrap()
                .stem,
            Path::new("rel")
        );
    }

    #[test]
    fn rejects_other_names() {
        for name in [
            "model.gguf",
            "m-00000-of-00003.gguf",
            "m-00004-of-00003.gguf",
            "m-0001-of-00003.gguf",
            "m-00001-of-00003.bin",
            "-00001-of-00003.gguf",
            "m-00001-of-99999.gguf",
            "m-0000a-of-00003.gguf",
        ] {
            assert_eq!(parse_split_path(Path::new(name)), None, "{name}");
        }
    }
}
