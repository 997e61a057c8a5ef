//! What a Redis server (or a hostile one) and a user hand the remote table
//! source, on arbitrary bytes: RESP replies (whole and into a fixed
//! buffer), a manifest's JSON checked into a layout and a row-id mapping,
//! and a `redis://` address. An error or a value, never a panic, a hang
//! or an unbounded allocation.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use pleio::remote::resp;
use pleio::remote::store::Manifest;
use pleio::remote::url::RedisUrl;

fuzz_target!(|data: &[u8]| {
    let mut r = Cursor::new(data);
    for _ in 0..64 {
        if resp::read(&mut r).is_err() {
            break;
        }
    }
    let mut dst = [0u8; 16];
    let mut line = Vec::new();
    let mut r = Cursor::new(data);
    for _ in 0..64 {
        if resp::read_into(&mut r, &mut dst, &mut line).is_err() {
            break;
        }
    }
    if let Ok(m) = serde_json::from_slice::<Manifest>(data) {
        if let Ok(layout) = m.layout() {
            assert_eq!(layout.rows(), m.rows);
            let _ = m.row_ids();
            let _ = m.bucket_key(m.buckets.saturating_sub(1));
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(u) = RedisUrl::parse_with(s, None) {
            assert!(!u.seeds.is_empty());
            let _ = u.to_string();
        }
    }
});
