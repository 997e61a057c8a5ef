//! RESP2, the Redis wire protocol: commands written as arrays of bulk
//! strings, replies parsed with every length checked before anything is
//! allocated (a reply names its own sizes; a broken or hostile server must
//! not make us allocate gigabytes or recurse without end).

use std::io::{self, BufRead, Read};

/// The largest bulk string a reply may carry (Redis's own limit is 512 MB;
/// pleio never asks for more than one bucket).
pub const MAX_BULK: usize = 512 << 20;
/// The most elements an array reply may have (pleio's largest is a
/// cluster's slot map).
const MAX_ARRAY: usize = 1 << 20;
/// How deep arrays may nest (`CLUSTER SLOTS` is 3 deep).
const MAX_DEPTH: usize = 8;
/// The longest status, error or integer line.
const MAX_LINE: usize = 64 << 10;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$n`: a string, or `None` for the nil string.
    Bulk(Option<Vec<u8>>),
    /// `*n`: an array, or `None` for the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The bytes of a bulk or simple string.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The integer of an integer reply.
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The elements of an array reply.
    pub fn array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(a)) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages.
    pub fn describe(&self) -> String {
        match self {
            Reply::Simple(s) => format!("status {s:?}"),
            Reply::Error(e) => format!("error {e:?}"),
            Reply::Int(i) => format!("integer {i}"),
            Reply::Bulk(None) => "nil".into(),
            Reply::Bulk(Some(b)) => format!("a string of {} bytes", b.len()),
            Reply::Array(None) => "a nil array".into(),
            Reply::Array(Some(a)) => format!("an array of {} elements", a.len()),
        }
    }
}

/// The decimal digits of `v`, written into `buf` (no allocation).
pub fn digits(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    let mut v = v;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// Appends the command `args` to `out` (an array of bulk strings).
pub fn encode<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    let mut d = [0u8; 20];
    out.push(b'*');
    out.extend_from_slice(digits(args.len() as u64, &mut d));
    out.extend_from_slice(b"\r\n");
    for a in args {
        let a = a.as_ref();
        out.push(b'$');
        out.extend_from_slice(digits(a.len() as u64, &mut d));
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Reads one CRLF-terminated line (without the CRLF), at most [`MAX_LINE`].
fn line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    let n = r.take(MAX_LINE as u64 + 2).read_until(b'\n', buf)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    if !buf.ends_with(b"\r\n") {
        return Err(bad("a reply line without CRLF, or longer than 64 KiB"));
    }
    buf.truncate(buf.len() - 2);
    Ok(())
}

fn number(s: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not a number: {:?}", String::from_utf8_lossy(s))))
}

/// A length header's value: -1 for nil, else at most `max`.
fn length(s: &[u8], max: usize) -> io::Result<Option<usize>> {
    match number(s)? {
        -1 => Ok(None),
        n if n >= 0 && (n as u64) <= max as u64 => Ok(Some(n as usize)),
        n => Err(bad(format!("a length of {n} (at most {max} accepted)"))),
    }
}

/// Reads `n` bytes then the CRLF after them.
fn payload(r: &mut impl BufRead, dst: &mut [u8]) -> io::Result<()> {
    r.read_exact(dst)?;
    let mut crlf = [0u8; 2];
    r.read_exact(&mut crlf)?;
    if crlf != *b"\r\n" {
        return Err(bad("a bulk string not followed by CRLF"));
    }
    Ok(())
}

/// Reads one reply.
pub fn read(r: &mut impl BufRead) -> io::Result<Reply> {
    read_at(r, &mut Vec::new(), 0)
}

fn read_at(r: &mut impl BufRead, buf: &mut Vec<u8>, depth: usize) -> io::Result<Reply> {
    line(r, buf)?;
    let header = std::mem::take(buf);
    from_header(r, &header, buf, depth)
}

/// The reply whose first line (without CRLF) is `header`.
fn from_header(
    r: &mut impl BufRead,
    header: &[u8],
    buf: &mut Vec<u8>,
    depth: usize,
) -> io::Result<Reply> {
    let (&tag, rest) = header
        .split_first()
        .ok_or_else(|| bad("an empty reply line"))?;
    let text = || String::from_utf8_lossy(rest).into_owned();
    Ok(match tag {
        b'+' => Reply::Simple(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Int(number(rest)?),
        b'$' => match length(rest, MAX_BULK)? {
            None => Reply::Bulk(None),
            Some(n) => {
                let mut v = vec![0u8; n];
                payload(r, &mut v)?;
                Reply::Bulk(Some(v))
            }
        },
        b'*' => match length(rest, MAX_ARRAY)? {
            None => Reply::Array(None),
            Some(_) if depth >= MAX_DEPTH => return Err(bad("arrays nested too deep")),
            Some(n) => {
                let mut v = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    v.push(read_at(r, buf, depth + 1)?);
                }
                Reply::Array(Some(v))
            }
        },
        t => return Err(bad(format!("a reply starting with byte {t:#04x}"))),
    })
}

/// Reads one reply into `dst` when it is a bulk string of exactly
/// `dst.len()` bytes (the common case of a `GETRANGE`, with no
/// allocation: `line` is scratch); any other reply is returned.
pub fn read_into(r: &mut impl BufRead, dst: &mut [u8], line_buf: &mut Vec<u8>) -> io::Result<Option<Reply>> {
    line(r, line_buf)?;
    if line_buf.first() == Some(&b'$') && length(&line_buf[1..], MAX_BULK)? == Some(dst.len()) {
        payload(r, dst)?;
        return Ok(None);
    }
    // Not an exact bulk string: parse it from the line already read.
    let mut nested = Vec::new();
    Ok(Some(from_header(r, line_buf, &mut nested, 0)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> io::Result<Reply> {
        read(&mut io::Cursor::new(b))
    }

    #[test]
    fn digits_are_decimal() {
        let mut d = [0u8; 20];
        for v in [0, 7, 10, 99, 12345, u64::MAX] {
            assert_eq!(digits(v, &mut d), v.to_string().as_bytes());
        }
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        let mut out = Vec::new();
        encode(&["GETRANGE", "k", "0", "9"], &mut out);
        assert_eq!(out, b"*4\r\n$8\r\nGETRANGE\r\n$1\r\nk\r\n$1\r\n0\r\n$1\r\n9\r\n");
    }

    #[test]
    fn parses_each_reply_type() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            parse(b"-MOVED 3999 127.0.0.1:6381\r\n").unwrap(),
            Reply::Error("MOVED 3999 127.0.0.1:6381".into())
        );
        assert_eq!(parse(b":-7\r\n").unwrap(), Reply::Int(-7));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nbc".to_vec()))
        );
        assert_eq!(
            parse(b"*2\r\n:1\r\n*1\r\n$0\r\n\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![Reply::Bulk(Some(vec![]))]))
            ]))
        );
    }

    #[test]
    fn refuses_hostile_lengths_and_depths_without_allocating() {
        for b in [
            &b"$99999999999\r\n"[..],
            b"$-2\r\n",
            b"*9999999999\r\n",
            b"$3\r\nabcXY",
            b"?x\r\n",
            b"+no crlf",
            b"",
        ] {
            assert!(parse(b).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
        let deep = b"*1\r\n".repeat(20);
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn read_into_fills_exact_bulks_and_returns_the_rest() {
        let mut dst = [0u8; 3];
        let mut r = io::Cursor::new(&b"$3\r\nxyz\r\n$2\r\nab\r\n-ERR x\r\n:1\r\n"[..]);
        let mut l = Vec::new();
        assert_eq!(read_into(&mut r, &mut dst, &mut l).unwrap(), None);
        assert_eq!(&dst, b"xyz");
        assert_eq!(
            read_into(&mut r, &mut dst, &mut l).unwrap(),
            Some(Reply::Bulk(Some(b"ab".to_vec())))
        );
        assert_eq!(
            read_into(&mut r, &mut dst, &mut l).unwrap(),
            Some(Reply::Error("ERR x".into()))
        );
    }
}
