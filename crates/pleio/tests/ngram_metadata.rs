//! qwen4exp/gemma4 row-id parameters read from synthetic files' metadata:
//! the intended values come out, and every missing or mistyped key is named.

use pleio::gguf::{Array, Metadata, Value};
use pleio::ngram::released as synth;
use pleio::ngram::*;
use pleio::quant::GgmlType;
use pleio_lab::synth::SynthSpec;

/// Metadata of `spec`, with `edit` applied to each (key, value) pair
/// (returning `None` drops the pair).
fn synth_md(spec: &SynthSpec, edit: impl Fn(&str, Value) -> Option<Value>) -> Metadata {
    let mut md = Metadata::new();
    for (k, v) in spec.metadata().unwrap() {
        if let Some(v) = edit(&k, v) {
            md.insert(k, v).unwrap();
        }
    }
    md
}

fn qwen_spec(rows: u64) -> SynthSpec {
    SynthSpec::qwen(GgmlType::IQ4_NL, rows, 1)
}

fn qwen_md_without(suffix: &str) -> Metadata {
    let drop = format!("qwen4exp.{suffix}");
    synth_md(&qwen_spec(100_000), |k, v| (k != drop).then_some(v))
}

fn qwen_md_with(suffix: &str, value: Value) -> Metadata {
    let key = format!("qwen4exp.{suffix}");
    synth_md(&qwen_spec(100_000), |k, v| {
        Some(if k == key { value.clone() } else { v })
    })
}

#[test]
fn synth_metadata_gives_the_intended_params() {
    for rows in [synth::QWEN_FULL_ROWS, 100_000, 381] {
        let md = synth_md(&qwen_spec(rows), |_, v| Some(v));
        let heads = synth::QwenHeads::for_rows(rows).unwrap();
        let want = QwenNgramParams::new(
            3,
            8,
            synth::QWEN_EOS,
            Some(synth::QWEN_IMAGE),
            synth::QWEN_MULTIPLIERS.to_vec(),
            heads.sizes,
            heads.offsets,
            rows,
        )
        .unwrap();
        let got = ModelRows::from_metadata(&md, 160, rows).unwrap();
        assert_eq!(got, ModelRows::Qwen(want.clone()), "rows {rows}");
        assert_eq!(QwenNgramParams::from_metadata(&md, rows).unwrap(), want);
        assert_eq!(got.architecture(), "qwen4exp");
        assert_eq!(got.rows_per_token(), 16);
    }
    let md = synth_md(&qwen_spec(synth::QWEN_FULL_ROWS), |_, v| Some(v));
    let full = QwenNgramParams::from_metadata(&md, synth::QWEN_FULL_ROWS).unwrap();
    assert_eq!(full, QwenNgramParams::released());
}

#[test]
fn missing_keys_are_named() {
    for suffix in [
        keys::ROW_WIDTH,
        keys::NGRAM_SIZE,
        keys::HEADS_PER_NGRAM,
        keys::EOS_TOKEN_ID,
        keys::LAYER_MULTIPLIERS,
        keys::HEAD_VOCAB_SIZES,
        keys::HEAD_OFFSETS,
    ] {
        let err = ModelRows::from_metadata(&qwen_md_without(suffix), 160, 100_000).unwrap_err();
        let key = format!("qwen4exp.{suffix}");
        assert_eq!(err, NgramError::MissingKey { key: key.clone() });
        assert!(err.to_string().contains(&key), "{err}");
    }
    // optional keys
    let p = QwenNgramParams::from_metadata(&qwen_md_without(keys::IMAGE_TOKEN_ID), 100_000);
    assert_eq!(p.unwrap().image_token_id(), None);
    assert!(QwenNgramParams::from_metadata(&qwen_md_without(keys::LAYERS), 100_000).is_ok());
}

#[test]
fn wrong_key_types_are_named() {
    let cases = [
        (keys::NGRAM_SIZE, Value::F32(3.0), "f32 3"),
        (keys::EOS_TOKEN_ID, Value::U64(1 << 32), "u64 4294967296"),
        (keys::HEADS_PER_NGRAM, Value::I32(-8), "i32 -8"),
        (keys::IMAGE_TOKEN_ID, Value::String("x".into()), "string"),
        (
            keys::HEAD_OFFSETS,
            Value::Array(Array::I32(vec![0, -1])),
            "[i32; 2]",
        ),
        (keys::LAYER_MULTIPLIERS, Value::U64(7), "u64 7"),
        (
            keys::LAYERS,
            Value::Array(Array::F32(vec![1.0])),
            "[f32; 1]",
        ),
    ];
    for (suffix, value, found) in cases {
        let err =
            QwenNgramParams::from_metadata(&qwen_md_with(suffix, value), 100_000).unwrap_err();
        let NgramError::WrongKeyType { key, found: f, .. } = &err else {
            panic!("{suffix}: {err:?}");
        };
        assert_eq!(key, &format!("qwen4exp.{suffix}"));
        assert!(f.starts_with(found), "{suffix}: {f}");
        assert!(err.to_string().contains(key.as_str()), "{err}");
    }
    // any integer type in range is accepted
    let md = qwen_md_with(keys::NGRAM_SIZE, Value::U8(3));
    assert!(QwenNgramParams::from_metadata(&md, 100_000).is_ok());
    let md = qwen_md_with(keys::LAYERS, Value::Array(Array::I32(vec![1, 2])));
    assert!(matches!(
        QwenNgramParams::from_metadata(&md, 100_000),
        Err(NgramError::ArrayLength {
            key: keys::LAYERS,
            len: 2,
            ..
        })
    ));
}

#[test]
fn row_width_and_architecture_are_checked() {
    let md = synth_md(&qwen_spec(100_000), |_, v| Some(v));
    let err = ModelRows::from_metadata(&md, 256, 100_000).unwrap_err();
    assert!(
        matches!(&err, NgramError::RowWidth { key, value: 160, row_elems: 256, .. }
            if key == "qwen4exp.embedding_length_per_layer_input"),
        "{err:?}"
    );
    // validation against the table's rows still applies
    assert!(matches!(
        ModelRows::from_metadata(&md, 160, 99_000),
        Err(NgramError::HeadOutOfTable { .. })
    ));

    let gemma = SynthSpec::gemma(GgmlType::Q8_0, 1000, 2, 0);
    let md = synth_md(&gemma, |_, v| Some(v));
    let rows = ModelRows::from_metadata(&md, 512, 1000).unwrap();
    assert_eq!(rows, ModelRows::Gemma(Gemma4Rows::new(1000)));
    assert_eq!((rows.architecture(), rows.rows_per_token()), ("gemma4", 1));
    assert!(rows.qwen().is_none());
    let err = ModelRows::from_metadata(&md, 768, 1000).unwrap_err();
    assert!(err.to_string().contains("gemma4.block_count = 2"), "{err}");
    let no_count = synth_md(&gemma, |k, v| (k != "gemma4.block_count").then_some(v));
    assert!(ModelRows::from_metadata(&no_count, 768, 1000).is_ok());
    assert!(ModelRows::from_metadata(&no_count, 700, 1000).is_err());

    let llama = synth_md(&gemma, |k, v| {
        Some(if k == "general.architecture" {
            Value::String("llama".into())
        } else {
            v
        })
    });
    let err = ModelRows::from_metadata(&llama, 512, 1000).unwrap_err();
    assert_eq!(
        err,
        NgramError::UnknownArchitecture {
            arch: Some("llama".into())
        }
    );
    assert!(err.to_string().contains("\"llama\""), "{err}");
    let none = synth_md(&gemma, |k, v| (k != "general.architecture").then_some(v));
    let err = ModelRows::from_metadata(&none, 512, 1000).unwrap_err();
    assert_eq!(err, NgramError::UnknownArchitecture { arch: None });
}
