//! A request's keys mapped onto the model's inputs: by default the checkpoint's own feature
//! names (`observation.images.<camera>` as uint8 HWC, `observation.state`) and `prompt`, plus
//! pi0d's optional `noise` (the flow-matching start, for reproducible replies) and real-time
//! chunking's optional `prev_actions`, `inference_delay`, `execution_horizon`. Anything
//! missing, extra, of another dtype or shape is refused naming the key and what was expected.

use crate::chunk::ChunkPrefix;
use crate::observation::{CameraFrame, PixelFormat};
use crate::policy::openpi::msgpack_numpy::{Dtype, Item, NdArray, WireError};
use crate::time::MonoTime;

/// Largest image side taken (a 4K frame is 3840).
pub(crate) const MAX_SIDE: usize = 4096;

/// The keys a server takes and the sizes behind them.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Per model camera, its key.
    pub(crate) image_keys: Vec<String>,
    /// Per model camera, whether a request may leave it out (fed masked, as lerobot does).
    pub(crate) optional: Vec<bool>,
    pub(crate) state_key: String,
    pub(crate) state_dim: usize,
    pub(crate) prompt_key: String,
    /// Keys accepted and dropped.
    pub(crate) ignored: Vec<String>,
    /// Values in a `noise` array: chunk x the model's padded action width.
    pub(crate) noise_shape: [usize; 2],
    /// The chunk's steps and the robot's action width (a `prev_actions` leftover's bounds).
    pub(crate) actions_shape: [usize; 2],
}

pub(crate) const NOISE_KEY: &str = "noise";
pub(crate) use crate::policy::openpi::{
    EXECUTION_HORIZON_KEY, INFERENCE_DELAY_KEY, PREV_ACTIONS_KEY,
};
const DEFAULT_EXECUTION_HORIZON: usize = 10;
/// The optional keys every layout takes.
pub(crate) const OPTIONAL_KEYS: [&str; 4] = [
    NOISE_KEY,
    PREV_ACTIONS_KEY,
    INFERENCE_DELAY_KEY,
    EXECUTION_HORIZON_KEY,
];

/// One observation, ready for the pipeline.
#[derive(Debug)]
pub(crate) struct Request {
    /// Per model camera (`None`: left out, fed masked).
    pub(crate) frames: Vec<Option<CameraFrame>>,
    pub(crate) state: Vec<f32>,
    pub(crate) prompt: String,
    pub(crate) noise: Option<Vec<f32>>,
    /// Real-time chunking's leftover, when the request brings one.
    pub(crate) rtc: Option<ChunkPrefix>,
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

    pub(crate) fn parse(&self, items: Vec<(String, Item)>) -> Result<Request, WireError> {
        let mut frames: Vec<Option<CameraFrame>> = vec![None; self.image_keys.len()];
        let (mut state, mut prompt, mut noise) = (None, None, None);
        let (mut prev, mut delay, mut horizon) = (None, None, None);
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
            } else if key == PREV_ACTIONS_KEY {
                prev = Some(self.prev_actions(&key, &item)?);
            } else if key == INFERENCE_DELAY_KEY {
                delay = Some(steps(&key, &item, 0, self.actions_shape[0])?);
            } else if key == EXECUTION_HORIZON_KEY {
                horizon = Some(steps(&key, &item, 1, self.actions_shape[0])?);
            } else if self.ignored.contains(&key) {
                continue;
            } else {
                return Err(wrong(
                    &key,
                    format!(
                        "not a key this server takes (it takes {}, and {})",
                        self.keys().join(", "),
                        OPTIONAL_KEYS.map(|k| format!("`{k}`")).join(", ")
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
        let rtc = match prev {
            Some((actions, rows)) => Some(ChunkPrefix {
                actions,
                action_dim: self.actions_shape[1],
                inference_delay: delay.unwrap_or(0).min(rows),
                execution_horizon: horizon.unwrap_or(DEFAULT_EXECUTION_HORIZON).min(rows),
            }),
            None => {
                if let Some(k) = [
                    (INFERENCE_DELAY_KEY, delay),
                    (EXECUTION_HORIZON_KEY, horizon),
                ]
                .iter()
                .find_map(|(k, v)| v.map(|_| *k))
                {
                    return Err(wrong(
                        k,
                        format!("given without `{PREV_ACTIONS_KEY}`, the leftover it applies to"),
                    ));
                }
                None
            }
        };
        Ok(Request {
            frames,
            state,
            prompt,
            noise,
            rtc,
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

    /// `[T, action_dim]` (or `[1, T, action_dim]`), T from 1 to the chunk's steps: the values
    /// and T.
    fn prev_actions(&self, key: &str, item: &Item) -> Result<(Vec<f64>, usize), WireError> {
        let [h, a] = self.actions_shape;
        let what = format!("[T, {a}] numbers (T from 1 to {h})");
        let (shape, v) = self.floats(key, item, &what)?;
        match shape.as_slice() {
            [t, d] | [1, t, d] if *d == a && (1..=h).contains(t) => {
                Ok((v.into_iter().map(f64::from).collect(), *t))
            }
            _ => Err(wrong(
                key,
                format!("expected {what}, found shape {shape:?}"),
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

/// A whole number of steps within `lo..=hi`.
fn steps(key: &str, item: &Item, lo: usize, hi: usize) -> Result<usize, WireError> {
    let n = match item {
        Item::Number(n) => *n,
        other => {
            return Err(wrong(
                key,
                format!("expected a whole number of steps, found {}", found(other)),
            ))
        }
    };
    if n.fract() == 0.0 && n >= lo as f64 && n <= hi as f64 {
        Ok(n as usize)
    } else {
        Err(wrong(
            key,
            format!("expected {lo} to {hi} steps, found {n}"),
        ))
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
            actions_shape: [3, 2],
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
        let mut long = good();
        long.push((
            PREV_ACTIONS_KEY.into(),
            Item::Array(NdArray::f32(vec![4, 2], &[0.0; 8])),
        ));
        assert!(err(long).contains("expected [T, 2] numbers (T from 1 to 3), found shape [4, 2]"));
        let mut lone = good();
        lone.push((INFERENCE_DELAY_KEY.into(), Item::Number(1.0)));
        assert!(err(lone).starts_with("`inference_delay`: given without `prev_actions`"));
        let mut half = good();
        half.push((
            PREV_ACTIONS_KEY.into(),
            Item::Array(NdArray::f32(vec![2, 2], &[0.0; 4])),
        ));
        half.push((EXECUTION_HORIZON_KEY.into(), Item::Number(1.5)));
        assert!(err(half).contains("expected 1 to 3 steps, found 1.5"));
    }

    #[test]
    fn when_a_leftover_is_given_expect_it_with_its_delay_and_horizon() {
        let mut items = good();
        items.extend([
            (
                PREV_ACTIONS_KEY.into(),
                Item::Array(NdArray::f32(vec![2, 2], &[1.0, 2.0, 3.0, 4.0])),
            ),
            (INFERENCE_DELAY_KEY.into(), Item::Number(1.0)),
            (EXECUTION_HORIZON_KEY.into(), Item::Number(3.0)),
        ]);
        let p = layout().parse(items).unwrap().rtc.unwrap();
        assert_eq!(p.actions, [1.0, 2.0, 3.0, 4.0]);
        // The horizon is cut to the leftover's two steps.
        assert_eq!(
            (p.steps(), p.inference_delay, p.execution_horizon),
            (2, 1, 2)
        );
    }
}
