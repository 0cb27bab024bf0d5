//! openpi's frames: msgpack with numpy arrays as maps `{__ndarray__: true, data, dtype, shape}`
//! (the keys as msgpack bin, as openpi-client's `msgpack_numpy` packs them; str keys are
//! accepted too) and numpy scalars as `{__npgeneric__: true, data, dtype}`. Only plain numeric
//! dtypes are taken (openpi refuses object, void and complex ones too; there is no pickle).

//!
//! A frame is checked before anything is built from it (`scan`), in time linear in its size:
//! nesting, keys per map and values in all are capped, so a hostile frame costs at most its
//! own bytes plus `MAX_VALUES` small values of memory, and no more work than reading it.

use std::collections::HashSet;

use rmpv::Value;

/// How deep containers may nest (openpi's observations are three levels deep: the keys, an
/// array's map, its shape list).
pub(crate) const MAX_DEPTH: usize = 16;
/// Most dimensions an array may have.
pub(crate) const MAX_DIMS: usize = 4;
/// Most keys in one map: openpi's observations, replies and metadata have tens.
pub(crate) const MAX_KEYS: usize = 1024;
/// Most msgpack values in one frame (each scalar, string, list or map counts one; an array's
/// bytes are one). An openpi observation or reply has a few hundred. Decoded, a value takes
/// ~40 bytes besides its bytes: a frame costs at most its size plus ~2.6 MB.
pub(crate) const MAX_VALUES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("not msgpack: {0}")]
    Msgpack(#[from] rmpv::decode::Error),
    #[error("not msgpack: {0}")]
    Structure(String),
    #[error("not msgpack within bounds: nested deeper than {MAX_DEPTH} levels (at byte {at})")]
    TooDeep { at: usize },
    #[error("a map of {keys} keys (at byte {at}): at most {MAX_KEYS} keys per map are taken")]
    TooManyKeys { keys: u64, at: usize },
    #[error(
        "more than {MAX_VALUES} values in one frame (at byte {at}): at most {MAX_VALUES} are taken"
    )]
    TooManyValues { at: usize },
    #[error("`{key}`: {message}")]
    Field { key: String, message: String },
    #[error("{0}")]
    Request(String),
}

fn field(key: &str, message: impl Into<String>) -> WireError {
    WireError::Field {
        key: key.into(),
        message: message.into(),
    }
}

/// An element type numpy names by `dtype.str`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    U8,
    F32,
    F64,
    I32,
    I64,
}

impl Dtype {
    pub(crate) fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "|u1" | "u1" | "uint8" => Dtype::U8,
            "<f4" | "float32" => Dtype::F32,
            "<f8" | "float64" => Dtype::F64,
            "<i4" | "int32" => Dtype::I32,
            "<i8" | "int64" => Dtype::I64,
            _ => return None,
        })
    }

    pub(crate) fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "|u1",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
        }
    }
}

/// A numpy array off the wire: its bytes little-endian, checked against dtype and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct NdArray {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl NdArray {
    pub fn f32(shape: Vec<usize>, values: &[f32]) -> NdArray {
        NdArray {
            dtype: Dtype::F32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The values as f32 (from any float or integer dtype; u8 too).
    pub fn to_f32(&self) -> Vec<f32> {
        let n = self.dtype.size();
        self.data
            .chunks_exact(n)
            .map(|b| match self.dtype {
                Dtype::U8 => b[0] as f32,
                Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                Dtype::F64 => {
                    f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                }
                Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
                Dtype::I64 => {
                    i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
                }
            })
            .collect()
    }
}

/// What a request's values are, once decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Array(NdArray),
    Text(String),
    Number(f64),
    Bool(bool),
    /// A map that is not an array (a reply's `server_timing`).
    Map(Vec<(String, Item)>),
    Other(&'static str),
}

/// A map key as text: msgpack str, or bin holding UTF-8.
fn key_text(k: &Value) -> Option<&str> {
    match k {
        Value::String(s) => s.as_str(),
        Value::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| key_text(k) == Some(key))
        .map(|(_, v)| v)
}

/// The big-endian length of `n` bytes at `at`, if the frame has them.
fn length(bytes: &[u8], at: usize, n: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(n)?)?;
    Some(b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x)))
}

/// Walks the frame's msgpack structure without building it (iteratively: no recursion for a
/// hostile nesting to blow): exactly one value, no container deeper than `MAX_DEPTH`, no map
/// of more than `MAX_KEYS` keys, at most `MAX_VALUES` values, and no length that claims more
/// than the bytes left. Its work is linear in the frame's size.
pub(crate) fn scan(bytes: &[u8]) -> Result<(), WireError> {
    let short = |at: usize| {
        WireError::Structure(format!(
            "the frame ends inside a value (at byte {at} of {})",
            bytes.len()
        ))
    };
    // Per open container: the values still to come in it (a map's keys and values both).
    let mut open: Vec<u64> = Vec::with_capacity(MAX_DEPTH + 1);
    open.push(1);
    let mut values = 0usize;
    let mut at = 0usize;
    while let Some(left) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        values += 1;
        if values > MAX_VALUES {
            return Err(WireError::TooManyValues { at });
        }
        let m = *bytes.get(at).ok_or_else(|| short(at))?;
        at += 1;
        // (payload bytes to skip, entries of a container: (count, is a map))
        let (skip, entries): (u64, Option<(u64, bool)>) = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, None),
            0x80..=0x8f => (0, Some((u64::from(m & 0x0f), true))),
            0x90..=0x9f => (0, Some((u64::from(m & 0x0f), false))),
            0xa0..=0xbf => (u64::from(m & 0x1f), None),
            0xc1 => {
                return Err(WireError::Structure(format!(
                    "the reserved byte 0xc1 at byte {}",
                    at - 1
                )))
            }
            // bin, str: 1, 2 or 4 length bytes.
            0xc4 | 0xd9 => (length(bytes, at, 1).ok_or_else(|| short(at))? + 1, None),
            0xc5 | 0xda => (length(bytes, at, 2).ok_or_else(|| short(at))? + 2, None),
            0xc6 | 0xdb => (length(bytes, at, 4).ok_or_else(|| short(at))? + 4, None),
            // ext: the length, then the type byte.
            0xc7 => (length(bytes, at, 1).ok_or_else(|| short(at))? + 2, None),
            0xc8 => (length(bytes, at, 2).ok_or_else(|| short(at))? + 3, None),
            0xc9 => (length(bytes, at, 4).ok_or_else(|| short(at))? + 5, None),
            0xca => (4, None),
            0xcb => (8, None),
            0xcc | 0xd0 => (1, None),
            0xcd | 0xd1 => (2, None),
            0xce | 0xd2 => (4, None),
            0xcf | 0xd3 => (8, None),
            // fixext 1, 2, 4, 8, 16 (and the type byte).
            0xd4 => (2, None),
            0xd5 => (3, None),
            0xd6 => (5, None),
            0xd7 => (9, None),
            0xd8 => (17, None),
            0xdc => (
                2,
                Some((length(bytes, at, 2).ok_or_else(|| short(at))?, false)),
            ),
            0xdd => (
                4,
                Some((length(bytes, at, 4).ok_or_else(|| short(at))?, false)),
            ),
            0xde => (
                2,
                Some((length(bytes, at, 2).ok_or_else(|| short(at))?, true)),
            ),
            0xdf => (
                4,
                Some((length(bytes, at, 4).ok_or_else(|| short(at))?, true)),
            ),
        };
        let end = (at as u64).saturating_add(skip);
        if end > bytes.len() as u64 {
            return Err(short(at));
        }
        let container_at = at - 1;
        at = end as usize;
        if let Some((n, map)) = entries {
            if map && n > MAX_KEYS as u64 {
                return Err(WireError::TooManyKeys {
                    keys: n,
                    at: container_at,
                });
            }
            let n = if map { 2 * n } else { n };
            // Every value takes at least a byte.
            if n > (bytes.len() - at) as u64 {
                return Err(short(bytes.len()));
            }
            if open.len() > MAX_DEPTH {
                return Err(WireError::TooDeep { at: container_at });
            }
            open.push(n);
        }
    }
    if at < bytes.len() {
        return Err(WireError::Request(format!(
            "{} bytes after the request's msgpack value",
            bytes.len() - at
        )));
    }
    Ok(())
}

/// Decodes one frame (a request, or a reply) into its top-level keys, in order. The frame is
/// scanned first: what is built from it is bounded by the caps above.
pub fn decode_request(bytes: &[u8]) -> Result<Vec<(String, Item)>, WireError> {
    scan(bytes)?;
    let mut rd = bytes;
    // rmpv counts a container twice and a string once more: the scan has bounded the
    // nesting already.
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, 4 * MAX_DEPTH + 8)?;
    let Value::Map(entries) = v else {
        return Err(WireError::Request(format!(
            "expected a map of keys, found {}",
            kind(&v)
        )));
    };
    map_items(&entries)
}

fn map_items(entries: &[(Value, Value)]) -> Result<Vec<(String, Item)>, WireError> {
    let mut out = Vec::with_capacity(entries.len());
    let mut seen = HashSet::with_capacity(entries.len());
    for (k, v) in entries {
        let Some(key) = key_text(k) else {
            return Err(WireError::Request(format!(
                "a key is {}, not a string",
                kind(k)
            )));
        };
        if !seen.insert(key) {
            return Err(field(key, "given twice"));
        }
        out.push((key.to_string(), item(key, v)?));
    }
    Ok(out)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) | Value::F32(_) | Value::F64(_) => "a number",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "a list",
        Value::Map(_) => "a map",
        Value::Ext(..) => "a msgpack extension",
    }
}

fn item(key: &str, v: &Value) -> Result<Item, WireError> {
    Ok(match v {
        Value::String(s) => match s.as_str() {
            Some(s) => Item::Text(s.to_string()),
            None => return Err(field(key, "a string that is not UTF-8")),
        },
        Value::Integer(i) => Item::Number(i.as_f64().unwrap_or(f64::NAN)),
        Value::F32(x) => Item::Number(*x as f64),
        Value::F64(x) => Item::Number(*x),
        Value::Boolean(b) => Item::Bool(*b),
        Value::Map(m) if get(m, "__ndarray__").is_some() => Item::Array(ndarray(key, m)?),
        Value::Map(m) if get(m, "__npgeneric__").is_some() => match get(m, "data") {
            Some(Value::Integer(i)) => Item::Number(i.as_f64().unwrap_or(f64::NAN)),
            Some(Value::F64(x)) => Item::Number(*x),
            Some(Value::F32(x)) => Item::Number(*x as f64),
            Some(Value::Boolean(b)) => Item::Bool(*b),
            _ => return Err(field(key, "a numpy scalar without a numeric `data`")),
        },
        Value::Map(m) => Item::Map(map_items(m)?),
        other => Item::Other(kind(other)),
    })
}

fn ndarray(key: &str, m: &[(Value, Value)]) -> Result<NdArray, WireError> {
    let dtype_text = match get(m, "dtype") {
        Some(Value::String(s)) => s.as_str().unwrap_or(""),
        Some(Value::Binary(b)) => std::str::from_utf8(b).unwrap_or(""),
        _ => return Err(field(key, "an array without a `dtype` string")),
    };
    let Some(dtype) = Dtype::parse(dtype_text) else {
        return Err(field(
            key,
            format!("dtype \"{dtype_text}\" is not taken (|u1, <f4, <f8, <i4 or <i8)"),
        ));
    };
    let Some(Value::Array(dims)) = get(m, "shape") else {
        return Err(field(key, "an array without a `shape` list"));
    };
    if dims.len() > MAX_DIMS {
        return Err(field(
            key,
            format!(
                "shape has {} dimensions, at most {MAX_DIMS} are taken",
                dims.len()
            ),
        ));
    }
    let mut shape = Vec::with_capacity(dims.len());
    for d in dims {
        match d.as_u64() {
            Some(d) => shape.push(d as usize),
            None => return Err(field(key, format!("shape entry {d} is not a size"))),
        }
    }
    let Some(Value::Binary(data)) = get(m, "data") else {
        return Err(field(key, "an array without `data` bytes"));
    };
    let elements = shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .and_then(|n| n.checked_mul(dtype.size()));
    if elements != Some(data.len()) {
        return Err(field(
            key,
            format!(
                "shape {shape:?} of {} needs {} bytes, data has {}",
                dtype.name(),
                elements.map_or("too many".into(), |n| n.to_string()),
                data.len()
            ),
        ));
    }
    Ok(NdArray {
        dtype,
        shape,
        data: data.clone(),
    })
}

/// A reply value, encoded as openpi-client's `unpackb` turns it into Python objects.
pub enum Out {
    Array(NdArray),
    Number(f64),
    Int(i64),
    Bool(bool),
    Text(String),
    List(Vec<Out>),
    Map(Vec<(String, Out)>),
}

/// Writes `out` as msgpack straight into `buf` (no intermediate value tree: images are
/// copied once).
fn write(buf: &mut Vec<u8>, out: &Out) {
    use rmp::encode as e;
    // Writing into a Vec cannot fail: the results are dropped.
    let bin = |buf: &mut Vec<u8>, b: &[u8]| {
        let _ = e::write_bin(buf, b);
    };
    match out {
        Out::Array(a) => {
            let _ = e::write_map_len(buf, 4);
            bin(buf, b"__ndarray__");
            let _ = e::write_bool(buf, true);
            bin(buf, b"data");
            bin(buf, &a.data);
            bin(buf, b"dtype");
            let _ = e::write_str(buf, a.dtype.name());
            bin(buf, b"shape");
            let _ = e::write_array_len(buf, a.shape.len() as u32);
            for d in &a.shape {
                let _ = e::write_uint(buf, *d as u64);
            }
        }
        Out::Number(x) => {
            let _ = e::write_f64(buf, *x);
        }
        Out::Int(i) => {
            let _ = e::write_sint(buf, *i);
        }
        Out::Bool(b) => {
            let _ = e::write_bool(buf, *b);
        }
        Out::Text(t) => {
            let _ = e::write_str(buf, t);
        }
        Out::List(v) => {
            let _ = e::write_array_len(buf, v.len() as u32);
            for x in v {
                write(buf, x);
            }
        }
        Out::Map(m) => {
            let _ = e::write_map_len(buf, m.len() as u32);
            for (k, v) in m {
                let _ = e::write_str(buf, k);
                write(buf, v);
            }
        }
    }
}

pub fn encode(out: &Out) -> Vec<u8> {
    let mut buf = Vec::new();
    write(&mut buf, out);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(dtype: &str, shape: &[u64], data: Vec<u8>) -> Value {
        let bin = |s: &str| Value::Binary(s.as_bytes().to_vec());
        Value::Map(vec![
            (bin("__ndarray__"), Value::Boolean(true)),
            (bin("data"), Value::Binary(data)),
            (bin("dtype"), Value::String(dtype.into())),
            (
                bin("shape"),
                Value::Array(shape.iter().map(|d| Value::from(*d)).collect()),
            ),
        ])
    }

    fn request(entries: Vec<(&str, Value)>) -> Vec<u8> {
        let v = Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::String(k.into()), v))
                .collect(),
        );
        let mut b = Vec::new();
        rmpv::encode::write_value(&mut b, &v).unwrap();
        b
    }

    #[test]
    fn when_an_openpi_observation_is_decoded_expect_its_arrays_and_prompt() {
        let state: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = request(vec![
            ("observation/state", array("<f4", &[2], state)),
            ("observation/image", array("|u1", &[2, 2, 3], vec![7; 12])),
            ("prompt", Value::String("stack".into())),
        ]);
        let items = decode_request(&bytes).unwrap();
        let Item::Array(s) = &items[0].1 else {
            panic!()
        };
        assert_eq!(s.to_f32(), [1.5, -2.0]);
        let Item::Array(img) = &items[1].1 else {
            panic!()
        };
        assert_eq!((img.dtype, img.shape.clone()), (Dtype::U8, vec![2, 2, 3]));
        assert_eq!(items[2], ("prompt".into(), Item::Text("stack".into())));
    }

    #[test]
    fn when_arrays_lie_about_their_size_or_type_expect_the_key_named() {
        let cases = [
            (array("<f4", &[3], vec![0; 8]), "needs 12 bytes, data has 8"),
            (array("|O", &[1], vec![0; 8]), "dtype \"|O\" is not taken"),
            (array(">f4", &[1], vec![0; 4]), "dtype \">f4\" is not taken"),
            (
                array("|u1", &[1 << 40, 1 << 40, 1 << 40], vec![0; 4]),
                "needs too many bytes",
            ),
            (
                array("|u1", &[1, 1, 1, 1, 1], vec![0]),
                "shape has 5 dimensions",
            ),
        ];
        for (v, want) in cases {
            let e = decode_request(&request(vec![("observation/state", v)])).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("`observation/state`: ") && text.contains(want),
                "{text}"
            );
        }
    }

    #[test]
    fn when_the_frame_is_hostile_expect_an_error_not_a_crash() {
        // Nested far deeper than any observation.
        let mut deep = Value::Nil;
        for _ in 0..100 {
            deep = Value::Array(vec![deep]);
        }
        let e = decode_request(&request(vec![("x", deep)])).unwrap_err();
        assert!(matches!(e, WireError::TooDeep { .. }), "{e}");
        // A list claiming 4 billion entries in a few bytes.
        let e = decode_request(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]).unwrap_err();
        assert!(e.to_string().contains("ends inside a value"), "{e}");
        // Strings and bytes claiming more than the frame has; the reserved marker.
        for bad in [
            &[0x81, 0xdb, 0xff, 0xff, 0xff, 0xff][..],
            &[0x81, 0xc4],
            &[0xc1],
        ] {
            let e = decode_request(bad).unwrap_err();
            assert!(matches!(e, WireError::Structure(_)), "{e}");
        }
        // Not a map; trailing bytes; a key given twice.
        assert!(decode_request(&[0x01]).is_err());
        let mut b = request(vec![("prompt", Value::String("a".into()))]);
        b.push(0xc0);
        assert!(decode_request(&b)
            .unwrap_err()
            .to_string()
            .contains("after"));
        let twice = request(vec![
            ("prompt", Value::String("a".into())),
            ("prompt", Value::String("b".into())),
        ]);
        assert!(decode_request(&twice)
            .unwrap_err()
            .to_string()
            .contains("given twice"));
    }

    /// A map of `n` keys `k0`, `k1`, ... (`dup`: the last one repeats the first), nil values.
    fn many_keys(n: usize, dup: bool) -> Vec<u8> {
        let mut b = Vec::new();
        rmp::encode::write_map_len(&mut b, n as u32).unwrap();
        for i in 0..n {
            let k = if dup && i == n - 1 { 0 } else { i };
            rmp::encode::write_str(&mut b, &format!("k{k}")).unwrap();
            rmp::encode::write_nil(&mut b).unwrap();
        }
        b
    }

    #[test]
    fn when_a_map_has_150k_keys_expect_the_key_cap_named_not_a_quadratic_check() {
        // 1.5 MB: what kept `pi0d serve` (and the robot's client) busy for a minute.
        let e = decode_request(&many_keys(150_000, false)).unwrap_err();
        assert!(
            e.to_string()
                .contains("a map of 150000 keys (at byte 0): at most 1024 keys per map"),
            "{e}"
        );
        // A nested map is held to it too.
        let mut nested = vec![0x81, 0xa1, b'x'];
        nested.extend(many_keys(MAX_KEYS + 1, false));
        let e = decode_request(&nested).unwrap_err();
        assert!(
            matches!(e, WireError::TooManyKeys { keys: 1025, at: 3 }),
            "{e}"
        );
        // Up to the cap a map is taken, and a repeated key is still found at its end.
        assert_eq!(
            decode_request(&many_keys(MAX_KEYS, false)).unwrap().len(),
            MAX_KEYS
        );
        let e = decode_request(&many_keys(MAX_KEYS, true)).unwrap_err();
        assert!(e.to_string().starts_with("`k0`: given twice"), "{e}");
    }

    #[test]
    fn when_a_frame_is_a_list_of_millions_of_nils_expect_it_refused_before_it_is_built() {
        // 4 MiB of nils would decode to ~170 MB of values (16 MiB, the default reply cap,
        // to ~700 MB): refused at the values cap by the scan, before anything is built.
        let n = 4 << 20;
        let mut b = vec![0x81, 0xa1, b'x', 0xdd];
        b.extend((n as u32).to_be_bytes());
        b.resize(b.len() + n, 0xc0);
        let e = decode_request(&b).unwrap_err();
        assert!(matches!(e, WireError::TooManyValues { .. }), "{e}");
        assert!(e.to_string().contains("at most 65536"), "{e}");
    }

    #[test]
    fn when_a_frame_nests_100k_deep_expect_an_error_not_a_stack_overflow() {
        let mut b = vec![0x81, 0xa1, b'x'];
        b.resize(b.len() + 100_000, 0x91);
        b.push(0xc0);
        let e = decode_request(&b).unwrap_err();
        assert!(matches!(e, WireError::TooDeep { .. }), "{e}");
        // As deep as allowed is taken: the top map and MAX_DEPTH - 1 lists in it.
        let mut ok = vec![0x81, 0xa1, b'x'];
        ok.resize(ok.len() + MAX_DEPTH - 1, 0x91);
        ok.push(0xc0);
        assert_eq!(decode_request(&ok).unwrap()[0].1, Item::Other("a list"));
    }

    #[test]
    fn when_a_reply_is_encoded_expect_numpy_maps_with_bin_keys() {
        let out = Out::Map(vec![(
            "actions".into(),
            Out::Array(NdArray::f32(vec![1, 2], &[0.5, -1.0])),
        )]);
        let v = rmpv::decode::read_value(&mut &encode(&out)[..]).unwrap();
        let Value::Map(top) = v else { panic!() };
        assert_eq!(top[0].0, Value::String("actions".into()));
        let Value::Map(a) = &top[0].1 else { panic!() };
        assert_eq!(a[0].0, Value::Binary(b"__ndarray__".to_vec()));
        assert_eq!(
            get(a, "shape"),
            Some(&Value::Array(vec![Value::from(1u64), Value::from(2u64)]))
        );
    }
}
