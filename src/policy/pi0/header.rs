//! Checks a safetensors header before the `safetensors` crate reads it. The crate checks the
//! data offsets in sorted order and, when one entry is wrong, names whichever tensor comes next
//! (or none); this names the tensor whose own entry is wrong, with what it holds and what was
//! expected. Every file pi0d reads as safetensors goes through here first.

use serde_json::Value;

/// Bytes of the little-endian header length that starts a safetensors file.
const LEN_BYTES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("{len} bytes, too short for a safetensors file (an 8-byte header length comes first)")]
    TooShort { len: usize },
    #[error("the header length {header} runs past the end of the {len}-byte file")]
    HeaderLength { header: u64, len: usize },
    #[error("the header is not UTF-8")]
    Utf8(#[source] std::str::Utf8Error),
    #[error("the header is not JSON")]
    Json(#[source] serde_json::Error),
    #[error("the header is not a JSON object")]
    NotObject,
    #[error("tensor `{name}`: {message}")]
    Entry { name: String, message: String },
    #[error("tensor `{name}`: data_offsets [{start}, {end}] end before they start")]
    Reversed {
        name: String,
        start: usize,
        end: usize,
    },
    #[error("tensor `{name}`: data_offsets [{start}, {end}] run past the end of the data ({data_len} bytes after the header)")]
    PastEnd {
        name: String,
        start: usize,
        end: usize,
        data_len: usize,
    },
    #[error("tensor `{name}`: data_offsets [{start}, {end}] hold {found} bytes, its {dtype} shape {shape:?} needs {expected}")]
    Size {
        name: String,
        start: usize,
        end: usize,
        found: usize,
        dtype: String,
        shape: Vec<usize>,
        expected: usize,
    },
    #[error("tensors `{first}` (data_offsets [{first_start}, {first_end}]) and `{second}` (data_offsets [{second_start}, {second_end}]) overlap")]
    Overlap {
        first: String,
        first_start: usize,
        first_end: usize,
        second: String,
        second_start: usize,
        second_end: usize,
    },
    #[error(
        "bytes {start}..{end} of the data belong to no tensor (tensor `{next}` starts at {end})"
    )]
    Gap {
        start: usize,
        end: usize,
        next: String,
    },
    #[error("the last {extra} bytes of the data belong to no tensor (the tensors end at {end})")]
    Trailing { extra: usize, end: usize },
}

/// Bits per element of a safetensors dtype name; `None` for names this check does not know
/// (the crate then judges them).
fn dtype_bits(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

struct Span {
    name: String,
    start: usize,
    end: usize,
}

fn entry_err(name: &str, message: impl Into<String>) -> HeaderError {
    HeaderError::Entry {
        name: name.into(),
        message: message.into(),
    }
}

fn usizes(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
        .collect()
}

/// Checks the header of the safetensors file `bytes`: every entry well formed, its offsets
/// inside the data and sized for its dtype and shape, no two overlapping, no byte left over.
pub(crate) fn check(bytes: &[u8]) -> Result<(), HeaderError> {
    let len = bytes.len();
    let Some(head) = bytes.get(..LEN_BYTES) else {
        return Err(HeaderError::TooShort { len });
    };
    let mut n = [0u8; LEN_BYTES];
    n.copy_from_slice(head);
    let header = u64::from_le_bytes(n);
    let stop = usize::try_from(header)
        .ok()
        .and_then(|h| h.checked_add(LEN_BYTES))
        .filter(|stop| *stop <= len)
        .ok_or(HeaderError::HeaderLength { header, len })?;
    let text = std::str::from_utf8(&bytes[LEN_BYTES..stop]).map_err(HeaderError::Utf8)?;
    let json: Value = serde_json::from_str(text).map_err(HeaderError::Json)?;
    let map = json.as_object().ok_or(HeaderError::NotObject)?;
    let data_len = len - stop;
    let mut spans = Vec::with_capacity(map.len());
    for (name, entry) in map {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry["dtype"]
            .as_str()
            .ok_or_else(|| entry_err(name, "no \"dtype\" string"))?;
        let shape = usizes(&entry["shape"])
            .ok_or_else(|| entry_err(name, "\"shape\" is not a list of sizes"))?;
        let offsets = usizes(&entry["data_offsets"])
            .filter(|o| o.len() == 2)
            .ok_or_else(|| entry_err(name, "\"data_offsets\" is not two byte offsets"))?;
        let (start, end) = (offsets[0], offsets[1]);
        if end < start {
            return Err(HeaderError::Reversed {
                name: name.clone(),
                start,
                end,
            });
        }
        if end > data_len {
            return Err(HeaderError::PastEnd {
                name: name.clone(),
                start,
                end,
                data_len,
            });
        }
        if let Some(bits) = dtype_bits(dtype) {
            let expected = shape
                .iter()
                .try_fold(bits, |acc, d| acc.checked_mul(*d))
                .map(|b| b.div_ceil(8))
                .ok_or_else(|| entry_err(name, format!("shape {shape:?} overflows")))?;
            if end - start != expected {
                return Err(HeaderError::Size {
                    name: name.clone(),
                    start,
                    end,
                    found: end - start,
                    dtype: dtype.into(),
                    shape,
                    expected,
                });
            }
        }
        spans.push(Span {
            name: name.clone(),
            start,
            end,
        });
    }
    // Each entry is fine on its own: now how they sit together. Empty tensors take no room.
    spans.sort_by_key(|s| (s.start, s.end));
    let mut covered = 0usize;
    let mut last: Option<&Span> = None;
    for s in spans.iter().filter(|s| s.end > s.start) {
        if let Some(prev) = last.filter(|p| s.start < p.end) {
            return Err(HeaderError::Overlap {
                first: prev.name.clone(),
                first_start: prev.start,
                first_end: prev.end,
                second: s.name.clone(),
                second_start: s.start,
                second_end: s.end,
            });
        }
        if s.start > covered {
            return Err(HeaderError::Gap {
                start: covered,
                end: s.start,
                next: s.name.clone(),
            });
        }
        covered = s.end;
        last = Some(s);
    }
    if covered < data_len {
        return Err(HeaderError::Trailing {
            extra: data_len - covered,
            end: covered,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, data));
        b
    }

    const GOOD: &str = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;

    #[test]
    fn when_header_is_sound_expect_accepted() {
        check(&file(GOOD, 12)).unwrap();
    }

    #[test]
    fn when_first_tensor_points_past_the_end_expect_it_named_not_its_neighbour() {
        let h = GOOD.replace("[0,8]", "[12,20]");
        let e = check(&file(&h, 12)).unwrap_err().to_string();
        assert!(e.starts_with("tensor `a`") && e.contains("[12, 20]"), "{e}");
        assert!(!e.contains("`b`"), "{e}");
        // The crate itself blames `b` (whose offsets are fine): the reason for this check.
        let crate_err = safetensors::SafeTensors::deserialize(&file(&h, 12))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!crate_err.contains("`a`"), "{crate_err}");
    }

    #[test]
    fn when_offsets_overlap_or_leave_gaps_expect_both_tensors_named() {
        let h = GOOD.replace("[8,12]", "[4,8]");
        let e = check(&file(&h, 12)).unwrap_err().to_string();
        assert!(
            e.contains("`a`") && e.contains("`b`") && e.contains("overlap"),
            "{e}"
        );
        let e = check(&file(&GOOD.replace("[8,12]", "[12,16]"), 16))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bytes 8..12") && e.contains("`b`"), "{e}");
        let e = check(&file(GOOD, 20)).unwrap_err().to_string();
        assert!(e.contains("last 8 bytes"), "{e}");
    }

    #[test]
    fn when_entry_malformed_expect_tensor_and_field_named() {
        let e = check(&file(&GOOD.replace("[0,8]", "[8,0]"), 12))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a`") && e.contains("end before"), "{e}");
        let e = check(&file(&GOOD.replace("\"shape\":[2]", "\"shape\":[3]"), 12))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a`") && e.contains("needs 12"), "{e}");
        let e = check(&file(&GOOD.replace("\"shape\":[2]", "\"shape\":\"x\""), 12))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a`") && e.contains("shape"), "{e}");
        assert!(matches!(
            check(&[1, 2]),
            Err(HeaderError::TooShort { len: 2 })
        ));
        let mut b = file(GOOD, 12);
        b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(check(&b), Err(HeaderError::HeaderLength { .. })));
    }
}
