//! Row mappers against the worked examples of docs/ple-tables.md, batch-split
//! invariance, and parameter validation.

use pleio::ngram::{keys, Gemma4Rows, NgramError, QwenNgramParams, RowMapper};
use proptest::prelude::*;

const EOS: u32 = 248_044;

fn rows_of(tokens: &[u32]) -> Vec<u64> {
    let params = QwenNgramParams::released();
    let mut seq = params.sequence();
    let mut out = Vec::new();
    seq.map_tokens(tokens, &mut out).unwrap();
    out
}

#[test]
fn worked_example_fresh_sequence_all_heads() {
    let expect: [[u64; 16]; 3] = [
        [
            16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
            169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954, 300984276,
        ],
        [
            18158303, 36390029, 45652312, 70783524, 98191154, 114024957, 127804916, 159566246,
            175132467, 192583600, 217919476, 237199054, 259336807, 261799367, 289359313, 307699687,
        ],
        [
            6380558, 26411572, 56460672, 78566983, 94693008, 106742196, 124822692, 148942556,
            164226950, 190352573, 210933682, 238908951, 242182004, 265475238, 299910982, 312121804,
        ],
    ];
    let rows = rows_of(&[9707, 11, 1879]);
    assert_eq!(rows.len(), 48);
    for (i, want) in expect.iter().enumerate() {
        assert_eq!(&rows[i * 16..(i + 1) * 16], want, "token {i}");
    }
}

#[test]
fn worked_example_eos_resets_context() {
    // (token index, h0, h8)
    let expect = [
        (0, 5727835, 162363667),
        (1, 4253433, 163256257),
        (2, 15114226, 177805529),
        (3, 6129193, 160807097),
    ];
    let rows = rows_of(&[100, EOS, 200, 300]);
    for (i, h0, h8) in expect {
        assert_eq!((rows[i * 16], rows[i * 16 + 8]), (h0, h8), "token {i}");
    }
}

#[test]
fn rows_stay_inside_their_heads() {
    let params = QwenNgramParams::released();
    let tokens: Vec<u32> = (0..2000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 248_320)
        .collect();
    let rows = rows_of(&tokens);
    for chunk in rows.chunks_exact(16) {
        for (h, &r) in chunk.iter().enumerate() {
            let off = params.head_offsets()[h];
            assert!(
                r >= off && r < off + params.head_vocab_sizes()[h],
                "head {h} row {r}"
            );
        }
    }
}

fn sequence_with_eos() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![4 => 0u32..248_320, 1 => Just(EOS)], 0..200)
}

proptest! {
    #[test]
    fn batch_split_does_not_change_rows(
        tokens in sequence_with_eos(),
        cuts in prop::collection::vec(0usize..200, 0..8),
    ) {
        let whole = rows_of(&tokens);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(tokens.len())).collect();
        cuts.sort_unstable();
        let params = QwenNgramParams::released();
        let mut seq = params.sequence();
        let mut split = Vec::new();
        let mut start = 0;
        for end in cuts.into_iter().chain([tokens.len()]) {
            seq.map_tokens(&tokens[start..end], &mut split).unwrap();
            start = end;
        }
        prop_assert_eq!(whole, split);
    }

    #[test]
    fn history_advance_matches_mapping(tokens in sequence_with_eos(), cut in 0usize..200) {
        let cut = cut.min(tokens.len());
        let params = QwenNgramParams::released();
        let whole = rows_of(&tokens);
        let mut hist = params.new_history();
        hist.advance(&params, &tokens[..cut]);
        let mut tail = vec![0; (tokens.len() - cut) * 16];
        hist.map_into(&params, &tokens[cut..], &mut tail).unwrap();
        prop_assert_eq!(&whole[cut * 16..], &tail[..]);
    }
}

struct Args {
    ngram: u32,
    heads: u32,
    mult: Vec<u64>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    n_rows: u64,
}

impl Args {
    fn small() -> Self {
        Args {
            ngram: 3,
            heads: 2,
            mult: vec![3, 5, 7],
            sizes: vec![11, 13, 17, 19],
            offsets: vec![0, 11, 24, 41],
            n_rows: 60,
        }
    }

    fn build(self) -> Result<QwenNgramParams, NgramError> {
        QwenNgramParams::new(
            self.ngram,
            self.heads,
            EOS,
            None,
            self.mult,
            self.sizes,
            self.offsets,
            self.n_rows,
        )
    }
}

#[test]
fn small_params_are_valid_and_hash_by_the_formula() {
    let params = Args::small().build().unwrap();
    assert_eq!(params.n_heads(), 4);
    assert_eq!(params.stand_in_token(), EOS);
    let mut out = Vec::new();
    params.sequence().map_tokens(&[10, 20], &mut out).unwrap();
    let e = u64::from(EOS);
    let bi0 = (10 * 3) ^ (e * 5);
    let tri0 = bi0 ^ (e * 7);
    let bi1 = (20 * 3) ^ (10 * 5);
    let tri1 = bi1 ^ (e * 7);
    let want = [
        bi0 % 11,
        bi0 % 13 + 11,
        tri0 % 17 + 24,
        tri0 % 19 + 41,
        bi1 % 11,
        bi1 % 13 + 11,
        tri1 % 17 + 24,
        tri1 % 19 + 41,
    ];
    assert_eq!(out, want);
}

#[test]
fn validation_names_the_bad_value() {
    let err = |f: fn(&mut Args)| {
        let mut a = Args::small();
        f(&mut a);
        a.build().unwrap_err()
    };
    assert_eq!(err(|a| a.ngram = 1), NgramError::NgramSize { value: 1 });
    assert_eq!(err(|a| a.ngram = 9), NgramError::NgramSize { value: 9 });
    assert_eq!(
        err(|a| a.heads = 0),
        NgramError::HeadCount {
            heads_per_ngram: 0,
            n_heads: 0
        }
    );
    assert_eq!(
        err(|a| a.heads = 33),
        NgramError::HeadCount {
            heads_per_ngram: 33,
            n_heads: 66
        }
    );
    assert!(matches!(
        err(|a| a.mult = vec![3, 5]),
        NgramError::ArrayLength { key, len: 2, .. } if key == keys::LAYER_MULTIPLIERS
    ));
    assert!(matches!(
        err(|a| a.sizes.push(23)),
        NgramError::ArrayLength { key, len: 5, .. } if key == keys::HEAD_VOCAB_SIZES
    ));
    assert!(matches!(
        err(|a| { a.offsets.pop(); }),
        NgramError::ArrayLength { key, len: 3, .. } if key == keys::HEAD_OFFSETS
    ));
    assert_eq!(
        err(|a| a.sizes[2] = 0),
        NgramError::ZeroHeadSize { head: 2 }
    );
    assert_eq!(
        err(|a| a.n_rows = 59),
        NgramError::HeadOutOfTable {
            head: 3,
            offset: 41,
            size: 19,
            n_rows: 59
        }
    );
    assert_eq!(
        err(|a| a.offsets[1] = u64::MAX - 5),
        NgramError::HeadOutOfTable {
            head: 1,
            offset: u64::MAX - 5,
            size: 13,
            n_rows: 60
        }
    );
    // extra multipliers are allowed
    let mut a = Args::small();
    a.mult.push(9);
    assert!(a.build().is_ok());
    // messages carry the metadata key
    let msg = err(|a| a.ngram = 1).to_string();
    assert!(msg.contains("qwen4exp.ple.ngram_size"), "{msg}");
}

#[test]
fn wrong_output_length_is_an_error_and_keeps_history() {
    let params = QwenNgramParams::released();
    let mut seq = params.sequence();
    let mut short = [0u64; 15];
    assert_eq!(
        seq.map_into(&[1], &mut short),
        Err(NgramError::OutputLength {
            len: 15,
            needed: 16
        })
    );
    assert_eq!(*seq.history(), params.new_history());
}

#[test]
fn gemma4_rows_are_token_ids_bounds_checked() {
    let mut g = Gemma4Rows::new(262_144);
    let mut out = vec![7];
    g.map_tokens(&[0, 5, 262_143], &mut out).unwrap();
    assert_eq!(out, [7, 0, 5, 262_143]);
    let err = g.map_tokens(&[1, 262_144], &mut out).unwrap_err();
    assert_eq!(
        err,
        NgramError::TokenOutOfTable {
            token: 262_144,
            n_rows: 262_144
        }
    );
    assert!(err.to_string().contains("262144"));
    assert_eq!(
        out,
        [7, 0, 5, 262_143],
        "failed batch leaves output untouched"
    );
}
