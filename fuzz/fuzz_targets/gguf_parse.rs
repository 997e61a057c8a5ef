//! The GGUF reader on arbitrary bytes: it returns an error or a file whose
//! every tensor lies inside the bytes, never panics or allocates without
//! bound; and for each 2-D tensor of a file that parses, the row-id mapper
//! built from the file's metadata refuses, or maps tokens to rows inside
//! the table (crafted `qwen4exp.ple.*` keys included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pleio::gguf::GgufFile;
use pleio::ngram::{ModelRows, RowMapper};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::parse(data) else {
        return;
    };
    assert_eq!(file.file_size(), data.len() as u64);
    for (key, value) in file.metadata().iter() {
        // The lookup finds the very value iterated (values may hold NaN,
        // so by address, not by ==).
        let found = file.metadata().get(key);
        assert!(found.is_some_and(|v| std::ptr::eq(v, value)), "{key}");
    }
    for t in file.tensors() {
        let end = file.data_offset() + t.offset + t.n_bytes;
        assert!(end <= data.len() as u64, "{} ends at {end}", t.name);
        assert_eq!(file.tensor(&t.name).map(|x| x.offset), Some(t.offset));
        let [row_elems, n_rows] = t.dims[..] else {
            continue;
        };
        let Ok(mapper) = ModelRows::from_metadata(file.metadata(), row_elems, n_rows) else {
            continue;
        };
        // Tokens from the input itself, resets (EOS) and all.
        let tokens: Vec<u32> = data
            .chunks(4)
            .take(64)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(b)
            })
            .collect();
        let mut seq = mapper.sequence();
        let mut rows = vec![u64::MAX; tokens.len() * seq.rows_per_token()];
        if seq.map_into(&tokens, &mut rows).is_ok() {
            assert!(
                rows.iter().all(|&r| r < n_rows),
                "a row id past the table's {n_rows} rows"
            );
        }
    }
});
