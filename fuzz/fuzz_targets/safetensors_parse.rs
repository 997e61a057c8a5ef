//! The safetensors reader on arbitrary bytes: a header parses to an error
//! or to tensors that each lie inside the bytes, do not overlap, have the
//! byte count their dtype and shape give, and are found by name; never a
//! panic or an unbounded allocation. The same bytes as a
//! `model.safetensors.index.json` parse to an error or an index whose every
//! tensor maps to one of its files.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pleio::safetensors::{SafetensorsFile, WeightIndex};

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = SafetensorsFile::parse(data) {
        let len = data.len() as u64;
        assert_eq!(file.file_size(), len);
        assert_eq!(file.data_offset(), 8 + file.header_len());
        let mut ranges = Vec::new();
        for t in file.tensors() {
            let r = file.tensor_range(t);
            assert!(r.start <= r.end && r.end <= len, "{} at {r:?}", t.name);
            assert_eq!(r.end - r.start, t.n_bytes(), "{}", t.name);
            let bits = t.n_elems().checked_mul(t.dtype.bits());
            assert_eq!(bits, Some(t.n_bytes() * 8), "{}", t.name);
            assert_eq!(
                file.tensor_data(data, t).map(<[u8]>::len),
                Some(t.n_bytes() as usize)
            );
            assert_eq!(file.tensor(&t.name), Some(t));
            if t.n_bytes() > 0 {
                ranges.push(r);
            }
        }
        ranges.sort_by_key(|r| r.start);
        for w in ranges.windows(2) {
            assert!(w[0].end <= w[1].start, "tensors overlap: {w:?}");
        }
        // The header alone (file size given) parses to the same tensors.
        let prefix = &data[..file.data_offset() as usize];
        let again = SafetensorsFile::parse_header(prefix, len).expect("the header parses");
        assert_eq!(again.tensors(), file.tensors());
    }
    if let Ok(index) = WeightIndex::parse(data) {
        for (name, file) in index.entries() {
            assert!(file < index.files().len(), "{name} -> file {file}");
            assert_eq!(index.file_of(name), Some(file));
        }
    }
});
