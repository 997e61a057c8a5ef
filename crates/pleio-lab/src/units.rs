//! The one parser of sizes and counts the tools accept: `4096`, `64k`,
//! `512M`, `1.5G`, `2T` (also `KiB`, `MB`, ... and `_` between digits).
//! Every suffix is a power of 1024, for byte sizes and row counts alike.

/// Parses a quantity: a decimal number (a fraction allowed, e.g. `1.5G`)
/// with an optional suffix `k`/`K`, `M`, `G` or `T` (optionally followed by
/// `B` or `iB`), each a power of 1024. A fractional result is rounded down.
/// `None` for anything else, zero suffix digits, or a value past `u64`.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0u32,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    let num = num.replace('_', "");
    let (int, frac) = num.split_once('.').unwrap_or((&num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 18 {
        return None;
    }
    let digits = |t: &str| -> Option<u128> {
        if t.is_empty() {
            Some(0)
        } else {
            t.parse::<u128>().ok()
        }
    };
    let scale = 10u128.pow(frac.len() as u32);
    // (int + frac / scale) << shift, in u128 so nothing wraps.
    let whole = digits(int)?
        .checked_mul(scale)?
        .checked_add(digits(frac)?)?;
    let value = whole.checked_mul(1u128 << shift)? / scale;
    u64::try_from(value).ok()
}

/// [`parse_quantity`] for command-line parsers: the error says what is
/// accepted.
pub fn parse_quantity_arg(s: &str) -> Result<u64, String> {
    parse_quantity(s).ok_or_else(|| {
        format!(
            "{s:?} is not a quantity like 4096, 64k, 512M or 1.5G (k, M, G, T are powers of 1024)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_every_quantity() {
        assert_eq!(parse_quantity("4096"), Some(4096));
        assert_eq!(parse_quantity("64k"), Some(64 << 10));
        assert_eq!(parse_quantity("64K"), Some(64 << 10));
        assert_eq!(parse_quantity("512M"), Some(512 << 20));
        assert_eq!(parse_quantity("512MiB"), Some(512 << 20));
        assert_eq!(parse_quantity("2GB"), Some(2 << 30));
        assert_eq!(parse_quantity("1.5G"), Some(3 << 29));
        assert_eq!(parse_quantity("0.5k"), Some(512));
        assert_eq!(parse_quantity("1.1k"), Some(1126));
        assert_eq!(parse_quantity("48_000_000"), Some(48_000_000));
        assert_eq!(parse_quantity("16777216"), Some(16_777_216));
        assert_eq!(parse_quantity("16T"), Some(16 << 40));
        for bad in [
            "",
            "G",
            ".",
            "1.2.3",
            "-1",
            "1e9",
            "4X",
            "99999999999T",
            "1.5.G",
        ] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
        assert_eq!(parse_quantity("16777215T"), Some(16_777_215 << 40));
        assert_eq!(parse_quantity("16777216T"), None);
    }
}
