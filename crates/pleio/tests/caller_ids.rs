//! What the C and Python bindings need from the engine: row ids held in
//! signed or narrow integers (`Table::rows_from`), token streams that own
//! their mapper (`OwnedSequence`), and running totals of a table's gathers
//! (`Table::stats`).

mod fetch_fixture;

use std::sync::Arc;

use fetch_fixture::Fixture;
use pleio::ngram::{ModelRows, OwnedSequence, RowMapper};
use pleio::quant::GgmlType;
use pleio::{ErrorKind, Table};
use pleio_lab::synth::SynthSpec;

#[test]
fn rows_from_widens_every_id_type_and_names_bad_ids() {
    let fx = Fixture::qwen(1000, 5);
    let t = fx.reader();
    let mut rows = vec![77];
    t.rows_from(&[3i32, 0, 999], &mut rows).unwrap();
    assert_eq!(rows, [3, 0, 999], "cleared first, then widened in order");
    t.rows_from(&[3i64, 999], &mut rows).unwrap();
    assert_eq!(rows, [3, 999]);
    t.rows_from(&[4u32], &mut rows).unwrap();
    assert_eq!(rows, [4]);
    t.rows_from(&[5u64, 6], &mut rows).unwrap();
    assert_eq!(rows, [5, 6]);
    t.rows_from::<i32>(&[], &mut rows).unwrap();
    // u64 ids need no widening
    assert_eq!(
        <u64 as pleio::RowId>::as_rows(&[1, 2]),
        Some(&[1u64, 2][..])
    );
    assert_eq!(<i64 as pleio::RowId>::as_rows(&[1, 2]), None);
    assert!(rows.is_empty());

    for (ids, named) in [
        (vec![1i64, -1, 2], "-1"),
        (vec![i64::MIN], "-9223372036854775808"),
        (vec![0, 1000], "1000"),
    ] {
        let e = t.rows_from(&ids, &mut rows).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RowOutOfRange);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("row {named} is out of range")),
            "{msg}"
        );
        assert!(msg.contains("1000 rows"), "{msg}");
        assert!(msg.contains(&fx.file.path().display().to_string()), "{msg}");
    }
    let e = t.rows_from(&[-7i32], &mut rows).unwrap_err();
    assert_eq!((e.kind(), e.row()), (ErrorKind::RowOutOfRange, None));
    let e = t.rows_from(&[1000i32], &mut rows).unwrap_err();
    assert_eq!(e.row(), Some(1000));

    // the widened ids gather exactly what u64 ids do
    t.rows_from(&[7i32, 7, 998], &mut rows).unwrap();
    let mut a = vec![0f32; 3 * t.row_elems()];
    let mut b = a.clone();
    t.gather(&rows, &mut a).unwrap();
    t.gather(&[7, 7, 998], &mut b).unwrap();
    assert_eq!(a, b);
}

#[test]
fn owned_sequences_map_like_borrowed_ones() {
    for spec in [
        SynthSpec::qwen(GgmlType::IQ4_NL, 50_000, 3),
        SynthSpec::gemma(GgmlType::Q8_0, 1000, 2, 3),
    ] {
        let fx = Fixture::of_spec(&spec);
        let rows: ModelRows = Table::from_model(fx.model.clone())
            .unwrap()
            .row_ids()
            .unwrap();
        let tokens: Vec<u32> = (0..200u32).map(|i| (i * 7919) % 997).collect();
        let mut want = Vec::new();
        rows.sequence().map_tokens(&tokens, &mut want).unwrap();

        let mut seq = OwnedSequence::new(Arc::new(rows.clone()));
        assert_eq!(seq.rows_per_token(), rows.rows_per_token());
        let mut got = Vec::new();
        for chunk in tokens.chunks(33) {
            seq.map_tokens(chunk, &mut got).unwrap();
        }
        assert_eq!(got, want, "{}: across calls", rows.architecture());
        seq.reset();
        got.clear();
        seq.map_tokens(&tokens, &mut got).unwrap();
        assert_eq!(got, want, "{}: after reset", rows.architecture());

        // a failed call leaves the stream where it was
        let mut seq = OwnedSequence::new(Arc::new(rows.clone()));
        seq.map_tokens(&tokens[..10], &mut got).unwrap();
        let mut short = vec![0u64; 1];
        assert!(seq.map_into(&tokens[10..12], &mut short).is_err());
        got.clear();
        seq.map_tokens(&tokens[10..], &mut got).unwrap();
        assert_eq!(got, want[10 * rows.rows_per_token()..]);
    }
}

#[test]
fn stats_total_every_gather_of_every_clone() {
    let fx = Fixture::qwen(4000, 9);
    let t = fx.reader().with_strategy(pleio::Strategy::Pread);
    let zero = t.stats();
    assert_eq!((zero.gathers, zero.rows, zero.bytes), (0, 0, 0));
    let mut out = vec![0f32; 10 * t.row_elems()];
    t.gather(&(0..10).collect::<Vec<_>>(), &mut out).unwrap();
    let clone = t.clone();
    std::thread::spawn(move || {
        let mut out = vec![0f32; 3 * clone.row_elems()];
        clone.gather(&[1, 2, 3], &mut out).unwrap();
    })
    .join()
    .unwrap();
    // a failed gather is not counted
    assert!(t.gather(&[4000], &mut out[..t.row_elems()]).is_err());
    let look = t.lookahead().unwrap();
    look.prefetch(&[5, 6]).wait().unwrap();
    let s = t.stats();
    assert_eq!(s.gathers, 3);
    assert_eq!(s.rows, 15);
    assert_eq!(s.bytes, 15 * t.row_bytes());
    assert_eq!(s.cold_rows, 15, "pread reads every row");
    assert!(s.read_requests >= 3 && s.read_bytes >= 15 * t.row_bytes());
    assert_eq!(
        (s.gathers(), s.rows(), s.bytes()),
        (3, 15, 15 * t.row_bytes())
    );
    let fields: Vec<_> = s.fields().collect();
    assert_eq!(fields[0], ("gathers", 3));
    assert_eq!(fields.len(), 16);
    assert!(fields.contains(&("cold_rows", 15)));
}
