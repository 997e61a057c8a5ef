//! `pleio rows` end to end: token inputs, the worked examples of
//! docs/ple-tables.md through a file's metadata, text, corpus, gemma4, errors.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use pleio::gguf::{GgufWriter, Value};
use pleio::quant::GgmlType;
use pleio::tokenizer::QwenTokenizer;
use serde_json::Value as Json;

const EOS: u64 = 248_044;

fn pleio(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pleio"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pleio");
    let mut pipe = child.stdin.take().unwrap();
    // pleio may exit (an error) before reading its input
    if let Err(e) = pipe.write_all(stdin.unwrap_or("").as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = pleio(args, stdin);
    assert!(
        out.status.success(),
        "pleio {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail with status 2; returns its stderr.
fn fails(args: &[&str], stdin: Option<&str>) -> String {
    let out = pleio(args, stdin);
    assert_eq!(out.status.code(), Some(2), "pleio {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn json_rows(args: &[&str], stdin: Option<&str>) -> (Vec<u64>, Vec<Vec<u64>>) {
    let j: Json = serde_json::from_str(&ok(args, stdin)).unwrap();
    let ids = |v: &Json| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let tokens = ids(&j["tokens"]);
    let rows: Vec<Vec<u64>> = j["rows"].as_array().unwrap().iter().map(ids).collect();
    assert_eq!(tokens.len(), rows.len());
    (tokens, rows)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

struct Files {
    dir: tempfile::TempDir,
    qwen: PathBuf,
}

/// A sparse full-size qwen4exp file (released constants in its metadata).
fn qwen_full() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let qwen = dir.path().join("q.gguf");
    ok(
        &["synth", "--rows", "full", "--sparse", "-o", p(&qwen)],
        None,
    );
    Files { dir, qwen }
}

#[test]
fn worked_examples_through_file_metadata() {
    let f = qwen_full();
    let (tokens, rows) = json_rows(
        &["rows", p(&f.qwen), "--tokens", "-", "--json"],
        Some("9707 11 1879"),
    );
    assert_eq!(tokens, [9707, 11, 1879]);
    assert_eq!(
        rows[2],
        [
            6380558, 26411572, 56460672, 78566983, 94693008, 106742196, 124822692, 148942556,
            164226950, 190352573, 210933682, 238908951, 242182004, 265475238, 299910982, 312121804
        ]
    );
    assert_eq!((rows[0][0], rows[0][15]), (16410909, 300984276));
    assert_eq!((rows[1][0], rows[1][15]), (18158303, 307699687));

    // every token-list form, including the JSON that `rows --json` prints
    let forms = [
        "100, 248044\n200 300",
        "[100, 248044, 200, 300]",
        r#"{"tokens": [100, 248044, 200, 300]}"#,
    ];
    for form in forms {
        let (tokens, rows) =
            json_rows(&["rows", p(&f.qwen), "--tokens", "-", "--json"], Some(form));
        assert_eq!(tokens, [100, EOS, 200, 300], "{form}");
        let h0_h8: Vec<(u64, u64)> = rows.iter().map(|r| (r[0], r[8])).collect();
        assert_eq!(
            h0_h8,
            [
                (5727835, 162363667),
                (4253433, 163256257),
                (15114226, 177805529),
                (6129193, 160807097)
            ],
            "{form}"
        );
    }
    let file = f.dir.path().join("t.json");
    std::fs::write(&file, "[9707,11]").unwrap();
    let (tokens, _) = json_rows(&["rows", p(&f.qwen), "--tokens", p(&file), "--json"], None);
    assert_eq!(tokens, [9707, 11]);
}

#[test]
fn text_is_tokenized_with_the_builtin_tokenizer() {
    let f = qwen_full();
    let text = "fn main() {\n    println!(\"héllo, 世界\");\n}\n<|endoftext|>fn again";
    let file = f.dir.path().join("t.txt");
    std::fs::write(&file, text).unwrap();
    let tok = QwenTokenizer::shared().unwrap();

    let (tokens, rows) = json_rows(&["rows", p(&f.qwen), "--text", p(&file), "--json"], None);
    let want: Vec<u64> = tok
        .encode(text)
        .unwrap()
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(tokens, want);
    assert!(tokens.contains(&EOS));
    // the token after <|endoftext|> hashes like a fresh sequence's first token
    let after = tokens.iter().position(|&t| t == EOS).unwrap() + 1;
    let fresh = format!("{}", tokens[after]);
    let (_, fresh_rows) = json_rows(
        &["rows", p(&f.qwen), "--tokens", "-", "--json"],
        Some(&fresh),
    );
    assert_eq!(rows[after], fresh_rows[0]);

    let (ordinary, _) = json_rows(
        &[
            "rows",
            p(&f.qwen),
            "--text",
            p(&file),
            "--ordinary",
            "--json",
        ],
        None,
    );
    let want: Vec<u64> = tok
        .encode_ordinary(text)
        .unwrap()
        .into_iter()
        .map(u64::from)
        .collect();
    assert_eq!(ordinary, want);
    assert!(!ordinary.contains(&EOS));

    // text output: two header lines, then position, id, text, 16 row ids
    let out = ok(&["rows", p(&f.qwen), "--text", p(&file)], None);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), tokens.len() + 2);
    assert!(lines[0].starts_with("# qwen4exp:"), "{}", lines[0]);
    for (i, line) in lines[2..].iter().enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 4, "{line}");
        assert_eq!(cols[0], i.to_string());
        assert_eq!(cols[1], tokens[i].to_string());
        let r: Vec<u64> = cols[3].split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(r, rows[i]);
    }
    assert!(out.contains("\t\"<|endoftext|>\"\t"), "{out}");
}

#[test]
fn corpus_stream_joins_files_with_endoftext() {
    let f = qwen_full();
    let (tokens, rows) = json_rows(&["rows", p(&f.qwen), "--corpus", "--json"], None);
    assert!(tokens.len() > 50_000, "{} tokens", tokens.len());
    assert!(rows.iter().all(|r| r.len() == 16));
    // separators between the files, plus <|endoftext|> written in the texts
    let eos = tokens.iter().filter(|&&t| t == EOS).count();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../corpus");
    let n_files: usize = std::fs::read_dir(&dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|d| d.is_dir())
        .map(|d| std::fs::read_dir(d).unwrap().count())
        .sum();
    assert!(eos >= n_files - 1, "{eos} EOS for {n_files} files");
    // the first file's tokens open the stream
    let chat = std::fs::read_to_string(dir.join("chat/code-review-chat.txt")).unwrap();
    let first = QwenTokenizer::shared().unwrap().encode(&chat).unwrap();
    let head: Vec<u64> = first.iter().map(|&t| u64::from(t)).collect();
    assert_eq!(&tokens[..head.len()], &head[..]);
    assert_eq!(tokens[head.len()], EOS);
}

#[test]
fn scaled_tables_keep_rows_inside() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("small.gguf");
    ok(
        &["synth", "--rows", "100000", "--sparse", "-o", p(&q)],
        None,
    );
    let (_, rows) = json_rows(
        &["rows", p(&q), "--tokens", "-", "--json"],
        Some("1 2 3 248044 4"),
    );
    assert!(rows.iter().flatten().all(|&r| r < 100_000));
    let full = qwen_full();
    let (_, full_rows) = json_rows(
        &["rows", p(&full.qwen), "--tokens", "-", "--json"],
        Some("1 2 3"),
    );
    assert_ne!(rows[..3], full_rows[..], "the file's head sizes are used");
}

#[test]
fn gemma4_rows_are_token_ids() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("g.gguf");
    ok(
        &[
            "synth",
            "--arch",
            "gemma4",
            "--rows",
            "1000",
            "--layers",
            "2",
            "-o",
            p(&g),
        ],
        None,
    );
    let (tokens, rows) = json_rows(
        &["rows", p(&g), "--tokens", "-", "--json"],
        Some("[5, 999, 5]"),
    );
    assert_eq!(tokens, [5, 999, 5]);
    assert_eq!(rows, [[5], [999], [5]]);
    let out = ok(&["rows", p(&g), "--tokens", "-"], Some("7"));
    assert_eq!(out.lines().nth(2), Some("0\t7\t7"));

    let err = fails(&["rows", p(&g), "--tokens", "-"], Some("1 1000"));
    assert!(
        err.contains("token 1000") && err.contains("1000 rows"),
        "{err}"
    );
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "hello").unwrap();
    for input in [["--text", p(&text)].as_slice(), ["--corpus"].as_slice()] {
        let args = [["rows", p(&g)].as_slice(), input].concat();
        let err = fails(&args, None);
        assert!(
            err.contains("no gemma4 tokenizer") && err.contains("--tokens"),
            "{err}"
        );
    }
}

#[test]
fn bad_inputs_fail_cleanly() {
    let f = qwen_full();
    let err = fails(&["rows", p(&f.qwen), "--tokens", "-"], Some("1 2 x"));
    assert!(err.contains("item 3"), "{err}");
    let err = fails(&["rows", p(&f.qwen), "--tokens", "-"], Some("4294967296"));
    assert!(err.contains("not a token id"), "{err}");
    let missing = f.dir.path().join("nope.txt");
    let err = fails(&["rows", p(&f.qwen), "--text", p(&missing)], None);
    assert!(err.contains("nope.txt"), "{err}");
    // exactly one input, and --ordinary only with text
    let usage = pleio(&["rows", p(&f.qwen)], None);
    assert!(!usage.status.success());
    let usage = pleio(&["rows", p(&f.qwen), "--corpus", "--tokens", "-"], None);
    assert!(!usage.status.success());
    let usage = pleio(
        &["rows", p(&f.qwen), "--tokens", "-", "--ordinary"],
        Some("1"),
    );
    assert!(!usage.status.success());
}

#[test]
fn unknown_architecture_and_bad_metadata_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, meta: Vec<(&str, Value)>| -> PathBuf {
        let path = dir.path().join(name);
        let mut w = GgufWriter::new(File::create(&path).unwrap());
        for (k, v) in meta {
            w.add_metadata(k.to_string(), v).unwrap();
        }
        w.add_tensor("per_layer_token_embd.weight", GgmlType::F32, &[4, 8])
            .unwrap();
        w.begin_data().unwrap();
        w.write_tensor_data(&[0u8; 128]).unwrap();
        w.finish().unwrap();
        path
    };
    let llama = write(
        "llama.gguf",
        vec![("general.architecture", Value::String("llama".into()))],
    );
    let err = fails(&["rows", p(&llama), "--tokens", "-"], Some("1"));
    assert!(
        err.contains("\"llama\"") && err.contains("qwen4exp"),
        "{err}"
    );
    let qwen = write(
        "q.gguf",
        vec![
            ("general.architecture", Value::String("qwen4exp".into())),
            ("qwen4exp.embedding_length_per_layer_input", Value::U32(4)),
        ],
    );
    let err = fails(&["rows", p(&qwen), "--tokens", "-"], Some("1"));
    assert!(err.contains("qwen4exp.ple.ngram_size is missing"), "{err}");
}
