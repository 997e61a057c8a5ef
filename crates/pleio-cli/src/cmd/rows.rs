//! `pleio rows`: the row ids a text or token stream needs.
//!
//! Also home of what other commands reuse to get a token stream: [`Input`]
//! (`--text`, `--tokens`, `--corpus`, `--ordinary`; flatten it into a
//! command's args), the token-list reader (`crate::lists::parse_token_list`) and the embedded [`CORPUS`].

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pleio::layout::Layout;
use pleio::model::Model;
use pleio::ngram::{ModelRows, RowMapper};
use pleio::tokenizer::{QwenTokenizer, ENDOFTEXT_ID};
use pleio_lab::replay::MAX_TOKENS;

use crate::lists::{parse_token_list, read_bounded_text};

/// Embeds the listed files of `corpus/` (repository root), in order.
macro_rules! corpus {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../corpus/", $name)))),*]
    };
}

/// The bundled corpus (`corpus/` at the repository root; origins and
/// licences in `corpus/NOTICE.md`): `(path inside corpus/, text)`, sorted by
/// path. Embedded in the binary, so it works from any directory.
pub const CORPUS: &[(&str, &str)] = corpus![
    "chat/code-review-chat.txt",
    "code/anyhow-error.rs",
    "code/flate2-gz-mod.rs",
    "code/fnv-lib.rs",
    "code/gguf_reader.py",
    "code/itoa-lib.rs",
    "code/memchr-memchr.rs",
    "code/serde_json-read.rs",
    "code/strsim-lib.rs",
    "code/tiktoken-core.py",
    "docs/anyhow-README.md",
    "docs/rayon-FAQ.md",
    "docs/regex-README.md",
    "docs/regex-UNICODE.md",
    "docs/serde_json-README.md",
    "licenses/Apache-2.0.txt",
    "licenses/MIT-anyhow.txt",
    "licenses/MIT-flate2.txt",
    "licenses/MIT-fnv.txt",
    "licenses/MIT-gguf-py.txt",
    "licenses/MIT-itoa.txt",
    "licenses/MIT-memchr.txt",
    "licenses/MIT-rayon.txt",
    "licenses/MIT-regex.txt",
    "licenses/MIT-serde_json.txt",
    "licenses/MIT-strsim.txt",
    "licenses/MIT-tiktoken.txt",
    "licenses/MPL-2.0.txt",
];

/// Where a token stream comes from (exactly one of `--text`, `--tokens`,
/// `--corpus`).
#[derive(clap::Args, Debug, Clone)]
#[group(skip)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["text", "tokens", "corpus"]))]
pub struct Input {
    /// UTF-8 text to tokenize with the model's tokenizer (qwen4exp's
    /// Qwen3.5/3.6 BPE, built in; `-` reads stdin). At most 64 MiB.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Token ids: whitespace- or comma-separated, a JSON array, or
    /// `{"tokens": [...]}` (`-` reads stdin). At most 64 MiB and 4194304
    /// tokens.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// The bundled corpus (licence texts, docs, source code, a chat): each
    /// file tokenized, files joined by `<|endoftext|>`.
    #[arg(long)]
    pub corpus: bool,
    /// With --corpus: the corpus N times, the first in its own order, each
    /// later one with its files in another seeded order (a stream of many
    /// prompts that share text, as a server sees).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "corpus",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub orders: u64,
    /// Encode special-token strings such as `<|im_start|>` as plain text.
    #[arg(long, conflicts_with = "tokens")]
    pub ordinary: bool,
}

impl Input {
    /// The token stream for a model mapped by `rows`; text needs the
    /// model's tokenizer, which pleio has for qwen4exp only.
    ///
    /// Inputs are read up to [`crate::lists::MAX_INPUT_BYTES`] and streams of more than
    /// [`MAX_TOKENS`] tokens are refused.
    pub fn load(&self, rows: &ModelRows) -> Result<Vec<u32>> {
        let tokens = if let Some(path) = &self.tokens {
            let text = read_bounded_text(path, "--tokens")?;
            parse_token_list(&text, &path.display().to_string())?
        } else {
            let tok = tokenizer_for(rows)?;
            if let Some(path) = &self.text {
                let text = read_bounded_text(path, "--text")?;
                encode(tok, &text, self.ordinary).with_context(|| path.display().to_string())?
            } else {
                corpus_orders(tok, self.ordinary, self.orders)?
            }
        };
        if tokens.len() > MAX_TOKENS {
            bail!(
                "the token stream has {} tokens, more than {MAX_TOKENS}, the most pleio takes",
                tokens.len()
            );
        }
        Ok(tokens)
    }
}

/// The built-in tokenizer of the mapped model, or an error saying why there
/// is none.
pub(crate) fn tokenizer_for(rows: &ModelRows) -> Result<&'static QwenTokenizer> {
    match rows {
        ModelRows::Qwen(_) => Ok(QwenTokenizer::shared()?),
        other => bail!(
            "pleio has no {} tokenizer (only qwen4exp's is built in), so it cannot \
             read --text or --corpus for this model: pass token ids with --tokens",
            other.architecture()
        ),
    }
}

pub(crate) fn encode(tok: &QwenTokenizer, text: &str, ordinary: bool) -> Result<Vec<u32>> {
    Ok(if ordinary {
        tok.encode_ordinary(text)?
    } else {
        tok.encode(text)?
    })
}

/// The corpus as one stream: every file of [`CORPUS`] in order, with
/// `<|endoftext|>` between files.
pub fn corpus_tokens(tok: &QwenTokenizer, ordinary: bool) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for (i, (name, text)) in CORPUS.iter().enumerate() {
        if i > 0 {
            out.push(ENDOFTEXT_ID);
        }
        out.extend(encode(tok, text, ordinary).with_context(|| format!("corpus/{name}"))?);
    }
    Ok(out)
}

/// The corpus `orders` times as one stream: first in [`CORPUS`] order, then
/// in seeded shuffles of its files (seed = the order's number), every file
/// separated by `<|endoftext|>`.
///
/// A stream of more than [`MAX_TOKENS`] tokens is refused before it is
/// built (`--orders 2^64-1` used to build copies until memory ran out).
pub fn corpus_orders(tok: &QwenTokenizer, ordinary: bool, orders: u64) -> Result<Vec<u32>> {
    if orders <= 1 {
        return corpus_tokens(tok, ordinary);
    }
    let files: Vec<Vec<u32>> = CORPUS
        .iter()
        .map(|(name, text)| encode(tok, text, ordinary).with_context(|| format!("corpus/{name}")))
        .collect::<Result<_>>()?;
    // One order: every file plus a separator before each but the first.
    let per_order = files.iter().map(|f| f.len() as u64 + 1).sum::<u64>();
    let total = orders
        .checked_mul(per_order)
        .map(|t| t - 1)
        .filter(|&t| t <= MAX_TOKENS as u64);
    let Some(total) = total else {
        bail!(
            "--orders {orders}: {orders} copies of the corpus ({per_order} tokens each) are more \
             than {MAX_TOKENS} tokens, the most pleio takes (at most {} orders)",
            (MAX_TOKENS as u64 + 1) / per_order.max(1)
        );
    };
    let mut out = Vec::with_capacity(total as usize);
    for k in 0..orders {
        let mut idx: Vec<usize> = (0..files.len()).collect();
        if k > 0 {
            let mut rng = pleio_lab::random::Rng::new(k);
            for i in (1..idx.len()).rev() {
                idx.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        for i in idx {
            if !out.is_empty() {
                out.push(ENDOFTEXT_ID);
            }
            out.extend_from_slice(&files[i]);
        }
    }
    Ok(out)
}

/// Print, per token, its id and the PLE row ids the model needs for it
/// (qwen4exp: the n-gram hash of the token and its predecessors, 16 rows;
/// gemma4: the token id, 1 row).
///
/// The stream is one sequence: `<|endoftext|>` resets the n-gram context.
/// Text output has one line per token: position, id, the token's text (for
/// qwen4exp) and its row ids.
#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file (or any shard of a split set) whose metadata sets the
    /// mapping (a `synth --sparse` file of the same architecture will do),
    /// or a safetensors checkpoint (directory, index, file, ple-store.json)
    /// whose config.json does.
    file: PathBuf,
    #[command(flatten)]
    layer: crate::table_args::LayerArg,
    #[command(flatten)]
    input: Input,
    /// Print `{"tokens": [...], "rows": [[...], ...]}`.
    #[arg(long)]
    json: bool,
    /// Print counts and timings (tokenize, map, row ids/s) to stderr.
    #[arg(long)]
    stats: bool,
}

/// The row mapper of the model at `path`: a GGUF file's metadata, or a
/// safetensors checkpoint's `config.json` (checked against its buffers),
/// for the PLE table of `layer` (default: the lowest PLE layer).
pub fn mapper_of(path: &std::path::Path, layer: &crate::table_args::LayerArg) -> Result<ModelRows> {
    let remote = pleio::remote::is_remote(&path.to_string_lossy());
    if remote || pleio::checkpoint::is_checkpoint_path(path) || layer.layer.is_some() {
        return Ok(layer.open(path, None)?.row_ids()?);
    }
    let model = Model::open(path)?;
    let table = Layout::of_ple(&model).with_context(|| path.display().to_string())?;
    ModelRows::from_model(&model, &table).with_context(|| path.display().to_string())
}

pub fn run(a: Args) -> Result<()> {
    let mapper = mapper_of(&a.file, &a.layer)?;

    // Build the tokenizer first (when needed) so the stats can tell its
    // one-off load from the tokenizing itself.
    let t0 = Instant::now();
    if a.input.tokens.is_none() && matches!(mapper, ModelRows::Qwen(_)) {
        QwenTokenizer::shared()?;
    }
    let t_load = t0.elapsed();
    let t0 = Instant::now();
    let tokens = a.input.load(&mapper)?;
    let t_tok = t0.elapsed();

    let t1 = Instant::now();
    let mut rows = Vec::new();
    mapper.sequence().map_tokens(&tokens, &mut rows)?;
    let t_map = t1.elapsed();

    if a.stats {
        print_stats(&mapper, &tokens, &rows, [t_load, t_tok, t_map]);
    }
    let res = if a.json {
        write_json(&tokens, &rows, mapper.rows_per_token())
    } else {
        let tok = match &mapper {
            ModelRows::Qwen(_) => Some(QwenTokenizer::shared()?),
            _ => None,
        };
        write_text(&mapper, tok, &tokens, &rows)
    };
    match res {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// `times`: tokenizer load, tokenize (or read ids), map.
fn print_stats(mapper: &ModelRows, tokens: &[u32], rows: &[u64], times: [Duration; 3]) {
    let mut distinct = rows.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let [load, tok, map] = times.map(|t| t.as_secs_f64());
    let rate = if map > 0.0 {
        format!("{:.1} M row ids/s", rows.len() as f64 / map / 1e6)
    } else {
        "too fast to time".into()
    };
    eprintln!(
        "{}: {} tokens, {} row ids ({} distinct); tokenizer load {:.1} ms, \
         tokenize/read {:.1} ms ({:.2} M tokens/s), map {:.2} ms ({rate})",
        mapper.architecture(),
        tokens.len(),
        rows.len(),
        distinct.len(),
        load * 1e3,
        tok * 1e3,
        tokens.len() as f64 / tok.max(1e-9) / 1e6,
        map * 1e3,
    );
}

/// Writes `items` separated by commas.
fn write_list<T: std::fmt::Display>(w: &mut impl Write, items: &[T]) -> io::Result<()> {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        write!(w, "{x}")?;
    }
    Ok(())
}

fn write_json(tokens: &[u32], rows: &[u64], per: usize) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    w.write_all(b"{\"tokens\":[")?;
    write_list(&mut w, tokens)?;
    w.write_all(b"],\"rows\":[")?;
    for (i, r) in rows.chunks_exact(per).enumerate() {
        w.write_all(if i > 0 { b",[" } else { b"[" })?;
        write_list(&mut w, r)?;
        w.write_all(b"]")?;
    }
    w.write_all(b"]}\n")?;
    w.flush()
}

fn write_text(
    mapper: &ModelRows,
    tok: Option<&QwenTokenizer>,
    tokens: &[u32],
    rows: &[u64],
) -> io::Result<()> {
    let per = mapper.rows_per_token();
    let mut w = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    writeln!(
        w,
        "# {}: {} tokens, {per} row id{} per token",
        mapper.architecture(),
        tokens.len(),
        if per == 1 { "" } else { "s" }
    )?;
    let piece_col = if tok.is_some() { "\ttext" } else { "" };
    writeln!(w, "# pos\ttoken{piece_col}\trows")?;
    for (i, (&t, r)) in tokens.iter().zip(rows.chunks_exact(per)).enumerate() {
        write!(w, "{i}\t{t}")?;
        if let Some(tok) = tok {
            match tok.decode_bytes(&[t]) {
                Ok(b) => write!(w, "\t{:?}", String::from_utf8_lossy(&b))?,
                Err(_) => w.write_all(b"\t?")?,
            }
        }
        w.write_all(b"\t")?;
        for (j, x) in r.iter().enumerate() {
            if j > 0 {
                w.write_all(b" ")?;
            }
            write!(w, "{x}")?;
        }
        w.write_all(b"\n")?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lists_parse_in_every_form() {
        assert_eq!(parse_token_list("1 2,3\n4", "x").unwrap(), [1, 2, 3, 4]);
        assert_eq!(parse_token_list(" [5, 6]\n", "x").unwrap(), [5, 6]);
        assert_eq!(
            parse_token_list("{\"tokens\": [7, 4294967295], \"rows\": []}", "x").unwrap(),
            [7, u32::MAX]
        );
        assert!(parse_token_list("", "x").unwrap().is_empty());
        let e = parse_token_list("1 4294967296", "t.txt")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.txt") && e.contains("item 2"), "{e}");
        let e = parse_token_list("{\"tokens\": [1, -1]}", "j")
            .unwrap_err()
            .to_string();
        assert!(e.contains("item 2"), "{e}");
        assert!(parse_token_list("{\"ids\": [1]}", "j").is_err());
        assert!(parse_token_list("1 x", "j").is_err());
    }

    #[test]
    fn embedded_corpus_lists_every_corpus_file() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../corpus");
        let mut on_disk = Vec::new();
        for dir in std::fs::read_dir(&root).unwrap() {
            let dir = dir.unwrap().path();
            if dir.is_dir() {
                for f in std::fs::read_dir(&dir).unwrap() {
                    let f = f.unwrap().path();
                    let rel = f.strip_prefix(&root).unwrap().to_str().unwrap().to_string();
                    on_disk.push(rel);
                }
            }
        }
        on_disk.sort();
        let listed: Vec<&str> = CORPUS.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            listed, on_disk,
            "CORPUS must list corpus/*/* in sorted order"
        );
        let bytes: usize = CORPUS.iter().map(|(_, t)| t.len()).sum();
        assert!((100_000..1_000_000).contains(&bytes), "{bytes} bytes");
    }
}
