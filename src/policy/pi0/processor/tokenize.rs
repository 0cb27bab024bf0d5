//! `tokenizer_processor`'s settings applied to one prompt's ids exactly as Hugging Face's
//! tokenizer call applies them (`max_length`, `padding`, `padding_side`, `truncation`), then
//! filled out with masked padding to the length the model takes. Masked tokens neither attend
//! nor are attended to, and do not advance the positions of the tokens after them, so that
//! filling changes no action.

/// Hugging Face's padding strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Padding {
    /// To `max_length`.
    MaxLength,
    /// To the longest prompt of the batch: lerobot tokenizes one observation at a time, so none.
    Longest,
    /// `do_not_pad`.
    None,
}

/// A tokenizer step's settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenizerStep {
    pub(crate) max_length: usize,
    pub(crate) padding: Padding,
    /// Padding before the prompt instead of after it.
    pub(crate) left: bool,
    pub(crate) truncation: bool,
    /// The hub tokenizer lerobot loads; pi0d reads the checkpoint's tokenizer.json instead.
    pub(crate) hub_name: Option<String>,
}

/// A prompt longer than the model's token inputs (only with truncation off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the prompt is {tokens} tokens, more than the model's {capacity} (the checkpoint's tokenizer step does not truncate)")]
pub struct TooLong {
    pub(crate) tokens: usize,
    pub(crate) capacity: usize,
}

impl TokenizerStep {
    /// Padded right to `len`, truncated (openpi's tokenizer, and a checkpoint without steps).
    pub(crate) fn fixed(len: usize) -> TokenizerStep {
        TokenizerStep {
            max_length: len,
            padding: Padding::MaxLength,
            left: false,
            truncation: true,
            hub_name: None,
        }
    }

    /// `ids` (the tokenizer's encoding, special tokens included) as the step leaves them, then
    /// masked `pad_id`s after them up to `capacity`.
    pub(crate) fn apply(
        &self,
        mut ids: Vec<i64>,
        pad_id: i64,
        capacity: usize,
    ) -> Result<(Vec<i64>, Vec<bool>), TooLong> {
        if self.truncation {
            ids.truncate(self.max_length);
        }
        let real = ids.len();
        let padded = match self.padding {
            Padding::MaxLength => real.max(self.max_length),
            Padding::Longest | Padding::None => real,
        };
        if padded > capacity {
            return Err(TooLong {
                tokens: padded,
                capacity,
            });
        }
        let pad = padded - real;
        let (mut out, mut mask) = if self.left {
            let mut out = vec![pad_id; pad];
            out.extend(ids);
            let mut mask = vec![false; pad];
            mask.resize(padded, true);
            (out, mask)
        } else {
            ids.resize(padded, pad_id);
            let mut mask = vec![true; real];
            mask.resize(padded, false);
            (ids, mask)
        };
        out.resize(capacity, pad_id);
        mask.resize(capacity, false);
        Ok((out, mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(max_length: usize, padding: Padding, left: bool, truncation: bool) -> TokenizerStep {
        TokenizerStep {
            max_length,
            padding,
            left,
            truncation,
            hub_name: None,
        }
    }

    #[test]
    fn when_padded_to_max_length_expect_hugging_faces_layout() {
        let ids = vec![2, 10, 11];
        let right = step(5, Padding::MaxLength, false, true).apply(ids.clone(), 0, 5);
        assert_eq!(
            right,
            Ok((vec![2, 10, 11, 0, 0], vec![true, true, true, false, false]))
        );
        let left = step(5, Padding::MaxLength, true, true).apply(ids.clone(), 0, 5);
        assert_eq!(
            left,
            Ok((vec![0, 0, 2, 10, 11], vec![false, false, true, true, true]))
        );
        // Truncated from the end; filled to the model's capacity after the step's padding.
        let cut = step(2, Padding::MaxLength, true, true).apply(ids, 7, 4);
        assert_eq!(cut, Ok((vec![2, 10, 7, 7], vec![true, true, false, false])));
    }

    #[test]
    fn when_padded_to_the_longest_expect_no_padding_of_its_own() {
        let s = step(4, Padding::Longest, true, true);
        assert_eq!(
            s.apply(vec![2, 9], 0, 4),
            Ok((vec![2, 9, 0, 0], vec![true, true, false, false]))
        );
        assert_eq!(
            s.apply(vec![2, 9, 9, 9, 9, 9], 0, 4).map(|r| r.1),
            Ok(vec![true; 4])
        );
    }

    #[test]
    fn when_truncation_is_off_expect_a_long_prompt_refused_and_a_short_one_padded() {
        let s = step(3, Padding::MaxLength, false, false);
        assert_eq!(
            s.apply(vec![2, 5, 6, 7], 0, 3),
            Err(TooLong {
                tokens: 4,
                capacity: 3
            })
        );
        assert_eq!(
            s.apply(vec![2], 0, 3),
            Ok((vec![2, 0, 0], vec![true, false, false]))
        );
    }
}
