//! A checkpoint's `config.json` on arbitrary bytes: the n-gram keys parse
//! to an error or to a config whose every derivation (heads, head sizes and
//! offsets, table rows, multipliers, the checked hash parameters) returns
//! a value or an error; never a panic, an abort, a hang or an unbounded
//! allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pleio::checkpoint::config::NgramConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(c) = NgramConfig::from_json(data) else {
        return;
    };
    // The first PLE layers, and one far out (refused, not walked).
    for index in [0u64, 1, 3, u64::MAX] {
        let sizes = c.head_sizes(index);
        let offsets = c.head_offsets(index);
        if let (Ok(s), Ok(o)) = (&sizes, &offsets) {
            assert_eq!(s.len(), o.len());
            assert!(o.first().is_none_or(|&x| x == 0));
        }
        let _ = c.multipliers(index);
        if let Ok(rows) = c.table_rows(index) {
            let sum = sizes.expect("rows imply sizes").iter().sum::<u64>();
            assert!(rows >= sum);
            let _ = c.params(index, rows);
        }
        let _ = c.ple_layer_index(index, &[0, 1, 2]);
    }
});
