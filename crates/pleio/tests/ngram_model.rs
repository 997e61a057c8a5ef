//! `ModelRows::from_model` on files written by `synth`: the metadata read
//! back from disk gives the parameters synth intended.

use std::fs::File;

use pleio::layout::Layout;
use pleio::model::Model;
use pleio::ngram::released::{QwenHeads, QWEN_EOS, QWEN_FULL_ROWS, QWEN_IMAGE, QWEN_MULTIPLIERS};
use pleio::ngram::{Gemma4Rows, ModelRows, QwenNgramParams, RowMapper};
use pleio::quant::GgmlType;
use pleio_lab::synth::SynthSpec;

fn open_rows(spec: &SynthSpec) -> (ModelRows, Layout) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    spec.write(File::create(&path).unwrap(), &mut |_| {})
        .unwrap();
    let model = Model::open(&path).unwrap();
    let table = Layout::of_ple(&model).unwrap();
    (ModelRows::from_model(&model, &table).unwrap(), table)
}

#[test]
fn qwen_files_round_trip_their_hash_parameters() {
    for rows in [QWEN_FULL_ROWS, 1_000_000] {
        let mut spec = SynthSpec::qwen(GgmlType::IQ4_NL, rows, 7);
        spec.sparse = true;
        let (got, table) = open_rows(&spec);
        assert_eq!(table.rows(), rows);
        let heads = QwenHeads::for_rows(rows).unwrap();
        let want = QwenNgramParams::new(
            3,
            8,
            QWEN_EOS,
            Some(QWEN_IMAGE),
            QWEN_MULTIPLIERS.to_vec(),
            heads.sizes,
            heads.offsets,
            rows,
        )
        .unwrap();
        assert_eq!(got, ModelRows::Qwen(want));
        if rows == QWEN_FULL_ROWS {
            assert_eq!(got.qwen(), Some(&QwenNgramParams::released()));
            // the first worked example of docs/ple-tables.md, through the file's constants
            let mut out = Vec::new();
            got.sequence().map_tokens(&[9707], &mut out).unwrap();
            assert_eq!((out[0], out[8]), (16410909, 169641436));
        }
    }
}

#[test]
fn gemma_files_map_token_ids() {
    let spec = SynthSpec::gemma(GgmlType::Q8_0, 1000, 2, 3);
    let (got, table) = open_rows(&spec);
    assert_eq!(table.row_elems(), 512);
    assert_eq!(got, ModelRows::Gemma(Gemma4Rows::new(1000)));
    let mut out = Vec::new();
    assert!(got.sequence().map_tokens(&[999, 1000], &mut out).is_err());
}
