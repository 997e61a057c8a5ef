//! The user-list readers of the `pleio` binary (`gather --rows-file`,
//! `--tokens`), compiled from its source: no input panics; the streaming
//! row-list reader never returns more ids than its limit and agrees with
//! the in-memory parse; a parsed row list printed back parses to itself; a
//! parsed token list parses to itself as `{"tokens": [...]}`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/pleio-cli/src/lists.rs"]
#[allow(dead_code)]
mod lists;

/// A small limit, so inputs reach it.
const LIMIT: usize = 64;

fuzz_target!(|data: &[u8]| {
    let streamed = lists::read_row_list(data, "fuzz", LIMIT);
    if let Ok(ids) = &streamed {
        assert!(ids.len() <= LIMIT, "{} ids past the limit", ids.len());
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ids) = lists::parse_row_list(text, "fuzz") {
        if ids.len() <= LIMIT {
            assert_eq!(
                streamed.as_ref().ok(),
                Some(&ids),
                "streamed and in-memory parses differ"
            );
        }
        let printed: Vec<String> = ids.iter().map(u64::to_string).collect();
        assert_eq!(
            lists::parse_row_list(&printed.join(","), "again").unwrap(),
            ids
        );
    }
    if let Ok(tokens) = lists::parse_token_list(text, "fuzz") {
        let json = format!("{{\"tokens\": {tokens:?}}}");
        assert_eq!(lists::parse_token_list(&json, "again").unwrap(), tokens);
    }
});
