//! Metadata values: the 13 GGUF value types, typed arrays, and their
//! little-endian encoding.

use std::fmt;

/// The type tag of a metadata value (or of an array's elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueType {
    /// `u8` (id 0).
    U8 = 0,
    /// `i8` (id 1).
    I8 = 1,
    /// `u16` (id 2).
    U16 = 2,
    /// `i16` (id 3).
    I16 = 3,
    /// `u32` (id 4).
    U32 = 4,
    /// `i32` (id 5).
    I32 = 5,
    /// `f32` (id 6).
    F32 = 6,
    /// `bool`, one byte 0 or 1 (id 7).
    Bool = 7,
    /// UTF-8 string with a `u64` length (id 8).
    String = 8,
    /// Array: element type `u32`, length `u64`, elements (id 9).
    Array = 9,
    /// `u64` (id 10).
    U64 = 10,
    /// `i64` (id 11).
    I64 = 11,
    /// `f64` (id 12).
    F64 = 12,
}

impl ValueType {
    const BY_ID: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The type with this GGUF id, if any.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::BY_ID.get(usize::try_from(id).ok()?).copied()
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short lower-case name: `u8`, `f32`, `string`, `array`, ...
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Smallest number of bytes one value of this type takes in a file:
    /// its size for fixed-size types, the length field for strings, and
    /// the element type plus length fields for arrays.
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of one element type.
    Array(Array),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

/// A homogeneous array, stored typed (a 248k-token vocabulary is a
/// `Vec<String>`, not a `Vec<Value>`).
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements; each inner array has its own element type.
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

/// Applies `$body` to the integer payload of a [`Value`], or yields `None`.
macro_rules! int_value {
    ($v:expr, $x:ident => $body:expr) => {
        match $v {
            Value::U8($x) => $body,
            Value::I8($x) => $body,
            Value::U16($x) => $body,
            Value::I16($x) => $body,
            Value::U32($x) => $body,
            Value::I32($x) => $body,
            Value::U64($x) => $body,
            Value::I64($x) => $body,
            _ => None,
        }
    };
}

impl Value {
    /// The type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type holding a nonnegative value.
    pub fn as_u64(&self) -> Option<u64> {
        int_value!(self, x => u64::try_from(i128::from(*x)).ok())
    }

    /// Any integer type holding a value in `0..=u32::MAX`.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|x| u32::try_from(x).ok())
    }

    /// Any integer type holding a value that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        int_value!(self, x => i64::try_from(i128::from(*x)).ok())
    }

    /// An `f32` or `f64` value (integers are not converted).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F32(x) => Some(f64::from(*x)),
            Value::F64(x) => Some(*x),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An array of any integer type whose elements are all nonnegative.
    pub fn as_u64_array(&self) -> Option<Vec<u64>> {
        self.as_array()?.to_u64_vec()
    }

    /// Appends the little-endian encoding of the payload (without the type
    /// tag) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::U8(x) => x.put_le(out),
            Value::I8(x) => x.put_le(out),
            Value::U16(x) => x.put_le(out),
            Value::I16(x) => x.put_le(out),
            Value::U32(x) => x.put_le(out),
            Value::I32(x) => x.put_le(out),
            Value::F32(x) => x.put_le(out),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => put_string(s, out),
            Value::Array(a) => a.encode(out),
            Value::U64(x) => x.put_le(out),
            Value::I64(x) => x.put_le(out),
            Value::F64(x) => x.put_le(out),
        }
    }
}

fn to_u64s<T: Copy>(v: &[T]) -> Option<Vec<u64>>
where
    u64: TryFrom<T>,
{
    v.iter().map(|&x| u64::try_from(x).ok()).collect()
}

/// Applies `$f` to the slice inside an [`Array`], whatever its type.
macro_rules! any_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            Array::U8($v) => $body,
            Array::I8($v) => $body,
            Array::U16($v) => $body,
            Array::I16($v) => $body,
            Array::U32($v) => $body,
            Array::I32($v) => $body,
            Array::F32($v) => $body,
            Array::Bool($v) => $body,
            Array::String($v) => $body,
            Array::Array($v) => $body,
            Array::U64($v) => $body,
            Array::I64($v) => $body,
            Array::F64($v) => $body,
        }
    };
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        any_array!(self, v => v.len())
    }

    /// True if there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The elements as `u64`, if they are integers and all nonnegative.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        match self {
            Array::U8(v) => to_u64s(v),
            Array::I8(v) => to_u64s(v),
            Array::U16(v) => to_u64s(v),
            Array::I16(v) => to_u64s(v),
            Array::U32(v) => to_u64s(v),
            Array::I32(v) => to_u64s(v),
            Array::U64(v) => Some(v.clone()),
            Array::I64(v) => to_u64s(v),
            _ => None,
        }
    }

    /// The elements, if they are strings.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// Depth of nesting: 1 for an array of scalars or strings.
    pub(crate) fn depth(&self) -> usize {
        match self {
            Array::Array(v) => 1 + v.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// Appends element type, length and elements to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        self.element_type().id().put_le(out);
        (self.len() as u64).put_le(out);
        match self {
            Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
            Array::String(v) => v.iter().for_each(|s| put_string(s, out)),
            Array::Array(v) => v.iter().for_each(|a| a.encode(out)),
            Array::U8(v) => put_all(v, out),
            Array::I8(v) => put_all(v, out),
            Array::U16(v) => put_all(v, out),
            Array::I16(v) => put_all(v, out),
            Array::U32(v) => put_all(v, out),
            Array::I32(v) => put_all(v, out),
            Array::F32(v) => put_all(v, out),
            Array::U64(v) => put_all(v, out),
            Array::I64(v) => put_all(v, out),
            Array::F64(v) => put_all(v, out),
        }
    }
}

/// Fixed-size little-endian numbers, as stored in GGUF.
pub(crate) trait Le: Copy {
    /// Encoded size in bytes.
    const SIZE: usize;
    /// Decodes from exactly `SIZE` bytes.
    fn from_le(b: &[u8]) -> Self;
    /// Appends the encoding.
    fn put_le(self, out: &mut Vec<u8>);
}

macro_rules! impl_le {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
impl_le!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

fn put_all<T: Le>(v: &[T], out: &mut Vec<u8>) {
    out.reserve(v.len() * T::SIZE);
    v.iter().for_each(|x| x.put_le(out));
}

/// Appends a GGUF string: `u64` length, then the bytes.
pub(crate) fn put_string(s: &str, out: &mut Vec<u8>) {
    (s.len() as u64).put_le(out);
    out.extend_from_slice(s.as_bytes());
}

/// Longest string shown in full by `Display`.
const SHOWN_STRING_CHARS: usize = 64;
/// Arrays up to this length are shown in full by `Display`; longer ones
/// show their first [`SHOWN_HEAD`] elements.
const SHOWN_ARRAY_LEN: usize = 6;
const SHOWN_HEAD: usize = 3;

fn fmt_str(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    match s.char_indices().nth(SHOWN_STRING_CHARS) {
        None => write!(f, "{s:?}"),
        Some((cut, _)) => write!(f, "{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

fn fmt_elems<T>(
    f: &mut fmt::Formatter<'_>,
    v: &[T],
    each: impl Fn(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    let shown = if v.len() <= SHOWN_ARRAY_LEN {
        v.len()
    } else {
        SHOWN_HEAD
    };
    f.write_str("[")?;
    for (i, x) in v[..shown].iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, x)?;
    }
    if shown < v.len() {
        f.write_str(", ...")?;
    }
    f.write_str("]")
}

impl fmt::Display for Array {
    /// `[u32; 248320] [1, 2, 3, ...]`: type and length, then at most a few
    /// elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}; {}] ", self.element_type(), self.len())?;
        match self {
            Array::String(v) => fmt_elems(f, v, |f, s| fmt_str(f, s)),
            Array::Array(v) => fmt_elems(f, v, |f, a| fmt::Display::fmt(a, f)),
            other => any_array!(other, v => fmt_elems(f, v, |f, x| write!(f, "{x}"))),
        }
    }
}

impl fmt::Display for Value {
    /// Numbers as Rust prints them, strings quoted (long ones cut), arrays
    /// as in [`Array`]'s `Display`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(x) => write!(f, "{x}"),
            Value::I8(x) => write!(f, "{x}"),
            Value::U16(x) => write!(f, "{x}"),
            Value::I16(x) => write!(f, "{x}"),
            Value::U32(x) => write!(f, "{x}"),
            Value::I32(x) => write!(f, "{x}"),
            Value::F32(x) => write!(f, "{x}"),
            Value::Bool(x) => write!(f, "{x}"),
            Value::String(s) => fmt_str(f, s),
            Value::Array(a) => fmt::Display::fmt(a, f),
            Value::U64(x) => write!(f, "{x}"),
            Value::I64(x) => write!(f, "{x}"),
            Value::F64(x) => write!(f, "{x}"),
        }
    }
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$variant(x)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}
impl_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn accessors() {
        assert_eq!(Value::I8(5).as_u64(), Some(5));
        assert_eq!(Value::I8(-5).as_u64(), None);
        assert_eq!(Value::I8(-5).as_i64(), Some(-5));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U64(1 << 32).as_u32(), None);
        assert_eq!(Value::U16(7).as_u32(), Some(7));
        assert_eq!(Value::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(Value::U32(1).as_f64(), None);
        assert_eq!(Value::F32(1.5).as_u64(), None);
        assert_eq!(Value::from("x").as_str(), Some("x"));
        assert_eq!(Value::Bool(true).as_bool(), Some(true));
        assert_eq!(Value::from(vec![1i16, 2]).as_u64_array(), Some(vec![1, 2]));
        assert_eq!(Value::from(vec![1i16, -2]).as_u64_array(), None);
        assert_eq!(Value::from(vec![1.0f32]).as_u64_array(), None);
    }

    #[test]
    fn display_is_short() {
        let long: Vec<u32> = (1..=248_320).collect();
        assert_eq!(
            Value::from(long).to_string(),
            "[u32; 248320] [1, 2, 3, ...]"
        );
        assert_eq!(Value::from(vec![1u8, 2]).to_string(), "[u8; 2] [1, 2]");
        assert_eq!(
            Value::from(Vec::<String>::new()).to_string(),
            "[string; 0] []"
        );
        let nested = Array::Array(vec![
            Array::from(vec![true]),
            Array::from(vec!["a".to_owned()]),
        ]);
        assert_eq!(
            Value::from(nested).to_string(),
            "[array; 2] [[bool; 1] [true], [string; 1] [\"a\"]]"
        );
        let s = "é".repeat(100);
        let shown = Value::from(s.as_str()).to_string();
        assert!(shown.ends_with("... (200 bytes)"), "{shown}");
        assert_eq!(
            shown.chars().filter(|&c| c == 'é').count(),
            SHOWN_STRING_CHARS
        );
    }

    #[test]
    fn encoding_of_scalars_and_arrays() {
        let mut out = Vec::new();
        Value::U16(0x0102).encode(&mut out);
        Value::from("ab").encode(&mut out);
        Value::from(vec![true, false]).encode(&mut out);
        let expect: Vec<u8> = [
            &[0x02, 0x01][..],
            &[2, 0, 0, 0, 0, 0, 0, 0, b'a', b'b'],
            &[7, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        ]
        .concat();
        assert_eq!(out, expect);
    }
}
