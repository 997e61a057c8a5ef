//! One harness for every fetch strategy: each `Strategy::ALL` member gathers
//! the same row lists and must produce the same bits as an independent
//! reference (plain reads, scalar decoder). New strategies are picked up
//! from `Strategy::ALL` without touching this file.

mod fetch_fixture;

use std::sync::Arc;

use fetch_fixture::{bits, Fixture, Lcg};
use pleio::fetch::{GatherError, Strategy, TableReader};
use pleio::sys;
use pleio::table::TableError;

/// The row lists every strategy must agree on.
fn row_lists(fx: &Fixture) -> Vec<(&'static str, Vec<u64>)> {
    let n = fx.table.n_rows;
    let page = sys::page_size();
    let mut rng = Lcg(7);
    let random: Vec<u64> = (0..1000).map(|_| rng.below(n)).collect();
    let mut dense: Vec<u64> = (0..700).collect();
    dense.reverse();
    vec![
        ("empty batch", vec![]),
        ("first row", vec![0]),
        ("last row, ending at EOF", vec![n - 1]),
        ("duplicates", vec![3, 3, 9, 3, n - 1, 9, n - 1, 0, 0]),
        ("page straddlers", fx.straddlers(page, 40)),
        ("random, more than one advice chunk", random),
        ("dense, reversed (overlapping runs)", dense),
        ("both ends", vec![n - 1, 0, n - 2, 1]),
    ]
}

fn gather(reader: &TableReader, s: Strategy, rows: &[u64]) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows.len() * reader.row_elems()];
    let stats = reader
        .gather(s, rows, &mut out)
        .unwrap_or_else(|e| panic!("{s}: {e}"));
    assert_eq!(stats.rows, rows.len() as u64, "{s}");
    out
}

#[test]
fn every_strategy_gives_identical_bits() {
    let fx = Fixture::qwen(6000, 11);
    let reader = fx.reader();
    for (what, rows) in row_lists(&fx) {
        let want = bits(&fx.reference(&rows));
        for &s in Strategy::ALL {
            assert_eq!(bits(&gather(&reader, s, &rows)), want, "{s}: {what}");
            // Once more, warm, with detailed stats on.
            let detailed = reader.clone().with_detailed_stats(true);
            assert_eq!(bits(&gather(&detailed, s, &rows)), want, "{s} warm: {what}");
        }
    }
}

#[test]
fn every_strategy_rejects_bad_ids_before_writing() {
    let fx = Fixture::qwen(1000, 3);
    let reader = fx.reader();
    let n = fx.table.n_rows;
    for &s in Strategy::ALL {
        for bad in [n, u64::MAX, i64::MIN as u64] {
            let rows = [0, bad, 1];
            let mut out = vec![7.0f32; rows.len() * reader.row_elems()];
            let e = reader.gather(s, &rows, &mut out).unwrap_err();
            assert!(
                matches!(e, GatherError::Table(TableError::RowOutOfRange { row, .. }) if row == bad),
                "{s}: {e}"
            );
            assert!(out.iter().all(|&x| x == 7.0), "{s}: output written");
        }
        let mut short = vec![0f32; 3];
        assert!(matches!(
            reader.gather(s, &[1], &mut short),
            Err(GatherError::OutputLength { .. })
        ));
    }
}

#[test]
fn eight_threads_gather_concurrently() {
    let fx = Fixture::qwen(20_000, 5);
    let reader = Arc::new(fx.reader().with_detailed_stats(true));
    let n = fx.table.n_rows;
    let lists: Vec<Vec<u64>> = (0..8u64)
        .map(|t| {
            let mut rng = Lcg(100 + t);
            (0..300).map(|_| rng.below(n)).collect()
        })
        .collect();
    let wants: Vec<Vec<u32>> = lists.iter().map(|l| bits(&fx.reference(l))).collect();
    std::thread::scope(|sc| {
        for (rows, want) in lists.iter().zip(&wants) {
            let reader = reader.clone();
            sc.spawn(move || {
                for round in 0..10 {
                    for &s in Strategy::ALL {
                        assert_eq!(&bits(&gather(&reader, s, rows)), want, "{s} round {round}");
                    }
                }
            });
        }
    });
}
