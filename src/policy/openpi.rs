//! `policy.backend = "openpi"`: the chunks come from a policy server speaking openpi's
//! websocket protocol (openpi's own server, `pi0d serve`, anything compatible). The client runs
//! on the inference worker, so the control loop never waits on the network; a reply's actions
//! are a chunk like a local model's (validated, time-aligned to the observation, blended,
//! governed). Every failure (down, stalled, closed, an error frame, a malformed or wrongly
//! shaped reply) is a typed error and no chunk: the arm holds when the running chunk ends.
//! A reply is only ever taken for the request it answers: one request is in flight, a timeout
//! drops the connection, and so does any frame that comes unasked (`websocket`). The request
//! timeout is a deadline on the whole reply, its decoding included.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub mod msgpack_numpy;
mod websocket;
mod wire;

pub(crate) use websocket::LinkError;
pub use websocket::{ServerInfo, Websocket};

/// Why an openpi policy cannot be built from its options.
#[derive(Debug, thiserror::Error)]
pub enum OpenpiError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("camera `{camera}` has no key in policy.openpi.images (it maps {mapped})")]
    UnmappedCamera { camera: String, mapped: String },
    #[error("policy.openpi.images.{key}: no such camera (the cameras are {cameras})")]
    UnknownCamera { key: String, cameras: String },
    #[error("policy.backend = \"zenoh\" needs pi0d built with the `zenoh` feature")]
    NoZenoh,
}

use self::msgpack_numpy::{Dtype, Item, NdArray, Out};
use super::{ActionChunk, Policy, PolicyError, RemoteFault, RemoteStats};
use crate::config::{ExtraValue, OpenpiOptions};
use crate::observation::{CameraFrame, Observation, PixelFormat};

/// Real-time chunking's extension keys of an openpi request: the running chunk's leftover
/// `[T, action_dim]` (robot units, as the replies' `actions`), row `i` due with the new chunk's
/// step `i`; the steps of the new chunk that run before it arrives (default 0); the steps
/// guided towards the leftover (default 10, lerobot's).
pub(crate) const PREV_ACTIONS_KEY: &str = "prev_actions";
pub(crate) const INFERENCE_DELAY_KEY: &str = "inference_delay";
pub(crate) const EXECUTION_HORIZON_KEY: &str = "execution_horizon";

/// Round trips kept for the percentiles.
const RTT_WINDOW: usize = 1000;
/// The longest a request waits for its reconnection time before giving up this time.
const MAX_WAIT_FOR_RECONNECT: Duration = Duration::from_millis(250);

fn fault(fault: RemoteFault, message: impl Into<String>) -> PolicyError {
    PolicyError::Remote {
        fault,
        message: message.into(),
    }
}

/// How requests reach the server and replies come back: a websocket (openpi's protocol) or,
/// with the `zenoh` feature, a Zenoh query (`policy::openpi_zenoh`).
pub trait Link: Send {
    /// Opens the link if it is not open (connects, reads the metadata).
    fn open(&mut self) -> Result<(), PolicyError>;
    fn is_open(&self) -> bool;
    /// Sends one request and returns its reply, by `deadline`.
    fn round_trip(&mut self, bytes: Vec<u8>, deadline: Instant) -> Result<Vec<u8>, PolicyError>;
    /// Closes the link after a failure, so that no late reply is read for a later request.
    fn close(&mut self);
    /// Replies dropped because their request was already answered (a link that can take more
    /// than one reply per request counts them; one that closes on a second has none).
    fn replies_dropped(&self) -> u64 {
        0
    }
}

pub struct OpenpiPolicy {
    opts: OpenpiOptions,
    link: Box<dyn Link>,
    /// Per observation image (the configured camera order): its request key.
    image_keys: Vec<String>,
    action_dim: usize,
    /// The longest chunk taken (`policy.chunk_steps`).
    max_steps: usize,
    step_period_s: f64,
    backoff: Duration,
    next_attempt: Instant,
    last_error: Option<String>,
    connects: u64,
    stats: RemoteStats,
    rtt_ms: VecDeque<f64>,
    server_ms: VecDeque<f64>,
}

impl OpenpiPolicy {
    /// `cameras`: the configured cameras' names, in observation order; `chunk_steps`: the
    /// longest chunk taken. The link is openpi's websocket, or Zenoh where the options say so.
    pub fn new(
        opts: &OpenpiOptions,
        cameras: &[String],
        action_dim: usize,
        chunk_steps: usize,
        step_period_s: f64,
    ) -> Result<OpenpiPolicy, OpenpiError> {
        let link: Box<dyn Link> = match &opts.zenoh {
            None => Box::new(Websocket::new(opts)?),
            #[cfg(feature = "zenoh")]
            Some(z) => Box::new(super::openpi_zenoh::ZenohLink::new(z, opts.max_reply_bytes)),
            #[cfg(not(feature = "zenoh"))]
            Some(_) => return Err(OpenpiError::NoZenoh),
        };
        Self::with_link(opts, link, cameras, action_dim, chunk_steps, step_period_s)
    }

    pub fn with_link(
        opts: &OpenpiOptions,
        link: Box<dyn Link>,
        cameras: &[String],
        action_dim: usize,
        chunk_steps: usize,
        step_period_s: f64,
    ) -> Result<OpenpiPolicy, OpenpiError> {
        let mut image_keys = Vec::with_capacity(cameras.len());
        for cam in cameras {
            match opts.image_key(cam) {
                Some(k) => image_keys.push(k),
                None => {
                    return Err(OpenpiError::UnmappedCamera {
                        camera: cam.clone(),
                        mapped: opts
                            .images
                            .as_ref()
                            .map(|m| m.keys().cloned().collect::<Vec<_>>().join(", "))
                            .unwrap_or_default(),
                    })
                }
            }
        }
        if let Some(m) = &opts.images {
            if let Some(extra) = m.keys().find(|k| !cameras.contains(k)) {
                return Err(OpenpiError::UnknownCamera {
                    key: extra.clone(),
                    cameras: cameras.join(", "),
                });
            }
        }
        Ok(OpenpiPolicy {
            opts: opts.clone(),
            link,
            image_keys,
            action_dim: opts.action_dim.unwrap_or(action_dim),
            max_steps: chunk_steps,
            step_period_s,
            backoff: Duration::from_secs_f64(opts.reconnect_initial_s),
            next_attempt: Instant::now(),
            last_error: None,
            connects: 0,
            stats: RemoteStats {
                url: opts.url.clone(),
                ..RemoteStats::default()
            },
            rtt_ms: VecDeque::new(),
            server_ms: VecDeque::new(),
        })
    }

    /// Drops the connection after `e` and schedules the next attempt (capped exponential).
    fn failed(&mut self, e: PolicyError) -> PolicyError {
        // A protocol fault is logged every time (the worker logs only every so many errors).
        if let PolicyError::Remote {
            fault: RemoteFault::Unsolicited,
            message,
        } = &e
        {
            tracing::warn!(url = %self.opts.url, "policy server protocol fault: {message}");
        }
        self.link.close();
        self.stats.connected = self.link.is_open();
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs_f64(self.opts.reconnect_max_s));
        self.last_error = Some(e.to_string());
        e
    }

    /// The request frame for `obs`.
    pub fn request(&self, obs: &Observation) -> Vec<u8> {
        let mut entries = Vec::with_capacity(self.image_keys.len() + 3);
        for (k, img) in self.image_keys.iter().zip(&obs.images) {
            // A camera without a frame yet is left out (the server masks or refuses it).
            if let Some(f) = img {
                let (h, w, data) = rgb_resized(f, self.opts.image_size);
                entries.push((
                    k.clone(),
                    Out::Array(NdArray {
                        dtype: Dtype::U8,
                        shape: vec![h, w, 3],
                        data,
                    }),
                ));
            }
        }
        let state: Vec<f32> = obs.state.iter().map(|x| *x as f32).collect();
        entries.push((
            self.opts.state_key.clone(),
            Out::Array(NdArray::f32(vec![state.len()], &state)),
        ));
        entries.push((self.opts.prompt_key.clone(), Out::Text(obs.prompt.clone())));
        for (k, v) in &self.opts.extra {
            entries.push((
                k.clone(),
                match v {
                    ExtraValue::Text(s) => Out::Text(s.clone()),
                    ExtraValue::Number(x) => Out::Number(*x),
                    ExtraValue::Bool(b) => Out::Bool(*b),
                },
            ));
        }
        // Real-time chunking as extension keys: servers that know them guide the chunk
        // (pi0d serve does); openpi's policies pick their own keys and ignore these.
        if let Some(p) = &obs.rtc {
            let v: Vec<f32> = p.actions.iter().map(|x| *x as f32).collect();
            entries.extend([
                (
                    PREV_ACTIONS_KEY.to_string(),
                    Out::Array(NdArray::f32(vec![p.steps(), p.action_dim], &v)),
                ),
                (
                    INFERENCE_DELAY_KEY.to_string(),
                    Out::Int(p.inference_delay as i64),
                ),
                (
                    EXECUTION_HORIZON_KEY.to_string(),
                    Out::Int(p.execution_horizon as i64),
                ),
            ]);
        }
        msgpack_numpy::encode(&Out::Map(entries))
    }

    /// The reply's `actions`, the first `action_dim` columns, as a chunk for `obs`.
    pub fn chunk(&mut self, reply: &[u8], obs: &Observation) -> Result<ActionChunk, PolicyError> {
        let malformed = |m: String| fault(RemoteFault::Malformed, m);
        let items = msgpack_numpy::decode_request(reply).map_err(|e| malformed(e.to_string()))?;
        let mut actions = None;
        for (k, v) in items {
            match (k.as_str(), v) {
                ("actions", Item::Array(a)) => actions = Some(a),
                ("actions", other) => {
                    return Err(malformed(format!(
                        "`actions` is not an array ({})",
                        crate::outside::text(&format!("{other:?}"))
                    )))
                }
                ("server_timing", Item::Map(m)) => {
                    if let Some((_, Item::Number(ms))) = m.iter().find(|(k, _)| k == "infer_ms") {
                        push(&mut self.server_ms, *ms);
                    }
                }
                _ => {}
            }
        }
        let Some(a) = actions else {
            return Err(malformed("the reply has no `actions`".into()));
        };
        if !matches!(a.dtype, Dtype::F32 | Dtype::F64) {
            return Err(fault(
                RemoteFault::Shape,
                format!("`actions` is {}, expected <f4 or <f8", a.dtype.name()),
            ));
        }
        let (h, d) = match a.shape.as_slice() {
            [h, d] | [1, h, d] => (*h, *d),
            s => {
                return Err(fault(
                    RemoteFault::Shape,
                    format!("`actions` has shape {s:?}, expected [horizon, action_dim]"),
                ))
            }
        };
        if h > self.max_steps {
            return Err(fault(
                RemoteFault::Shape,
                format!(
                    "`actions` has {h} steps: at most policy.chunk_steps = {} are taken (at {} s a step, it would run {:.1} s open loop)",
                    self.max_steps,
                    self.step_period_s,
                    h as f64 * self.step_period_s
                ),
            ));
        }
        if h < 2 || d < self.action_dim {
            return Err(fault(
                RemoteFault::Shape,
                format!(
                    "`actions` is [{h}, {d}]: expected at least 2 steps of at least {} values (policy.action_joints)",
                    self.action_dim
                ),
            ));
        }
        let values = a.to_f32();
        let mut out = Vec::with_capacity(h * self.action_dim);
        for row in values.chunks_exact(d) {
            // Non-finite values go on: the chunk checks refuse them, as for a local model.
            out.extend(row[..self.action_dim].iter().map(|x| *x as f64));
        }
        Ok(ActionChunk {
            obs_stamp: obs.stamp,
            step_period_s: self.step_period_s,
            action_dim: self.action_dim,
            actions: out,
            model: None,
        })
    }
}

fn push(q: &mut VecDeque<f64>, x: f64) {
    if q.len() == RTT_WINDOW {
        q.pop_front();
    }
    q.push_back(x);
}

fn percentile(q: &VecDeque<f64>, p: f64) -> f64 {
    if q.is_empty() {
        return 0.0;
    }
    let mut v: Vec<f64> = q.iter().copied().collect();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// `f` as RGB8 `[h, w, 3]`, resized with pad into a `size` square as openpi's client does
/// (aspect kept, bilinear, black borders, centred); `size` 0 leaves it as captured.
pub(crate) fn rgb_resized(f: &CameraFrame, size: u32) -> (usize, usize, Vec<u8>) {
    let rgb: Vec<u8> = match f.format {
        PixelFormat::Rgb8 => f.data.clone(),
        PixelFormat::Bgr8 => f
            .data
            .chunks_exact(3)
            .flat_map(|p| [p[2], p[1], p[0]])
            .collect(),
        PixelFormat::Mono8 => f.data.iter().flat_map(|g| [*g, *g, *g]).collect(),
    };
    let (w, h) = (f.width, f.height);
    let Some(img) = image::RgbImage::from_raw(w, h, rgb) else {
        // A frame shorter than its size (the decoders refuse those first): sent black.
        let s = size.max(1) as usize;
        return (s, s, vec![0; s * s * 3]);
    };
    if size == 0 || (w == size && h == size) {
        return (h as usize, w as usize, img.into_raw());
    }
    let ratio = (w as f64 / size as f64).max(h as f64 / size as f64);
    let (rw, rh) = (
        ((w as f64 / ratio) as u32).clamp(1, size),
        ((h as f64 / ratio) as u32).clamp(1, size),
    );
    let resized = image::imageops::resize(&img, rw, rh, image::imageops::FilterType::Triangle);
    let mut out = image::RgbImage::new(size, size);
    image::imageops::replace(
        &mut out,
        &resized,
        ((size - rw) / 2) as i64,
        ((size - rh) / 2) as i64,
    );
    (size as usize, size as usize, out.into_raw())
}

impl Policy for OpenpiPolicy {
    fn name(&self) -> &str {
        "openpi"
    }

    /// Connects (no request: a server's request count is its own business).
    fn warm_up(&mut self, _obs: &Observation) -> Result<(), PolicyError> {
        if self.link.is_open() {
            return Ok(());
        }
        if let Err(e) = self.link.open() {
            return Err(self.failed(e));
        }
        self.connects += 1;
        self.stats.connected = true;
        Ok(())
    }

    fn infer(&mut self, obs: &Observation) -> Result<ActionChunk, PolicyError> {
        if !self.link.is_open() {
            let now = Instant::now();
            if now < self.next_attempt {
                // The worker asks again at once: wait a little here rather than spin.
                std::thread::sleep((self.next_attempt - now).min(MAX_WAIT_FOR_RECONNECT));
                if Instant::now() < self.next_attempt {
                    return Err(fault(
                        RemoteFault::Down,
                        format!(
                            "reconnecting to {} (last error: {})",
                            self.opts.url,
                            self.last_error.as_deref().unwrap_or("none")
                        ),
                    ));
                }
            }
            if let Err(e) = self.link.open() {
                return Err(self.failed(e));
            }
            self.connects += 1;
            self.stats.reconnects = self.connects.saturating_sub(1);
            self.stats.connected = true;
            self.backoff = Duration::from_secs_f64(self.opts.reconnect_initial_s);
        }
        let bytes = self.request(obs);
        self.stats.requests += 1;
        let sent = Instant::now();
        let deadline = sent + Duration::from_secs_f64(self.opts.request_timeout_s);
        let reply = match self.link.round_trip(bytes, deadline) {
            Ok(r) => r,
            Err(e) => return Err(self.failed(e)),
        };
        push(&mut self.rtt_ms, sent.elapsed().as_secs_f64() * 1e3);
        self.stats.replies += 1;
        // The deadline covers the decoding too (bounded by the decoder's caps).
        let timeout_s = self.opts.request_timeout_s;
        let late = |when: &str| {
            fault(
                RemoteFault::Timeout,
                format!(
                    "the reply was not decoded within policy.openpi.request_timeout_s = {timeout_s} s ({when})"
                ),
            )
        };
        if Instant::now() >= deadline {
            return Err(self.failed(late("it came at the deadline")));
        }
        // A malformed reply is the server's fault but the link is fine: keep it.
        let chunk = self.chunk(&reply, obs);
        if Instant::now() >= deadline {
            return Err(self.failed(late("decoding ran past it")));
        }
        chunk
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
        Some(RemoteStats {
            rtt_ms_p50: percentile(&self.rtt_ms, 0.5),
            rtt_ms_p99: percentile(&self.rtt_ms, 0.99),
            rtt_ms_max: self.rtt_ms.iter().copied().fold(0.0, f64::max),
            server_infer_ms_p50: percentile(&self.server_ms, 0.5),
            replies_dropped: self.link.replies_dropped(),
            ..self.stats.clone()
        })
    }
}

/// The client's parser of a reply (`chunk`) on arbitrary bytes, for `crate::fuzz`: a
/// one-camera, 7-joint robot's policy whose server is never contacted.
pub(crate) fn fuzz_reply(bytes: &[u8]) -> Result<(), String> {
    let opts = OpenpiOptions {
        url: "ws://127.0.0.1:9".into(),
        api_key: None,
        ca_file: None,
        connect_timeout_s: 1.0,
        request_timeout_s: 1.0,
        reconnect_initial_s: 0.1,
        reconnect_max_s: 1.0,
        images: None,
        state_key: "observation.state".into(),
        prompt_key: "prompt".into(),
        extra: Vec::new(),
        image_size: 0,
        action_dim: None,
        max_reply_bytes: 1 << 20,
        zenoh: None,
    };
    let mut policy =
        OpenpiPolicy::new(&opts, &["front".to_string()], 7, 50, 0.02).map_err(|e| e.to_string())?;
    let obs = Observation {
        state: vec![0.0; 7],
        ..Observation::default()
    };
    policy
        .chunk(bytes, &obs)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    #[test]
    fn when_a_frame_is_resized_with_pad_expect_aspect_kept_and_black_borders() {
        let f = CameraFrame {
            stamp: MonoTime::ZERO,
            width: 8,
            height: 4,
            format: PixelFormat::Bgr8,
            data: [10u8, 20, 30].repeat(32),
        };
        let (h, w, data) = rgb_resized(&f, 4);
        assert_eq!((h, w, data.len()), (4, 4, 48));
        // Rows 0 and 3 are the pad; rows 1 and 2 the image, BGR turned RGB.
        assert!(data[..12].iter().all(|b| *b == 0));
        assert_eq!(&data[12..15], &[30, 20, 10]);
        assert!(data[36..].iter().all(|b| *b == 0));
        let (h, w, same) = rgb_resized(&f, 0);
        assert_eq!((h, w, same.len()), (4, 8, 96));
    }
}
