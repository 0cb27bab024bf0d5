//! A request's keys mapped onto the model's inputs: by default the checkpoint's own feature
//! names (`observation.images.<camera>` as uint8 HWC, `observation.state`) and `prompt`, plus
//! pi0d's optional `noise` (the flow-matching start, for reproducible replies). Anything
//! missing, extra, of another dtype or shape is refused naming the key and what was expected.

use crate::io::msgpack_numpy::{Dtype, Item, NdArray, WireError};
use crate::policy::{CameraFrame, PixelFormat};
use crate::time::MonoTime;

/// Largest image side taken (a 4K frame is 3840).
pub const MAX_SIDE: usize = 4096;

/// The keys a server takes and the sizes behind them.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Per model camera, its key.
    pub image_keys: Vec<String>,
    /// Per model camera, whether a request may leave it out (fed masked, as lerobot does).
    pub optional: Vec<bool>,
    pub state_key: String,
    pub state_dim: usize,
    pub prompt_key: String,
    /// Keys accepted and dropped.
    pub ignored: Vec<String>,
    /// Values in a `noise` array: chunk x the model's padded action width.
    pub noise_shape: [usize; 2],
}

pub const NOISE_KEY: &str = "noise";

/// One observation, ready for the pipeline.
#[derive(Debug)]
pub struct Request {
    /// Per model camera (`None`: left out, fed masked).
    pub frames: Vec<Option<CameraFrame>>,
    pub state: Vec<f32>,
    pub prompt: String,
    pub noise: Option<Vec<f32>>,
}

fn wrong(key: &str, message: impl Into<String>) -> WireError {
    WireError::Field {
        key: key.into(),
        message: message.into(),
    }
}

fn found(item: &Item) -> String {
    match item {
        Item::Array(a) => format!("an array {} {:?}", a.dtype.name(), a.shape),
        Item::Text(_) => "a string".into(),
        Item::Number(_) => "a number".into(),
        Item::Bool(_) => "a boolean".into(),
        Item::Map(_) => "a map".into(),
        Item::Other(k) => k.to_string(),
    }
}

impl Layout {
    /// Every key it takes, for messages.
    pub fn keys(&self) -> Vec<String> {
        let mut k = self.image_keys.clone();
        k.extend([self.state_key.clone(), self.prompt_key.clone()]);
        k
    }

    pub fn parse(&self, items: Vec<(String, Item)>) -> Result<Request, WireError> {
        let mut frames: Vec<Option<CameraFrame>> = vec![None; self.image_keys.len()];
        let (mut state, mut prompt, mut noise) = (None, None, None);
        for (key, item) in items {
            if let Some(cam) = self.image_keys.iter().position(|k| *k == key) {
                frames[cam] = Some(self.image(&key, item)?);
            } else if key == self.state_key {
                state = Some(self.state(&key, &item)?);
            } else if key == self.prompt_key {
                match item {
                    Item::Text(t) => prompt = Some(t),
                    other => {
                        return Err(wrong(
                            &key,
                            format!("expected a string, found {}", found(&other)),
                        ))
                    }
                }
            } else if key == NOISE_KEY {
                noise = Some(self.noise(&key, &item)?);
            } else if self.ignored.contains(&key) {
                continue;
            } else {
                return Err(wrong(
                    &key,
                    format!(
                        "not a key this server takes (it takes {}, and `{NOISE_KEY}`)",
                        self.keys().join(", ")
                    ),
                ));
            }
        }
        for (cam, key) in self.image_keys.iter().enumerate() {
            if frames[cam].is_none() && !self.optional[cam] {
                return Err(wrong(key, "missing: expected a uint8 [H, W, 3] image"));
            }
        }
        let Some(state) = state else {
            return Err(wrong(
                &self.state_key,
                format!("missing: expected {} numbers", self.state_dim),
            ));
        };
        let Some(prompt) = prompt else {
            return Err(wrong(
                &self.prompt_key,
                "missing: expected the task as a string",
            ));
        };
        Ok(Request {
            frames,
            state,
            prompt,
            noise,
        })
    }

    fn image(&self, key: &str, item: Item) -> Result<CameraFrame, WireError> {
        let expected = "expected a uint8 [H, W, 3] image (HWC, RGB)";
        let Item::Array(NdArray { dtype, shape, data }) = item else {
            return Err(wrong(key, format!("{expected}, found {}", found(&item))));
        };
        match (dtype, shape.as_slice()) {
            (Dtype::U8, &[h, w, 3])
                if (1..=MAX_SIDE).contains(&h) && (1..=MAX_SIDE).contains(&w) =>
            {
                Ok(CameraFrame {
                    stamp: MonoTime::now(),
                    width: w as u32,
                    height: h as u32,
                    format: PixelFormat::Rgb8,
                    data,
                })
            }
            (Dtype::U8, &[h, w, 3]) => Err(wrong(
                key,
                format!("{h}x{w} is outside 1 to {MAX_SIDE} pixels a side"),
            )),
            _ => Err(wrong(
                key,
                format!("{expected}, found {} {shape:?}", dtype.name()),
            )),
        }
    }

    fn floats(
        &self,
        key: &str,
        item: &Item,
        what: &str,
    ) -> Result<(Vec<usize>, Vec<f32>), WireError> {
        let Item::Array(a) = item else {
            return Err(wrong(
                key,
                format!("expected {what}, found {}", found(item)),
            ));
        };
        if !matches!(a.dtype, Dtype::F32 | Dtype::F64) {
            return Err(wrong(
                key,
                format!("expected {what} as <f4 or <f8, found {}", a.dtype.name()),
            ));
        }
        let v = a.to_f32();
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(wrong(
                key,
                format!("value {i} is {}, not a finite number", v[i]),
            ));
        }
        Ok((a.shape.clone(), v))
    }

    fn state(&self, key: &str, item: &Item) -> Result<Vec<f32>, WireError> {
        let what = format!("{} numbers", self.state_dim);
        let (shape, v) = self.floats(key, item, &what)?;
        // [D] or [1, D], as clients batch or not.
        match shape.as_slice() {
            [d] | [1, d] if *d == self.state_dim => Ok(v),
            _ => Err(wrong(
                key,
                format!(
                    "expected {what} ([{}]), found shape {shape:?}",
                    self.state_dim
                ),
            )),
        }
    }

    fn noise(&self, key: &str, item: &Item) -> Result<Vec<f32>, WireError> {
        let [h, a] = self.noise_shape;
        let what = format!("[{h}, {a}] numbers");
        let (shape, v) = self.floats(key, item, &what)?;
        match shape.as_slice() {
            [x, y] | [1, x, y] if (*x, *y) == (h, a) => Ok(v),
            _ => Err(wrong(
                key,
                format!("expected {what}, found shape {shape:?}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            image_keys: vec![
                "observation.images.front".into(),
                "observation.images.wrist".into(),
            ],
            optional: vec![false, true],
            state_key: "observation.state".into(),
            state_dim: 2,
            prompt_key: "prompt".into(),
            ignored: vec!["observation/joint_velocity".into()],
            noise_shape: [3, 4],
        }
    }

    fn image(h: usize, w: usize) -> Item {
        Item::Array(NdArray {
            dtype: Dtype::U8,
            shape: vec![h, w, 3],
            data: vec![0; h * w * 3],
        })
    }

    fn good() -> Vec<(String, Item)> {
        vec![
            ("observation.images.front".into(), image(4, 6)),
            (
                "observation.state".into(),
                Item::Array(NdArray::f32(vec![2], &[0.1, 0.2])),
            ),
            ("prompt".into(), Item::Text("stack".into())),
        ]
    }

    #[test]
    fn when_the_checkpoints_keys_are_given_expect_frames_state_and_prompt() {
        let mut items = good();
        items.push(("observation/joint_velocity".into(), Item::Number(1.0)));
        let r = layout().parse(items).unwrap();
        let f = r.frames[0].as_ref().unwrap();
        assert_eq!((f.width, f.height), (6, 4));
        assert!(r.frames[1].is_none(), "the optional wrist camera, masked");
        assert_eq!(r.state, [0.1, 0.2]);
        assert_eq!(r.prompt, "stack");
        assert!(r.noise.is_none());
    }

    #[test]
    fn when_a_key_is_missing_extra_or_of_another_kind_expect_it_named() {
        let err = |items: Vec<(String, Item)>| layout().parse(items).unwrap_err().to_string();
        let mut extra = good();
        extra.push(("observation/image".into(), image(2, 2)));
        let e = err(extra);
        assert!(
            e.starts_with("`observation/image`: not a key this server takes"),
            "{e}"
        );
        assert!(
            e.contains(
                "observation.images.front, observation.images.wrist, observation.state, prompt"
            ),
            "{e}"
        );
        let mut no_front = good();
        no_front.remove(0);
        assert!(err(no_front).starts_with("`observation.images.front`: missing"));
        let mut chw = good();
        chw[0].1 = Item::Array(NdArray {
            dtype: Dtype::U8,
            shape: vec![3, 4, 6],
            data: vec![0; 72],
        });
        assert!(
            err(chw).contains("expected a uint8 [H, W, 3] image (HWC, RGB), found |u1 [3, 4, 6]")
        );
        let mut floats = good();
        floats[0].1 = Item::Array(NdArray::f32(vec![1, 1, 3], &[0.0; 3]));
        assert!(err(floats).contains("found <f4 [1, 1, 3]"));
        let mut wide = good();
        wide[1].1 = Item::Array(NdArray::f32(vec![3], &[0.0; 3]));
        assert!(err(wide).contains("expected 2 numbers ([2]), found shape [3]"));
        let mut nan = good();
        nan[1].1 = Item::Array(NdArray::f32(vec![2], &[0.0, f32::NAN]));
        assert!(err(nan).contains("value 1 is NaN"));
        let mut number = good();
        number[2].1 = Item::Number(3.0);
        assert!(err(number).starts_with("`prompt`: expected a string, found a number"));
        let mut noise = good();
        noise.push((
            NOISE_KEY.into(),
            Item::Array(NdArray::f32(vec![4, 3], &[0.0; 12])),
        ));
        assert!(err(noise).contains("expected [3, 4] numbers, found shape [4, 3]"));
    }
}
